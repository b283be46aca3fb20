"""JSON is a contract: every command's --json output, produced for real (real process trees, the demo's
server, gloo workers, throwaway venvs, NVML fakes through the CLI), validates against the schema
ncclprobe ships for it; the schemas document every key, and their enums are the code's own lists."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from boot_support import clean_env, make_venv, run as run_python
from fake_nvml import LIBRARY_NOT_FOUND, FakeNvml, lost_scenario, not_supported_scenario, nvlink_pair, pcie_box
from livetree import running
from ncclprobe import schemas, topo
from ncclprobe.cli import main
from ncclprobe.doc import ERROR_REASONS
from ncclprobe.diagnose.findings import CODES, SEVERITIES

jsonschema = pytest.importorskip("jsonschema")  # the test extra

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
NCCL_LOGS = sorted((Path(__file__).parent / "data" / "nccllog").glob("*.log"))
SCHEMA_FILES = sorted(p.name for p in schemas.DIR.glob("*.json"))


def cli(*args, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*NCCLPROBE, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def valid(doc: dict, schema_file: str) -> dict:
    """doc is the document of a command whose schema is schema_file, and it validates."""
    assert doc["schema"] == "ncclprobe/2"
    assert schemas.FILES.get(doc["command"], schemas.FALLBACK) == schema_file, doc["command"]
    schemas.validate(doc)
    return doc


def output(r: subprocess.CompletedProcess, schema_file: str, code: int | tuple[int, ...]) -> dict:
    """The JSON document on stdout, with the exit code expected, valid against schema_file."""
    assert r.returncode in ((code,) if isinstance(code, int) else code), (r.returncode, r.stderr[-3000:])
    return valid(json.loads(r.stdout), schema_file)


# -- the schemas themselves -------------------------------------------------------------------------

def _walk(node, path=()):
    """Every (path, subschema) of a schema, following properties, $defs and the composition keywords."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            if key in ("properties", "$defs", "patternProperties"):
                for name, sub in value.items():
                    yield from _walk(sub, (*path, key, name))
            elif key in ("items", "additionalProperties", "propertyNames", "not"):
                yield from _walk(value, (*path, key))
            elif key in ("oneOf", "anyOf", "allOf", "prefixItems"):
                for i, sub in enumerate(value):
                    yield from _walk(sub, (*path, key, i))


def test_the_schemas_are_installed_with_the_package_and_each_is_draft_2020_12():
    assert "site-packages" in schemas.DIR.parts, schemas.DIR  # the tests run the installed package
    assert set(SCHEMA_FILES) == {*schemas.FILES.values(), schemas.FALLBACK, "common.json"}
    for name in SCHEMA_FILES:
        schema = schemas.load(name)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", name
        jsonschema.Draft202012Validator.check_schema(schema)


def test_every_command_has_its_schema():
    commands = {name for name, cmd in main.commands.items() if not hasattr(cmd, "commands")}
    commands |= {f"inject {name}" for name in main.commands["inject"].commands}
    assert commands == set(schemas.FILES)


def test_every_description_is_non_empty_and_every_property_and_definition_has_one():
    for name in SCHEMA_FILES:
        schema = schemas.load(name)
        assert schema.get("description", "").strip(), name
        for path, node in _walk(schema):
            if "description" in node:
                assert isinstance(node["description"], str) and node["description"].strip(), (name, path)
            if len(path) >= 2 and path[-2] in ("properties", "$defs", "prefixItems"):
                assert node.get("description", "").strip(), f"{name}: {'/'.join(map(str, path))} has no description"


def test_error_reasons_in_the_schema_are_exactly_the_codes_with_their_meanings():
    reason = schemas.load("error.json")["$defs"]["reason"]
    assert reason["enum"] == list(ERROR_REASONS)
    assert {c["const"]: c["description"] for c in reason["oneOf"]} == ERROR_REASONS
    assert [c["const"] for c in reason["oneOf"]] == list(ERROR_REASONS)


def test_finding_codes_and_severities_in_the_schema_are_the_code_s_own():
    defs = schemas.load("common.json")["$defs"]
    assert defs["finding_code"]["enum"] == list(CODES)
    assert defs["severity"]["enum"] == list(SEVERITIES)


# -- demo, and report / inspect of the demo's log directory ----------------------------------------

@pytest.fixture(scope="module")
def demo():
    r = cli("demo", "--keep", "--json")
    doc = output(r, "demo.json", 0)
    yield doc
    shutil.rmtree(doc["log_dir"], ignore_errors=True)


