"""`run --dir D` is one run's directory: an earlier run there is refused (exit 2) unless --append; runs that
share a directory (--append, several hosts) are kept apart by their run id, each in its own
run-<host>-<run id>.json; `report` says how many runs and hosts it merged, and judges each process by what
the run that started it gave its CMD; a run's own report leaves out the others. Real runs, real processes:
ground truth is each worker's own record (examples/_worker.py)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rundirs import run_files

PY = sys.executable
NCCLPROBE = [PY, "-m", "ncclprobe"]
WORKER = str(Path(__file__).resolve().parent.parent / "examples" / "_worker.py")
MEET_WAIT_S = 120.0  # concurrent runs' workers all started by then: a bound on a polled condition


def cli(*args, env=None, timeout=180) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "NCCL_PROTO"}  # the tests say what each run gives
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**base, **(env or {}), "COLUMNS": "200"})


def worker(out: Path, *pre: str) -> list[str]:
    return [*pre, PY, WORKER, "--out", str(out)]


def records(out: Path) -> dict[int, dict]:
    return {r["pid"]: r for r in (json.loads(p.read_text()) for p in out.glob("worker-*.json"))}


def report_json(*dirs, expect: str | None = None) -> tuple[int, dict]:
    r = cli("report", "--json", *(["--expect", expect] if expect else []), *map(str, dirs))
    return r.returncode, json.loads(r.stdout)


def pids(doc: dict) -> set[int]:
    return {p["pid"] for p in doc["processes"]}


def listing(d: Path) -> dict[str, tuple]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in d.iterdir()}


# ---------------------------------------------------------------------------- refusal

def test_a_directory_that_holds_an_earlier_run_is_refused_naming_it(tmp_path):
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    assert cli("run", "--dir", str(d), "--", *worker(out)).returncode == 0
    before, ran = listing(d), set(records(out))
    r = cli("run", "--dir", str(d), "--", *worker(out))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    message = " ".join(r.stderr.split())
    assert f"log directory {d} holds an earlier run" in message and "--append" in message
    assert listing(d) == before and set(records(out)) == ran  # nothing written, CMD never started
    j = cli("run", "--json", "--dir", str(d), "--", *worker(out))
    assert j.returncode == 2 and json.loads(j.stdout)["error"]["reason"] == "usage_error"
    assert str(d) in json.loads(j.stdout)["error"]["message"]


def test_event_files_alone_are_an_earlier_run_and_an_empty_directory_is_none(tmp_path):
    """A directory the probes wrote (NCCLPROBE_DIR, inject install --dir) holds a run too."""
    d = tmp_path / "probed"
    d.mkdir(mode=0o700)
    (d / "somehost-12.jsonl").write_text("")
    assert cli("run", "--dir", str(d), "--", "true").returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    (empty / "notes.txt").write_text("mine\n")
    assert cli("run", "--dir", str(empty), "--", "true").returncode == 0


def test_append_needs_dir(tmp_path):
    r = cli("run", "--append", "--", "true")
    assert r.returncode == 2 and "--append needs --dir" in r.stderr


def test_help_documents_append_within_80_columns():
    r = subprocess.run([*NCCLPROBE, "run", "--help"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "COLUMNS": "80"})
    text = r.stdout
    assert r.returncode == 0 and "--append" in text
    block = text[text.index("--append"):].split("\n  -", 1)[0]
    assert all(len(line) <= 80 for line in block.splitlines()), block
    assert "earlier run" in " ".join(text.split())


# ---------------------------------------------------------------------------- --append

def test_append_keeps_two_runs_apart_and_report_merges_them(tmp_path):
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    first = cli("run", "--json", "--dir", str(d), "--set", "NCCL_PROTO=LL", "--", *worker(out))
    ran_first = set(records(out))
    second = cli("run", "--json", "--dir", str(d), "--append", "--", *worker(out))
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    ran_second = set(records(out)) - ran_first
    assert len(ran_first) == 1 and len(ran_second) == 1
    metas = [json.loads(p.read_text()) for p in run_files(d)]
    assert len(metas) == 2 and len({m["run_id"] for m in metas}) == 2
    host = os.uname().nodename
    assert {p.name for p in run_files(d)} == {f"run-{host}-{m['run_id']}.json" for m in metas}
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    # each run's own report is its own run's, though the second one shares the first one's directory
    assert ran_first <= pids(a) and not ran_second & pids(a)
    assert ran_second <= pids(b) and not ran_first & pids(b)
    assert [r["run_id"] for r in b["runs"]] == [m["run_id"] for m in metas if m["set"] == {}]
    assert b["merged"] == {"runs": 1, "hosts": 1, "dirs": 1}
    code, doc = report_json(d)
    assert code == 0 and doc["merged"] == {"runs": 2, "hosts": 1, "dirs": 1}
    assert ran_first | ran_second <= pids(doc)
    assert [r["run_id"] for r in doc["runs"]] == [a["runs"][0]["run_id"], b["runs"][0]["run_id"]]  # start order
    watch = doc["watch"][host]  # one line per host: both runs' watches added up
    assert watch["runs"] == 2 and watch["seen"] == a["watch"][host]["seen"] + b["watch"][host]["seen"] >= 2
    text = cli("report", str(d)).stdout
    assert "merged 2 run(s) of 1 host(s) from 1 log directory" in text and "/proc watch (2 runs): " in text
    assert f"run {a['runs'][0]['run_id']} on {host}: ncclprobe put into CMD's environment" in text


def test_each_process_is_judged_by_what_its_own_run_gave(tmp_path):
    """The run that started a process is the one whose environment is its reference, not the first run of
    the directory: a run that gave nothing, appended after one that gave NCCL_PROTO=LL, is healthy; a run
    that gave it to a CMD that dropped it (`env -u`) is named, with that run as the edge's parent."""
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    assert cli("run", "--dir", str(d), "--set", "NCCL_PROTO=LL", "--", *worker(out)).returncode == 0
    assert cli("run", "--dir", str(d), "--append", "--", *worker(out)).returncode == 0
    code, doc = report_json(d)
    assert code == 0 and not doc["findings"], doc["findings"]
    second = set(records(out))
    r = cli("run", "--json", "--dir", str(d), "--append", "--set", "NCCL_PROTO=LL", "--expect", "NCCL_PROTO=LL",
            "--", *worker(out, "env", "-u", "NCCL_PROTO"))
    (dropped,) = set(records(out)) - second
    assert records(out)[dropped]["NCCL_PROTO"] is None  # ground truth
    (found,) = [f for f in json.loads(r.stdout)["findings"] if f["var"] == "NCCL_PROTO"]
    assert found["pids"] == [dropped] and found["edge"]["kind"] == "curated_env", found
    assert "ncclprobe run (the environment it gave CMD)" in found["message"]
    code, doc = report_json(d, expect="NCCL_PROTO=LL")
    edges = {pid: f["edge"]["kind"] for f in doc["findings"] if f["var"] == "NCCL_PROTO" for pid in f["pids"]}
    (given_nothing,) = [pid for pid, rec in records(out).items() if pid in second and rec["NCCL_PROTO"] is None]
    assert edges[dropped] == "curated_env" and edges[given_nothing] == "not_in_root", edges


