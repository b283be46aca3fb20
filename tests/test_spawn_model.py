"""The `spawn` event (a probe in the parent recorded the call that started a child) through the one door into the
model and the rules: the child known only from the record gets the environment the call passed, the rules name the
call site, the boot probe's and the native probe's records of one call are one edge, a later witness of the child
wins over the record, and an expectation the record cannot hold is said as not checked (never met)."""
from __future__ import annotations

import json

from ncclprobe import diagnose, model
from ncclprobe.diagnose import verdict
from ncclprobe.witnesses.events import EventLog, read_dirs

H = "node1"
LL = {"NCCL_PROTO": "LL"}
EXPECT = {"NCCL_PROTO": "LL"}
WHERE = "/srv/app/main.py:37"


def ev(kind, pid, t, src, **kw):
    return {"ev": kind, "pid": pid, "t": t, "host": H, "src": src, **kw}


def start(pid, ppid, env, t=0.0, argv=None):
    return ev("process_start", pid, t, "boot", ppid=ppid, argv=argv or ["python", f"w{pid}.py"],
              exe="/usr/bin/python3", env=env, exec_env=env, exec_env_differs=False, start=t)


def spawn(pid, t, child, env, src="boot", call="subprocess.Popen", where=WHERE, given=True, count=3, **kw):
    return ev("spawn", pid, t, src, call=call, where=where, argv=["/usr/bin/python3", "/srv/app/_worker.py"],
              exe="/usr/bin/python3", child=child, exec=child is None, env_given=given, env=env, env_count=count, **kw)


def build(events):
    return model.build(EventLog(events=sorted(events, key=lambda e: e["t"])))


def errors(fs):
    return [f for f in fs if f.severity == "error"]


def test_a_child_known_only_from_the_record_is_named_with_the_call_that_dropped_it():
    m = build([start(1, 0, LL, argv=["python", "main.py"]), spawn(1, 1.0, 10, {}), spawn(1, 1.01, 11, LL, count=40)])
    child = m.processes[(H, 10)]
    assert child.sources == {"edge"} and child.ppid == 1 and child.started_by.where == WHERE
    assert [e.child for e in m.processes[(H, 1)].spawned] == [10, 11]
    [f] = errors(diagnose.rules(m, EXPECT))
    assert (f.code, f.pids, f.edge["kind"]) == ("ENV_MISSING", (10,), "curated_env")
    assert f.edge["spawn"]["where"] == WHERE and f.edge["spawn"]["call"] == "subprocess.Popen"
    assert f.message.startswith("`main.py:37` (pid 1) started `_worker.py` with env={3 variables}: NCCL_PROTO not "
                                "passed"), f.message
    assert "add NCCL_PROTO=LL to that env= mapping" in f.hint and "os.environ" in f.hint
    # no variable outside the watched set is named anywhere
    assert "PATH" not in json.dumps(f.to_json()).replace("PYTHONPATH", "")


def test_the_boot_and_the_native_record_of_one_call_are_one_edge_in_either_order():
    for native_first in (False, True):
        boot = spawn(1, 1.0, 10, {})
        native = spawn(1, 1.0 + (-0.002 if native_first else 0.002), 10, {}, src="preload", call="posix_spawn",
                       where=None, ppid=0)
        m = build([start(1, 0, LL, argv=["python", "main.py"]), boot, native])
        [edge] = m.processes[(H, 1)].spawned
        assert edge.witnesses == {"boot", "preload"}
        assert (edge.call, edge.where) == ("subprocess.Popen", WHERE)  # the Python caller's spelling and line
        [f] = errors(diagnose.rules(m, EXPECT))
        assert f.edge["spawn"]["witnesses"] == ["boot", "preload"] and f.pids == (10,)


def test_two_children_started_close_together_stay_two_edges():
    m = build([start(1, 0, LL), spawn(1, 1.0, 10, {}), spawn(1, 1.0, 11, {}, src="preload", where=None)])
    assert sorted(e.child for e in m.processes[(H, 1)].spawned) == [10, 11]