def test_demo(demo):
    assert demo["ok"] is True and demo["findings"] and demo["communicators"]
    assert {f["severity"] for f in demo["findings"]} >= {"error", "warning"}


def test_report_of_the_demo_s_log_directory(demo):
    doc = output(cli("report", demo["log_dir"], "--json"), "report.json", 1)
    assert doc["communicators"] and doc["runs"] == [] and doc["verdict"]["holders"] == "communicators"
    assert any(c["collectives"] for c in doc["communicators"])
    assert any(p["env_writes"] for p in doc["processes"]) and any(p["nccl_reads"] for p in doc["processes"])


def test_an_undocumented_key_fails(demo):
    """additionalProperties/unevaluatedProperties false: a key nobody documented is an error, at any depth."""
    for where in (lambda d: d, lambda d: d["findings"][0], lambda d: d["findings"][0]["instances"][0],
                  lambda d: d["communicators"][0], lambda d: d["processes"][0],
                  lambda d: next(c for c in d["communicators"] if c["collectives"])["collectives"][0],
                  lambda d: d["verdict"]["variables"][0]["groups"][0]):
        doc = json.loads(json.dumps(demo))
        where(doc)["undocumented"] = 1
        with pytest.raises(jsonschema.ValidationError, match="undocumented"):
            schemas.validate(doc)
    doc = json.loads(json.dumps(demo))
    doc["communicators"][0]["rank"] = "zero"
    with pytest.raises(jsonschema.ValidationError) as err:  # named where it is, not as the whole document
        schemas.validate(doc)
    assert list(err.value.absolute_path) == ["communicators", 0, "rank"]


@pytest.mark.parametrize("log", NCCL_LOGS, ids=lambda p: p.name)
def test_report_of_an_nccl_log(log):
    doc = output(cli("report", "--nccl-log", log, "--json"), "report.json", (0, 1))
    assert doc["processes"] or doc["communicators"]


def test_report_of_an_nccl_log_with_an_expectation():
    output(cli("report", "--nccl-log", NCCL_LOGS[0], "--expect", "NCCL_PROTO=LL", "--json"), "report.json", (0, 1))


def test_report_errors():
    doc = output(cli("report", "/nonexistent/ncclprobe-logs", "--json"), "report.json", 3)
    assert doc["error"]["reason"] == "no_log_directory"
    doc = output(cli("report", "--json"), "report.json", 2)
    assert doc["error"]["reason"] == "usage_error"


# -- inspect of a live tree --------------------------------------------------------------------------

TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-S', '-c', 'import time; time.sleep(60)'],
                         env={'NCCL_ALGO': 'Tree', 'PATH': os.environ.get('PATH', '')})
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture(scope="module")
def tree():
    env = {**os.environ, "NCCL_PROTO": "LL", "MY_SECRET_TOKEN": "planted-secret"}
    with running(TREE, env) as (pid, words):
        yield pid, int(words[0])


def test_inspect_of_a_live_tree(tree):
    root, child = tree
    doc = output(cli("inspect", root, "--scope", "all", "--expect", "NCCL_PROTO=LL", "--json"), "inspect.json", 1)
    rows = {p["pid"]: p for p in doc["processes"]}
    assert rows[root]["exec_env"]["NCCL_PROTO"] == "LL" and rows[child]["exec_env"] == {"NCCL_ALGO": "Tree"}
    assert rows[child]["exec_env_diff"]["removed"] == ["NCCL_PROTO"]
    assert any(f["code"] == "ENV_MISSING" and child in f["pids"] for f in doc["findings"])


def test_inspect_with_every_variable_and_a_missing_pid(tree):
    root, _ = tree
    doc = output(cli("inspect", root, "999999999", "--all-vars", "--json"), "inspect.json", 3)
    assert doc["missing_pids"] == [999999999] and {"pid": 999999999, "reason": "no_such_process",
                                                  "given": True} in doc["skipped"]
    assert {p["pid"]: p for p in doc["processes"]}[root]["exec_env"]["MY_SECRET_TOKEN"] == "<redacted>"


def test_inspect_with_the_demo_s_log_directory_and_an_nccl_log(tree, demo):
    root, _ = tree
    doc = output(cli("inspect", root, "--dir", demo["log_dir"], "--json"), "inspect.json", (0, 1))
    assert doc["communicators"] and doc["in_process"]["dirs"] == [demo["log_dir"]]
    doc = output(cli("inspect", root, "--nccl-log", NCCL_LOGS[0], "--json"), "inspect.json", (0, 1))
    assert doc["communicators"] and doc["in_process"]["dirs"] == []