# ---------------------------------------------------------------------------- older directories

def _as_older_version(d: Path) -> None:
    """What an older `run` left: one run.json, without a run id."""
    (path,) = run_files(d)
    meta = json.loads(path.read_text())
    del meta["run_id"]
    (d / "run.json").write_text(json.dumps(meta))
    path.unlink()


def test_an_older_run_json_is_still_read_and_counts_as_an_earlier_run(tmp_path):
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    assert cli("run", "--dir", str(d), "--set", "NCCL_PROTO=LL", "--", *worker(out)).returncode == 0
    _as_older_version(d)
    code, doc = report_json(d)
    assert code == 0 and doc["merged"] == {"runs": 1, "hosts": 1, "dirs": 1}
    (run,) = doc["runs"]
    assert run["file"] == "run.json" and "run_id" not in run and run["set"] == {"NCCL_PROTO": "LL"}
    assert set(records(out)) <= pids(doc)
    assert cli("run", "--dir", str(d), "--", "true").returncode == 2
    assert cli("run", "--dir", str(d), "--append", "--", *worker(out)).returncode == 0
    code, doc = report_json(d)
    assert doc["merged"]["runs"] == 2 and sorted(r["file"] for r in doc["runs"])[-1] == "run.json"
    assert set(records(out)) <= pids(doc)


