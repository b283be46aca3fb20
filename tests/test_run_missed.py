"""What the scan mode may have missed is counted, and an expectation is never reported as met over it: a 10 ms
worker started by a process that no probe is in (its environment was curated), between two scans of run's
/proc watch (NCCLPROBE_WATCH_S=30: one scan as CMD starts, one at the end; NCCLPROBE_WATCH_KERNEL=0: no kernel
events), leaves no record and is never read, but the process that reaped it has the worker's page faults added to
its own count (witnesses/reaping.py): the watch counts at least one child missed and the verdict says NOT CHECKED
first, exit 3 with --expect. Should a scan catch the worker after all (a busy machine delays the watch), it is read,
and named: ENV_MISSING, exit 1; seen only as it ended, it is named unread: exit 3. Never "No findings", never 0.
Ground truth: the worker writes its pid; NOT CHECKED names it with how it was missed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from boot_support import clean_env
from ncclprobe.model import FORK_GONE

ROOT = Path(__file__).resolve().parent.parent
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
WORKER = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()))"
# no probe in it (python -S, and the environment its starter gave it holds neither PYTHONPATH nor LD_PRELOAD):
# starts the worker with an environment of its own, without NCCL_PROTO, and reaps it
MIDDLE = (f"import os, subprocess, sys; subprocess.run([sys.executable, '-S', '-c', {WORKER!r}, sys.argv[1]], "
          "env={'PATH': os.environ['PATH']})")
# the probed launcher: starts MIDDLE with NCCL_PROTO but without the probes, waits for it to end and leaves it
# to run, which reaps it (and reads it first, as a zombie). (posix_spawn: a Popen object would reap it when
# collected, and what MIDDLE reaped would then be in the launcher's count as MIDDLE's own: MIDDLE, known from the
# launcher's record, is all it could be counted as.)
LAUNCHER = f"""
import os, sys
pid = os.posix_spawn(sys.executable, [sys.executable, "-S", "-c", {MIDDLE!r}, sys.argv[1]],
                     {{"PATH": os.environ["PATH"], "NCCL_PROTO": "LL"}})
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
print("middle", pid, flush=True)
"""


def _run(tmp_path: Path, cmd: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = clean_env(NCCL_PROTO="LL", NCCLPROBE_WATCH_KERNEL="0", NCCLPROBE_WATCH_S="30")
    args = [*NCCLPROBE, "run", "--json", "--dir", str(tmp_path / "logs"), *extra, "--"]
    out = subprocess.run([*args, *cmd], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    return out, json.loads(out.stdout)  # (with --json, what CMD prints goes to stderr)


def _summary(doc: dict) -> dict:
    (w,) = doc["watch"].values()
    return w


def _missed_or_named(out, doc: dict, worker: int, parents: set[int]) -> bool:
    """Each outcome that is true: the worker was missed and counted (NOT CHECKED said first, exit 3) as a child of
    one of `parents` (the one that reaped it, or the one that reaped that); a scan saw it only as it ended, unread
    (NOT CHECKED, named; exit 3); or a scan read it (exit 1, ENV_MISSING, named). True for the first."""
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    if any(worker in f["pids"] for f in errors):
        assert out.returncode == 1 and [f["code"] for f in errors] == ["ENV_MISSING"], (out.stdout, out.stderr)
        return False
    assert not errors, (out.stdout, out.stderr)
    w, un = _summary(doc), doc["verdict"]["unchecked"]
    assert w["mode"] == "scan" and un and un["reason"].startswith("not checked: "), (w, un)
    assert out.returncode == 3, (out.stdout, out.stderr)
    if worker in un["unread"]:
        assert "whose environment no witness read, and that ran no probe: " in un["reason"], un
        how = rf"pids? [0-9, ]*\b{worker}\b[0-9, …]* \((/proc showed|seen once as fork|known to run's watch alone)"
        assert re.search(how, un["reason"]), un
        return False
    assert w["missed_children"] >= 1 and w["missed_parents"] and set(w["missed_parents"]) <= parents, w
    assert "reaped between two scans" in un["reason"], un
    return True


def test_a_worker_an_unprobed_orphan_reaped_is_counted_and_the_expectation_not_checked(tmp_path):
    pidfile = tmp_path / "worker.pid"
    out, doc = _run(tmp_path, [sys.executable, "-c", LAUNCHER, str(pidfile)], "--expect", "NCCL_PROTO=LL")
    worker = int(pidfile.read_text())
    middle = int(out.stderr.split("middle ", 1)[1].split()[0])
    counted = _missed_or_named(out, doc, worker, {middle, _cmd_pid(tmp_path)})
    # the text says it before anything else, and the watch's line counts it; without --expect, nothing is failed
    args = [*NCCLPROBE, "report", str(tmp_path / "logs")]
    text = subprocess.run([*args, "--expect", "NCCL_PROTO=LL"], capture_output=True, text=True, timeout=120)
    plain = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert text.returncode == out.returncode and plain.returncode == 0, (text.stdout, plain.stdout)
    if doc["verdict"]["unchecked"]:
        assert "NOT CHECKED: " in text.stdout and "No findings" not in text.stdout.split("NOT CHECKED")[0], text.stdout
    if counted:
        parents = ", ".join(map(str, _summary(doc)["missed_parents"]))
        assert f"more that pid(s) {parents} started" in " ".join(plain.stdout.split()), plain.stdout


def test_a_worker_cmd_itself_reaped_is_counted_from_cmd_read_as_a_zombie(tmp_path):
    # CMD is `env`, which drops the probes and execs a python -S: nothing in CMD's image records what it starts
    pidfile = tmp_path / "worker.pid"
    cmd = ["env", "-u", "LD_PRELOAD", "-u", "PYTHONPATH", sys.executable, "-S", "-c", MIDDLE, str(pidfile)]
    out, doc = _run(tmp_path, cmd, "--expect", "NCCL_PROTO=LL")
    worker = int(pidfile.read_text())
    _missed_or_named(out, doc, worker, {_cmd_pid(tmp_path)})


def _cmd_pid(tmp_path: Path) -> int:
    (meta,) = (tmp_path / "logs").glob("run-*.json")
    return json.loads(meta.read_text())["cmd_pid"]


def test_lines_a_probe_could_not_write_leave_the_expectation_not_checked(tmp_path):
    # a boot probe that read its worker, but lost a line (its writes stalled): a record of a process it started
    # may be that line, so what was read is not all that ran
    start = {"ev": "process_start", "t": 1.7e9, "host": "h", "pid": 100, "src": "boot", "ppid": 1,
             "argv": ["python3", "w.py"], "exe": "/usr/bin/python3", "env": {"NCCL_PROTO": "LL"}}
    later = {"ev": "env_write", "t": 1.7e9 + 1, "host": "h", "pid": 100, "src": "boot", "var": "NCCL_DEBUG",
             "old": None, "new": "INFO", "where": "w.py:3 main", "op": "set", "blocked": False, "dropped": 1}
    (tmp_path / "h-100.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (start, later)))
    args = [*NCCLPROBE, "report", "--expect", "NCCL_PROTO=LL", str(tmp_path)]
    out = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, (out.stdout, out.stderr)
    un = json.loads(out.stdout)["verdict"]["unchecked"]
    assert "1 line(s) the probes of pid(s) 100 could not write" in un["reason"], un
    clean = tmp_path / "clean"
    clean.mkdir()
    (clean / "h-100.jsonl").write_text(json.dumps(start) + "\n")
    ok = subprocess.run([*NCCLPROBE, "report", "--expect", "NCCL_PROTO=LL", str(clean)], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout


def test_the_ledger_counts_each_rise_no_child_a_scan_saw_can_explain():
    from ncclprobe.witnesses.reaping import Reaping
    r, parent, kid = Reaping(), (10, 1), (11, 2)
    r.look(0, 1, {parent: (None, 0)})
    r.look(2, 3, {parent: (None, 0), kid: (parent, 0)})  # a child a scan saw
    r.look(4, 5, {parent: (None, 50)}, gone=[kid])  # it ended: it may be the rise
    r.look(6, 7, {parent: (None, 50)})
    r.look(8, 9, {parent: (None, 90)})  # no child it was seen with can have ended in (6, 9]: one it was not
    r.look(8, 9, {(12, 3): (None, 7)})  # first read with reaped children already: one before any scan
    r.reaped({(12, 3): (10.0, 7), (13, 4): (10.0, 0)})  # read as zombies by run: no more, and none
    assert r.unseen() == {10: 1, 12: 1}


def test_a_fork_child_seen_only_before_an_exec_is_not_checked(tmp_path):
    # the race the scans can lose: a vfork/fork child read while it still held its parent's block (the parent's
    # NCCL_PROTO), gone before a second look; it may have exec'd with an environment of its own that no read saw
    def seen(pid, ppid, reason=None):
        return {"ev": "proc_seen", "t": 1.7e9, "host": "h", "pid": pid, "src": "proc", "ppid": ppid, "start": 1.7e9,
                "argv": ["python3", "-S", "-c", "x"], "exe": "/usr/bin/python3", "exec_env": {"NCCL_PROTO": "LL"},
                "env_reason": reason, "env_hash": "aa", "execs": 0}
    summary = {"ev": "watch_summary", "t": 1.7e9 + 1, "host": "h", "pid": 50, "src": "proc", "scans": 2, "walks": 2,
               "interval_s": 30, "seen": 2, "missed_known": 0, "missed_pids": [], "reaped_unseen": [], "mode": "scan"}
    for reason, code in ((FORK_GONE, 3), (None, 0)):
        d = tmp_path / str(code)
        d.mkdir()
        (d / "h-50.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (seen(100, 50), seen(101, 100, reason),
                                                                             summary)))
        out = subprocess.run([*NCCLPROBE, "report", "--json", "--expect", "NCCL_PROTO=LL", str(d)], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == code, out.stdout
        if code:
            assert json.loads(out.stdout)["verdict"]["unchecked"]["unread"] == [101]


def test_a_child_a_walk_read_and_gone_before_its_stat_read_explains_its_parents_rise(monkeypatch):
    # a script's $(…) subshell: the walk reads it, and it is reaped before the walk's stat reads of the tree that
    # follow; it is a child seen all the same, and its reaping is its parent's next rise (no child missed)
    import os
    import time
    from ncclprobe.witnesses import procwatch
    from ncclprobe.witnesses.reaping import Reaping
    sh = subprocess.Popen(["sh", "-c", "sleep 0.6; exec sleep 30"])

    def until(what, ready):  # (polled: a busy machine starts sh late)
        deadline = time.monotonic() + 60
        while not ready():
            assert time.monotonic() < deadline, what
            time.sleep(0.01)
    children = Path(f"/proc/{sh.pid}/task/{sh.pid}/children")
    try:
        until("sh forked its first sleep", lambda: children.read_text().strip())
        ledger = Reaping()
        sc = procwatch.Scanner(os.getpid(), b"k", native=False, reaping=ledger)
        stat = procwatch.Scanner._stat
        kid = []

        def gone_at_stat(self, pid):  # the first walk's stat read of sh's child finds it gone
            st = stat(self, pid)
            if st is not None and st[0] == sh.pid:
                kid.append(pid)
                return None
            return st
        monkeypatch.setattr(procwatch.Scanner, "_stat", gone_at_stat)
        sc.scan(final=True)
        assert kid, "the walk read no child of sh"
        monkeypatch.setattr(procwatch.Scanner, "_stat", stat)
        # sh reaped it (its cminflt rose) and exec'd the second sleep
        until("sh exec'd its second sleep", lambda: Path(f"/proc/{sh.pid}/cmdline").read_bytes().startswith(b"sleep"))
        sc.scan(final=True)
        assert ledger.unseen().get(sh.pid, 0) == 0, ledger.unseen()
    finally:
        sh.kill()
        sh.wait()
