"""Each in-process rule on constructed event logs: a case that must fire and a near miss that must not."""
from __future__ import annotations

import pytest

from ncclprobe import model
from ncclprobe import diagnose
from ncclprobe.diagnose import copies, inprocess
from ncclprobe.witnesses.events import EventLog

H = "node1"


def ev(kind, pid, t, src, **kw):
    return {"ev": kind, "pid": pid, "t": t, "host": H, "src": src, **kw}


def start(pid, ppid, env, t=0.0):
    return ev("process_start", pid, t, "boot", ppid=ppid, argv=["python", f"w{pid}.py"], exe="/usr/bin/python3",
              env=env, exec_env=env, exec_env_differs=False)


def comm(pid, t, env, call=1, api="ncclCommInitRankConfig", rank=0, nranks=2, uid="ab", ptr="0x1"):
    return ev("comm_init", pid, t, "preload", api=api, call=call, comm=ptr, rank=rank, nranks=nranks, uid=uid,
              env=env, rc=0, lib="/lib/libnccl.so.2", version=22809)


def pinit(pid, t, h, env, call=None, rank=0, nranks=2):
    return ev("comm_plugin_init", pid, t, "profiler", comm_hash=h, comm_name=None, nnodes=1, nranks=nranks,
              rank=rank, env=env, lib="/lib/libnccl.so.2", call=call)


def coll(pid, t, h, algo, proto, count=4):
    return ev("coll_summary", pid, t, "profiler", comm_hash=h, func="AllReduce", algo=algo, proto=proto,
              nchannels=1, bytes_min=14336, bytes_max=14336, count=count)


def write(pid, t, var, old, new, where="engine.py:9 enable_speculative", blocked=False):
    return ev("env_write", pid, t, "boot", var=var, old=old, new=new, where=where, op="set", blocked=blocked)


def build(events, runs=()):
    return model.build(EventLog(events=sorted(events, key=lambda e: e["t"]), runs=list(runs)))


def codes(findings):
    return sorted(f.code for f in findings)


LL = {"NCCL_PROTO": "LL"}
SIMPLE = {"NCCL_PROTO": "Simple"}


def test_tuning_divergent_names_the_write_between_the_two_comms():
    m = build([start(10, 1, LL), comm(10, 1.0, LL, call=1, ptr="0x1"), write(10, 2.0, "NCCL_PROTO", "LL", "Simple"),
               comm(10, 3.0, SIMPLE, call=2, ptr="0x2")])
    fs = inprocess.comm_tuning_divergent(m)
    assert codes(fs) == ["COMM_TUNING_DIVERGENT"]
    assert fs[0].var == "NCCL_PROTO" and fs[0].evidence["changed_at"] == "engine.py:9 enable_speculative"
    assert "engine.py:9" in fs[0].message and fs[0].severity == "error"


def test_tuning_divergent_near_miss_cached_variable_or_same_value():
    same = build([comm(10, 1.0, LL, call=1), comm(10, 3.0, LL, call=2, ptr="0x2")])
    assert inprocess.comm_tuning_divergent(same) == []
    # NCCL_BUFFSIZE is cached per process: two comms "seeing" different values is ENV_LATE's business
    cached = build([comm(10, 1.0, {}, call=1), comm(10, 3.0, {"NCCL_BUFFSIZE": "16777216"}, call=2, ptr="0x2")])
    assert inprocess.comm_tuning_divergent(cached) == []


def test_ranks_divergent_one_finding_per_communicator():
    m = build([comm(10, 1.0, LL, rank=0, uid="u1"), comm(11, 1.0, LL, rank=1, uid="u1"),
               comm(12, 1.0, {"NCCL_ALGO": "Tree"}, rank=2, uid="u1")])
    fs = inprocess.comm_ranks_divergent(m)
    assert codes(fs) == ["COMM_RANKS_DIVERGENT"]
    assert set(fs[0].evidence["values"]) == {"NCCL_ALGO", "NCCL_PROTO"}
    # the odd rank alone is named (one finding per odd-rank set); the values say who holds what
    assert fs[0].pids == (12,) and fs[0].evidence["odd_ranks"] == [2] and len(fs[0].evidence["odd_hosts"]) == 1


