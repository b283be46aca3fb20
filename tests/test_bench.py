"""`ncclprobe bench` on CPU with gloo: the matrix end to end (a fresh pid set per configuration, each
worker's own view of its environment), the timeout and wrong-result paths, torchrun-style job mode, the
JSON schema, the plot, and the pure parts (sizes, matrix, busbw, realized algo/proto, recommendation)."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from livetree import alive
from click.testing import CliRunner

from ncclprobe import render
from ncclprobe.cli import main
from ncclprobe.bench import allreduce, command, driver, matrix, plot, report, summary
from ncclprobe.bench.report import Context
from ncclprobe.doc import Unexaminable
from ncclprobe.commands.envfile import AssignmentError

SMALL = dict(backend="gloo", ranks=2, minbytes="1K", maxbytes="4K", stepfactor=4, iters=2, warmup=1,
             timeout=60.0)
HANG_TIMEOUT_S = 30.0


def _text(result, width=160) -> str:
    out = io.StringIO()
    render.render_text(result, out, width=width, color=False)
    return out.getvalue()


def _hang_dir(tmp_path: Path, rank: str = "1") -> Path:
    """A PYTHONPATH entry whose sitecustomize stalls one rank forever before it reaches the harness:
    a real hung worker, as a wedged NCCL init looks from outside."""
    d = tmp_path / "stall"
    d.mkdir()
    (d / "sitecustomize.py").write_text(
        "import os, time\n"
        f"if os.environ.get('RANK') == '{rank}' and 'NCCLPROBE_BENCH_PARENT' in os.environ:\n"
        f"    open({str(tmp_path / 'stalled.pid')!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(3600)\n")
    return d




@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    os.environ["NCCL_ALGO"] = "Tree"  # inherited: must not reach the workers ("defaults" means defaults)
    nvls = os.environ.get("NCCL_NVLS_ENABLE")
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # a site's safety policy (NVLink multicast off): must stay
    old_tmp, tempfile.tempdir = tempfile.tempdir, str(tmp)  # where the driver's own directory goes
    figures, real_figure = [], plot.figure

    def recording(*a, **k):  # the seam: the texts of the figure the command saves
        fig = real_figure(*a, **k)
        figures.append([t.get_text() for t in fig.texts])
        return fig
    plot.figure = recording
    try:
        result = command.bench_command(
            **SMALL, proto="LL", algo="", configs=("chan:NCCL_MAX_NCHANNELS=4,NCCL_BUFFSIZE=1048576",),
            envs=("NCCL_DEBUG=WARN",), plot=str(tmp / "lat.png"), keep=True)
        result.data["figure_texts"] = figures
    finally:
        plot.figure = real_figure
        del os.environ["NCCL_ALGO"]
        if nvls is None:
            del os.environ["NCCL_NVLS_ENABLE"]
        else:
            os.environ["NCCL_NVLS_ENABLE"] = nvls
        tempfile.tempdir = old_tmp
    return result, tmp


def _bench_dirs(tmp: Path) -> list[Path]:
    return list(tmp.glob("ncclprobe-bench-*"))


def test_matrix_runs_every_config_in_a_fresh_worker_set(matrix_run):
    result, _ = matrix_run
    configs = result.data["configs"]
    assert [c["name"] for c in configs] == ["defaults", "proto=LL", "chan"]
    assert [c["status"] for c in configs] == ["ok", "ok", "ok"]
    pid_sets = [set(c["pids"]) for c in configs]
    assert all(len(p) == 2 for p in pid_sets)
    assert not (pid_sets[0] & pid_sets[1]) and not (pid_sets[1] & pid_sets[2]) and not (pid_sets[0] & pid_sets[2])
    for c in configs:  # the pid each worker reports for itself is the one the driver started
        assert sorted(w["pid"] for w in c["workers"]) == sorted(c["pids"])
        assert [w["state"] for w in c["workers"]] == ["done", "done"]


def test_each_worker_reports_the_environment_it_ran_with(matrix_run):
    result, _ = matrix_run
    by_name = {c["name"]: c for c in result.data["configs"]}
    for c in by_name.values():
        for w in c["workers"]:
            assert w["env"]["NCCL_DEBUG"] == "WARN"          # --env reaches every configuration
            assert "NCCL_ALGO" not in w["env"]               # the inherited value was dropped
            assert w["env"]["NCCL_NVLS_ENABLE"] == "0"       # the site's NVLS policy was kept
    assert all("NCCL_PROTO" not in w["env"] for w in by_name["defaults"]["workers"])
    assert all(w["env"]["NCCL_PROTO"] == "LL" for w in by_name["proto=LL"]["workers"])
    assert all(w["env"]["NCCL_MAX_NCHANNELS"] == "4" and w["env"]["NCCL_BUFFSIZE"] == "1048576"
               for w in by_name["chan"]["workers"])
    assert by_name["chan"]["env"] == {"NCCL_DEBUG": "WARN", "NCCL_MAX_NCHANNELS": "4", "NCCL_BUFFSIZE": "1048576"}
    assert result.data["dropped_env"] == ["NCCL_ALGO"]


def test_json_schema(matrix_run):
    result, _ = matrix_run
    doc = json.loads(json.dumps(result.to_json(), default=str))
    assert doc["schema"] == "ncclprobe/2" and doc["command"] == "bench"
    for key in ("topology", "configs", "recommendation", "backend", "label", "nranks", "sizes", "basis"):
        assert key in doc
    assert doc["label"] == "CPU/gloo" and doc["basis"] == "eager" and doc["nranks"] == 2
    assert doc["sizes"] == [1024, 4096]
    for c in doc["configs"]:
        assert set(c) >= {"name", "env", "status", "realized", "results"}
        assert c["status"] in ("ok", "wrong", "hang", "error")
        assert c["realized"] == {"available": False, "reason": "gloo: no NCCL", "per_size": {}, "per_size_modes": {},
                                 "timing": None, "per_size_gpu_us": {}, "gpu_note": ""}
        assert {(r["bytes"], r["mode"], r["inplace"]) for r in c["results"]} == {
            (b, "eager", ip) for b in (1024, 4096) for ip in (False, True)}
        for r in c["results"]:
            assert set(r) >= {"bytes", "time_us", "algbw", "busbw", "wrong", "mode"}
            assert r["wrong"] == 0 and r["time_us"] > 0
            assert r["busbw"] == pytest.approx(r["algbw"] * 1.0)  # 2(n-1)/n = 1 at n=2
            assert r["algbw"] == pytest.approx(r["bytes"] / 1e9 / (r["time_us"] / 1e6))
    rec = doc["recommendation"]
    assert rec["applicable"] is False and "gloo" in rec["reason"]


def test_text_says_cpu_gloo_and_never_gpu(matrix_run):
    result, _ = matrix_run
    text = _text(result)
    assert text.startswith("bench: all_reduce on CPU/gloo, 2 ranks: CPU numbers, not GPU or NCCL numbers")
    assert "CPU/gloo all_reduce time" in text
    assert "No recommendation" in text and "export" not in text
    assert "GPU/NCCL" not in text


def test_gloo_marks_no_fastest_and_says_what_oop_is(matrix_run):
    """On gloo the NCCL configurations are the same all-reduce: a '*' would rank noise. The summary
    says the configurations do not apply, and 'oop' is spelled out next to the columns."""
    result, _ = matrix_run
    text = _text(result, width=400)
    table = text.split("defaults: (NCCL defaults)")[0]
    assert " *" not in table and "fastest correct" not in table
    assert "NCCL configurations do not apply to gloo" in table and "no fastest is marked" in table
    assert "out-of-place = copy + in-place all_reduce" in table
    # one line per configuration; the per-size rows were streamed while measured, not repeated here
    assert "proto=LL: NCCL_DEBUG=WARN NCCL_PROTO=LL; ok, 2 sizes in " in text
    assert "algo/proto" not in text  # gloo: nothing to say about NCCL's choice


def test_keep_says_where_the_worker_directory_is(matrix_run):
    result, tmp = matrix_run
    (kept,) = _bench_dirs(tmp)
    assert result.data["workdir"] == str(kept)
    assert f"kept in {kept}" in _text(result, width=400)
    assert (kept / "00-defaults" / "rank0.log").is_file()


def test_plot_file_is_a_png_that_says_gloo_numbers_cannot_differ(matrix_run):
    result, tmp = matrix_run
    png = tmp / "lat.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.data["plot"] == str(png)
    assert result.data["figure_texts"] == [[command.GLOO_PLOT_CAVEAT]]  # on the image itself


def _corrupt_dir(tmp_path: Path) -> Path:
    """A PYTHONPATH entry whose sitecustomize makes rank 1's all-reduce return garbage in half the
    elements (as forced LL128 over PCIe can)."""
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1' and 'NCCLPROBE_BENCH_PARENT' in os.environ:\n"
        "    import torch, torch.distributed as dist\n"
        "    real = dist.all_reduce\n"
        "    def all_reduce(t, *a, **k):\n"
        "        work = real(t, *a, **k)\n"
        "        if t.dtype == torch.bfloat16:\n"
        "            t[::2] += 1000\n"
        "        return work\n"
        "    dist.all_reduce = all_reduce\n")
    return d


@pytest.fixture(scope="module")
def hang_then_corrupt(tmp_path_factory):
    """One run for both failure paths (keeps the file fast): defaults, a configuration that hangs, then
    one that returns wrong results, which also shows that the matrix goes on after a hang."""
    tmp = tmp_path_factory.mktemp("fail")
    stall, bad = _hang_dir(tmp), _corrupt_dir(tmp)
    # the timeout is every configuration's: on two loaded cores, two ranks that import torch need more
    # than 10 s (the healthy ones were killed as hung); the stuck one waits it out, whatever it is
    result = command.bench_command(**dict(SMALL, maxbytes="1K", timeout=HANG_TIMEOUT_S), proto="", algo="",
                                   configs=(f"stuck:PYTHONPATH={stall}", f"bad:PYTHONPATH={bad}"),
                                   workdir=tmp / "work")
    return result, tmp


def test_hung_configuration_is_killed_and_the_rest_go_on(hang_then_corrupt):
    result, tmp = hang_then_corrupt
    status = {c["name"]: c for c in result.data["configs"]}
    assert status["stuck"]["status"] == "hang"
    assert status["stuck"]["reason"] == (f"killed after the {HANG_TIMEOUT_S:g} s timeout; ranks not finished: 0; "
                                         "ranks that never reached the harness: 1")
    assert status["defaults"]["status"] == "ok" and status["bad"]["status"] == "wrong"  # it ran after
    stalled = int((tmp / "stalled.pid").read_text())
    assert stalled in status["stuck"]["pids"]
    assert not any(alive(p) for c in status.values() for p in c["pids"])
    assert "hang" in _text(result)
    assert result.exit_code() == 0  # something was measured: a hang is a status, not a failure to examine


def test_corrupted_results_make_the_configuration_wrong(hang_then_corrupt):
    """A configuration whose all-reduce returns garbage on one rank is marked wrong, counted per size,
    and never recommended."""
    result, _ = hang_then_corrupt
    bad = {c["name"]: c for c in result.data["configs"]}["bad"]
    assert bad["status"] == "wrong"
    assert {r["wrong"] for r in bad["results"]} == {256}  # half of 512 elements, one rank's view
    assert result.data["recommendation"]["scores_us"].keys() == {"defaults"}
    assert "WRONG" in _text(result)


def test_torchrun_style_job_mode(tmp_path):
    """Started as ranks of a job (RANK/WORLD_SIZE/MASTER_* set, as torchrun does): each process runs one
    rank per configuration, rank 0 reports."""
    port = driver._free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TMPDIR=str(tmp_path))
        procs.append(subprocess.Popen([sys.executable, "-m", "ncclprobe", "bench", "--backend", "gloo",
                                       "--proto", "LL", "--algo", "", "-b", "2K", "-e", "2K", "-n", "2",
                                       "-w", "1", "--json", "--timeout", "60"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    lead, other = json.loads(outs[0][0]), json.loads(outs[1][0])
    assert lead["nranks"] == 2 and [c["status"] for c in lead["configs"]] == ["ok", "ok"]
    assert lead["sizes"] == [2048]
    assert other["rank"] == 1 and "configs" in other and "recommendation" not in other


def test_fewer_gpus_than_asked_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(command, "_visible_gpus", lambda: 1)
    with pytest.raises(Unexaminable, match="asked for 2 GPUs but only 1 are visible"):
        command.bench_command(gpus=2)


def test_no_gpu_points_to_gloo(monkeypatch):
    monkeypatch.setattr(command, "_visible_gpus", lambda: 0)
    with pytest.raises(Unexaminable) as err:
        command.bench_command(gpus=1)
    assert err.value.reason == "no_gpu" and "--backend gloo" in err.value.data["hint"]


def test_plot_without_matplotlib_fails_before_measuring(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(AssignmentError, match="matplotlib"):
        command.bench_command(**SMALL, plot="x.png")


def _no_measuring(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("measured although the command line was unusable")
    monkeypatch.setattr(driver, "run_matrix", boom)


def test_without_torch_exit_3_with_the_install_line_before_any_worker(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)  # find_spec says: not installed
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _no_measuring(monkeypatch)
    with pytest.raises(Unexaminable) as err:
        command.bench_command(**SMALL)
    assert err.value.reason == "no_torch"
    assert err.value.data["hint"] == "install the bench extra: pip install 'ncclprobe[bench]'"
    res = CliRunner().invoke(main, ["bench", "--backend", "gloo"])
    assert res.exit_code == 3 and "install the bench extra: pip install 'ncclprobe[bench]'" in res.output
    res = CliRunner().invoke(main, ["bench", "--gpus", "1", "--json"])  # the NCCL path says the same
    assert res.exit_code == 3 and json.loads(res.stdout)["error"]["reason"] == "no_torch"
    assert _bench_dirs(tmp_path) == []


def test_every_configuration_failing_is_exit_3_and_visible(monkeypatch, tmp_path):
    """Workers that cannot import torch (an interpreter without the bench extra): nothing was measured,
    so no 'No findings.' and no exit 0; the worker directory is removed and --keep is offered."""
    notorch = tmp_path / "notorch"
    notorch.mkdir()
    (notorch / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    result = command.bench_command(**dict(SMALL, maxbytes="1K"), proto="LL", algo="",
                                   envs=(f"PYTHONPATH={notorch}",))
    assert [c["status"] for c in result.data["configs"]] == ["error", "error"]
    assert all("ModuleNotFoundError" in c["reason"] for c in result.data["configs"])
    assert result.exit_code() == 3
    assert result.data["error"]["reason"] == "nothing_measured"
    text = _text(result)
    assert "nothing was measured: every configuration ended in error or hang" in text
    assert "No findings." not in text and "Recommendation" not in text
    assert "pip install 'ncclprobe[bench]'" in text
    assert "run again with --keep" in text and result.data["workdir"] is None
    assert _bench_dirs(tmp_path) == []


@pytest.mark.parametrize("plot,why", [("/nonexistent/x.png", "directory /nonexistent does not exist"),
                                      ("{tmp}/file/x.png", "does not exist"),
                                      ("{tmp}", "is a directory")])
def test_unwritable_plot_path_is_a_usage_error_before_measuring(monkeypatch, tmp_path, plot, why):
    (tmp_path / "file").write_text("")
    plot = plot.format(tmp=tmp_path)
    _no_measuring(monkeypatch)
    with pytest.raises(AssignmentError, match=why):
        command.bench_command(**SMALL, plot=plot)
    res = CliRunner().invoke(main, ["bench", "--backend", "gloo", "--plot", "/nonexistent/x.png"])
    assert res.exit_code == 2 and "does not exist" in res.output


@pytest.mark.parametrize("args", [["--backend", "gloo", "--ranks", "0"], ["--backend", "gloo", "--ranks", "-2"],
                                  ["--backend", "gloo", "--gpus", "0"], ["--gpus", "0"], ["--gpus", "-1"]])
def test_zero_or_negative_ranks_or_gpus_is_a_usage_error(monkeypatch, args):
    monkeypatch.setattr(command, "_visible_gpus", lambda: 4)
    _no_measuring(monkeypatch)
    res = CliRunner().invoke(main, ["bench"] + args)
    assert res.exit_code == 2 and "must be at least 1" in res.output, res.output
    with pytest.raises(AssignmentError, match="--ranks must be at least 1"):
        command.bench_command(backend="gloo", ranks=0)


@pytest.mark.parametrize("args,shown", [
    (["--proto", "LX"], "'LX': NCCL has no such protocol; valid names (any case): LL, LL128, Simple"),
    (["--algo", "Ring,Ringg"], "'Ringg': NCCL has no such algorithm; valid names (any case): Tree, Ring"),
    (["--config", "x:NCCL_PROTO=^LL129"], "unknown name 'LL129'"),
    (["--env", "NCCL_ALGO=allreduce:tree;allgather:rink"], "unknown name 'rink'")])
def test_unknown_proto_or_algo_is_a_usage_error(monkeypatch, args, shown):
    _no_measuring(monkeypatch)
    res = CliRunner().invoke(main, ["bench", "--backend", "gloo"] + args)
    assert res.exit_code == 2 and shown in " ".join(res.output.split()), res.output


def test_proto_and_algo_names_are_case_insensitive_in_nccls_spelling():
    cfgs = matrix.build_matrix("ll128,SIMPLE", "ring,nvlstree", ["x:NCCL_PROTO=^ll128", "y:NCCL_ALGO=^nvls"])
    assert [(c.name, c.env) for c in cfgs[1:5]] == [
        ("proto=LL128", {"NCCL_PROTO": "LL128"}), ("proto=Simple", {"NCCL_PROTO": "Simple"}),
        ("algo=Ring", {"NCCL_ALGO": "Ring"}), ("algo=NVLSTree", {"NCCL_ALGO": "NVLSTree"})]
    with pytest.raises(AssignmentError, match="unique"):
        matrix.build_matrix("LL,ll", "")


def _doc_data(nranks, backend="nccl"):
    def cfg(name, t):
        return {"name": name, "env": {}, "status": "ok", "reason": "", "out_of_place": None, "seconds": 1.0,
                "realized": {"available": False, "reason": "x", "per_size": {}},
                "results": [{"bytes": 1024, "count": 512, "mode": "eager", "inplace": ip, "time_us": t,
                             "algbw": 1.0, "busbw": 1.0, "wrong": 0, "note": ""} for ip in (False, True)]}
    return {"configs": [cfg("defaults", 20.0), cfg("proto=LL", 10.0)], "options": dict(
        dtype="bf16", iters=2, warmup=1, graph=False, check=True, timeout=60.0), "sizes": [1024],
        "device": "GPU", "versions": {"torch": "t", "nccl": "n"}, "dropped_env": [], "projection": None,
        "recommendation": {"config": None, "reason": "r"}, "incomplete": False, "interrupted": None,
        "notes": []}


@pytest.mark.parametrize("backend,nranks,marked", [("nccl", 4, True), ("nccl", 1, False), ("gloo", 4, False)])
def test_fastest_is_marked_only_where_nccl_settings_can_differ(backend, nranks, marked):
    ctx = Context(backend, nranks, "eager", "CPU/gloo" if backend == "gloo" else "GPU/NCCL")
    text = _text(command.Result("bench", doc=summary.document(ctx, _doc_data(nranks), {})), width=400)
    assert ("10.00 *" in text) is marked and ("* = fastest correct configuration" in text) is marked


def test_help_imports_neither_torch_nor_nvml():
    code = ("import sys; from click.testing import CliRunner; from ncclprobe.cli import main; "
            "import ncclprobe.bench, ncclprobe.topo; r = CliRunner().invoke(main, ['bench', '--help']); "
            "assert r.exit_code == 0, r.output; print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- pure parts -------------------------------------------------------------------------------

@pytest.mark.parametrize("n,factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_formula(n, factor):
    assert allreduce.bus_factor(n) == pytest.approx(factor)
    assert allreduce.algbw(2_000_000_000, 0.5) == pytest.approx(4.0)
    assert allreduce.busbw(2_000_000_000, 0.5, n) == pytest.approx(4.0 * factor)


def test_check_pattern_is_exact_in_bf16_for_8_ranks():
    assert [allreduce.expected_value(8, i) for i in range(4)] == [36, 72, 108, 36]
    assert sum(allreduce.rank_value(r, 1) for r in range(8)) == allreduce.expected_value(8, 1)


def test_sizes_and_matrix():
    assert matrix.parse_size("64M") == 64 << 20 and matrix.parse_size("1k") == 1024
    assert matrix.sweep(1024, 64 << 20, 4, 2) == [1 << p for p in range(10, 27, 2)]
    assert matrix.sweep(3, 3, 2, 2) == [2]
    assert matrix.model_sizes(7168, [1, 8], "bf16") == {1: 14336, 8: 114688}
    names = [c.name for c in matrix.build_matrix("LL,LL128,Simple", "Ring,Tree", ["p2p:NCCL_P2P_LEVEL=SYS"])]
    assert names == ["defaults", "proto=LL", "proto=LL128", "proto=Simple", "algo=Ring", "algo=Tree", "p2p"]
    with pytest.raises(AssignmentError):
        matrix.parse_config("noequals")
    with pytest.raises(AssignmentError):
        matrix.build_matrix("LL", "", ["proto=LL:NCCL_PROTO=LL"])


def test_worker_env_precedence_and_dropped_inherited():
    env, dropped = driver.worker_env({"NCCL_PROTO": "LL128", "NCCL_SOCKET_IFNAME": "eth0", "HOME": "/h"},
                                     {"NCCL_BUFFSIZE": "1"}, matrix.Config("x", {"NCCL_BUFFSIZE": "2"}),
                                     {"RANK": "0"})
    assert env == {"NCCL_SOCKET_IFNAME": "eth0", "HOME": "/h", "NCCL_BUFFSIZE": "2", "RANK": "0"}
    assert dropped == ["NCCL_PROTO"]


def test_job_from_env():
    assert driver.job_from_env({}) is None
    job = driver.job_from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0",
                               "MASTER_PORT": "1234"})
    assert (job.rank, job.nranks, job.local_rank, job.master_addr, job.master_port) == (3, 8, 1, "n0", 1234)
    slurm = driver.job_from_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
                                 "MASTER_ADDR": "n0"})
    assert (slurm.rank, slurm.nranks) == (2, 4)
    assert driver.job_from_env({"RANK": "0", "WORLD_SIZE": "2", "NCCLPROBE_BENCH_PARENT": "1"}) is None


def _write_events(d: Path, events):
    d.mkdir(parents=True)
    with open(d / "host-1.jsonl", "w") as fh:
        for e in events:
            fh.write(json.dumps({"ev": "coll_summary", "t": 1.0, "host": "h", "pid": 1, "src": "profiler",
                                 "comm_hash": "0x1", "func": "AllReduce", "nchannels": 1, "count": 20, **e}) + "\n")


def test_realized_from_profiler_events_and_mismatch(tmp_path):
    _write_events(tmp_path / "events", [{"algo": "Ring", "proto": "LL", "bytes_min": 1024, "bytes_max": 65536},
                                        {"algo": "Ring", "proto": "Simple", "bytes_min": 1 << 20,
                                         "bytes_max": 1 << 20}])
    ctx = Context("nccl", 4, "graph", "GPU/NCCL")
    real = report.realized(ctx, str(tmp_path), [1024, 1 << 20, 4 << 20], "")
    # NCCL's own spelling, as the model keeps it; no mode (no API event), no GPU timing (no comm_activity)
    assert real["per_size"] == {1024: "Ring/LL", 1 << 20: "Ring/Simple", 4 << 20: None}
    assert real["per_size_modes"] == {1024: {"unknown": 20}, 1 << 20: {"unknown": 20}, 4 << 20: {}}
    assert (real["timing"], real["per_size_gpu_us"]) == (None, {})
    found = report.mismatch_findings("proto=LL", {"NCCL_PROTO": "LL"}, real, [11, 12])
    assert [(f.code, f.severity, f.var) for f in found] == [("ALGO_PROTO_MISMATCH", "error", "NCCL_PROTO")]
    assert found[0].evidence["realized"] == {1 << 20: "Ring/Simple"}
    assert report.mismatch_findings("algo=Ring", {"NCCL_ALGO": "ring"}, real, []) == []


def test_realized_unknown_reasons(tmp_path):
    one = Context("nccl", 1, "graph", "GPU/NCCL")
    assert "short-cuts" in report.realized(one, str(tmp_path), [1024], "")["reason"]
    four = Context("nccl", 4, "graph", "GPU/NCCL")
    assert report.realized(four, str(tmp_path), [1024], "the probe library is not built (x)")["reason"] == \
        "the probe library is not built (x)"
    (tmp_path / "events").mkdir()
    assert "no all-reduce coll_summary" in report.realized(four, str(tmp_path), [1024], "")["reason"]


# the simulated NCCL's Ring/Simple all-reduce on 2 ranks (probes/simnccl/profiler.c simKernelNs): 7 us + n / 100 B/ns
def sim_ns(n: int) -> int:
    return 7000 + n // 100

SIM_BENCH = """
import os, sys
from pathlib import Path
from ncclprobe.demo.ops import SimOps
eager, captured, replays = [int(x) for x in sys.argv[1].split(",") if x], int(sys.argv[2]), int(sys.argv[3])
ops = SimOps(0, Path("."))
comm = ops.init_ctypes(2, "cd" * 128, 0)
for n in eager:
    for _ in range(5):
        ops.all_reduce(comm, n)
