"""The propagation rules on constructed models: each edge kind fires where it must, names the right
processes (the endpoints, never the intermediates) and stays silent on its near miss."""
from __future__ import annotations

from ncclprobe import diagnose, model
from ncclprobe.witnesses import procsnap
from ncclprobe.witnesses.events import EventLog

H = "node1"
LL = {"NCCL_PROTO": "LL"}
EXPECT = {"NCCL_PROTO": "LL"}


def ev(kind, pid, t, src, **kw):
    return {"ev": kind, "pid": pid, "t": t, "host": H, "src": src, **kw}


def start(pid, ppid, env, t=0.0, argv=None, forked_from=None):
    return ev("process_start", pid, t, "boot", ppid=ppid, argv=argv or ["python", f"w{pid}.py"],
              exe="/usr/bin/python3", env=env, exec_env=env, exec_env_differs=False, forked_from=forked_from,
              start=t)


def write(pid, t, var, old, new, where="driver.py:7 main"):
    return ev("env_write", pid, t, "boot", var=var, old=old, new=new, where=where, op="set", blocked=False)


def comm(pid, t, env, rank=0):
    return ev("comm_init", pid, t, "preload", api="ncclCommInitRank", call=1, comm="0x1", rank=rank, nranks=2,
              uid="ab", env=env, rc=0, lib="/lib/libnccl.so.2", version=22809)


def build(events, records=()):
    m = model.build(EventLog(events=sorted(events, key=lambda e: e["t"])))
    if records:
        model.add_sightings(m, procsnap.sightings(list(records), H))
    return m


def rec(pid, ppid, env, start=0.0, cmdline=None, exe="/usr/bin/python3", stale=None, source="exec"):
    """An inspect record as commands/inspection builds it (the keys model.add_records reads)."""
    return {"pid": pid, "ppid": ppid, "cmdline": cmdline or [exe, f"p{pid}"], "exe": exe, "env_source": source,
            "env_reason": None if source == "exec" else source, "_watched": env, "_exp": dict(env), "_start": start,
            "_hash": None, "stale": stale, "nccl_libs": [], "gpus": [], "in_scope": True}


def errors(fs):
    return [f for f in fs if f.severity == "error"]


def test_curated_environment_at_spawn_names_the_launcher_and_only_the_child():
    m = build([start(1, 0, LL), start(10, 1, {}, t=1.0), start(11, 1, LL, t=1.0)])
    [f] = errors(diagnose.rules(m, EXPECT))
    assert (f.code, f.pids, f.var, f.edge["kind"], f.edge["parent"]) == ("ENV_MISSING", (10,), "NCCL_PROTO",
                                                                          "curated_env", 1)
    assert "forward NCCL_PROTO" in f.hint
    # without an expectation, the same edge is a warning
    [w] = diagnose.rules(m)
    assert w.severity == "warning" and w.edge["kind"] == "curated_env"


def test_a_write_in_the_parent_before_the_spawn_is_what_the_child_should_have_had():
    m = build([start(1, 0, {}), write(1, 1.0, "NCCL_PROTO", None, "LL"), start(10, 1, {}, t=2.0)])
    [f] = diagnose.rules(m)
    assert f.code == "ENV_MISSING" and f.edge["kind"] == "curated_env"


def test_a_child_started_before_the_parents_write_is_set_after_start_with_both_times():
    m = build([start(1, 0, {}), start(10, 1, {}, t=0.5), write(1, 1.0, "NCCL_PROTO", None, "LL")])
    [f] = diagnose.rules(m, EXPECT)
    assert f.code == "ENV_SET_AFTER_START" and f.severity == "error" and f.pids == (10,)
    assert f.edge["where"] == "driver.py:7 main" and f.edge["written_at"] == 1.0 and f.edge["started_at"] == 0.5


def test_an_intermediate_started_before_the_write_is_named_in_the_edge_not_in_the_pids():
    # driver (1) starts a daemon (5) at 0.5, sets the value at 1.0, then the daemon starts workers at 2.0
    m = build([start(1, 0, {}, argv=["python", "driver.py"]), write(1, 1.0, "NCCL_PROTO", None, "LL"),
               start(20, 5, {}, t=2.0), start(21, 5, {}, t=2.0)],
              records=[rec(5, 1, {}, start=0.5, cmdline=["/opt/raylet", "--x"], exe="/opt/raylet")])
    [f] = diagnose.rules(m, EXPECT)
    assert f.code == "ENV_SET_AFTER_START" and f.pids == (20, 21) and f.edge["children"] == [5]
    assert f.edge["launcher"] == "ray" and "ray.init()" in f.hint and "runtime_env" in f.hint