def test_report_of_several_directories_counts_their_runs_and_hosts(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        assert cli("run", "--dir", str(d), "--", *worker(out)).returncode == 0
    code, doc = report_json(*dirs)
    assert doc["merged"] == {"runs": 2, "hosts": 1, "dirs": 2}
    assert set(records(out)) <= pids(doc)


# ---------------------------------------------------------------------------- at once

MEET = """import os, sys, time
from pathlib import Path
meet, n = Path(sys.argv[1]), int(sys.argv[2])
(meet / str(os.getpid())).write_text("")
deadline = time.monotonic() + float(sys.argv[3])
while len(list(meet.iterdir())) < n and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(0 if len(list(meet.iterdir())) >= n else 9)
"""


def _together(tmp_path: Path, d: Path, nodes: list[str | None]) -> tuple[list[dict], dict[int, dict]]:
    """One `run --append` into d per entry of nodes (a hostname: in a UTS namespace of its own; None: this
    host), all at once: each CMD waits until every CMD has started, so the runs overlap, then starts a
    worker. Returns each run's own JSON report and the workers' records."""
    meet, out = tmp_path / "meet", tmp_path / "out"
    meet.mkdir()
    out.mkdir()
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    procs = []
    for name in nodes:
        cmd = [*NCCLPROBE, "run", "--json", "--dir", str(d), "--append", "--", "sh", "-c",
               f'{PY} "$1" "$2" "$3" "$4" && exec {PY} {WORKER} --out "$5"', "sh", str(script), str(meet),
               str(len(nodes)), str(MEET_WAIT_S), str(out)]
        if name is not None:
            cmd = ["unshare", "--uts", "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", name, *cmd]
        env = {k: v for k, v in os.environ.items() if k != "NCCL_PROTO"}
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    docs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=MEET_WAIT_S + 120)
        assert p.returncode == 0, stderr
        docs.append(json.loads(stdout))
    return docs, records(out)


def _own_host_files(d: Path, hosts: set[str]) -> None:
    """Every file in d is one host's and one run's or process's: no two writers share a name."""
    for p in d.iterdir():
        if p.name.startswith("boot-"):
            continue  # each run's boot probe, in a directory of its own (mkdtemp)
        host = next((h for h in hosts if re.fullmatch(rf"(run-)?{re.escape(h)}(-.+\.jsonl?|\.files|-.+\.json)",
                                                       p.name)), None)
        assert host is not None, p.name
        if p.suffix == ".jsonl":
            lines = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            assert {e["host"] for e in lines} <= {host}, p.name


def test_two_runs_on_one_host_at_once_keep_their_own_reports(tmp_path):
    d = tmp_path / "logs"
    (a, b), recs = _together(tmp_path, d, [None, None])
    assert len(recs) == 2 and len(run_files(d)) == 2
    assert len(pids(a) & set(recs)) == 1 and len(pids(b) & set(recs)) == 1 and pids(a).isdisjoint(pids(b))
    _own_host_files(d, {os.uname().nodename})
    code, doc = report_json(d)
    assert doc["merged"] == {"runs": 2, "hosts": 1, "dirs": 1} and set(recs) <= pids(doc)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root (unshare --uts)")
def test_two_hosts_writing_one_directory_at_once_never_collide(tmp_path):
    d = tmp_path / "logs"
    t0 = time.time()
    (a, b), recs = _together(tmp_path, d, ["host-one", "host-two"])
    assert len(recs) == 2
    assert sorted(run_meta_host(p) for p in run_files(d)) == ["host-one", "host-two"]
    _own_host_files(d, {"host-one", "host-two"})
    assert {p["host"] for p in a["processes"]} == {"host-one"} and {p["host"] for p in b["processes"]} == {"host-two"}
    code, doc = report_json(d)
    assert doc["merged"] == {"runs": 2, "hosts": 2, "dirs": 1}
    assert {p["host"] for p in doc["processes"] if p["pid"] in recs} == {"host-one", "host-two"}
    assert all(r["started"] >= t0 - 1 for r in doc["runs"])


def run_meta_host(path: Path) -> str:
    return json.loads(path.read_text())["host"]


# ---------------------------------------------------------------------------- hostile metadata

def test_run_metadata_that_is_no_regular_file_is_skipped_and_said(tmp_path):
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    assert cli("run", "--dir", str(d), "--", *worker(out)).returncode == 0
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"command": ["leaked"], "host": "elsewhere"}))
    (d / "run-elsewhere-x.json").symlink_to(secret)
    os.mkfifo(d / "run-elsewhere-y.json")  # opening it for reading would block
    code, doc = report_json(d)
    assert code == 0 and doc["merged"]["runs"] == 1 and "leaked" not in json.dumps(doc["runs"])
    notes = {n["path"].rsplit("/", 1)[-1]: n["note"] for n in doc["reading"]["file_notes"]}
    assert notes["run-elsewhere-x.json"] == "skipped: symlink (not followed)"
    assert notes["run-elsewhere-y.json"].startswith("skipped: not a regular file")


def test_more_run_metadata_than_a_report_reads_is_counted(tmp_path):
    from ncclprobe.witnesses import events
    d, out = tmp_path / "logs", tmp_path / "out"
    out.mkdir()
    assert cli("run", "--dir", str(d), "--", *worker(out)).returncode == 0
    (meta,) = run_files(d)
    for i in range(events.RUNS_MAX):
        os.link(meta, d / f"run-h-{i:05d}.json")
    code, doc = report_json(d)
    assert code == 0 and doc["merged"]["runs"] == events.RUNS_MAX
    assert doc["skipped"][f"more than {events.RUNS_MAX} run metadata files"] == 1