if captured:
    graph = ops.capture_all_reduce(comm, captured)
    for _ in range(replays):
        ops.replay(graph)
ops.nccl.ncclprobeSimSynchronize()
ops.close()
"""


def _sim_events(tmp_path: Path, eager: list[int], captured: int, replays: int, **env) -> Path:
    """A bench configuration's events directory as the real probe library (the installed
    libncclprobe.so, NCCL's profiler plugin) writes it under the simulated NCCL."""
    from ncclprobe.witnesses import probelib
    check = probelib.self_check()
    assert check.ok, check.reason
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCLPROBE_", "NCCL_"))}
    full = {**base, "NCCLPROBE_DIR": str(tmp_path / "events"), "NCCL_PROFILER_PLUGIN": check.path,
            "NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", **env}
    p = subprocess.run([sys.executable, "-c", SIM_BENCH, ",".join(map(str, eager)), str(captured), str(replays)],
                       env=full, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    return tmp_path


def _realized_schema_errors(real) -> list:
    from referencing import Registry, Resource
    from ncclprobe import schemas
    registry = Registry().with_resources((f.name, Resource.from_contents(schemas.load(f.name)))
                                         for f in schemas.DIR.glob("*.json"))
    doc = json.loads(json.dumps(real))  # keys become text, as in --json
    import jsonschema
    return list(jsonschema.Draft202012Validator({"$ref": "bench.json#/$defs/realized"}, registry=registry)
                .iter_errors(doc))


def test_realized_counts_launch_modes_and_gpu_time_per_size_through_the_model(tmp_path):
    """The accounting `report` uses, on the real plugin's counts: eager calls at 4K, a graph captured at
    64K and replayed 3 times (seen with GPU timing), GPU time per call within one 1/8-octave bin."""
    pytest.importorskip("jsonschema")
    d = _sim_events(tmp_path, [4096], 65536, 3, NCCLPROBE_GPU_TIMING="1")
    ctx = Context("nccl", 2, "graph", "GPU/NCCL")
    real = report.realized(ctx, str(d), [4096, 65536, 1 << 20], "")
    assert real["available"] and real["timing"] == "gpu" and real["gpu_note"] == ""
    assert real["per_size"] == {4096: "Ring/Simple", 65536: "Ring/Simple", 1 << 20: None}
    assert real["per_size_modes"] == {4096: {"eager": 5}, 65536: {"replayed": 3}, 1 << 20: {}}
    for size, calls in ((4096, 5), (65536, 3)):
        g = real["per_size_gpu_us"][size]
        expected_us = sim_ns(size) / 1e3
        assert g["calls"] == calls and abs(g["median"] - expected_us) <= 0.0625 * expected_us
        assert g["p90"] >= g["median"]
    assert real["per_size_gpu_us"][1 << 20] is None
    assert _realized_schema_errors(real) == []
    lines = report.realized_lines(real)
    assert lines[0] == "NCCL ran (profiler): Ring/Simple at 4K-64K, unknown at 1M"
    assert lines[1] == "launched (profiler): eager at 4K, replayed at 64K, unknown at 1M"
    assert re.fullmatch(r"GPU time per call \(profiler, longest channel, median/p90 µs\): "
                        r"4K [67]\.\d\d/[67]\.\d\d, 64K 7\.\d\d/[78]\.\d\d", lines[2]), lines[2]


def test_realized_without_gpu_timing_sees_the_capture_once_and_no_replay(tmp_path):
    d = _sim_events(tmp_path, [4096], 65536, 3)
    real = report.realized(Context("nccl", 2, "graph", "GPU/NCCL"), str(d), [4096, 65536], "")
    assert real["timing"] == "off" and real["per_size_gpu_us"] == {}
    assert real["per_size_modes"] == {4096: {"eager": 5}, 65536: {"captured": 1}}
    assert report.realized_lines(real)[1] == "launched (profiler): eager at 4K, captured at 64K"


def test_sizes_in_one_profiler_bucket_get_no_gpu_time_and_say_why(tmp_path):
    """--hidden 7168: 3 and 4 tokens are 42K and 56K, one power-of-two bucket of the plugin's: their
    times are mixed there, so neither gets one; 14K keeps its own."""
    d = _sim_events(tmp_path, [14336, 43008, 57344], 0, 0, NCCLPROBE_GPU_TIMING="1")
    real = report.realized(Context("nccl", 2, "graph", "GPU/NCCL"), str(d), [14336, 43008, 57344], "")
    assert real["per_size_gpu_us"][43008] is None and real["per_size_gpu_us"][57344] is None
    assert real["per_size_gpu_us"][14336]["calls"] == 5
    assert real["gpu_note"] == ("sizes 42K, 56K share the profiler's power-of-two buckets with the same "
                                "algorithm/protocol: no GPU time per size for them")
    assert real["per_size"][43008] == real["per_size"][57344] == "Ring/Simple"


def _cfg(name, env, times, status="ok"):
    return {"name": name, "env": env, "status": status,
            "results": [{"bytes": b, "mode": "graph", "inplace": False, "time_us": t} for b, t in times.items()]}


def test_recommendation_gain_and_export():
    ctx = Context("nccl", 8, "graph", "GPU/NCCL")
    configs = [_cfg("defaults", {}, {1024: 24.0, 4096: 25.0}),
               _cfg("proto=LL", {"NCCL_PROTO": "LL"}, {1024: 12.0, 4096: 12.5}),
               _cfg("proto=LL128", {"NCCL_PROTO": "LL128"}, {1024: 1.0, 4096: 1.0}, status="wrong")]
    rec = report.recommend(ctx, configs, [1024, 4096], {"NCCL_DEBUG": "WARN"})
    assert rec["config"] == "proto=LL" and rec["gain"] == pytest.approx(2.0) and rec["applicable"]
    assert rec["export"] == "export NCCL_DEBUG=WARN NCCL_PROTO=LL"
    one = report.recommend(Context("nccl", 1, "graph", "GPU/NCCL"), configs, [1024], {})
    assert one["applicable"] is False and "not interconnect" in one["reason"]
    same = report.recommend(ctx, [_cfg("defaults", {}, {1024: 10.0}), _cfg("x", {"A": "1"}, {1024: 9.95})],
                            [1024], {})
    assert same["config"] == "defaults" and same["export"] == ""


def test_projection_break_even():
    ctx = Context("nccl", 8, "graph", "GPU/NCCL")
    proj = report.projection(ctx, [_cfg("defaults", {}, {14336: 20.0, 28672: 30.0})], {1: 14336, 2: 28672}, 61)
    row = proj["rows"][0]
    assert proj["allreduces_per_forward"] == 122
    assert row["per_forward_us"] == {1: pytest.approx(2440.0), 2: pytest.approx(3660.0)}
    assert row["break_even"] == {2: pytest.approx(1.5)}


def test_speculation_projection_the_seed_s_numbers():
    """The seed: plain decoding at 12 ms a token, a 2-step verify (3 tokens) accepting ~2.1: break-even
    cycle 25.2 ms; the communication floor adds (comm(3) - comm(1)) per forward to the step."""
    ctx = Context("nccl", 8, "graph", "GPU/NCCL")
    spec = report.projection_options(7168, "2.1", 12.0).fitted([1, 2, 3, 4])
    assert spec.accept == {3: 2.1, 4: 2.1}  # a 2-token verify step cannot accept 2.1 tokens
    times = {14336: 20.0, 28672: 24.0, 43008: 30.0, 57344: 29.0}
    proj = report.projection(ctx, [_cfg("defaults", {}, times)], {1: 14336, 2: 28672, 3: 43008, 4: 57344}, 61, spec)
    row = proj["rows"][0]
    assert proj["step_ms"] == 12.0 and proj["plain_tok_s"] == 83.333
    assert proj["break_even_verify_ms"] == {3: pytest.approx(25.2), 4: pytest.approx(25.2)}
    assert row["comm_of_step"] == pytest.approx(122 * 20.0 / 1e3 / 12, abs=1e-6)
    assert row["verify_ms"] == {2: pytest.approx(12 + 122 * 4.0 / 1e3), 3: pytest.approx(12 + 122 * 10.0 / 1e3),
                                4: pytest.approx(12 + 122 * 9.0 / 1e3)}
    assert row["tok_s"][3] == pytest.approx(1e3 * 2.1 / row["verify_ms"][3], abs=1e-3)
    assert row["speedup"][3] == pytest.approx(row["tok_s"][3] / (1000 / 12), abs=1e-4)
    # per-k acceptance, and a width whose communication reads lower than one token's (noise): no saving
    per_k = report.projection_options(7168, "2:1.6, 4:2.5", 12.0).fitted([1, 2, 4])
    proj = report.projection(ctx, [_cfg("defaults", {}, {14336: 20.0, 28672: 19.0, 57344: 30.0})],
                             {1: 14336, 2: 28672, 4: 57344}, None, per_k)
    assert proj["accept_len"] == {2: 1.6, 4: 2.5} and proj["rows"][0]["verify_ms"][2] == 12.0


def test_speculation_text(monkeypatch):
    ctx = Context("nccl", 8, "graph", "GPU/NCCL")
    spec = report.projection_options(7168, "2.1", 12.0).fitted([1, 3])
    proj = report.projection(ctx, [_cfg("defaults", {}, {14336: 20.0, 43008: 30.0}),
                                   _cfg("proto=LL", {"NCCL_PROTO": "LL"}, {14336: 200.0, 43008: 300.0})],
                             {1: 14336, 3: 43008}, 61, spec)
    text = "\n".join(str(getattr(n, "text", "")) + " ".join(map(str, getattr(n, "rows", [])))
                     for n in summary._projection_nodes(proj, {1: 14336, 3: 43008}, "GPU/NCCL"))
    assert "plain decoding at D = 12 ms a token, 83.3 tok/s" in text
    assert "k=3 25.2 ms" in text
    assert "a 3-token verify step costs 13.22 ms (defaults)" in text
    assert "exceeds --step-ms 12 for proto=LL" in text


@pytest.mark.parametrize("args,shown", [
    (["--accept-len", "2"], "need --hidden"),
    (["--hidden", "64", "--accept-len", "2"], "--accept-len needs --step-ms"),
    (["--hidden", "64", "--step-ms", "0"], "positive number of milliseconds"),
    (["--hidden", "64", "--step-ms", "nan"], "positive number of milliseconds"),
    (["--hidden", "64", "--tokens", "2,3", "--step-ms", "12"], "must include 1"),
    (["--hidden", "64", "--step-ms", "12", "--accept-len", "5"], "no verify width in --tokens (2, 3, 4)"),
    (["--hidden", "64", "--step-ms", "12", "--accept-len", "3:3.5"], "accepts at most 3 tokens"),
    (["--hidden", "64", "--step-ms", "12", "--accept-len", "7:2"], "7 is not a verify width"),
    (["--hidden", "64", "--step-ms", "12", "--accept-len", "two"], "expected a number such as 2.1"),
    (["--hidden", "64", "--step-ms", "12", "--accept-len", "0.5"], "accepts at least 1 token"),
    (["--gpu-timing"], "a gloo all-reduce has none"),
])
def test_projection_and_timing_options_are_usage_errors_before_measuring(monkeypatch, args, shown):
    monkeypatch.setattr(command, "_require_torch", lambda: pytest.fail("got past the usage checks"))
    r = CliRunner().invoke(main, ["bench", "--backend", "gloo", *args])
    assert r.exit_code == 2 and shown in r.output, r.output


def test_recommendation_ignores_a_winner_that_ran_what_nccl_already_picked():
    """Seen on 2 H200s: algo=Ring 'won' by 1.06x while the defaults also ran RING/LL at every size."""
    from ncclprobe.bench import report as rep

    def cfg(name, us, per_size, env):
        res = [{"bytes": 1024, "mode": "graph", "inplace": False, "time_us": us}]
        return {"name": name, "status": "ok", "results": res, "env": env,
                "realized": {"available": True, "per_size": per_size}}

    ctx = rep.Context("nccl", 2, "graph", "GPU/NCCL")
    for key in (1024, "1024"):  # as realized() builds it, and as JSON reads it back
        same = [cfg("defaults", 13.3, {key: "RING/LL"}, {}), cfg("algo=Ring", 12.0, {key: "RING/LL"}, {"NCCL_ALGO": "Ring"})]
        rec = rep.recommend(ctx, same, [1024], {})
        assert rec["config"] == "defaults" and rec["export"] == "" and rec["same_as_defaults"] == "algo=Ring"
    assert "run-to-run noise" in rep.recommendation_text(rec, "GPU/NCCL")[0]
    other = [cfg("defaults", 13.3, {"1024": "RING/LL"}, {}), cfg("algo=Tree", 12.0, {"1024": "TREE/LL"}, {"NCCL_ALGO": "Tree"})]
    rec = rep.recommend(ctx, other, [1024], {})
    assert rec["config"] == "algo=Tree" and rec["export"] == "export NCCL_ALGO=Tree"


def test_a_configuration_variable_outside_the_watched_set_is_shown_by_name_only():
    from ncclprobe.model.watched import shown_values
    assert shown_values({"NCCL_PROTO": "LL", "HF_TOKEN": "hf_secret"}) == {"NCCL_PROTO": "LL", "HF_TOKEN": "<redacted>"}
