"""`ncclprobe bench` while it runs: rows streamed as they are measured (nccl-tests layout), progress on
stderr, Ctrl-C mid-run returning what was measured (exit 130, no worker left), gloo running one
configuration, options that would be silently ignored being usage errors, and the plot's caveat.
Real processes where the point is real processes; ordering is proved by gates the test opens itself,
never by timing."""
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from livetree import alive
from click.testing import CliRunner

from ncclprobe.bench import command, driver, live, matrix, plot, report, summary
from ncclprobe.bench.report import Context
from ncclprobe.cli import main

BENCH = [sys.executable, "-m", "ncclprobe", "bench", "--backend", "gloo", "--ranks", "2", "-n", "1", "-w", "0"]
ROW = re.compile(r"^\s+\d+\s+\d+\s+bfloat16\s+sum\s+-1\s+eager(\s+\S+){8}$")




def _sitecustomize(tmp_path: Path, name: str, body: str) -> Path:
    """A PYTHONPATH entry for one --config: only that configuration's workers run `body`."""
    d = tmp_path / name
    d.mkdir()
    (d / "sitecustomize.py").write_text("import os, time\nif 'NCCLPROBE_BENCH_PARENT' in os.environ:\n" + body)
    return d


def _wait_for(check, proc, what: str, limit: float = 120.0):
    """Poll a state the test depends on; fail (never hang) if the run ends or stalls first."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        assert proc.poll() is None, f"bench ended before {what}: {proc.communicate()}"
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


# -- streaming ----------------------------------------------------------------------------------

def test_rows_are_printed_before_the_last_configuration_starts(tmp_path):
    """The second configuration's workers wait at a gate this test opens only after it has read the
    first configuration's rows from the running process's stdout: without streaming, those rows would
    come after the gated configuration ended (as a hang), and it would not be ok."""
    gate = tmp_path / "open"
    gated = _sitecustomize(tmp_path, "gate", f"    while not os.path.exists({str(gate)!r}):\n"
                                             "        time.sleep(0.02)\n")
    proc = subprocess.Popen(BENCH + ["-b", "1K", "-e", "4K", "--config", f"gate:PYTHONPATH={gated}",
                                     "--timeout", "120"],
                            env=dict(os.environ, TMPDIR=str(tmp_path), COLUMNS="200"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line.rstrip("\n"))
        if line.startswith("# defaults: ok"):
            break
    assert proc.poll() is None and not gate.exists()  # the gated configuration cannot have measured anything
    rows = [line for line in seen if not line.startswith("#")]
    assert [int(r.split()[0]) for r in rows] == [1024, 4096] and all(ROW.match(r) for r in rows), seen
    assert "# config 1/2 defaults: (NCCL defaults)" in seen
    assert any(line.split()[1:5] == ["size", "count", "type", "redop"] for line in seen)  # the column header
    gate.touch()
    rest = proc.stdout.read()  # the same buffered reader: communicate() would skip what it read ahead
    err = proc.stderr.read()   # two lines: it cannot fill the pipe while stdout is read first
    assert proc.wait(timeout=120) == 0, err
    assert f"# config 2/2 gate: PYTHONPATH={gated}" in rest and "# gate: ok, 2 of 2 sizes" in rest
    assert "CPU/gloo all_reduce time" in rest  # the summary follows the stream
    # not a terminal: one plain progress line per configuration, never rewritten in place
    assert [line for line in err.splitlines() if line.startswith("bench: config")] == [
        "bench: config 1/2 defaults: (NCCL defaults): 2 sizes", f"bench: config 2/2 gate: PYTHONPATH={gated}: 2 sizes"]
    assert "\r" not in err


def test_gloo_runs_one_configuration_and_json_keeps_stdout_for_the_document(tmp_path):
    r = subprocess.run(BENCH + ["-b", "1K", "-e", "1K", "--json"], env=dict(os.environ, TMPDIR=str(tmp_path)),
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # stdout is the JSON document and nothing else
    assert [c["name"] for c in doc["configs"]] == ["defaults"] and doc["configs"][0]["status"] == "ok"
    assert doc["notes"] == [matrix.GLOO_ONE_CONFIG] and doc["incomplete"] is False and doc["interrupted"] is None
    assert "# config 1/1 defaults: (NCCL defaults)" in r.stderr  # the rows stream to stderr instead
    assert any(ROW.match(line) for line in r.stderr.splitlines())


def test_gloo_runs_what_the_user_asks_for_and_only_that():
    cfgs, note = matrix.select("gloo", "LL", None)
    assert [c.name for c in cfgs] == ["defaults", "proto=LL"] and note == ""
    cfgs, note = matrix.select("gloo", None, None, ["x:NCCL_BUFFSIZE=1"])
    assert [c.name for c in cfgs] == ["defaults", "x"] and note == ""
    assert [c.name for c in matrix.select("gloo", None, None)[0]] == ["defaults"]
    assert len(matrix.select("nccl", None, None)[0]) == 6  # NCCL keeps its matrix


# -- Ctrl-C ------------------------------------------------------------------------------------

def test_ctrl_c_mid_run_writes_what_was_measured_and_leaves_no_worker(tmp_path):
    """Interrupted in configuration 2 of 3, after its first size: the JSON holds configuration 1 whole,
    configuration 2 marked interrupted with the size it finished, configuration 3 as not run."""
    stalled = tmp_path / "stalled.pid"
    stall = _sitecustomize(tmp_path, "stall", (
        "    if os.environ.get('RANK') == '1':\n"
        "        import torch, torch.distributed as dist\n"
        "        real = dist.all_reduce\n"
        "        def all_reduce(t, *a, **k):\n"
        "            if t.dtype == torch.bfloat16 and t.numel() >= 2048:  # the second size: 4 KB\n"
        f"                open({str(stalled)!r}, 'w').write(str(os.getpid()))\n"
        "                time.sleep(3600)\n"
        "            return real(t, *a, **k)\n"
        "        dist.all_reduce = all_reduce\n"))
    proc = subprocess.Popen(BENCH + ["-b", "1K", "-e", "4K", "--config", f"stall:PYTHONPATH={stall}",
                                     "--config", "after:NCCL_BUFFSIZE=1048576", "--timeout", "120", "--json"],
                            env=dict(os.environ, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    rows = _wait_for(lambda: [p for p in tmp_path.glob("ncclprobe-bench-*/01-stall/rows.jsonl")
                              if p.read_text().endswith("\n")], proc, "the stalled configuration's first row")
    _wait_for(lambda: stalled.exists() and stalled.read_text(), proc, "rank 1 stalling")
    rank0 = json.loads((rows[0].parent / "rank0.json").read_text())["pid"]
    pids = [int(stalled.read_text()), rank0]
    assert all(alive(p) for p in pids)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    doc = json.loads(out)
    assert doc["incomplete"] is True
    assert doc["interrupted"] == {"signal": "SIGINT", "config": "stall", "index": 1, "of": 3, "finished": 1,
                                  "sizes_done": 1, "sizes": 2, "not_run": ["after"]}
    by = {c["name"]: c for c in doc["configs"]}
    assert list(by) == ["defaults", "stall"]
    assert by["defaults"]["status"] == "ok" and {r["bytes"] for r in by["defaults"]["results"]} == {1024, 4096}
    assert by["stall"]["status"] == "interrupted" and by["stall"]["reason"] == "stopped by SIGINT after 1 of 2 sizes"
    assert {r["bytes"] for r in by["stall"]["results"]} == {1024}
    assert set(by["stall"]["pids"]) >= set(pids)
    assert not any(alive(p) for c in doc["configs"] for p in c["pids"])
    assert list(tmp_path.glob("ncclprobe-bench-*")) == []  # the worker directory goes too
    assert ("bench: interrupted by SIGINT during configuration 2/3 (stall) after 1 of 2 sizes; not run: after; "
            "every worker was stopped") in err
    assert "Traceback" not in err and "Aborted!" not in err


def test_incomplete_text_says_so_first_and_keeps_the_measured_columns():
    ctx = Context("nccl", 2, "eager", "GPU/NCCL")
    res = [{"bytes": 1024, "count": 512, "mode": "eager", "inplace": ip, "time_us": 9.0, "algbw": 1.0,
            "busbw": 1.0, "wrong": 0, "note": ""} for ip in (False, True)]
    unreal = {"available": False, "reason": "x", "per_size": {}}
    data = {"configs": [dict(name="defaults", env={}, status="ok", reason="", realized=unreal, seconds=1.0,
                             results=res + [dict(r, bytes=4096) for r in res]),
                        dict(name="proto=LL", env={"NCCL_PROTO": "LL"}, status="interrupted", realized=unreal,
                             reason="stopped by SIGINT after 1 of 2 sizes", seconds=1.0, results=res)],
            "options": dict(dtype="bf16", iters=1, warmup=0, graph=False, check=True, timeout=60.0),
            "sizes": [1024, 4096], "device": "GPU", "versions": {"torch": "t", "nccl": "n"}, "dropped_env": [],
            "projection": None, "notes": [], "incomplete": True,
            "interrupted": {"signal": "SIGINT", "config": "proto=LL", "index": 1, "of": 3, "finished": 1,
                            "sizes_done": 1, "sizes": 2, "not_run": ["algo=Ring"]},
            "recommendation": {"config": None, "reason": command.INCOMPLETE}}
    from ncclprobe import render
    buf = io.StringIO()
    render.render_text(command.Result("bench", doc=summary.document(ctx, data, {})), buf, width=200, color=False)
    text = buf.getvalue()
    assert text.splitlines()[1] == ("INCOMPLETE: interrupted by SIGINT during configuration 2/3 (proto=LL) after 1 "
                                    "of 2 sizes; not run: algo=Ring. What was measured before that follows.")
    table = [line for line in text.splitlines() if line.startswith("| 4K") or line.startswith("| 1K")]
    assert [line.split("|")[3].strip() for line in table] == ["9.00", "interrupted"]
    assert "proto=LL: NCCL_PROTO=LL; interrupted, 1 sizes in 1.0 s: stopped by SIGINT after 1 of 2 sizes" in text


def test_a_signal_while_workers_are_spawned_waits_until_they_are_recorded():
    with driver.Signals() as sig:
        reached = []
        with pytest.raises(driver.Interrupted) as exc:
            with sig.held():
                os.kill(os.getpid(), signal.SIGINT)
                reached.append("after the signal")  # not cut short
        assert reached == ["after the signal"] and exc.value.signum == signal.SIGINT
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C during cleanup is only recorded
        assert sig.signum == signal.SIGINT and not sig.armed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_row_tail_hands_on_complete_lines_only(tmp_path):
    path = tmp_path / "rows.jsonl"
    tail = driver.RowTail(path)
    assert tail.read() == []  # not written yet
    with open(path, "ab") as fh:
        fh.write(b'{"bytes": 1, "rows": []}\n{"bytes": 2, "ro')
    assert tail.read() == [{"bytes": 1, "rows": []}]
    with open(path, "ab") as fh:
        fh.write(b'ws": []}\nnot json\n')
    assert tail.read() == [{"bytes": 2, "rows": []}]
    tail.close()


# -- the printer -------------------------------------------------------------------------------

class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def _printer(out, err):
    cfgs = [matrix.Config("defaults"), matrix.Config("proto=LL", {"NCCL_PROTO": "LL"})]
    return live.Printer(out, err, intro=["ncclprobe bench: test"], nranks=2, dtype="bf16", checked=True,
                        basis="eager", configs=cfgs, nsizes=2,
                        realize=lambda run: {"available": False, "reason": "x", "per_size": {}})


def _size_rows(nbytes):
    return [{"bytes": nbytes, "count": nbytes // 2, "mode": "eager", "inplace": ip, "time_s": 20e-6, "wrong": 0,
             "note": ""} for ip in (False, True)]


@pytest.mark.parametrize("tty", [True, False])
def test_progress_is_rewritten_in_place_on_a_terminal_and_one_line_per_configuration_elsewhere(tty):
    out, err = _Stream(False), _Stream(tty)
    p = _printer(out, err)
    p.started(0, p.configs[0])
    p.rows(0, _size_rows(1024))
    p.started(1, p.configs[1])
    p.finish()
    if tty:
        assert err.getvalue().count(live._CLEAR) >= 3 and "\n" not in err.getvalue()
        assert "bench: config 1/2 defaults: 1/2 sizes" in err.getvalue()
        assert err.getvalue().endswith("bench: config 2/2 proto=LL: 0/2 sizes" + live._CLEAR)
    else:
        assert err.getvalue() == ("bench: config 1/2 defaults: (NCCL defaults): 2 sizes\n"
                                  "bench: config 2/2 proto=LL: NCCL_PROTO=LL: 2 sizes\n")
    lines = out.getvalue().splitlines()
    assert lines[0] == "# ncclprobe bench: test" and lines.count("# ncclprobe bench: test") == 1
    assert "# config 2/2 proto=LL: NCCL_PROTO=LL" in lines
    assert "        1024           512  bfloat16     sum      -1   eager    20.00    0.05    0.05       0    20.00" \
           "    0.05    0.05       0" in lines


def test_rows_keep_nccl_tests_columns():
    names = live.header()[1].split()
    assert names == ["#", "size", "count", "type", "redop", "root", "mode"] + ["time", "algbw", "busbw", "#wrong"] * 2
    assert [live.fit(v, 7) for v in (12.345, 12345.6, 1234567.0, 123456789.0)] == [
        "  12.35", "12345.6", "1234567", "  1e+08"]
    assert report.spans({1024: "RING/LL", 4096: "RING/LL", 16384: "RING/SIMPLE"}) == \
        "RING/LL at 1K-4K, RING/SIMPLE at 16K"
    both = _size_rows(1024) + [dict(r, mode="graph", time_s=10e-6) for r in _size_rows(1024)]
    eager, graph = live.rows_text(both, 8, "fp16", checked=False)  # NCCL: a line per mode for each size
    assert eager.split()[:6] == ["1024", "512", "half", "sum", "-1", "eager"] and graph.split()[5:] == [
        "graph", "10.00", "0.10", "0.18", "N/A", "10.00", "0.10", "0.18", "N/A"]  # busbw x 2(n-1)/n = x1.75


def test_a_reader_that_goes_away_stops_the_rows_not_the_run():
    class Closed(_Stream):
        def write(self, text):
            raise BrokenPipeError
    p = _printer(Closed(False), _Stream(False))
    p.started(0, p.configs[0])
    p.rows(0, _size_rows(1024))
    assert p.out is None


# -- options that would be ignored ---------------------------------------------------------------

def _no_measuring(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("measured although the command line was unusable")
    monkeypatch.setattr(driver, "run_matrix", boom)


@pytest.mark.parametrize("args,shown", [
    (["--backend", "gloo", "--gpus", "2"], "--gpus is for --backend nccl; gloo runs on CPU and takes its rank "
                                           "count from --ranks (e.g. --ranks 2)"),
    (["--ranks", "2"], "--ranks is for --backend gloo; with NCCL give the GPU count with --gpus"),
    (["--backend", "gloo", "--graph"], "--graph needs CUDA graphs"),
    (["--backend", "gloo", "--tokens", "1,2"], "--tokens and --layers need --hidden"),
    (["--backend", "gloo", "--layers", "61"], "--tokens and --layers need --hidden"),
    (["--backend", "gloo", "--hidden", "7168", "-e", "1M"], "give one or the other")])
def test_options_that_would_be_ignored_are_usage_errors(monkeypatch, args, shown):
    monkeypatch.setattr(command, "_visible_gpus", lambda: 4)
    _no_measuring(monkeypatch)
    res = CliRunner().invoke(main, ["bench"] + args)
    assert res.exit_code == 2 and shown in " ".join(res.output.split()), res.output


def test_a_job_rank_refuses_a_count_its_job_contradicts(monkeypatch):
    for k, v in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(k, v)
    _no_measuring(monkeypatch)
    res = CliRunner().invoke(main, ["bench", "--backend", "gloo", "--ranks", "4"])
    assert res.exit_code == 2 and "this process is rank 0 of a 2-rank job" in " ".join(res.output.split())


def test_nccl_env_on_gloo_is_a_stated_note(monkeypatch):
    seen = {}

    def nothing(d, cfgs, signals, watch):
        seen["intro"] = list(watch.intro)
        return driver.Matrix([], [], None)
    monkeypatch.setattr(driver, "run_matrix", nothing)
    res = command.bench_command(backend="gloo", envs=("NCCL_PROTO=LL",), progress_to=io.StringIO())
    note = "gloo: --env NCCL_PROTO cannot change a gloo all-reduce (it reads no NCCL variable)"
    assert note in res.data["notes"] and note in seen["intro"]  # in the JSON and in the streamed header


# -- the plot's caveat -------------------------------------------------------------------------

def test_plot_of_numbers_that_cannot_differ_says_so_on_the_image():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    configs = [{"name": n, "status": "ok", "results": [{"bytes": 1024, "mode": "eager", "inplace": False,
                                                        "time_us": t}]} for n, t in (("defaults", 9.0), ("x", 2.0))]
    fig = plot.figure(configs, "eager", "t", command.GLOO_PLOT_CAVEAT)
    assert [t.get_text() for t in fig.texts] == [command.GLOO_PLOT_CAVEAT]
    plt.close(fig)
    fig = plot.figure(configs, "eager", "t")
    assert fig.texts == []
    plt.close(fig)
    assert command._plot_caveat(Context("gloo", 2, "eager", "CPU/gloo")) == command.GLOO_PLOT_CAVEAT
    assert command._plot_caveat(Context("nccl", 1, "graph", "GPU/NCCL")) == command.ONE_GPU_PLOT_CAVEAT
    assert command._plot_caveat(Context("nccl", 8, "graph", "GPU/NCCL")) == ""


def test_ctrl_c_while_the_result_is_built_keeps_the_whole_result(monkeypatch, tmp_path):
    """After the last configuration the measurement is whole: a Ctrl-C then only sets the exit code."""
    def interrupt(ctx):
        os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(command, "_topology", interrupt)
    res = command.bench_command(backend="gloo", minbytes="1K", maxbytes="1K", iters=1, warmup=0,
                                workdir=tmp_path / "w")
    assert res.code == 130 and res.data["incomplete"] is False
    assert [c["status"] for c in res.data["configs"]] == ["ok"]
    assert "SIGINT arrived while the result was being built; every configuration had finished." in \
        [n.text for n in res.doc if hasattr(n, "text")]
