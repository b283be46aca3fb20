"""The kernel's process events (witnesses/kernelevents.py) and run's watch in kernel mode: a process of CMD's
tree read at its exec, however short it lives. The parser on messages laid out as linux/cn_proc.h lays them
out; the listener and run on real processes where the kernel gives the events (CAP_NET_ADMIN, the host's
namespaces), skipped with the kernel's reason elsewhere."""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from ncclprobe.witnesses import kernelevents as ke

CC = shutil.which("cc") or shutil.which("gcc")


def _msg(what: int, data: bytes, idx: int = ke.CN_IDX_PROC) -> bytes:
    ev = struct.pack("=IIQ", what, 0, 123) + data
    cn = struct.pack("=IIIIHH", idx, ke.CN_VAL_PROC, 0, 0, len(ev), 0) + ev
    return struct.pack("=IHHII", 16 + len(cn), ke.NLMSG_DONE, 0, 0, 0) + cn


def test_parse_reads_each_kind_and_skips_what_is_not_a_process_event():
    fork = _msg(ke.FORK, struct.pack("=IIII", 10, 10, 11, 11))
    thread = _msg(ke.FORK, struct.pack("=IIII", 10, 10, 12, 10))
    exe = _msg(ke.EXEC, struct.pack("=II", 11, 11))
    ex = _msg(ke.EXIT, struct.pack("=IIIIII", 11, 11, 0, 17, 10, 10))
    ack = _msg(ke.NONE, struct.pack("=I", 1))
    other = _msg(ke.EXEC, struct.pack("=II", 99, 99), idx=7)  # another connector's message
    got = ke.parse(fork + thread + exe + ex + ack + other)
    assert [(e.what, e.pid, e.tgid, e.ppid) for e in got] == [
        (ke.FORK, 11, 11, 10), (ke.FORK, 12, 10, 10), (ke.EXEC, 11, 11, 0), (ke.EXIT, 11, 11, 0), (ke.NONE, 0, 0, 0)]
    assert got[-1].err == 1 and got[0].t_ns == 123


@pytest.mark.parametrize("cut", [1, 15, 16, 20, 36, 44])
def test_parse_of_a_truncated_message_returns_what_is_whole(cut):
    whole = _msg(ke.EXEC, struct.pack("=II", 5, 5))
    assert ke.parse(whole + whole[:cut]) == ke.parse(whole)
    bad_len = struct.pack("=IHHII", 4, 0, 0, 0, 0) + whole  # a length below the header's: no further reading
    assert ke.parse(bad_len) == []


def _listener_or_skip() -> ke.Listener:
    lst = ke.Listener()
    if lst.refused:
        pytest.skip(f"the kernel's process events: {lst.refused}")
    return lst


def test_the_listener_sees_a_childs_fork_exec_and_exit():
    lst = _listener_or_skip()
    try:
        p = subprocess.Popen(["/bin/true"])
        p.wait()
        seen: list[ke.Event] = []
        for _ in range(50):  # until its exit has come (the events are queued in order)
            seen += lst.read(0.1)
            if any(e.what == ke.EXIT and e.tgid == p.pid for e in seen):
                break
        mine = [e.what for e in seen if e.tgid == p.pid and e.pid == p.pid]
        assert mine == [ke.FORK, ke.EXEC, ke.EXIT], seen[-20:]
        assert next(e for e in seen if e.what == ke.FORK and e.tgid == p.pid).ppid == os.getpid()
    finally:
        lst.close()


WORKER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(void) {
  const char* v = getenv("NCCL_PROTO");
  printf("cworker %d %s\n", getpid(), v ? v : "(unset)");
  fflush(stdout);
  usleep(10000); /* lives 10 ms */
  return 0;
}
"""


def test_run_names_a_10ms_worker_started_with_env_i_from_its_read_at_exec(tmp_path):
    """A C worker that lives 10 ms, started by a script through `env -i`: no probe runs in it and no scan
    can see it; run's watch reads it at its exec, and the verdict names it and the edge."""
    _listener_or_skip().close()
    if not CC:
        pytest.skip("needs a C compiler")
    (tmp_path / "w.c").write_text(WORKER_C)
    subprocess.run([CC, "-O1", "-o", str(tmp_path / "cworker"), str(tmp_path / "w.c")], check=True)
    script = tmp_path / "launch.sh"
    script.write_text(f"{tmp_path}/cworker\nenv -i PATH=/usr/bin:/bin {tmp_path}/cworker\n")
    env = {**os.environ, "NCCL_PROTO": "LL"}
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "run", "--dir", str(tmp_path / "logs"), "--json",
                        "--expect", "NCCL_PROTO=LL", "--", "bash", str(script)], env=env, capture_output=True,
                       text=True, timeout=120)
    said = {int(w[1]): w[2] for w in (x.split() for x in r.stderr.splitlines()) if w[:1] == ["cworker"]}
    assert sorted(said.values()) == ["(unset)", "LL"], r.stderr
    out = json.loads(r.stdout)
    assert r.returncode == 1, out["findings"]
    [lost] = [pid for pid, v in said.items() if v == "(unset)"]
    [f] = [f for f in out["findings"] if f["severity"] == "error"]
    assert f["pids"] == [lost] and f["edge"]["kind"] == "curated_env", f
    [w] = out["watch"].values()
    assert w["mode"] == "kernel", w
    both = {p["pid"] for p in out["processes"] if p["argv"] and p["argv"][0].endswith("cworker")}
    assert both == set(said), out["processes"]