def test_a_later_witness_of_the_child_wins_over_the_record():
    # the record says nothing was passed; the child's own boot probe saw it started with the value
    m = build([start(1, 0, LL), spawn(1, 1.0, 10, {}), start(10, 1, LL, t=1.1)])
    assert not errors(diagnose.rules(m, EXPECT))


def test_an_exec_with_its_own_environment_is_the_edge_of_the_process_itself():
    m = build([start(1, 0, LL, argv=["python", "main.py"]), spawn(1, 1.0, None, {}, call="os.execve", count=1)])
    p = m.processes[(H, 1)]
    assert p.exec_after_boot and p.started_by.exec and p.argv == ["/usr/bin/python3", "/srv/app/_worker.py"]
    [f] = errors(diagnose.rules(m, EXPECT))
    assert f.pids == (1,) and f.edge["spawn"]["exec"] is True and f.edge["spawn"]["call"] == "os.execve"
    assert "env={1 variable}" in f.message


def test_a_failed_call_started_nothing():
    m = build([start(1, 0, LL), spawn(1, 1.0, None, {}, rc=2) | {"exec": False},
               spawn(1, 1.0, None, {}, call="os.execve", rc=13)])
    assert list(m.processes) == [(H, 1)] and not m.processes[(H, 1)].spawned


def test_an_expectation_the_record_cannot_hold_is_not_checked_not_met():
    # FOO is outside the watched set: the record holds none of it, and no witness read the child
    m = build([start(1, 0, LL), spawn(1, 1.0, 10, LL)])
    expect = {"NCCL_PROTO": "LL", "FOO": "1"}
    fs = diagnose.rules(m, expect)
    v = verdict.for_model(m, fs, expect)
    assert v.unchecked is not None and v.unchecked.unread == [10] and "FOO" in v.unchecked.reason
    assert v.code == 3 and v.to_json()["unchecked"]["unread"] == [10]
    # NCCL_PROTO alone: the record holds it, so the child is checked, and fine
    v = verdict.for_model(m, diagnose.rules(m, EXPECT), EXPECT)
    assert v.unchecked is None and v.code is None


def test_not_checked_beside_errors_found_on_others_leaves_the_exit_code_to_the_errors():
    m = build([start(1, 0, LL), spawn(1, 1.0, 10, LL), spawn(1, 1.01, 11, {})])
    expect = {"NCCL_PROTO": "LL", "FOO": "1"}
    fs = diagnose.rules(m, expect)
    assert [f.pids for f in errors(fs)] == [(11,)]
    v = verdict.for_model(m, fs, expect)
    assert v.unchecked is not None and v.unchecked.unread == [10, 11] and v.code is None


def test_the_reader_checks_every_field_of_a_spawn_line(tmp_path):
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    line = spawn(1, 1.7e9, 10, LL, argv_dropped=3, ppid=7, rc=None) | {"child": "ten", "extra": 1}
    (d / f"{H}-1.jsonl").write_text(json.dumps(line) + "\n")
    log = read_dirs([d])
    [e] = list(log.events)
    assert e["ev"] == "spawn" and "child" not in e and "extra" not in e  # a bad type and an unknown field: dropped
    assert (e["argv_dropped"], e["ppid"], e["env"], e["env_count"], e["where"]) == (3, 7, LL, 3, WHERE)


def test_a_native_exec_record_of_an_unprobed_fork_child_is_its_edge():
    # a C daemon (no boot probe) forked a child that exec'd python with an envp of its own: the preload's line
    # of the child (pid 20, its parent in ppid) is all any witness saw of it
    native = spawn(20, 1.0, None, {}, src="preload", call="execve", where=None, count=1, ppid=5)
    m = build([start(1, 0, LL, argv=["python", "main.py"]),
               ev("proc_seen", 5, 0.5, "proc", ppid=1, start=0.4, argv=["daemon"], exe="/usr/bin/daemon",
                  exec_env=LL, execs=0), native])
    p = m.processes[(H, 20)]
    assert p.ppid == 5 and p.started_by.exec and p.started_by.witnesses == {"preload"}
    [f] = errors(diagnose.rules(m, EXPECT))
    assert f.pids == (20,) and f.edge["kind"] == "curated_env" and f.edge["spawn"]["call"] == "execve"
    assert f.message.startswith("execve in a fork of pid 5 started `_worker.py` with env={1 variable}: "
                                "NCCL_PROTO not passed") and "pid 5 (daemon) had it" in f.message
    assert "env= mapping" not in f.hint and "add NCCL_PROTO to the variables it passes on" in f.hint