def test_ranks_divergent_one_finding_per_odd_rank_set():
    m = build([comm(10, 1.0, LL, rank=0, uid="u1"), comm(11, 1.0, LL, rank=1, uid="u1"),
               comm(12, 1.0, {**LL, "NCCL_ALGO": "Tree"}, rank=2, uid="u1"),
               comm(13, 1.0, {"NCCL_PROTO": "Simple"}, rank=3, uid="u1"), comm(14, 1.0, LL, rank=4, uid="u1")])
    fs = inprocess.comm_ranks_divergent(m)
    assert sorted(f.evidence["odd_ranks"] for f in fs) == [[2], [3]]


def test_ranks_divergent_near_miss_other_communicator_or_debug_var():
    m = build([comm(10, 1.0, LL, uid="u1"), comm(11, 1.0, {**LL, "NCCL_DEBUG_FILE": "/x"}, uid="u1"),
               comm(12, 1.0, SIMPLE, uid="u2")])
    assert inprocess.comm_ranks_divergent(m) == []


def test_algo_proto_mismatch_fires_when_realized_protocol_is_excluded():
    m = build([comm(10, 1.0, LL, call=7), pinit(10, 1.1, "0xabc", LL, call=7), coll(10, 2.0, "0xabc", "Ring", "Simple")])
    fs = inprocess.algo_proto_mismatch(m)
    assert codes(fs) == ["ALGO_PROTO_MISMATCH"] and fs[0].var == "NCCL_PROTO"


@pytest.mark.parametrize("proto_env,realized", [("LL", "LL"), ("^LL128", "Simple"), ("allreduce:LL;broadcast:Simple", "LL"),
                                                ("broadcast:Simple", "Simple")])
def test_algo_proto_mismatch_near_miss(proto_env, realized):
    env = {"NCCL_PROTO": proto_env}
    m = build([comm(10, 1.0, env, call=7), pinit(10, 1.1, "0xabc", env, call=7), coll(10, 2.0, "0xabc", "Ring", realized)])
    assert inprocess.algo_proto_mismatch(m) == []


def test_profiler_init_joins_preload_comm_by_call_and_colls_by_hash():
    m = build([comm(10, 1.0, LL, call=7), pinit(10, 1.1, "0xabc", LL, call=7), coll(10, 2.0, "0xabc", "Ring", "LL", 3),
               coll(10, 3.0, "0xabc", "Ring", "LL", 2)])
    assert len(m.comms) == 1
    c = m.comms[0]
    assert c.seen_by == {"preload", "profiler"} and c.comm_hash == "0x0000000000000abc"
    assert [s.count for s in c.colls.values()] == [5]


def test_unhookable_only_when_preload_was_active():
    evs = [comm(10, 1.0, LL, call=1), pinit(10, 1.1, "0x1", LL, call=1), pinit(10, 2.0, "0x2", SIMPLE, call=None)]
    fs = copies.unhookable(build(evs))
    assert codes(fs) == ["NCCL_UNHOOKABLE"] and fs[0].evidence["comm_hash"] == "0x0000000000000002"
    no_preload = [pinit(10, 1.1, "0x1", LL), pinit(10, 2.0, "0x2", SIMPLE)]
    assert copies.unhookable(build(no_preload)) == []


def test_env_overridden_and_blocked_write():
    fs = inprocess.env_overridden(build([write(10, 1.0, "NCCL_PROTO", "LL", "Simple"),
                                         write(10, 2.0, "NCCL_ALGO", "Ring", "Tree", blocked=True)]))
    assert codes(fs) == ["ENV_OVERRIDDEN", "ENV_OVERRIDDEN"]
    assert any("blocked" in f.message for f in fs)
    # a first assignment to an absent variable overwrites nothing
    assert inprocess.env_overridden(build([write(10, 1.0, "NCCL_PROTO", None, "LL")])) == []


