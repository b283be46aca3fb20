"""Generated logs of a given size, for the tests and benchmarks of the log readers (tests/test_logs_hostile.py,
benchmarks/bench_report_scaling.py): NCCL INFO logs of many processes x communicators, probe event
directories of many ordinary lines or many files. Seeded or fully determined by their arguments."""
from __future__ import annotations

import json
import os
from pathlib import Path

LIB = "/opt/nccl/lib/libnccl.so.2"


def nccl_init_log(path: Path, procs: int, comms: int, host: str = "node") -> int:
    """An NCCL 2.28 INFO log: `procs` processes (ranks), each creating `comms` communicators that span every
    rank (Init START and COMPLETE each, one NCCL_PROTO line in the window); returns the Init lines written."""
    lines = 0
    with open(path, "w") as fh:
        for r in range(procs):
            pid = 10_000 + r
            out = [f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.28.9+cuda12.9"]
            for c in range(comms):
                ptr, cid = f"0x55{r:06x}{c:04x}", f"0x{0xc0ffee0000 + c:016x}"
                head = (f"{host}:{pid}:{pid} [0] NCCL INFO ncclCommInitRankConfig comm {ptr} rank {r} nranks {procs} "
                        f"cudaDev 0 nvmlDev 0 busId 1000 commId {cid} - Init ")
                out += [head + "START", f"{host}:{pid}:{pid} [0] NCCL INFO NCCL_PROTO set by environment to Simple",
                        head + "COMPLETE"]
                lines += 2
            fh.write("\n".join(out) + "\n")
    return lines


def event(t: float, pid: int, ev: str, src: str, host: str = "h", **fields) -> bytes:
    return (json.dumps({"ev": ev, "t": t, "host": host, "pid": pid, "src": src, **fields}) + "\n").encode()


def ordinary_events(pid: int, n: int, t0: float = 1.7e9) -> bytes:
    """One process's file of about n lines: a start, one communicator, then env plugin reads, collective
    flushes and activity lines in time order (what a long job's probes write)."""
    h = f"0x{0xab00 + pid:016x}"
    out = [event(t0, pid, "process_start", "boot", ppid=1, argv=["python", "train.py"], exe="/usr/bin/python3",
                 env={"NCCL_PROTO": "Simple"}),
           event(t0 + 1e-3, pid, "comm_init", "preload", api="ncclCommInitRank", call=1, comm=f"0x{pid:016x}",
                 nranks=8, rank=pid % 8, env={"NCCL_PROTO": "Simple"}, rc=0, lib=LIB, version=22809, ms=1.0),
           event(t0 + 2e-3, pid, "comm_plugin_init", "profiler", comm_hash=h, nranks=8, rank=pid % 8, lib=LIB, call=1)]
    body = [("coll_summary", "profiler", {"comm_hash": h, "func": "AllReduce", "algo": "Ring", "proto": "Simple",
                                          "nchannels": 2, "bytes_min": 8, "bytes_max": 1 << 20, "count": 7,
                                          "rank": pid % 8, "reason": "periodic"}),
            ("nccl_getenv", "envplugin", {"var": "NCCL_PROTO", "value": "Simple", "lib": LIB}),
            ("comm_activity", "profiler", {"comm_hash": h, "rank": pid % 8, "nranks": 8, "first_t": t0, "last_t": t0,
                                           "api_eager": 3, "api_captured": 0, "timing": "off", "flush_s": 1.0,
                                           "flush": 1, "reason": "periodic"})]
    for i in range(max(0, n - len(out))):
        ev, src, fields = body[i % 3]
        out.append(event(t0 + 1e-2 + i * 1e-4, pid, ev, src, **fields))
    return b"".join(out)


def event_dir(d: Path, procs: int, lines_each: int) -> int:
    """A log directory of `procs` process files of about `lines_each` ordinary lines; returns the lines."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    total = 0
    for i in range(procs):
        data = ordinary_events(100 + i, lines_each)
        (d / f"h-{100 + i}.jsonl").write_bytes(data)
        total += data.count(b"\n")
    return total


def one_line_files(d: Path, n: int) -> None:
    """n files of one process_start line each (fork children that did nothing else), written with bare
    os calls: a million of them take about a minute on tmpfs."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd_dir = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(n):
            pid = 1000 + i
            fd = os.open(f"h-{pid}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd_dir)
            os.write(fd, event(1.7e9 + i * 1e-3, pid, "process_start", "boot", ppid=999, argv=["python", "-c", "pass"]))
            os.close(fd)
    finally:
        os.close(fd_dir)


def comm_events_dir(d: Path, procs: int, comms: int, host: str = "h") -> int:
    """A log directory of `procs` process files, each creating `comms` communicators (preload comm_init and
    profiler init, one env plugin read each, a collective flush each) that span every process; returns
    the lines written."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    total = 0
    for r in range(procs):
        pid, t = 100 + r, 1.7e9 + r * 1e-3
        out = [event(t, pid, "process_start", "boot", host, ppid=1, argv=["python", "train.py"],
                     env={"NCCL_PROTO": "Simple"})]
        for c in range(comms):
            t += 1.0
            h = f"0x{0xc0ffee0000 + c:016x}"
            out += [event(t, pid, "comm_init", "preload", host, api="ncclCommInitRank", call=c + 1,
                          comm=f"0x{(r << 20) + c + 1:016x}", uid=f"0x{0xbeef0000 + c:016x}", nranks=procs, rank=r,
                          env={"NCCL_PROTO": "Simple"}, rc=0, lib=LIB, version=22809, ms=1.0),
                    event(t + 1e-3, pid, "nccl_getenv", "envplugin", host, var="NCCL_PROTO", value="Simple", lib=LIB),
                    event(t + 2e-3, pid, "comm_plugin_init", "profiler", host, comm_hash=h, nranks=procs, rank=r,
                          lib=LIB, call=c + 1),
                    event(t + 3e-3, pid, "coll_summary", "profiler", host, comm_hash=h, func="AllReduce", algo="Ring",
                          proto="Simple", nchannels=2, bytes_min=8, bytes_max=1 << 20, count=7, rank=r,
                          reason="finalize")]
        (d / f"{host}-{pid}.jsonl").write_bytes(b"".join(out))
        total += len(out)
    return total