def test_a_native_exec_that_failed_is_taken_back():
    # the preload writes an exec's line before the call (a successful exec never returns) and, when the call
    # returns, a second line with its errno: the process stays what it was, and nothing blames the exec
    before = spawn(1, 1.0, None, {}, src="preload", call="execve", where=None, count=1)
    failed = spawn(1, 1.001, None, {}, src="preload", call="execve", where=None, count=1, rc=2)
    m = build([start(1, 0, LL, argv=["python", "main.py"]), before, failed])
    p = m.processes[(H, 1)]
    assert not p.spawned and p.started_by is None and not p.exec_after_boot and p.argv == ["python", "main.py"]
    assert errors(diagnose.rules(m, EXPECT)) == []
    # the record alone (the exec happened) is the edge, as before
    m = build([start(1, 0, LL, argv=["python", "main.py"]), before])
    assert m.processes[(H, 1)].started_by.exec and errors(diagnose.rules(m, EXPECT))


def test_a_scan_stamped_after_an_exec_record_but_showing_the_image_before_it_is_stale():
    # bash (pid 9) forked 10, which exec'd `env -i PATH=... python3 w.py`; env's preload wrote its own exec of
    # python3 (an empty envp); the watch's scan read 10 while it was still env, but stamps its reads when the
    # scan began, after env's record: that sighting is of the image before the recorded exec and changes nothing
    wrapper = ["env", "-i", "PATH=/usr/bin", "python3", "/srv/app/_worker.py"]
    env_exec = ev("spawn", 10, 1.00, "preload", call="execve", where=None, argv=wrapper, exe="/usr/bin/env",
                  child=None, exec=True, env_given=True, env=LL, env_count=2, ppid=9)
    py_exec = ev("spawn", 10, 1.01, "preload", call="execvp", where=None, argv=["python3", "/srv/app/_worker.py"],
                 exe=None, child=None, exec=True, env_given=False, env={}, env_count=1)
    scan = ev("proc_seen", 10, 1.02, "proc", ppid=9, start=0.99, argv=wrapper, exe="/usr/bin/env", exec_env=LL,
              execs=0)
    shell = ev("proc_seen", 9, 0.5, "proc", ppid=1, start=0.4, argv=["bash", "fail.sh"], exe="/usr/bin/bash",
               exec_env=LL, execs=0)
    m = build([shell, env_exec, py_exec, scan])
    p = m.processes[(H, 10)]
    assert p.argv == ["python3", "/srv/app/_worker.py"] and wrapper in p.images and p.proc_exec_env is None
    [f] = errors(diagnose.rules(m, EXPECT))
    assert f.pids == (10,) and f.edge["kind"] == "curated_env"


def test_an_exec_wrapper_whose_program_no_witness_saw_is_not_checked():
    # the scan saw pid 10 only as `env -i … python3 w.py` and nothing after (no record of the exec, no
    # children): python3 ran, unread; the verdict does not take env's environment for the worker's
    wrapper = ["env", "-i", "PATH=/usr/bin", "python3", "/srv/app/_worker.py"]
    m = build([ev("proc_seen", 9, 0.5, "proc", ppid=1, start=0.4, argv=["bash", "fail.sh"], exe="/usr/bin/bash",
                  exec_env=LL, execs=0),
               ev("proc_seen", 10, 0.6, "proc", ppid=9, start=0.55, argv=wrapper, exe="/usr/bin/env", exec_env=LL,
                  execs=0)])
    v = verdict.for_model(m, diagnose.rules(m, EXPECT), EXPECT)
    assert v.unchecked is not None and 10 in v.unchecked.unread and v.code == 3
    # `env` alone runs nothing but itself: nothing unseen
    alone = build([ev("proc_seen", 10, 0.6, "proc", ppid=1, start=0.55, argv=["env"], exe="/usr/bin/env",
                      exec_env=LL, execs=0)])
    from ncclprobe.diagnose import coverage
    assert coverage.unseen_execs(alone) == []


