"""A fleet's event files read one host after another (events.stream_dirs(by_host=True), as `report` reads
them): memory holds one host's events at a time, and the model and the report are the same, to the byte, as
those of the time order of all hosts' events; a host whose events lie in files named for another is read
again in time order."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ncclprobe import model as model_mod, render
from ncclprobe.commands import report
from ncclprobe.witnesses import events

ROOT = Path(__file__).resolve().parent.parent
DEMO_RUN = ROOT / "tests" / "data" / "demo-run"
sys.path.insert(0, str(ROOT / "benchmarks"))
import fleetgen  # noqa: E402

HOSTS = 6


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    """Layouts of real (rewritten) logs: a directory per host, every host in one directory, replicas."""
    tmp = tmp_path_factory.mktemp("layouts")
    per_host = fleetgen.job(tmp / "job", HOSTS)
    shared = tmp / "shared"
    shared.mkdir()
    for d in per_host:
        for f in d.iterdir():
            shutil.copy(f, shared / f.name)
    return {"demo": [DEMO_RUN], "per_host": per_host, "shared": [shared],
            "replicas": fleetgen.replicas(tmp / "replicas", HOSTS)}


def _both(dirs, monkeypatch) -> tuple[tuple[str, str], tuple[str, str]]:
    """(JSON, text) of the report as `report` reads the logs, and as a read in time order gives it."""
    def drawn() -> tuple[str, str]:
        result = report.build_report([str(d) for d in dirs])
        as_json, text = io.StringIO(), io.StringIO()
        render.render_json(result, as_json)
        render.render_text(result, text, width=100, color=False)
        return as_json.getvalue(), text.getvalue()
    by_host = drawn()
    plain = events.stream_dirs
    with monkeypatch.context() as mp:
        mp.setattr(events, "stream_dirs", lambda d, fold=False, by_host=False: plain(d, fold=fold))
        in_time = drawn()
    return by_host, in_time


@pytest.mark.parametrize("layout", ["demo", "per_host", "shared", "replicas"])
def test_one_host_after_another_gives_the_report_of_time_order(layout, fleets, monkeypatch):
    log = events.stream_dirs([str(d) for d in fleets[layout]], by_host=True)
    assert len(list(log.events)) > 50 and not log.split_hosts  # (a split would be read again in time order)
    by_host, in_time = _both(fleets[layout], monkeypatch)
    assert by_host == in_time
    assert '"findings": [' in by_host[0] and len(by_host[1].splitlines()) > 10


@pytest.mark.parametrize("layout", ["per_host", "shared", "replicas"])
def test_the_model_keeps_time_order_of_all_hosts(layout, fleets):
    """Processes, communicators and watches in the order a build in time order gives them (_Placed)."""
    dirs = [str(d) for d in fleets[layout]]
    a = model_mod.build(events.stream_dirs(dirs, fold=True, by_host=True))
    b = model_mod.build(events.stream_dirs(dirs, fold=True))
    assert list(a.processes) == list(b.processes) and len(a.processes) > HOSTS
    assert [(c.host, c.pid, c.t, c.ident) for c in a.comms] == [(c.host, c.pid, c.t, c.ident) for c in b.comms]
    assert list(a.watch) == list(b.watch)
    order = [[(e["host"], e["pid"], e["t"]) for e in events.stream_dirs(dirs, by_host=by).events] for by in (1, 0)]
    assert order[0] != order[1] and sorted(order[0]) == sorted(order[1])  # two orders of the same events


def test_memory_holds_one_hosts_events_at_a_time(fleets, monkeypatch):
    """The first event of a host-major read has read that host's files only; a time-order read, every file."""
    dirs = [str(d) for d in fleets["shared"]]
    opened: list[str] = []
    real = events.read_file

    def counting(path, log):
        opened.append(Path(path).name)
        return real(path, log)
    monkeypatch.setattr(events, "read_file", counting)
    first = next(iter(events.stream_dirs(dirs, by_host=True).events))
    mine = set(opened)
    assert mine and all(n.startswith(first["host"] + "-") for n in mine)
    assert len(mine) == len(list(Path(dirs[0]).glob(f"{first['host']}-*.jsonl")))
    opened.clear()
    next(iter(events.stream_dirs(dirs).events))
    assert len(opened) == len(list(Path(dirs[0]).glob("*.jsonl")))


