"""`ncclprobe run --live` (commands/watch.py, witnesses/livewatch.py): the watch reads the environment
each process of CMD's tree holds from its memory and records where it changed, each change bracketed
by two reads (since, t]; the report takes the last reading as the process's live environment and
the bracket as the time of the write, which decides the edge for a child started before it (set after
start) or after it (an environment of its own). A process it cannot read gives its reason once;
with the watch off, --live is off too and says so.

Real processes under a real `ncclprobe run`; synchronisation is on the lines CMD prints and on the
log directory. The model's rules on a hand-made model pin down each side of the bracket."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclprobe import model, schemas
from ncclprobe.model import LIVE_WHERE
from ncclprobe.witnesses import events, livemem, livewatch
from rundirs import run_meta
from test_run_watch import NCCLPROBE, WAIT_S, Run, records, runs, wait_until  # noqa: F401 (runs: a fixture)

TICK_S = 0.011  # propagation.TICK_S: a start is known to the clock tick
FAST = {"NCCLPROBE_WATCH_S": "0.05", "NCCLPROBE_LIVE_S": "0.1"}
# CMD: python -S (no boot probe: only /proc and its memory tell what it holds). It starts A at once;
# then, one command a line: phase (a watched name that is no NCCL variable, to mark a read), write
# (NCCL_X=1 in its own environment), b (starts B with its environment less NCCL_X), end.
PARENT = r"""
import os, subprocess, sys
leaf = "import os, sys; os.write(1, b'leaf %d\\n' % os.getpid()); sys.stdin.read()"
kids = []
def start(name, env=None):
    p = subprocess.Popen([sys.executable, "-S", "-c", leaf], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env=env)
    kids.append(p)
    print(name, p.stdout.readline().split()[1], flush=True)
start("A")
for line in sys.stdin:
    op = line.strip()
    if op == "phase":
        os.environ["TORCH_NCCL_TEST_PHASE"] = "1"
        print("ok", flush=True)
    elif op == "write":
        os.environ["NCCL_X"] = "1"
        print("ok", flush=True)
    elif op == "b":
        start("B", {k: v for k, v in os.environ.items() if k != "NCCL_X"})
    elif op == "end":
        break
for p in kids:
    p.stdin.close()
    p.wait()
"""


def live_events(d: Path, pid: int) -> list[dict]:
    return [e for e in records(d) if e["ev"] == "live_env" and e["pid"] == pid]


def seen_start(d: Path, pid: int) -> float | None:
    return next((e["start"] for e in records(d) if e["ev"] == "proc_seen" and e["pid"] == pid), None)


def say(run: Run, command: str, answer: str) -> list[str]:
    """Send a command to CMD and wait for the line starting with answer."""
    n = len(run.lines)
    run.proc.stdin.write(command + "\n")
    run.proc.stdin.flush()
    with run._cv:
        assert run._cv.wait_for(lambda: any(x.startswith(answer) for x in run.lines[n:]), WAIT_S), run.lines
    return next(x for x in run.lines[n:] if x.startswith(answer)).split()


def until_clock_past(t: float) -> None:
    """Wait until this machine's clock has passed t (a start is floored to the tick: past it by more)."""
    wait_until(lambda: time.time() > t, f"the clock never passed {t}")


