"""A later, stronger witness outranks an earlier record: a vendor library whose constructor calls
setenv("NCCL_PROTO", ...) from C changes the process's environment without any os.environ write, so the
boot probe's record (the value at interpreter start, every Python write) still says the launcher's value.
The live witness (`run --live`) reads the memory and sees the C write: the model takes the later reading,
attributes it to native code, and the verdict and the finding say so (not "LL (expected)", and no blame on
an os.environ write). A real shared object, a real interpreter, a real `ncclprobe run --live`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from ncclprobe.model import LIVE_NATIVE
from test_run_live import FAST, live_events
from test_run_watch import NCCLPROBE, Run, runs, wait_until  # noqa: F401 (runs: a fixture)

CC = shutil.which("cc") or shutil.which("gcc")
VENDOR = r"""
#include <stdlib.h>
__attribute__((constructor)) static void vendor_init(void) { setenv("NCCL_PROTO", "Simple", 1); }
int vendor_version(void) { return 1; }
"""
WORKER = r"""
import ctypes, os, sys
ctypes.CDLL(sys.argv[1])
os.write(1, f"leaf {os.getpid()} {os.getppid()} os.environ says {os.environ.get('NCCL_PROTO')}\n".encode())  # one write: no interleaving
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def vendor(tmp_path_factory):
    if not CC:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("vendor")
    (d / "vendor.c").write_text(VENDOR)
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(d / "libvendor.so"), str(d / "vendor.c")],
                   check=True, capture_output=True)
    (d / "worker.py").write_text(WORKER)
    return d


def test_a_library_constructors_setenv_outranks_the_boot_probes_record(tmp_path, runs, vendor):
    env = {**os.environ, **FAST, "NCCL_PROTO": "LL"}
    run = Run(tmp_path, [sys.executable, str(vendor / "worker.py"), str(vendor / "libvendor.so")], env,
              opts=("--live",))
    runs.append(run)
    (pid, _), = run.leaves(1).items()
    assert any("os.environ says LL" in line for line in run.lines)  # Python never saw the C write
    wait_until(lambda: any((e.get("env") or {}).get("NCCL_PROTO") == "Simple" for e in live_events(run.dir, pid)),
               "the live watch never read the library's value")
    rc, _ = run.release()
    out = subprocess.run([*NCCLPROBE, "report", "--json", str(run.dir), "--expect", "NCCL_PROTO=LL"],
                         capture_output=True, text=True, timeout=120)
    doc = json.loads(out.stdout)
    assert out.returncode == 1
    (row,) = [r for r in doc["verdict"]["variables"] if r["var"] == "NCCL_PROTO"]
    assert [g["value"] for g in row["groups"] if pid in g["pids"]] == ["Simple"]
    (f,) = [f for f in doc["findings"] if f["severity"] == "error"]
    assert f["code"] == "ENV_OVERRIDDEN" and f["pids"] == [pid]
    assert f["edge"]["kind"] == "overwritten_in_child" and f["edge"]["where"] == LIVE_NATIVE
    assert "from C" in f["hint"] and "os.environ.setdefault" not in f["hint"]