def test_a_host_in_files_named_for_another_is_read_again_in_time_order(fleets, tmp_path, monkeypatch):
    """A renamed file puts one host's events under two names: the host-major read says so (split_hosts),
    and `report` reads the logs again in time order: the same report as a time-order read."""
    d = tmp_path / "logs"
    shutil.copytree(fleets["shared"][0], d)
    first, second = fleetgen.host_name(0), fleetgen.host_name(1)
    moved = sorted(d.glob(f"{first}-*.jsonl"))[-1]
    moved.rename(d / f"{second}-{moved.name.rsplit('-', 1)[1]}")
    log = events.stream_dirs([str(d)], by_host=True)
    assert len(list(log.events)) > 0 and log.split_hosts == {first}
    whole = events.stream_dirs([str(fleets["shared"][0])], by_host=True)
    assert len(list(whole.events)) > 0 and not whole.split_hosts
    by_host, in_time = _both([d], monkeypatch)
    assert by_host == in_time


def test_a_shared_directory_without_the_probes_names_is_one_group(tmp_path, monkeypatch):
    """Files named otherwise (a hand-made or collected log) are merged in time order among themselves."""
    d = tmp_path / "logs"
    d.mkdir()
    for i, f in enumerate(sorted(DEMO_RUN.glob("*.jsonl"))):
        shutil.copy(f, d / f"collected{i}.jsonl")
    log = events.stream_dirs([str(d)], by_host=True)
    got = list(log.events)
    assert got == list(events.stream_dirs([str(d)]).events) and not log.split_hosts
    by_host, in_time = _both([d], monkeypatch)
    assert by_host == in_time


def _real_run(tmp: Path) -> Path:
    """A real `ncclprobe run` of a small tree (a shell, Python that starts a child, short-lived processes): its
    log has run's watch (summaries, sightings of /proc, exits), the boot probe's starts and spawn edges."""
    d = tmp / "run"
    code = "import subprocess; subprocess.run(['true']); subprocess.run(['sh', '-c', 'sleep 0.05'])"
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "run", "--dir", str(d), "--", "sh", "-c",
                        f"{sys.executable} -c \"{code}\"; sleep 0.3; true"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "NCCLPROBE_WATCH_S": "0.1"})
    assert r.returncode in (0, 1, 3), r.stderr
    return d


def _as_host(src: Path, out: Path, host: str, shift: float) -> None:
    """src's files as host's: each line's host and file names rewritten, times shifted (hosts interleave)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.endswith(".jsonl"):
            lines = []
            for line in f.read_text().splitlines():
                e = json.loads(line)
                e["host"], e["t"] = host, e["t"] + shift
                lines.append(json.dumps(e, separators=(",", ":")))
            (out / f"{host}-{f.name.rsplit('-', 1)[1]}").write_text("\n".join(lines) + "\n")
        elif f.name.startswith("run-") and f.name.endswith(".json"):
            run = json.loads(f.read_text())
            run["host"] = host
            (out / f.name.replace(f.name.split("-")[1], host, 1)).write_text(json.dumps(run))


@pytest.fixture(scope="module")
def watched_fleet(tmp_path_factory):
    """Four hosts made of one real run, in two directories, one host's files in both; two files with a NUL
    hole and a torn line (notes and skip reasons)."""
    tmp = tmp_path_factory.mktemp("watched")
    src = _real_run(tmp)
    a, b = tmp / "a", tmp / "b"
    for i, host in enumerate(["h0", "h1", "h2", "h3"]):
        _as_host(src, a if i < 2 else b, host, i * 1e-4)
    holed = []
    for host in ("h0", "h1"):  # each in both directories: still one writer, no split; read order differs
        first, last = sorted(a.glob(f"{host}-*.jsonl"))[0], sorted(a.glob(f"{host}-*.jsonl"))[-1]
        first.rename(b / first.name)
        holed += [b / first.name, last]
    for f in holed:
        with open(f, "ab") as fh:
            fh.write(b"\0" * 64 + b'{"ev":"proc_seen","t":\n')
    return [a, b]


def _processes(m) -> list:
    """Every process's state, sets as sorted lists (their iteration order is no part of the model)."""
    def plain(v):
        return sorted(map(repr, v)) if isinstance(v, (set, frozenset)) else repr(v)
    return [(k, {n: plain(v) for n, v in sorted(vars(p).items())}) for k, p in m.processes.items()]


