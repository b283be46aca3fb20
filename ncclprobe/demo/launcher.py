"""The demo's miniature inference server: a launcher that starts tensor-parallel workers with
multiprocessing spawn, a replica with a curated environment, and a sidecar through a shell line that
scopes its NCCL variable to the wrong command. Run by `ncclprobe demo` under `ncclprobe run`."""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ncclprobe import selfexec
from ncclprobe.demo import worker

# What a launcher that copies an allow-list of prefixes hands its workers (vLLM's Ray path did this
# before it copied NCCL_*). NCCLPROBE_DIR is kept only so the demo can still watch the replica, and
# NCCL_NVLS_ENABLE because GPU hosts may require NVLink multicast off in every process (site policy).
CURATED_PREFIXES = ("PATH", "HOME", "PYTHON", "LD_", "CUDA_", "NCCLPROBE_DIR", "NCCL_NVLS_ENABLE", "LANG", "TMPDIR")


def curated_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(CURATED_PREFIXES)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sync", required=True, help="folder for the ready/go handshake")
    ap.add_argument("--backend", choices=["sim", "torch"], default="sim")
    ap.add_argument("--tp", type=int, default=2)
    args = ap.parse_args(argv)
    sync = Path(args.sync)
    uids = {name: secrets.token_hex(128) for name in ("decode", "verify", "replica")}
    ctx = mp.get_context("spawn")
    tp = [ctx.Process(target=worker.serve, name=f"tp{r}",
                      args=(r, args.tp, uids, str(sync), args.backend, "tp")) for r in range(args.tp)]
    for p in tp:
        p.start()
    base = selfexec.module_argv("ncclprobe.demo.worker", "--sync", sync, "--backend", args.backend)
    replica = subprocess.Popen([*base, "--role", "replica", "--uid", uids["replica"]], env=curated_env())
    # The shell-prefix pitfall: NCCL_P2P_LEVEL reaches `cd` only, not the python after `&&`.
    line = (f"NCCL_P2P_LEVEL=SYS cd {shlex.quote(str(sync))} && {shlex.join([*base, '--role', 'sidecar'])}; "
            "echo sidecar stopped >/dev/null")
    sidecar = subprocess.Popen(["bash", "-c", line])
    expected = args.tp + 2
    deadline = time.monotonic() + 60
    while len(list(sync.glob("ready-*"))) < expected:
        if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in tp):
            print("demo launcher: workers did not come up", file=sys.stderr)
            for p in tp:
                p.kill()
            replica.kill()
            sidecar.kill()
            return 1
        time.sleep(0.02)
    (sync / "server-ready.tmp").write_text(json.dumps({"launcher": os.getpid()}))
    os.replace(sync / "server-ready.tmp", sync / "server-ready")
    codes = [replica.wait(), sidecar.wait()]
    for p in tp:
        p.join()
        codes.append(p.exitcode)
    return 0 if all(c == 0 for c in codes) else 1


if __name__ == "__main__":
    sys.exit(main())
