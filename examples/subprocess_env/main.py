"""subprocess with an `env=` allow-list: the mapping replaces the parent's environment, so a variable
the operator exported and the list does not name never reaches the child (cpython PR #99253).

Start it with NCCL_PROTO=LL exported, as an operator would. Two workers:
- `fail`: one started with env={PATH, HOME, LANG, PYTHONPATH} (no NCCL_PROTO), one with the full
  environment; only the first lacks the value.
- `fail-nopythonpath`: the same, and the list also drops PYTHONPATH, so no boot probe reaches the
  first worker (only /proc can tell what it had).
- `ok`: both started with env={**os.environ}.
- `ok-nopythonpath`: the first with an allow-list that drops PYTHONPATH but names NCCL_PROTO.
"""
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import _worker  # noqa: E402

WORKER = str(Path(_worker.__file__).resolve())


def allow_list(variant: str) -> dict[str, str]:
    keep = ["PATH", "HOME", "LANG"] + ([] if variant.endswith("nopythonpath") else ["PYTHONPATH"])
    env = {k: os.environ[k] for k in keep if k in os.environ}
    if variant == "ok-nopythonpath" and "NCCL_PROTO" in os.environ:
        env["NCCL_PROTO"] = os.environ["NCCL_PROTO"]
    return env


def main() -> None:
    args = _worker.options(words=("fail", "fail-nopythonpath", "ok", "ok-nopythonpath"))
    if "NCCL_PROTO" not in os.environ:
        print("subprocess_env: start this with NCCL_PROTO=LL exported (the operator's setting)", file=sys.stderr)
    cmd = [sys.executable, WORKER, *_worker.forwarded(args)]
    first_env = {**os.environ} if args.variant == "ok" else allow_list(args.variant)
    procs = [subprocess.Popen(cmd, env=first_env), subprocess.Popen(cmd, env={**os.environ})]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