def subshell_script(ppid: int) -> list[dict]:
    """bash (pid 9, started by ppid) running ok.sh, read by a scan, whose `x=$(dirname …)` subshell (10) forked
    dirname (11): no scan saw 10 or 11; dirname's preload recorded its exec, naming 10 as its parent."""
    return [ev("proc_seen", 9, 0.5, "proc", ppid=ppid, start=0.4, argv=["bash", "ok.sh"], exe="/usr/bin/bash",
               exec_env=LL, execs=0),
            ev("spawn", 11, 0.6, "preload", call="execve", where=None, argv=["dirname", "ok.sh"],
               exe="/usr/bin/dirname", child=None, exec=True, env_given=False, env=LL, env_count=3, ppid=10)]


def test_a_missed_go_between_whose_children_a_witness_knows_is_not_unread():
    # scan mode: bash (9) ran `x=$(dirname …)`: the subshell (10) ended before a scan looked (the watch counted
    # it, missed_pids), its child dirname (11) is known from its preload's exec record, and the worker (12) was
    # read: what the subshell passed on reached what it started; a missed pid that started nothing known stays
    # unread (NOT CHECKED, exit 3)
    def job(missed):
        return build([
            *subshell_script(ppid=1),
            ev("proc_seen", 12, 0.7, "proc", ppid=9, start=0.65, argv=["python3", "w.py"], exe="/usr/bin/python3",
               exec_env=LL, execs=0),
            ev("watch_summary", 1, 2.0, "proc", scans=2, walks=2, interval_s=0.5, seen=2, missed_known=len(missed),
               missed_pids=missed, mode="scan")])
    for missed, unread in (([10], None), ([10, 13], [13])):
        m = job(missed)
        v = verdict.for_model(m, diagnose.rules(m, EXPECT), EXPECT)
        assert (v.unchecked.unread if v.unchecked else None) == unread, v.unchecked


def test_a_fork_child_read_before_its_exec_takes_the_record_of_the_call_not_its_parents_block():
    # posix_spawn: a scan read the child (11) in the moment it still ran its parent's image, with the parent's
    # block, and it was gone at the next look (FORK_GONE); the parent's boot probe recorded the call with env={PATH}
    shown = ev("proc_seen", 11, 1.00, "proc", ppid=10, start=0.99, argv=["python3", "parent.py"],
               exe="/usr/bin/python3", exec_env=LL, execs=0, env_reason=model.FORK_GONE)
    for order in ((shown, 1.01), (shown, 0.98)):  # the record after the read, or before it
        record = spawn(10, order[1], 11, {}, call="os.posix_spawn", count=1)
        m = build([start(10, 1, LL, t=0.5, argv=["python3", "parent.py"]), shown, record])
        [f] = errors(diagnose.rules(m, EXPECT))
        assert f.pids == (11,) and f.edge["kind"] == "curated_env" and f.edge["spawn"]["call"] == "os.posix_spawn"


