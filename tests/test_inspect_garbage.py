"""inspect leaves no reference cycle behind: what it built is freed when its result is dropped, not by a
later pass of the cyclic GC over all of it (a cached OSError's traceback once held inspect's frame)."""
import gc
import os
import subprocess
import sys

from ncclprobe.commands.inspection import inspect_processes

SLEEPER = "import sys, time; sys.stdout.write('x'); sys.stdout.flush(); time.sleep(60)"
PARENT = f"""
import subprocess, sys, time
kids = [subprocess.Popen([sys.executable, "-S", "-c", {SLEEPER!r}], stdout=subprocess.PIPE) for _ in range(4)]
for k in kids:
    k.stdout.read(1)
print("ready", flush=True)
time.sleep(60)
"""


def test_inspect_leaves_no_cyclic_garbage():
    parent = subprocess.Popen([sys.executable, "-S", "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "NCCL_PROTO": "LL"})
    try:
        assert parent.stdout.readline().strip() == "ready"
        run = lambda: inspect_processes([parent.pid], scope="all", expect={"NCCL_PROTO": "Simple"},  # noqa: E731
                                        gpu_lookup=lambda: ({}, "no NVML in this test"))
        run()  # once for what is made once per interpreter (caches, ctypes types)
        gc.collect()
        was = gc.isenabled()
        gc.disable()
        try:
            res = run()
            assert res.findings and len(res.data["processes"]) == 5
            del res
            found = gc.collect()
        finally:
            if was:
                gc.enable()
        assert found < 50, f"{found} objects in reference cycles after one inspect of 5 processes"
    finally:
        try:
            with open(f"/proc/{parent.pid}/task/{parent.pid}/children") as fh:
                kids = [int(x) for x in fh.read().split()]
        except OSError:
            kids = []
        for pid in kids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        parent.kill()
        parent.wait()