def test_env_late_after_nccl_read_it_and_near_miss_before():
    read = ev("nccl_getenv", 10, 1.0, "envplugin", var="NCCL_BUFFSIZE", value=None, lib="/lib/libnccl.so.2")
    late = build([read, write(10, 2.0, "NCCL_BUFFSIZE", None, "16777216")])
    fs = inprocess.env_late(late)
    assert codes(fs) == ["ENV_LATE"] and fs[0].evidence["basis"].startswith("NCCL's first read")
    early = build([write(10, 0.5, "NCCL_BUFFSIZE", None, "16777216"),
                   ev("nccl_getenv", 10, 1.0, "envplugin", var="NCCL_BUFFSIZE", value="16777216", lib="/lib/libnccl.so.2")])
    assert inprocess.env_late(early) == []
    # NCCL_PROTO is re-read per communicator: a late write is not "too late"
    proto = build([ev("nccl_getenv", 10, 1.0, "envplugin", var="NCCL_PROTO", value="LL", lib="/l"),
                   write(10, 2.0, "NCCL_PROTO", "LL", "Simple")])
    assert inprocess.env_late(proto) == []


def test_one_cause_on_many_ranks_and_hosts_is_one_finding_naming_every_host():
    from ncclprobe.diagnose.findings import aggregate
    events = []
    for i in range(64):
        host = f"node{i:02d}"
        for r in range(8):
            pid = 100 + r
            events += [{**start(pid, 1, LL), "host": host},
                       {**comm(pid, 1.0, LL, call=1, rank=r, nranks=8, uid="decode"), "host": host},
                       {**write(pid, 2.0, "NCCL_PROTO", "LL", "Simple"), "host": host},
                       {**comm(pid, 3.0, SIMPLE, call=2, rank=r, nranks=8, ptr="0x2", uid="verify"), "host": host}]
    fs = aggregate(diagnose.rules(build(events), {"NCCL_PROTO": "LL"}))
    # the write that changed the expected value is one cause (ENV_OVERRIDDEN, an error: it broke the
    # expectation), on every rank of every host, and not a second ENV_CHANGED
    assert sorted(f.code for f in fs) == ["COMM_TUNING_DIVERGENT", "ENV_OVERRIDDEN"]
    for f in fs:
        assert len(f.hosts) == 64 and len(f.instances) == 512, (f.code, len(f.hosts), len(f.instances))
        out = f.to_json()
        assert out["hosts"][0] == "node00" and out["ranks"] == list(range(8)) and f.severity == "error"


def test_an_unset_and_restore_within_a_moment_nets_out():
    m = build([start(10, 1, LL), write(10, 1.0, "NCCL_PROTO", "LL", None, where="accelerate/utils.py:5 clear"),
               write(10, 1.0003, "NCCL_PROTO", None, "LL", where="accelerate/utils.py:9 clear")])
    assert inprocess.env_overridden(m) == []
    read_between = build([start(10, 1, LL), write(10, 1.0, "NCCL_PROTO", "LL", None),
                          ev("nccl_getenv", 10, 1.0001, "envplugin", var="NCCL_PROTO", value=None, lib="/l"),
                          write(10, 1.0003, "NCCL_PROTO", None, "LL")])
    assert codes(inprocess.env_overridden(read_between)) == ["ENV_OVERRIDDEN"]


def test_multiple_libs_in_one_process():
    m = build([comm(10, 1.0, LL, call=1), ev("nccl_getenv", 10, 1.0, "envplugin", var="NCCL_PROTO", value="LL",
                                             lib="/other/libnccl.so.2")])
    assert codes(copies.multiple_libs(m)) == ["NCCL_MULTIPLE_LIBS"]
    assert copies.multiple_libs(build([comm(10, 1.0, LL)])) == []


def test_ranks_divergent_on_values_held_now_says_so():
    """A communicator only RAS listed carries what its processes hold now, not what they were created
    with: the finding says which (still an error: ranks that disagree now may hang the next collective)."""
    m = build([comm(10, 1.0, LL, rank=0, uid="u1"), comm(11, 1.0, SIMPLE, rank=1, uid="u1")])
    for c in m.comms:
        c.env_source = "held now (live read; not at creation)"
    [f] = inprocess.comm_ranks_divergent(m)
    assert f.severity == "error" and "hold different tuning now" in f.message and "created with" not in f.message
    [g] = inprocess.comm_ranks_divergent(build([comm(10, 1.0, LL, rank=0, uid="u1"),
                                                comm(11, 1.0, SIMPLE, rank=1, uid="u1")]))
    assert "were created with different tuning" in g.message