def test_a_write_after_start_is_bracketed_and_decides_each_childs_edge(tmp_path, runs):
    run = Run(tmp_path, [sys.executable, "-S", "-c", PARENT], {**os.environ, **FAST}, opts=("--live",))
    runs.append(run)
    with run._cv:
        assert run._cv.wait_for(lambda: any(x.startswith("A ") for x in run.lines), WAIT_S), run.lines
    a = int(next(x for x in run.lines if x.startswith("A ")).split()[1])
    parent = run.proc.pid
    cmd = wait_until(lambda: next((e["pid"] for e in records(run.dir) if e["ev"] == "proc_seen"
                                   and e["ppid"] == parent), None), "CMD was never recorded")
    a_start = wait_until(lambda: seen_start(run.dir, a), "A was never recorded")
    until_clock_past(a_start + 10 * TICK_S)
    # a read after A had started: the one that shows the mark (the next write's `since` is no earlier)
    say(run, "phase", "ok")
    wait_until(lambda: any((e["env"] or {}).get("TORCH_NCCL_TEST_PHASE") for e in live_events(run.dir, cmd)),
               "the mark was never read")
    say(run, "write", "ok")
    change = wait_until(lambda: next((e for e in live_events(run.dir, cmd) if (e["env"] or {}).get("NCCL_X")),
                                     None), "the write was never read")
    until_clock_past(change["t"] + 10 * TICK_S)
    b = int(say(run, "b", "B ")[1])
    wait_until(lambda: live_events(run.dir, b) and live_events(run.dir, a), "B or A was never read")
    run.proc.stdin.write("end\n")
    rc, err = run.release()
    assert rc == 0, err
    assert change["since"] is not None and change["since"] < change["t"]
    assert change["since"] >= a_start + TICK_S  # the mark's read came after A's start
    firsts = [e for e in live_events(run.dir, cmd)]
    assert firsts[0]["since"] is None and firsts[0]["env"] is not None  # the first reading is recorded
    assert all(e["env"] != f["env"] for e, f in zip(firsts[1:], firsts))  # then only changes
    # nothing but watched names in any live line
    from ncclprobe.model.watched import is_watched
    assert all(is_watched(k) for e in records(run.dir) if e["ev"] == "live_env" for k in e["env"] or {})

    r = subprocess.run([*NCCLPROBE, "report", str(run.dir), "--json"], capture_output=True, text=True, timeout=WAIT_S)
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    procs = {p["pid"]: p for p in doc["processes"]}
    assert procs[cmd]["live_env"]["NCCL_X"] == "1" and "live" in procs[cmd]["witnesses"]
    assert procs[cmd]["live_t"] == change["t"] and procs[cmd]["live_since"] == change["since"]
    assert [x["env"].get("NCCL_X") for x in procs[cmd]["live_readings"]][-1] == "1"
    assert "NCCL_X" not in procs[a]["live_env"] and "NCCL_X" not in procs[b]["live_env"]
    by_pid = {f["pids"][0]: f for f in doc["findings"] if f.get("var") == "NCCL_X" and len(f["pids"]) == 1}
    late, own = by_pid[a], by_pid[b]
    # A started before the read that still lacked it: the write came after A had started, for sure
    assert late["code"] == "ENV_SET_AFTER_START" and late["edge"]["kind"] == "set_after_start"
    assert late["edge"]["parent"] == cmd and late["edge"]["where"] == LIVE_WHERE
    assert late["edge"]["written_after"] == change["since"] and late["edge"]["written_at"] == change["t"]
    assert late["evidence"]["written_between"] == [change["since"], change["t"]]
    assert "live" in late["edge"]["witnesses"] and "proc+live" in late["evidence"]["sources"]
    assert "after the processes had started" in late["message"] and "or they were started" not in late["message"]
    # B started after the read that showed it: its parent had it, and B got an environment of its own
    assert own["code"] == "ENV_MISSING" and own["edge"]["kind"] == "curated_env" and own["edge"]["parent"] == cmd
    assert "live" in doc["verdict"]["witnesses"]
    # the verdict's values for processes no boot probe saw are what their memory showed
    row = next(r for r in doc["verdict"]["variables"] if r["var"] == "NCCL_X")
    unset = {p for g in row["groups"] if g["value"] is None for p in g["pids"]}
    assert {a, b} <= unset and not any(g["value"] == "?" for g in row["groups"] if {a, b} & set(g["pids"]))
    text = subprocess.run([*NCCLPROBE, "report", str(run.dir)], capture_output=True, text=True, timeout=WAIT_S).stdout
    flat = " ".join(text.split())
    assert f"live (read from memory), pid {cmd}: TORCH_NCCL_TEST_PHASE=1 (between" in flat
    assert "; NCCL_X=1 (between" in flat
    assert "live = its memory (run --live)" in flat and "--live:" in flat