def test_a_non_python_intermediate_that_had_it_and_dropped_it():
    m = build([start(20, 5, {}, t=2.0)],
              records=[rec(1, 0, LL, cmdline=["bash", "run.sh"], exe="/bin/bash"),
                       rec(5, 1, LL, start=0.5, cmdline=["/opt/daemon"], exe="/opt/daemon")])
    [f] = diagnose.rules(m, EXPECT)
    assert f.code == "ENV_MISSING" and f.pids == (20,) and f.edge["kind"] == "dropped_by_intermediate"
    assert f.edge["parent"] == 5 and "allow-list" in f.hint


def test_overwritten_in_the_process_before_its_communicator_is_the_write():
    m = build([start(10, 1, LL), write(10, 1.0, "NCCL_PROTO", "LL", "Simple", where="engine.py:11 x"),
               comm(10, 2.0, {"NCCL_PROTO": "Simple"})])
    [f] = errors(diagnose.rules(m, EXPECT))
    assert f.code == "ENV_OVERRIDDEN" and f.edge["kind"] == "overwritten_in_child" and f.culprit == "engine.py:11"


def test_an_unset_and_restore_nets_out():
    m = build([start(10, 1, LL), write(10, 1.0, "NCCL_PROTO", "LL", None), write(10, 1.0003, "NCCL_PROTO", None, "LL"),
               comm(10, 2.0, LL)])
    assert diagnose.rules(m, EXPECT) == []


def test_an_image_label_and_ncclprobe_wiring_dropped_at_a_spawn_are_no_lost_setting():
    lib = "/x/ncclprobe/_lib/libncclprobe.so"
    m = build([start(1, 0, {"NCCL_VERSION": "2.28.3-1", "NCCL_PROFILER_PLUGIN": lib}), start(10, 1, {}, t=1.0)])
    assert diagnose.rules(m) == []


def test_a_healthy_initializer_that_sets_it_in_each_worker_is_no_finding():
    m = build([start(1, 0, {}), start(10, 1, {}, t=1.0), write(10, 1.1, "NCCL_PROTO", None, "LL", where="init.py:3 init"),
               start(11, 1, {}, t=1.0), write(11, 1.1, "NCCL_PROTO", None, "LL", where="init.py:3 init")])
    assert diagnose.rules(m, EXPECT) == []


def test_fork_children_under_proc_alone_are_a_stated_blind_spot_forkserver_children_are_not():
    py = ["python3", "main.py"]
    server = ["python3", "-c", "from multiprocessing.forkserver import main; main(3)"]
    m = build([], records=[rec(1, 0, {}, cmdline=py), rec(10, 1, {}, start=1.0, cmdline=py, stale="fork"),
                           rec(2, 1, {}, start=0.5, cmdline=server), rec(20, 2, {}, start=1.0, cmdline=server,
                                                                          stale="forkserver")])
    fs = diagnose.rules(m, EXPECT)
    [blind] = [f for f in fs if f.code == "EXEC_ENV_STALE"]
    assert blind.pids == (10,) and "not checked" in blind.message
    [missing] = errors(fs)
    assert missing.pids == (20,) and missing.edge["kind"] == "not_in_root"  # the server's block is theirs


def test_an_expected_name_outside_the_watched_set_is_never_guessed():
    m = build([start(1, 0, {}), start(10, 1, {}, t=1.0)])
    assert diagnose.rules(m, {"HF_TOKEN": "x"}) == []  # the probes never record it: not known, not "absent"
    shown = build([], records=[rec(1, 0, {}), rec(10, 1, {}, start=1.0)])
    shown.processes[(H, 10)].proc_expected = {"HF_TOKEN": "hunter2-seen"}
    [f] = diagnose.rules(shown, {"HF_TOKEN": "hunter2-wanted"})
    text = f.message + f.hint + str(f.to_json())
    assert f.code == "ENV_CHANGED" and "hunter2" not in text


def seen(pid, ppid, t, argv, env, start):
    return ev("proc_seen", pid, t, "proc", ppid=ppid, start=start, argv=argv, exe="/bin/" + argv[0], exec_env=env,
              env_reason=None, env_hash=None)