def test_inspect_errors():
    assert output(cli("inspect", "999999999", "--json"), "inspect.json", 3)["error"]["reason"] == "no_such_process"
    doc = output(cli("inspect", "--bogus", "--json"), "inspect.json", 2)
    assert doc["error"]["reason"] == "usage_error" and "--bogus" in doc["error"]["message"]


# -- run -----------------------------------------------------------------------------------------------

def test_run_with_set_and_expect():
    code = "import os; print(os.environ['NCCL_PROTO']); os.environ['NCCL_ALGO'] = 'Tree'"
    doc = output(cli("run", "--json", "--set", "NCCL_PROTO=LL", "--expect", "NCCL_PROTO=LL", "--",
                     sys.executable, "-c", code), "run.json", (0, 1))
    try:
        assert doc["returncode"] == 0 and doc["exit_status"] == "exited with code 0"
        assert doc["runs"][0]["set"] == {"NCCL_PROTO": "LL"} == doc["injected"]["set"]  # `env K=V CMD`
        assert doc["injected"]["enforced"] == {} and doc["runs"][0]["profile"]["set"] == {}
        writes = [w for p in doc["processes"] for w in p["env_writes"]]
        assert [(w["var"], w["new"]) for w in writes] == [("NCCL_ALGO", "Tree")]
    finally:
        shutil.rmtree(doc["log_dir"], ignore_errors=True)


def test_run_of_a_command_that_cannot_be_found():
    doc = output(cli("run", "--json", "--", "no-such-cmd-ncclprobe"), "run.json", 127)
    if doc.get("log_dir"):
        shutil.rmtree(doc["log_dir"], ignore_errors=True)
    assert doc["error"]["reason"] == "command_not_found"


# -- bench -----------------------------------------------------------------------------------------------