def test_a_read_during_the_exec_stamped_after_its_record_gives_way_to_the_next_exec_count():
    # CMD is `env -i PATH=… python3 w.py` (pid 10, started by run: no record of env's own exec); env's preload
    # wrote its exec of python3 (t 1.00); the kernel's read at env's exec event ran during that execve and saw
    # env still (stamped 1.01, after the record: execs 0); its read at python3's exec saw python3 (execs 1).
    # The watch's count says which image is the later one: python3 with the environment env -i gave it.
    wrapper = ["env", "-i", "PATH=/usr/bin", "python3", "/srv/app/_worker.py"]
    worker = ["python3", "/srv/app/_worker.py"]
    py_exec = ev("spawn", 10, 1.00, "preload", call="execvp", where=None, argv=worker, exe="/usr/bin/python3",
                 child=None, exec=True, env_given=True, env={}, env_count=1, ppid=9)
    late = ev("proc_seen", 10, 1.01, "proc", ppid=9, start=0.99, argv=wrapper, exe="/usr/bin/env", exec_env=LL,
              execs=0)
    read = ev("proc_seen", 10, 1.02, "proc", ppid=9, start=0.99, argv=worker, exe="/usr/bin/python3", exec_env={},
              execs=1)
    for order in ([py_exec, late, read], [py_exec, read, late]):  # (and a read of the later image stamped first)
        m = model.build(EventLog(events=order))
        p = m.processes[(H, 10)]
        assert p.argv == worker and p.images == [wrapper] and p.proc_exec_env == {}, order
        v = verdict.for_model(m, fs := diagnose.rules(m, EXPECT), EXPECT)
        [f] = errors(fs)
        assert f.code == "ENV_MISSING" and f.pids == (10,) and f.edge["kind"] == "curated_env" and v.unchecked is None


def test_a_fork_childs_exec_read_by_a_scan_stamped_before_its_boot_record_is_its_later_image():
    # python (pid 9) forks 10, which exec's raylet; a scan that began before the fork read 10 as raylet, and
    # stamps its reads when it began: before the fork child's boot record. A fork child starts as its parent's
    # program, so raylet is what it exec'd since, with python its earlier image (in every order of the stamps)
    py = ["/usr/bin/python3", "-c", "fork_exec", "/t/raylet"]
    ray = ["/t/raylet", "--node-manager"]
    seen = ev("proc_seen", 10, 0.5, "proc", ppid=9, start=0.99, argv=ray, exe="/t/raylet", exec_env={}, execs=0)
    boot = ev("process_start", 10, 1.0, "boot", ppid=9, argv=py, exe="/usr/bin/python3", env={}, exec_env={},
              exec_env_differs=False, forked_from=9, start=0.99)
    execv = ev("spawn", 10, 2.0, "boot", call="os.execv", where="<string>:5", argv=ray, exe="/t/raylet", child=None,
               exec=True, env_given=False, env={}, env_count=3)
    for events in ([seen, boot, execv], [seen, boot], [boot, execv, {**seen, "t": 2.5}]):
        p = model.build(EventLog(events=events)).processes[(H, 10)]
        assert p.argv == ray and p.images == [py] and p.exec_after_boot and p.start_env is None, events


def test_a_subshell_known_only_as_its_childs_parent_explains_a_reaping_count():
    # scan mode: bash (9, CMD, started by run 8) ran `x=$(dirname …)`, then `env -i … python3` (12); no scan saw
    # the subshell (10), but the preload in its child dirname (11) names it as dirname's parent, and the
    # preload in 12 recorded its execs. bash's reaping count (two children no scan saw) is explained by 12 and 10:
    # nothing missed, nothing NOT CHECKED. A third count is one no witness can explain.
    def job(counts):
        return build([
            *subshell_script(ppid=8),
            ev("spawn", 12, 0.7, "preload", call="execvp", where=None, argv=["python3", "w.py"], exe=None, child=None,
               exec=True, env_given=True, env=LL, env_count=2, ppid=9),
            ev("watch_summary", 8, 2.0, "proc", scans=2, walks=2, interval_s=0.5, seen=1, missed_known=0,
               missed_pids=[], reaped_unseen=[9] * counts, mode="scan")])
    for counts, left in ((2, 0), (3, 1)):
        m = job(counts)
        assert m.watch[H]["missed_children"] == left, m.watch[H]
        v = verdict.for_model(m, diagnose.rules(m, EXPECT), EXPECT)
        assert (v.unchecked is None) == (left == 0), v.unchecked
