"""Fuzz of the /proc readers: procs.walk with the native reader (native/procread.c through
witnesses/procread.py) and with the Python one, run's watch scan (procwatch.Scanner, both readers),
procs' own parsers (stat, status, cmdline, environ, maps, children) and `inspect` end to end, on fake
/proc trees (tests/fakeproc.py) one file of which holds random or adversarial bytes: huge and sparse
files, NUL runs, missing fields, non-numeric and 5000-digit numbers, invalid UTF-8, parentheses in comm
(`a) R 1 (`), maps rows with very long paths, spaces, NULs and " (deleted)", FIFOs and directories
where files should be.

What must hold for every case: no exception but the command's own (Unexaminable: a value with a
reason), every process not read listed with its reason, and each case within CASE_S. The cases run in
a worker process, so a reader that loops or blocks costs the test its timeout, never the suite."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

CASE_S = 60.0  # per case, on a loaded 2-core machine (the slowest here takes ~2 s unloaded)
SEED = int(os.environ.get("NCCLPROBE_FUZZ_SEED", "21"))
RANDOM_CASES = 60
PIDS = (100, 101, 102)  # the fake tree: 100 -> 101 -> 102


# -- the cases ------------------------------------------------------------------------------------
def stat_line(pid: int, ppid: int, comm: str = "python", start: str = "100") -> bytes:
    fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "4194304"] + ["0"] * 12 + [start]
    fields += ["0"] * (45 - len(fields)) + ["1", "2", "3", "4", "0"]
    return f"{pid} ({comm}) ".encode() + " ".join(fields).encode() + b"\n"


def maps_row(path: bytes, inode: bytes = b"12", perms: bytes = b"r-xp") -> bytes:
    return b"7f0000000000-7f0000001000 " + perms + b" 00000000 08:01 " + inode + b" " + path + b"\n"


def sparse(size: int):
    def make(path: Path) -> None:
        with open(path, "wb") as f:
            f.truncate(size)  # a hole: it claims size bytes and costs none
    return make


def replaced_by(kind: str):
    def make(path: Path) -> None:
        path.unlink()
        {"fifo": os.mkfifo, "dir": os.mkdir, "loop": lambda p: os.symlink(p.name, p)}[kind](path)
    return make


# name -> (pid, file under /proc/<pid>, bytes or a function that makes the file)
ADVERSARIAL = {
    "stat empty": (101, "stat", b""),
    "stat NUL run": (101, "stat", b"\0" * 5000),
    "stat comm with parentheses": (101, "stat", stat_line(101, 100, comm="a) R 1 (")),
    "stat comm of ) alone": (101, "stat", stat_line(101, 100, comm=")))")),
    "stat comm with a newline": (101, "stat", stat_line(101, 100, comm="a\nb")),
    "stat non-numeric ppid": (101, "stat", stat_line(101, 100).replace(b" S 100 ", b" S x ")),
    "stat missing fields": (101, "stat", b"101 (a) S 100 1 2\n"),
    "stat no parenthesis": (101, "stat", b"101 a S 100 " + b"0 " * 50 + b"\n"),
    "stat 400-digit start": (101, "stat", stat_line(101, 100, start="9" * 400)),
    "stat 5000-digit start": (101, "stat", stat_line(101, 100, start="9" * 5000)),
    "stat 2^64 start": (101, "stat", stat_line(101, 100, start=str(2 ** 64))),
    "stat negative ppid": (101, "stat", stat_line(101, -5)),
    "stat parent cycle": (101, "stat", stat_line(101, 102)),
    "stat its own parent": (101, "stat", stat_line(101, 101)),
    "stat invalid UTF-8 comm": (101, "stat", stat_line(101, 100).replace(b"python", b"\xff\xfe\x80")),
    "stat 300 MB sparse": (101, "stat", sparse(300 << 20)),
    "root stat 30-digit ppid": (100, "stat", stat_line(100, 1).replace(b" S 1 ", b" S " + b"9" * 30 + b" ")),
    "status 5000-digit Tgid": (100, "status", b"Tgid:\t" + b"9" * 5000 + b"\n"),
    "status NUL run": (100, "status", b"\0" * 100_000),
    "status 1 GB sparse": (100, "status", sparse(1 << 30)),
    "cmdline NUL run": (101, "cmdline", b"\0" * 100_000),
    "cmdline invalid UTF-8": (101, "cmdline", b"\xff\xfe\0\x80abc"),
    "cmdline 3 GB sparse": (101, "cmdline", sparse(3 << 30)),
    "environ 3 GB sparse": (101, "environ", sparse(3 << 30)),
    "environ NUL run": (101, "environ", b"\0" * 100_000),
    "environ names without values": (101, "environ", b"=\0==\0=x\0NCCL_PROTO\0\0\0"),
    "environ invalid UTF-8": (101, "environ", b"NCCL_PROTO=\xff\xfe\0\xc3=\x80\0"),
    "environ one 8 MB value": (101, "environ", b"NCCL_PROTO=" + b"A" * (8 << 20) + b"\0"),
    "maps 200 KB path": (101, "maps", maps_row(b"/" + b"a" * 200_000)),
    "maps path with spaces, deleted": (101, "maps", maps_row(b"/lib/x y  z.so (deleted)")),
    "maps ' (deleted)' alone": (101, "maps", maps_row(b"/ (deleted)")),
    "maps 5000-digit inode": (101, "maps", maps_row(b"/lib/x.so", inode=b"9" * 5000)),
    "maps short rows": (101, "maps", b"7f00\nr-xp\n \n  \n7f00-7f01 r-x\n7f00-7f01 r-xp 0 08:01 12\n"),
    "maps NULs in a path": (101, "maps", maps_row(b"/lib/\0\0x.so") + b"\0" * 10_000),
    "maps invalid UTF-8 path": (101, "maps", maps_row(b"/lib/\xff\xfe.so", perms=b"r-xs")),
    "maps 200000 files": (101, "maps", b"".join(maps_row(b"/lib/l%d.so" % i, b"%d" % (i + 1)) for i in range(200_000))),
    "maps 3 GB sparse": (101, "maps", sparse(3 << 30)),
    "children garbage": (100, "task/100/children", b"abc -5 99999999999999999999 101 101 100 " + b"9" * 5000),
    "children of itself": (101, "task/101/children", b"101 100"),
    "stat a FIFO": (101, "stat", replaced_by("fifo")),
    "environ a FIFO": (101, "environ", replaced_by("fifo")),
    "maps a FIFO": (101, "maps", replaced_by("fifo")),
    "maps a directory": (101, "maps", replaced_by("dir")),
    "cmdline a symlink loop": (101, "cmdline", replaced_by("loop")),
}

NASTY = [b"\0", b"\0" * 64, b")", b"(", b") R 1 (", b" ", b"\n", b"\t", b"-", b"9" * 30, b"9" * 5000, b"\xff",
         b"\xc3", b"=", b" (deleted)", b"/", b"1_000", b"\\012"]


def random_cases(rng: random.Random, n: int) -> dict:
    """Valid files of the fake tree, mutated: random bytes, nasty tokens inserted, cut short, lines
    repeated; or random bytes whole."""
    valid = {"stat": stat_line(101, 100), "status": b"Name:\tpython\nTgid:\t101\nPPid:\t100\n",
             "cmdline": b"python\0-c\0pass\0", "environ": b"NCCL_PROTO=LL\0A=b\0",
             "maps": maps_row(b"/lib/libnccl.so.2") + maps_row(b"/dev/nvidia0", b"501", b"rw-s"),
             "task/101/children": b"102 "}
    out = {}
    for i in range(n):
        name = rng.choice(sorted(valid))
        data = bytearray(valid[name])
        for _ in range(rng.randint(1, 6)):
            how = rng.randrange(5)
            at = rng.randint(0, len(data))
            if how == 0:
                data[at:at] = rng.choice(NASTY)
            elif how == 1 and data:
                data[rng.randrange(len(data))] = rng.randrange(256)
            elif how == 2:
                del data[at:]
            elif how == 3:  # repeated, up to 1 MiB (size itself is the adversarial cases' part)
                data = data * max(1, min(rng.choice((2, 100, 10_000)), (1 << 20) // max(1, len(data))))
            else:
                data = bytearray(rng.randbytes(rng.randint(0, 1 << 16)))
        out[f"random {i} ({name})"] = (101, name, bytes(data))
    return out


# -- the worker (a process of its own) -----------------------------------------------------------
def build(base: Path, pid: int, name: str, content) -> Path:
    from fakeproc import FakeProc
    fp = FakeProc(base)
    fp.add(100, 1, cmdline=["python", "launcher"], env={"NCCL_PROTO": "LL", "A": "b"},
           maps=["/nonexistent/libnccl.so.2"])
    fp.add(101, 100, env={"NCCL_ALGO": "Ring"}, maps=["/nonexistent/libnccl.so.2"])
    fp.add(102, 101, env={"NCCL_ALGO": "Ring"})
    path = fp.root / str(pid) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if callable(content):
        content(path)
    else:
        path.write_bytes(content)
    return fp.root


def check_tree(tree) -> None:
    """Each process not read is listed with its reason; each value not read has one."""
    assert all(s["reason"] for s in tree.skipped), tree.skipped
    for p in tree.procs.values():
        assert p.env is not None and (p.env.env is not None or p.env.reason), (p.pid, p.env)
        assert p.maps is not None or p.maps_reason, p.pid
        assert p.cmdline is not None and (p.cmdline or p.cmdline_reason or p.name is not None), p.pid
        tree.start_time(p)


def one_case(root: Path) -> None:
    from ncclprobe.commands.inspection import inspect_processes
    from ncclprobe.doc import Unexaminable
    from ncclprobe.witnesses import procs, procwatch

    class PythonReader(procs.Reader):
        """The plain reader under another type: ProcFS then reads with Python, not the native one."""

    for fs in (procs.ProcFS(root), procs.ProcFS(root, PythonReader())):
        tree = procs.walk(fs, [100])
        for p in tree.procs.values():
            fs.resolve_root(p)
        check_tree(tree)
        procs.tgid_of(fs, 100)
        procs.matching_pids(fs, "python|launcher")
        for pid in PIDS:
            for read in (fs.status, fs.cmdline, fs.maps, fs.environ, fs.stat):
                try:
                    read(pid)
                except OSError as exc:  # a reader's refusal is an OSError (callers make it a reason)
                    assert procs.reason_of(exc)
            try:
                procs.children_of(fs, fs.stat(pid))
            except (OSError, ValueError):  # what procs._tree_by_children turns into a full scan
                pass
    for native in (True, False):
        scanner = procwatch.Scanner(100, b"k" * 16, proc_root=str(root), native=native)
        for seen in scanner.scan(final=True):
            assert seen.exec_env is not None or seen.env_reason, seen
    try:
        inspect_processes([100], proc_root=root, gpu_lookup=lambda: ({}, "no NVML here"), scope="all")
    except Unexaminable as exc:  # the command's own refusal (exit 3), with its reason
        assert exc.reason


def worker(names: list[str]) -> None:
    """Runs the named cases, one JSON line each ({"name", "s", "error"}), "start" lines before."""
    cases = {**ADVERSARIAL, **random_cases(random.Random(SEED), RANDOM_CASES)}
    base = Path(os.environ["FUZZ_TMP"])
    for name in names:
        print(json.dumps({"start": name}), flush=True)
        where = base / "case"
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir()
        error, t = None, time.monotonic()
        try:
            one_case(build(where, *cases[name]))
        except BaseException:  # noqa: BLE001 — any of them is what this test is after
            error = traceback.format_exc(limit=-6)
        print(json.dumps({"name": name, "s": time.monotonic() - t, "error": error}), flush=True)
        shutil.rmtree(where, ignore_errors=True)


# -- the tests ------------------------------------------------------------------------------------
def run_worker(tmp_path: Path, names: list[str]) -> dict[str, dict]:
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import test_procread_fuzz as t; t.worker(sys.argv[1:])")
    env = {**os.environ, "FUZZ_TMP": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", code, *names], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        out, err = proc.communicate(timeout=CASE_S * len(names))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        started = [json.loads(line)["start"] for line in out.splitlines() if '"start"' in line]
        pytest.fail(f"the fuzz worker ran past {CASE_S * len(names):g} s; last case started: {started[-1:]}")
    results = {}
    for line in out.splitlines():
        doc = json.loads(line)
        if "name" in doc:
            results[doc["name"]] = doc
    assert proc.returncode == 0 and len(results) == len(names), (proc.returncode, err[-3000:])
    return results


def assert_all_held(results: dict[str, dict]) -> None:
    failed = {n: r["error"] for n, r in results.items() if r["error"]}
    assert not failed, "\n\n".join(f"{n}:\n{e}" for n, e in failed.items())
    slow = {n: round(r["s"], 1) for n, r in results.items() if r["s"] > CASE_S}
    assert not slow, slow


@pytest.mark.slow
def test_adversarial_proc_files_are_values_with_reasons_in_bounded_time(tmp_path):
    assert_all_held(run_worker(tmp_path, list(ADVERSARIAL)))


@pytest.mark.slow
def test_random_proc_files_are_values_with_reasons_in_bounded_time(tmp_path):
    assert_all_held(run_worker(tmp_path, list(random_cases(random.Random(SEED), RANDOM_CASES))))


def test_a_huge_file_is_refused_with_a_reason_by_both_readers(tmp_path):
    """A sparse 3 GB environ is not read whole (nor its native buffer grown to hold it): the process
    is listed, its environment unreadable with the reason (EFBIG)."""
    from ncclprobe.witnesses import procs
    root = build(tmp_path, 101, "environ", sparse(3 << 30))

    class PythonReader(procs.Reader):
        pass

    for fs in (procs.ProcFS(root), procs.ProcFS(root, PythonReader())):
        t = time.monotonic()
        p = procs.walk(fs, [100]).procs[101]
        assert time.monotonic() - t < CASE_S
        assert p.env.env is None and p.env.reason == "error: File too large", p.env


def test_a_maps_row_that_no_kernel_writes_is_left_out_by_both_readers(tmp_path):
    """A 5000-digit inode or a NUL in a path: not a mapping (the kernel writes neither), the others kept."""
    from ncclprobe.witnesses import procs
    raw = maps_row(b"/lib/odd.so", b"9" * 5000) + maps_row(b"/lib/\0nul.so") + maps_row(b"/lib/libnccl.so.2")
    root = build(tmp_path, 101, "maps", raw)

    class PythonReader(procs.Reader):
        pass

    for fs in (procs.ProcFS(root), procs.ProcFS(root, PythonReader())):
        p = procs.walk(fs, [100]).procs[101]
        assert [m.path for m in p.maps] == ["/lib/libnccl.so.2"], p.maps
