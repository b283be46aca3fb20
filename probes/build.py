"""Builds the C probes (and the tool's own native /proc reader) and copies the boot probe into an
output folder (stdlib only).

Used by setup.py at install time and by tests that need a fresh build. Needs only a C compiler:
no CUDA, no nccl.h (the probes declare the NCCL ABI types they use themselves).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

# output file (relative to the output folder) -> (source folder under probes/, extra compiler/linker
# arguments). Built in this order; "{out}" in an argument is replaced by the output folder.
TARGETS: dict[str, tuple[str, list[str]]] = {
    # nodelete: NCCL dlcloses its plugins when the last communicator goes; the probe's tables,
    # log descriptor and exit flush must outlive that.
    "libncclprobe.so": ("ncclprobe", ["-ldl", "-lpthread", "-Wl,-z,nodelete"]),
    "sim/libnccl.so.2": ("simnccl", ["-ldl", "-lpthread", "-Wl,-soname,libnccl.so.2"]),
    "sim/libsimtorch.so": ("simframework", ["-L{out}/sim", "-l:libnccl.so.2", "-Wl,-rpath,$ORIGIN"]),
    # not a probe: the /proc reader `ncclprobe inspect` calls through ctypes (native/, beside probes/)
    "libprocread.so": ("../native", []),
}

# Python files that run inside the diagnosed interpreters, shipped as they are.
PY_FILES = ["ncclprobe_boot.py"]

CFLAGS = ["-O2", "-g", "-fPIC", "-shared", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden", "-D_GNU_SOURCE"]


def compiler() -> str:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or "cc"


def build(out_dir: Path, verbose: bool = False) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built: list[Path] = []
    for out_name, (folder, extra) in TARGETS.items():
        sources = sorted(str(p) for p in (HERE / folder).glob("*.c"))
        if not sources:
            continue
        out = out_dir / out_name
        out.parent.mkdir(parents=True, exist_ok=True)
        extra = [a.replace("{out}", str(out_dir)) for a in extra]
        tmp = out.with_suffix(out.suffix + ".tmp")
        cmd = [compiler(), *CFLAGS, f"-I{HERE / folder}", "-o", str(tmp), *sources, *extra]
        if verbose:
            print(" ".join(cmd), file=sys.stderr)
        subprocess.run(cmd, check=True)
        os.replace(tmp, out)  # atomic: a running process never maps a half-written library
        built.append(out)
    for name in PY_FILES:
        src = HERE / name
        if src.exists():
            shutil.copyfile(src, out_dir / name)
            built.append(out_dir / name)
    return built


if __name__ == "__main__":
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parent / "ncclprobe" / "_lib"
    for p in build(dest, verbose=True):
        print(p)
