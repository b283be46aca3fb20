"""The demo's story (DESIGN.md §1): an operator tunes NCCL for decode, yet the speculative verify
step runs another tuning. Starts the miniature server under the probes, looks at its live tree from
/proc, lets it finish, reads what the probes saw, and checks each planted cause was named."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from ncclprobe.commands import launch, report

from ncclprobe import selfexec
from ncclprobe.doc import FindingsHere, Result, Table, Text, Title, Unexaminable
from ncclprobe.diagnose.findings import sort_findings

TUNING = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "16"}
# code -> the cause planted for it
PLANTED = {
    "SHELL_PREFIX_SCOPE": "the sidecar is started by `NCCL_P2P_LEVEL=SYS cd … && python …; echo …`: the "
                          "variable reaches `cd` only",
    "ENV_MISSING": "the replica is started with a curated environment (an allow-list without NCCL_*)",
    "ENV_OVERRIDDEN": "engine.py rewrites NCCL_PROTO=Simple when speculative decoding is switched on",
    "COMM_TUNING_DIVERGENT": "so the verify communicator is created with NCCL_PROTO=Simple, the decode one with LL",
    "ENV_LATE": "engine.py sets NCCL_BUFFSIZE after the decode communicator: NCCL already cached it",
    "NCCL_UNHOOKABLE": "the verify communicator is created through ctypes, as SGLang/vLLM PyNccl do",
    "COMM_EAGER_BESIDE_GRAPH": "decode replays a CUDA graph, the verify step runs its all-reduces eagerly (the seed's "
                               "server): launch overhead no NCCL setting changes",
}
# Causes NCCL can only show with two or more ranks: a one-rank communicator reports no collective.
NEEDS_RANKS = {"COMM_EAGER_BESIDE_GRAPH"}


def planted(tp: int) -> dict[str, str]:
    """The causes this run can name: with one GPU, NCCL reports no collective (reference/observed.md)."""
    return {code: why for code, why in PLANTED.items() if tp >= 2 or code not in NEEDS_RANKS}
# Findings that follow from a planted cause (the verify communicator then differs from the expectation).
CONSEQUENCES = {"ENV_CHANGED"}
READY_TIMEOUT_S = 45.0


def _backend(real: bool) -> tuple[str, int]:
    if not real:
        from ncclprobe._lib import lib_path
        for name in ("sim/libnccl.so.2", "sim/libsimtorch.so"):
            if not lib_path(name).exists():
                raise Unexaminable(f"the simulated NCCL is not built ({lib_path(name)} is missing)", "not built",
                                   {"hint": "reinstall ncclprobe: pip install ."})
        return "sim", 2
    from ncclprobe.bench.torchnccl import gpu_count, torch_installed  # bench/ is the only torch importer
    if not torch_installed():
        raise Unexaminable("--real needs torch with CUDA", "no torch",
                           {"hint": "pip install 'ncclprobe[bench]' on a machine with an NVIDIA GPU"})
    gpus = gpu_count()
    if gpus < 1:
        raise Unexaminable("--real needs at least one NVIDIA GPU", "no GPU")
    return "torch", gpus


def run_demo(real: bool = False, keep: bool = False, show_wiring: bool = False) -> Result:
    backend, tp = _backend(real)
    t0 = time.monotonic()
    d = Path(tempfile.mkdtemp(prefix="ncclprobe-demo-"))
    sync = d / "sync"
    sync.mkdir()
    try:
        return _run(d, sync, backend, tp, t0, keep, show_wiring)
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def _split_at_findings(doc: list) -> tuple[list, list]:
    i = next(i for i, n in enumerate(doc) if isinstance(n, FindingsHere))
    return doc[:i], doc[i + 1:]


def _run(d: Path, sync: Path, backend: str, tp: int, t0: float, keep: bool, show_wiring: bool = False) -> Result:
    from ncclprobe.commands import inspection
    env = dict(os.environ)
    env.update(TUNING)  # the operator exports the tuning (as `env K=V CMD`)
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,ENV,TUNING", NCCL_DEBUG_FILE=str(d / "nccl-debug.%h.%p"))
    wiring = launch.wire(env, d, gpu_timing=True)  # simulated kernels cost nothing; a real GPU's say what they cost
    cmd = selfexec.module_argv("ncclprobe.demo.launcher", "--sync", sync, "--backend", backend, "--tp", tp)
    # NCCL opens NCCL_DEBUG_FILE with fopen(path, "w") (src/debug.cc ncclDebugInit), mode 0666 less the
    # umask, as the simulated NCCL does: the server's umask keeps its logs private from their creation
    old_umask = os.umask(0o077)
    try:
        group = launch.Group(cmd, selfexec.module_env(wiring.env), cwd=d)
    finally:
        os.umask(old_umask)
    rc = None
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (sync / "server-ready").exists():
            if group.proc.poll() is not None or time.monotonic() > deadline:
                raise Unexaminable("the demo server did not come up", "demo_failed",
                                   {"hint": f"its logs are in {d}" if keep else
                                    "run `ncclprobe demo --keep`: the log directory it names holds the server's logs"})
            time.sleep(0.02)
        live = inspection.inspect_processes([group.proc.pid], pgrep=None, expect=dict(TUNING), scope="nccl",
                                            all_vars=False, redact=True, log_dirs=[], nccl_logs=[],
                                            merge_probe_dirs=False, show_wiring=show_wiring)
        (sync / "go").touch()
        rc = group.wait()
    finally:
        if rc is None:
            group.reap_group()
    inproc = report.build_report([d], expect=dict(TUNING), proc_view=live.model)
    findings = inproc.findings
    found = {f.code for f in findings}
    causes = planted(tp)
    unplanted = sorted({f.code for f in findings if f.severity != "info"} - set(causes) - CONSEQUENCES)
    missed = [c for c in causes if c not in found]
    ok = rc == 0 and not missed and not unplanted
    label = "SIMULATED NCCL (no GPU)" if backend == "sim" else f"real NCCL on {tp} GPU(s)"
    live.head = []  # the verdict is the report's, over both witnesses
    tree = [n for n in live.doc if not isinstance(n, FindingsHere)]
    head, rest = _split_at_findings(inproc.doc)
    doc = [Title(f"ncclprobe demo: a miniature inference server on the {label}"),
           Text(f"The operator exports {' '.join(f'{k}={v}' for k, v in TUNING.items())} for decode; "
                f"{tp} tensor-parallel workers (multiprocessing spawn), a replica and a sidecar start. "
                "Then speculative decoding is switched on.", "note"),
           *head[1:],  # the report's own title names a temporary directory: the demo's says what ran
           Title("Planted causes"),
           Table(["cause", "finding", "named"], [[why, code, "yes" if code in found else "MISSED"]
                                                 for code, why in causes.items()])]
    if unplanted:
        doc.append(Text(f"Findings the demo did not plant: {', '.join(unplanted)}", "bad"))
    doc.append(Text(f"Server {launch.describe_status(rc)[0]}; demo took {time.monotonic() - t0:.1f} s"
                    + (f"; logs kept in {d}" if keep else ""), "good" if ok else "bad"))
    doc += [FindingsHere(), Title("Details: the live process tree, as /proc showed it (ncclprobe inspect)"), *tree,
            Title("Details: what the probes saw inside the processes (ncclprobe report)"), *rest]
    data = {"simulated": backend == "sim", "backend": backend, "ranks": tp, "ok": ok,
            "planted": causes, "missed": missed, "unplanted": unplanted, "server_returncode": rc,
            "verdict": inproc.data.get("verdict"),
            "processes": live.data.get("processes", []), "communicators": inproc.data.get("communicators", []),
            "seconds": round(time.monotonic() - t0, 2)}
    if keep:
        data["log_dir"] = str(d)
    return Result("demo", findings=sort_findings(findings), data=data, doc=doc, code=0 if ok else 1)
