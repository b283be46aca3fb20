"""A fleet's event files read one host after another (events.stream_dirs(by_host=True), as `report` reads
them): memory holds one host's events at a time, and the model and the report are the same, to the byte, as
those of the time order of all hosts' events; a host whose events lie in files named for another is read
again in time order."""
from __future__ import annotations

import io
import shutil
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