@pytest.fixture(scope="module")
def stripped(tmp_path_factory) -> Path:
    """tests/c/live_env.c as a static binary without a symbol table: its environ cannot be found."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("live") / "stripped"
    src = Path(__file__).parent / "c" / "live_env.c"
    r = subprocess.run([cc, "-O1", "-DDIRECT", "-static", "-s", "-o", str(out), str(src), "-lpthread"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot build a static binary: {r.stderr.strip()[-300:]}")
    return out


def test_a_process_that_cannot_be_read_gives_its_reason_once_and_the_json_says_so(tmp_path, stripped):
    d = tmp_path / "logs"
    p = subprocess.Popen([*NCCLPROBE, "run", "--live", "--json", "--dir", str(d), "--", str(stripped)],
                         env={**os.environ, **FAST}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        got = wait_until(lambda: [e for e in records(d) if e["ev"] == "live_env"] if d.exists() else None,
                         "no live_env line")
        out, err = p.communicate("exit\n", timeout=WAIT_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err[-2000:]
    lines = [e for e in records(d) if e["ev"] == "live_env"]
    assert len(lines) == 1 and lines[0]["env"] is None and lines[0]["reason"] == livemem.NO_SYMBOLS, lines
    assert got[0] == lines[0]
    doc = json.loads(out)
    schemas.validate(doc)
    (proc,) = [x for x in doc["processes"] if x["pid"] == lines[0]["pid"]]
    assert proc["live_reason"] == livemem.NO_SYMBOLS and proc["live_env"] is None and proc["live_readings"] == []
    assert "live" not in proc["witnesses"]
    w = next(iter(doc["watch"].values()))
    assert w["live_s"] == float(FAST["NCCLPROBE_LIVE_S"]) and w["live_reads"] >= 1 and w["live_reader"]
    assert doc["runs"][0]["live_s"] == w["live_s"]


def test_live_with_the_watch_off_says_it_is_off_too(tmp_path):
    r = subprocess.run([*NCCLPROBE, "run", "--live", "--json", "--dir", str(tmp_path / "off"), "--", "true"],
                       env={**os.environ, "NCCLPROBE_WATCH_S": "0"}, capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == 0, r.stderr
    assert not any(e["ev"] in ("live_env", "proc_seen") for e in records(tmp_path / "off"))
    meta = run_meta(tmp_path / "off")
    assert meta["live_s"] is None and any("--live reads through the watch, so it is off too" in n for n in meta["notes"])
    bad = subprocess.run([*NCCLPROBE, "run", "--live", "--dir", str(tmp_path / "bad"), "--", "true"],
                         env={**os.environ, "NCCLPROBE_LIVE_S": "often"}, capture_output=True, text=True,
                         timeout=WAIT_S)
    assert bad.returncode == 0, bad.stderr
    assert "NCCLPROBE_LIVE_S=often is not a number of seconds" in " ".join(bad.stdout.split())


# ------------------------------------------------------------------ the tracker, on a fake reading
class FakeReading:
    native = False

    def __init__(self):
        self.now: dict[int, livemem.LiveEnv] = {}

    def read_many(self, pids, exes):
        return [self.now[p] for p in pids]


def test_the_tracker_records_changes_with_the_read_before_them():
    fake = FakeReading()
    tr = livewatch.Tracker(fake)
    procs = [(10, 1, 0, None), (11, 1, 0, None)]
    fake.now = {10: livemem.LiveEnv({"NCCL_A": "1"}, {}, None), 11: livemem.LiveEnv(None, None, "permission: x")}
    first = tr.read(procs)
    assert [(c.pid, c.env, c.reason, c.since) for c in first] == [(10, {"NCCL_A": "1"}, None, None),
                                                                 (11, None, "permission: x", None)]
    assert tr.read(procs) == []  # nothing changed; the reason is said once
    held = tr._last[(10, 1, 0)][1]  # the start of the latest read that still showed NCCL_A=1 alone
    fake.now[10] = livemem.LiveEnv({"NCCL_A": "1", "NCCL_B": "2"}, {}, None)
    (c,) = tr.read(procs)
    assert c.pid == 10 and c.since == held and c.since < c.t and c.env["NCCL_B"] == "2"
    # an exec is another image: a first reading again
    (c,) = tr.read([(10, 1, 1, None)])
    assert c.since is None
    fake.now[10] = livemem.LiveEnv(None, None, livemem.GONE)
    assert tr.read([(10, 1, 1, None)]) == []  # gone after a reading: no news


# --------------------------------------------------------------------- the rules, on a hand-made model
def _edge(child_start: float, since: float | None, t: float = 20.0):
    """A non-Python parent (exec-time block without NCCL_X) whose memory held NCCL_X=1 at a read at t,
    not at one starting at since; its child, started at child_start, lacks it."""
    from ncclprobe import diagnose
    from ncclprobe.model import LiveReading, Model
    m = Model()
    parent, child = m.process("h", 10), m.process("h", 11)
    for p in (parent, child):
        p.sources.add("proc")
        p.argv, p.exe, p.proc_exec_env, p.proc_expected = ["daemon"], "/usr/bin/daemon", {}, {}
    parent.proc_start, child.proc_start, child.ppid, child.nccl_user = 1.0, child_start, 10, True
    parent.live_readings = [LiveReading({}, 5.0)] + ([LiveReading({"NCCL_X": "1"}, t, since)])
    parent.live_env, parent.live_t, parent.live_since = {"NCCL_X": "1"}, t, since
    parent.sources.add("live")
    found = [f for f in diagnose.rules(m, {"NCCL_X": "1"}) if f.pids == (11,)]
    assert len(found) == 1, [(f.code, f.message) for f in found]
    return found[0]


def test_the_bracket_decides_the_edge():
    sure = _edge(child_start=8.0, since=10.0)
    assert sure.code == "ENV_SET_AFTER_START" and sure.edge["written_after"] == 10.0
    assert "or they were started with an environment of their own" not in sure.message
    within = _edge(child_start=15.0, since=10.0)
    assert within.code == "ENV_SET_AFTER_START" and "or they were started with an environment of their own" in within.message
    at_the_tick = _edge(child_start=10.0 - TICK_S / 2, since=10.0)  # within a tick of since: either way
    assert "or they were started" in at_the_tick.message
    after = _edge(child_start=25.0, since=10.0)
    assert after.edge["kind"] == "dropped_by_intermediate" and after.edge["parent"] == 10
    unknown = _edge(child_start=8.0, since=None)  # a first reading (inspect's too): when is not known
    assert unknown.code == "ENV_SET_AFTER_START" and "when is not known" in unknown.message


def test_the_model_keeps_the_readings_of_the_last_image(tmp_path):
    d = tmp_path / "logs"
    d.mkdir(mode=0o700)
    lines = [{"ev": "proc_seen", "t": 1.0, "pid": 5, "src": "proc", "host": "h", "ppid": 1, "start": 0.5,
              "argv": ["sh"], "exec_env": {}, "execs": 0},
             {"ev": "live_env", "t": 2.0, "pid": 5, "src": "proc", "host": "h", "env": {"NCCL_A": "1"}, "since": None,
              "execs": 0},
             {"ev": "proc_seen", "t": 3.0, "pid": 5, "src": "proc", "host": "h", "ppid": 1, "start": 0.5,
              "argv": ["daemon"], "exec_env": {}, "execs": 1},
             {"ev": "live_env", "t": 4.0, "pid": 5, "src": "proc", "host": "h", "env": {"NCCL_B": "2"}, "since": None,
              "execs": 1},
             {"ev": "live_env", "t": 5.0, "pid": 5, "src": "proc", "host": "h", "env": {"NCCL_B": "3", "SECRET_KEY": "x"},
              "since": 4.5, "execs": 1},
             {"ev": "live_env", "t": 5.0, "pid": 6, "src": "proc", "host": "h", "env": None, "reason": "process gone",
              "since": None, "execs": 0}]
    (d / "h-1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    m = model.build(events.read_dirs([d]))
    p, q = m.processes[("h", 5)], m.processes[("h", 6)]
    assert [r.env for r in p.live_readings] == [{"NCCL_B": "2"}, {"NCCL_B": "3"}]  # unwatched names dropped
    assert p.live_env == {"NCCL_B": "3"} and p.live_t == 5.0 and p.live_since == 4.5 and "live" in p.sources
    assert q.live_reason == "process gone" and q.live_env is None and "live" not in q.sources
