"""Work beside the main line (ncclprobe/aside.py): a fleet's NCCL logs parsed in a forked child give the
report the model they give parsed here; a child that fails costs only its time; no child is left behind.
A report drawn as text never builds its model's JSON (doc.Later), and its JSON is the same either way."""
from __future__ import annotations

import io
import json
import os
import threading
from pathlib import Path

import pytest

from ncclprobe import aside, render
from ncclprobe.commands import report
from ncclprobe.views import report as view

from test_report_fleet import job  # noqa: F401 (a fixture: 32 hosts × 8 ranks, each host's NCCL logs)

DEMO_RUN = Path(__file__).resolve().parent / "data" / "demo-run"
two_cores = pytest.mark.skipif(aside.cores() < 2, reason="a child is started only where two cores can run")


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@two_cores
def test_the_child_s_value_is_the_value_here():
    with aside.Aside(sorted, [3, 1, 2]) as a:
        assert a.forked
        pid = a.pid
        assert a.result() == [1, 2, 3]
    assert _gone(pid)


@two_cores
def test_a_child_that_dies_costs_its_time_and_the_work_is_done_here():
    parent = os.getpid()

    def work():
        if os.getpid() != parent:
            os._exit(7)  # the child dies before it hands anything back
        return "done here"
    with aside.Aside(work) as a:
        assert a.forked
        assert a.result() == "done here"


@two_cores
def test_an_error_is_raised_here_where_the_caller_sees_it():
    def boom():
        raise ValueError("from the work")
    with aside.Aside(boom) as a, pytest.raises(ValueError, match="from the work"):
        a.result()


@two_cores
def test_a_child_whose_result_is_never_asked_for_is_killed_and_reaped():
    with aside.Aside(threading.Event().wait, 60) as a:  # would run a minute
        pid = a.pid
    assert _gone(pid)


def test_no_child_beside_threads_or_where_it_does_not_pay():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not aside.Aside(sum, [1, 2]).forked  # a lock another thread holds would stay held in the child
    finally:
        stop.set()
        t.join()
    a = aside.Aside(sum, [1, 2], worth=False)
    assert not a.forked and a.result() == 3


@two_cores
def test_a_fleet_s_report_is_the_same_with_its_nccl_logs_parsed_beside(job, monkeypatch):
    dirs = [str(d) for d in job[0]]
    assert report._bytes([p for d in job[0] for p in d.glob("nccl-debug*")]) > 0
    here = report.build_report(dirs).to_json()
    started = []
    real = aside.Aside._start

    def spy(self):
        real(self)
        started.append(self.forked)
    monkeypatch.setattr(report, "ASIDE_BYTES", 0)
    monkeypatch.setattr(aside.Aside, "_start", spy)
    beside = report.build_report(dirs).to_json()
    assert started == [True]
    assert beside == here
    assert any("nccl-log" in p["witnesses"] for p in beside["processes"])


def test_a_report_drawn_as_text_never_builds_its_json(monkeypatch):
    calls = []
    real = view.model_json

    def counted(m):
        calls.append(1)
        return real(m)
    monkeypatch.setattr(view, "model_json", counted)
    result = report.build_report([str(DEMO_RUN)])
    out = io.StringIO()
    render.render_text(result, out, width=100, color=False)
    assert calls == [] and "NCCL_PROTO" in out.getvalue()
    data = result.to_json()
    assert calls == [1] and data["processes"] and data["communicators"] and list(data)[-2:] == ["verdict", "fleet"]
    assert tuple(data)[3:3 + len(view.MODEL_KEYS)] == view.MODEL_KEYS  # after schema, command, findings
    assert json.loads(json.dumps(data)) == data


def test_later_is_a_plain_dict_to_every_reader():
    from ncclprobe.doc import Later
    calls = []
    d = Later(lambda: calls.append(1) or {"a": 1, "b": 2}, ("a", "b"), {"v": 3})
    assert d.get("v") == 3 and d.get("zz") is None and "v" in d and "a" in d and "zz" not in d
    assert calls == []  # keys it does not compute are read without computing it
    assert list(d) == ["a", "b", "v"] and calls == [1] and d["b"] == 2
    d.update(x=1)
    assert list(d) == ["a", "b", "v", "x"] and calls == [1]

    def fresh():
        return Later(lambda: {"a": 1}, ("a",), {"v": 3})
    want = {"a": 1, "v": 3}
    assert {**fresh()} == want and dict(fresh()) == want and fresh() == want and want == fresh()
    assert json.dumps(fresh()) == json.dumps(want) and fresh()["a"] == 1 and fresh().get("a") == 1
    out = {"schema": 0}
    out.update(fresh())
    assert out == {"schema": 0, **want}


@two_cores
def test_an_interrupt_while_waiting_ends_the_child_and_is_raised_at_once():
    import signal
    import time

    def interrupt(*_):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        with aside.Aside(time.sleep, 60) as a:  # the child would work a minute
            pid = a.pid
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            with pytest.raises(KeyboardInterrupt):
                a.result()
            assert time.monotonic() - t0 < 10
            assert _gone(pid)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