@pytest.mark.parametrize("budget", [None, 1])
def test_a_watched_fleet_in_two_directories_reads_the_same_both_ways(watched_fleet, budget, monkeypatch):
    """With run's watch, notes and skip reasons, a host in two directories; budget 1: every file streamed, as
    when a fleet's small files pass WHOLE_BUDGET (then which files are read whole is decided once, for both)."""
    if budget is not None:
        monkeypatch.setattr(events, "WHOLE_BUDGET", budget)
    dirs = [str(d) for d in watched_fleet]
    log = events.stream_dirs(dirs, fold=True, by_host=True)
    a, b = model_mod.build(log), model_mod.build(events.stream_dirs(dirs, fold=True))
    assert not log.split_hosts and len(a.watch) == 4 and len(a.sightings) > 4 and a.reading.notes
    assert list(a.watch) == list(b.watch) and [(s.host, s.pid, s.t) for s in a.sightings] == \
        [(s.host, s.pid, s.t) for s in b.sightings]
    assert _processes(a) == _processes(b)
    assert (a.skipped, a.reading.notes) == (b.skipped, b.reading.notes) and a.skipped.get("not JSON") == 4
    assert len(a.reading.notes) == 4
    by_host, in_time = _both(watched_fleet, monkeypatch)
    assert by_host == in_time


def test_equal_times_in_two_files_of_a_host_keep_one_order_whatever_the_budget(watched_fleet, tmp_path, monkeypatch):
    """A process's start record and a /proc sighting of it at the same time, in two files of one host (the
    heap merge puts a file read whole before one streamed where times are equal): which files are read whole
    is decided once, over all files, so both reads put them in one order, at every budget."""
    src = sorted(watched_fleet[0].glob("h0-*.jsonl")) + sorted(watched_fleet[1].glob("h0-*.jsonl"))
    evs = [json.loads(line) for f in src for line in f.read_text().splitlines() if line.startswith("{") and
           line.rstrip().endswith("}")]
    start = next(e for e in evs if e["ev"] == "process_start")
    seen = next(e for e in evs if e["ev"] == "proc_seen" and e["pid"] == start["pid"])
    seen.update(t=start["t"], exe="/usr/bin/other", argv=["other"])  # another program: the order decides its image
    d = tmp_path / "logs"
    d.mkdir()
    filler = d / "a0-1.jsonl"  # another host first, to spend the budget
    filler.write_text(json.dumps({**seen, "host": "a0", "pid": 1}) + "\n")
    for name, e in (("h0-1", start), ("h0-2", seen)):
        (d / f"{name}.jsonl").write_text(json.dumps(e) + "\n")
    sizes = [f.stat().st_size for f in sorted(d.iterdir())]
    for budget in sorted({1} | {sum(sizes[i] for i in range(3) if k >> i & 1) for k in range(1, 8)}):
        monkeypatch.setattr(events, "WHOLE_BUDGET", budget)
        a = model_mod.build(events.stream_dirs([str(d)], by_host=True))
        b = model_mod.build(events.stream_dirs([str(d)]))
        assert _processes(a) == _processes(b), budget