BENCH = ["bench", "--backend", "gloo", "--ranks", "2", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--json"]


def _importable(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def test_bench(tmp_path):
    pytest.importorskip("torch")
    doc = output(cli(*BENCH, env=dict(os.environ, TMPDIR=str(tmp_path))), "bench.json", 0)
    (config,) = doc["configs"]
    assert config["status"] == "ok" and {r["bytes"] for r in config["results"]} == {1024, 4096}
    assert all(r["time_us"] > 0 and r["algbw"] > 0 for r in config["results"])


def test_bench_with_a_projection_a_plot_and_the_workers_kept(tmp_path):
    pytest.importorskip("torch")
    plot = ["--plot", tmp_path / "bench.png"] if _importable("matplotlib") else []
    doc = output(cli("bench", "--backend", "gloo", "--ranks", "2", "--hidden", "256", "--tokens", "1,2",
                     "--layers", "2", "--step-ms", "12", "--accept-len", "2", "-n", "2", "-w", "1", "--keep", *plot,
                     "--json", env=dict(os.environ, TMPDIR=str(tmp_path))), "bench.json", 0)
    assert doc["projection"]["rows"] and doc["workdir"] and (not plot or doc["plot"] == str(plot[1]))
    proj = doc["projection"]
    assert proj["step_ms"] == 12 and proj["accept_len"] == {"2": 2.0} and proj["break_even_verify_ms"] == {"2": 24.0}
    assert set(proj["rows"][0]) >= {"verify_ms", "tok_s", "speedup", "comm_of_step"}
    assert doc["options"]["gpu_timing"] is False


def test_bench_interrupted(tmp_path):
    """SIGINT once rank 1 stalls in the second size: what was measured comes back, marked incomplete."""
    pytest.importorskip("torch")
    stalled = tmp_path / "stalled"
    stall = tmp_path / "stall"
    stall.mkdir()
    (stall / "sitecustomize.py").write_text(
        "import os, time\n"
        "if 'NCCLPROBE_BENCH_PARENT' in os.environ and os.environ.get('RANK') == '1':\n"
        "    import torch.distributed as dist\n"
        "    real = dist.all_reduce\n"
        "    def all_reduce(t, *a, **k):\n"
        "        if t.numel() >= 2048:  # the second size: 4 KB of bf16\n"
        "            import glob\n"
        "            # rank 0 writes the first size's row after this rank left it: wait for that row, so\n"
        "            # the signal finds it measured (else the test raced rank 0's write: one CI failure)\n"
        f"            while not any(os.path.getsize(p) for p in glob.glob({str(tmp_path)!r} + '/**/rows.jsonl', recursive=True)):\n"
        "                time.sleep(0.02)\n"
        f"            open({str(stalled)!r}, 'w').close()\n"
        "            time.sleep(3600)\n"
        "        return real(t, *a, **k)\n"
        "    dist.all_reduce = all_reduce\n")
    proc = subprocess.Popen([*NCCLPROBE, *BENCH, "--env", f"PYTHONPATH={stall}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
    try:
        deadline = time.monotonic() + 120
        while not stalled.exists():  # the worker says so itself: no timing involved
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-3000:]
    doc = valid(json.loads(out), "bench.json")
    assert doc["incomplete"] is True and doc["interrupted"]["config"] == "defaults"
    assert doc["configs"][0]["status"] == "interrupted" and {r["bytes"] for r in doc["configs"][0]["results"]} == {1024}


def test_bench_stopped_before_anything_ran():
    from ncclprobe.bench import command
    valid(command._stopped_before("gloo", signal.SIGINT).to_json(), "bench.json")


def test_bench_usage_error():
    doc = output(cli("bench", "--backend", "gloo", "--gpus", "2", "--json"), "bench.json", 2)
    assert doc["error"]["reason"] == "usage_error"


# -- topo ------------------------------------------------------------------------------------------------

def test_topo_on_this_machine():
    doc = output(cli("topo", "--json"), "topo.json", (0, 1, 3))
    assert "topology" in doc or doc["error"]["reason"] in ("no_nvml", "no_gpu")




@pytest.mark.parametrize("scenario,code", [
    (pcie_box, 0), (nvlink_pair, 0), (lost_scenario, 0), (not_supported_scenario, 0),
    (lambda: FakeNvml([], init_error=LIBRARY_NOT_FOUND), 3), (lambda: FakeNvml([]), 3),
], ids=["pcie_box", "nvlink_pair", "gpu_lost", "not_supported", "no_nvml", "no_gpu"])
def test_topo_on_fake_nvml(monkeypatch, scenario, code):
    monkeypatch.setattr(topo, "NVML_LOADER", scenario)
    res = CliRunner().invoke(main, ["topo", "--json"])
    assert res.exit_code == code, res.output
    valid(json.loads(res.output), "topo.json")


# -- explain ---------------------------------------------------------------------------------------------

def test_explain():
    assert output(cli("explain", "NCCL_PROTO", "--json"), "explain.json", 0)["variable"]["name"] == "NCCL_PROTO"
    assert len(output(cli("explain", "--list", "--json"), "explain.json", 0)["variables"]) > 10
    doc = output(cli("explain", "NCCL_PROTOO", "--json"), "explain.json", 2)
    assert doc["error"]["reason"] == "unknown_variable" and "NCCL_PROTO" in doc["suggestions"]
    assert output(cli("explain", "--json"), "explain.json", 2)["error"]["reason"] == "usage_error"


# -- inject ----------------------------------------------------------------------------------------------

def test_inject_status_of_this_interpreter():
    output(cli("inject", "status", "--json"), "inject.json", 0)


def test_inject_install_status_replace_uninstall_in_a_throwaway_venv(tmp_path):
    py = make_venv(tmp_path / "venv")
    log = tmp_path / "log"
    doc = output(cli("inject", "install", "--python", py, "--set", "NCCL_PROTO=LL", "--pin", "NCCL_PROTO",
                     "--dir", log, "--json"), "inject.json", 0)
    assert doc["installed"] is True and doc["replaced"] is None
    run_python([py, "-c", "pass"], clean_env())
    doc = output(cli("inject", "status", "--python", py, "--json"), "inject.json", 0)
    assert doc["installed"] is True and doc["seen_total"] >= 1
    doc = output(cli("inject", "install", "--python", py, "--set", "NCCL_PROTO=Simple", "--replace", "--dir", log,
                     "--json"), "inject.json", 0)
    assert doc["replaced"]["profile"]["set"] == {"NCCL_PROTO": "LL"}
    assert output(cli("inject", "uninstall", "--python", py, "--json"), "inject.json", 0)["removed"]
    assert output(cli("inject", "uninstall", "--python", py, "--json"), "inject.json", 0)["removed"] == []
    assert output(cli("inject", "status", "--python", py, "--json"), "inject.json", 0)["installed"] is False


def test_inject_into_what_is_not_an_interpreter():
    doc = output(cli("inject", "install", "--python", "/bin/true", "--json"), "inject.json", 3)
    assert doc["error"]["reason"] == "no_interpreter"


# -- usage errors of no command in particular --------------------------------------------------------------

@pytest.mark.parametrize("args", [["--bogus", "--json"], ["no-such-command", "--json"]])
def test_usage_error_of_no_command(args):
    doc = output(cli(*args), "error.json", 2)
    assert doc["command"] in ("ncclprobe", "no-such-command") and doc["error"]["reason"] == "usage_error"