def test_a_subshell_of_the_shell_a_worker_exec_d_from_is_no_worker():
    # `here=$(dirname "$0"); NCCL_PROTO=LL exec python w.py`: the watch saw pid 10 as bash with a subshell
    # (11) and its dirname (12), then pid 10 became python with the value
    sh = ["bash", "ok.sh"]
    m = build([seen(10, 1, 1.0, sh, {}, 0.9), seen(11, 10, 1.0, sh, {}, 0.95), seen(12, 11, 1.0, ["dirname", "x"], {}, 0.96),
               {**start(10, 1, LL, t=1.2), "start": 0.9}])
    assert m.processes[(H, 10)].images == [sh]
    assert diagnose.rules(m, EXPECT) == []


def test_a_child_started_surely_before_its_parents_interpreter_belongs_to_the_program_before_the_exec():
    m = build([seen(11, 10, 1.0, ["sleep", "1"], {}, 0.5), {**start(10, 1, LL, t=1.2), "start": 0.4}])
    assert diagnose.rules(m, EXPECT) == []
    # one started after it (to the tick) is its child, and checked
    m = build([{**start(10, 1, LL, t=1.0), "start": 0.4}, seen(11, 10, 2.0, ["python", "w.py"], {}, 1.5)])
    [f] = diagnose.rules(m, EXPECT)
    assert f.pids == (11,) and f.edge["kind"] == "curated_env"


def test_a_process_a_probe_saw_use_nccl_is_checked_whatever_an_earlier_proc_snapshot_scoped():
    # the demo on a GPU: inspect ran before torch loaded libnccl, so its records put the worker out of scope
    m = build([start(1, 0, LL), start(10, 1, {}, t=1.0), comm(10, 2.0, {})],
              records=[{**rec(1, 0, LL), "in_scope": True, "nccl_libs": [{"path": "/x/libnccl.so.2", "version": None}]},
                       {**rec(10, 1, {}, start=1.0), "in_scope": False}])
    [f] = errors(diagnose.rules(m, EXPECT))
    assert f.pids == (10,) and f.edge["kind"] == "curated_env"


def test_a_wrapper_whose_exec_no_witness_saw_is_said_not_silently_fine():
    """`env -i PATH=… python3 w.py` seen by the watch only as env (python3 ended before the next scan):
    the report cannot check what ran and says so, with `env -i`'s consequence; once the pid is seen as
    what it exec'd (or its boot probe speaks, or it has children), nothing is said."""
    from ncclprobe.views import report
    wrapper = ["env", "-i", "PATH=/usr/bin", "python3", "w.py"]
    sh = seen(10, 1, 1.0, ["bash", "fail.sh"], LL, 0.9)
    m = build([sh, seen(11, 10, 1.0, wrapper, LL, 0.95)])
    lines = [n.text for n in report.header_doc(m, [], title=False)]
    [line] = [t for t in lines if "was last seen as" in t]
    assert line.startswith("pid 11 was last seen as `env -i PATH=/usr/bin python3 w.py`: env execs python3, and "
                           "no witness saw python3")
    assert "`env -i` would have started it with only the variables named after it" in line
    m.watch[H] = {"seen": 2, "scans": 3, "interval_s": 0.5}
    assert report.model_json(m)["watch"][H]["exec_unseen"] == [11]
    for later in ([seen(11, 10, 1.2, ["python3", "w.py"], {}, 0.95)], [start(11, 10, {}, t=1.2)],
                  [seen(12, 11, 1.3, ["python3", "-c", "x"], {}, 1.25)]):
        m = build([sh, seen(11, 10, 1.0, wrapper, LL, 0.95), *later])
        assert not [n for n in report.header_doc(m, [], title=False) if "was last seen as" in n.text], later
    # a plain wrapper: no `env -i` sentence; one that names no command: nothing
    m = build([sh, seen(11, 10, 1.0, ["numactl", "--cpunodebind=0", "python3", "w.py"], LL, 0.95)])
    [line] = [n.text for n in report.header_doc(m, [], title=False) if "was last seen as" in n.text]
    assert "numactl execs python3" in line and "env -i" not in line
    m = build([sh, seen(11, 10, 1.0, ["env"], LL, 0.95)])
    assert not [n for n in report.header_doc(m, [], title=False) if "was last seen as" in n.text]
