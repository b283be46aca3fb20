"""A communicator's "NCCL read": what NCCL itself read for it, or why nothing is known — never
NCCL's defaults where NCCL read none of the tuning variables (observed.md: with one rank NCCL does not
tune the communicator, so it never reads NCCL_PROTO), and never another communicator's read."""
from __future__ import annotations

import json

from ncclprobe import model, schemas
from ncclprobe.commands import report as commands_report
from ncclprobe.diagnose import verdict
from ncclprobe.views import report
from ncclprobe.witnesses.events import EventLog

H = "node1"
TORCH = "/venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"
SECOND = "/usr/lib/x86_64-linux-gnu/libnccl.so.2"


def ev(kind, pid, t, src, **kw):
    return {"ev": kind, "pid": pid, "t": t, "host": H, "src": src, **kw}


def start(pid, env, t=0.0):
    return ev("process_start", pid, t, "boot", ppid=1, argv=["python", "w.py"], exe="/usr/bin/python3", env=env,
              exec_env=env, exec_env_differs=False)


def comm(pid, t, env, lib=TORCH, nranks=2, ptr="0x1", call=1):
    return ev("comm_init", pid, t, "preload", api="ncclCommInitRank", call=call, comm=ptr, rank=0, nranks=nranks,
              uid=f"0x{call:x}", env=env, rc=0, lib=lib, version=22809)


def pinit(pid, t, h, env, lib, nranks=1):
    return ev("comm_plugin_init", pid, t, "profiler", comm_hash=h, comm_name=None, nnodes=1, nranks=nranks, rank=0,
              env=env, lib=lib)


def read(pid, t, var, value, lib=TORCH):
    return ev("nccl_getenv", pid, t, "envplugin", var=var, value=value, lib=lib)


def loaded(pid, t, lib, version=22809):
    return ev("plugin_load", pid, t, "envplugin", plugin="ncclEnvPlugin_v1", nccl_version=version, lib=lib)


def build(events):
    return model.build(EventLog(events=sorted(events, key=lambda e: e["t"])))


def words(m, c):
    return report._nccl_read(m, c)


LL = {"NCCL_PROTO": "LL"}


def test_a_one_rank_communicator_is_not_read_not_defaults():
    # the shape seen on one H200: torch's copy and a ctypes-loaded second copy, one rank each; the env
    # plugin loaded in both; NCCL read cached variables, never NCCL_PROTO
    m = build([start(10, LL), loaded(10, 0.5, TORCH), comm(10, 1.0, LL, nranks=1),
               read(10, 1.001, "NCCL_BUFFSIZE", None), read(10, 1.002, "NCCL_DEBUG", None),
               loaded(10, 2.0, SECOND, 22803), read(10, 2.001, "NCCL_BUFFSIZE", None, lib=SECOND),
               pinit(10, 2.01, "0xfeed", LL, SECOND)])
    for c in m.comms:
        got = verdict.comm_reads(m, c)
        assert got.reason == "one_rank" and "NCCL_PROTO" not in got.values
        text = words(m, c)
        assert "not read (1 rank: NCCL does not tune a one-rank communicator)" in text
        assert text.startswith("1 read, all unset") and "PROTO" not in text.split(";")[0]


def test_a_one_rank_communicator_does_not_take_another_communicator_s_read():
    # a two-rank communicator read NCCL_PROTO=LL; the one-rank one made after it read nothing
    m = build([start(10, LL), comm(10, 1.0, LL, nranks=2, ptr="0x1", call=1), read(10, 1.001, "NCCL_PROTO", "LL"),
               comm(10, 2.0, LL, nranks=1, ptr="0x2", call=2)])
    two, one = sorted(m.comms, key=lambda c: c.t)
    assert verdict.comm_reads(m, two).values == {"NCCL_PROTO": "LL"} and verdict.comm_reads(m, two).reason is None
    assert verdict.nccl_read(m, one, "NCCL_PROTO") is None
    assert verdict.comm_reads(m, one) == verdict.CommReads({}, "one_rank")
    assert words(m, one) == "not read (1 rank: NCCL does not tune a one-rank communicator)"
    # what the verdict shows for it is then its environment at creation, not a read it never made
    assert verdict.effective(m, one, "NCCL_PROTO") == (True, "LL")


def test_a_one_rank_read_the_env_plugin_did_see_is_shown():
    m = build([start(10, LL), comm(10, 1.0, LL, nranks=1), read(10, 1.001, "NCCL_PROTO", "LL")])
    (c,) = m.comms
    assert verdict.comm_reads(m, c) == verdict.CommReads({"NCCL_PROTO": "LL"}, None)
    assert words(m, c) == "PROTO=LL"


def test_without_the_env_plugin_nothing_is_claimed():
    m = build([start(10, LL), comm(10, 1.0, LL, nranks=1)])
    (c,) = m.comms
    assert verdict.comm_reads(m, c) == verdict.CommReads(None, "no_witness")
    assert words(m, c) == "not seen (no env plugin, no NCCL log)"
    # the env plugin loaded into another copy only: this copy's reads were not seen either
    other = build([start(10, LL), loaded(10, 0.5, SECOND), read(10, 0.6, "NCCL_BUFFSIZE", None, lib=SECOND),
                   comm(10, 1.0, LL, nranks=2)])
    assert verdict.comm_reads(other, other.comms[0]).reason == "no_witness"


def test_two_ranks_and_no_tuning_read_says_so():
    m = build([start(10, {}), loaded(10, 0.5, TORCH), comm(10, 1.0, {}, nranks=2),
               read(10, 1.001, "NCCL_DEBUG", None)])
    (c,) = m.comms
    assert verdict.comm_reads(m, c) == verdict.CommReads({}, "none_read")
    assert words(m, c) == "not read (the env plugin saw NCCL read no tuning variable)"
    unset = build([start(10, {}), comm(10, 1.0, {}, nranks=2), read(10, 1.001, "NCCL_PROTO", None),
                   read(10, 1.002, "NCCL_ALGO", None)])
    assert words(unset, unset.comms[0]) == "2 read, all unset (NCCL's defaults)"  # read, and unset: a fact


def test_the_report_json_carries_the_reason_next_to_the_value(tmp_path):
    events = [start(10, LL), loaded(10, 0.5, TORCH), comm(10, 1.0, LL, nranks=1), read(10, 1.001, "NCCL_BUFFSIZE", None),
              start(11, LL), comm(11, 1.0, LL, nranks=2, ptr="0x9", call=7),
              loaded(12, 0.5, TORCH), comm(12, 1.0, LL, nranks=2, ptr="0x3", call=3), read(12, 1.001, "NCCL_PROTO", "LL")]
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    for pid in (10, 11, 12):
        (log / f"{H}-{pid}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events if e["pid"] == pid))
    result = commands_report.build_report([log])
    by_pid = {c["pid"]: c for c in result.data["communicators"]}
    assert (by_pid[10]["nccl_read"], by_pid[10]["nccl_read_reason"]) == ({"NCCL_BUFFSIZE": None}, "one_rank")
    assert (by_pid[11]["nccl_read"], by_pid[11]["nccl_read_reason"]) == (None, "no_witness")
    assert (by_pid[12]["nccl_read"], by_pid[12]["nccl_read_reason"]) == ({"NCCL_PROTO": "LL"}, None)
    schemas.validate(result.to_json())
