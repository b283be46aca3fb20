"""The catalog of NCCL variables: caching by version, suggestions, explain, and the CLI."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ncclprobe.commands.explain import explain
from ncclprobe.model import catalog
from ncclprobe.model.catalog import COMM, MODES, PROCESS_APPLIED

BRIEF = ["PROTO", "ALGO", "MIN_NCHANNELS", "MAX_NCHANNELS", "MIN_CTAS", "MAX_CTAS", "BUFFSIZE", "LL_BUFFSIZE",
         "LL128_BUFFSIZE", "NTHREADS", "LL128_NTHREADS", "P2P_LEVEL", "P2P_DISABLE", "SHM_DISABLE", "IB_DISABLE",
         "NET_GDR_LEVEL", "NVLS_ENABLE", "CUMEM_ENABLE", "CROSS_NIC", "COLLNET_ENABLE", "NET", "SOCKET_IFNAME",
         "IB_HCA", "DEBUG", "DEBUG_SUBSYS", "DEBUG_FILE", "CONF_FILE", "TOPO_FILE", "GRAPH_FILE", "LAUNCH_MODE",
         "CGA_CLUSTER_SIZE", "COMM_BLOCKING", "CTA_POLICY", "PROFILER_PLUGIN", "TUNER_PLUGIN", "ENV_PLUGIN",
         "NO_CACHE", "GRAPH_MIXING_SUPPORT", "COMM_SPLIT_SHARE_RESOURCES"]


def test_catalog_covers_the_variables_that_matter_and_each_entry_is_complete():
    for short in BRIEF:
        assert catalog.get("NCCL_" + short) is not None, short
    for info in catalog.CATALOG.values():
        assert info.name.startswith("NCCL_") and info.affects and info.default and info.values and info.source
        assert info.readings and all(r.mode in MODES and r.how for r in info.readings)
        assert [r.since for r in info.readings] == sorted(r.since for r in info.readings)
        for o in info.overrides:
            assert o.framework and o.action and o.where and o.source


@pytest.mark.parametrize("var,version,expect", [
    ("NCCL_PROTO", None, False),
    ("NCCL_ALGO", 21801, False),
    ("NCCL_MAX_NCHANNELS", None, True),
    ("NCCL_BUFFSIZE", "2.28.9", True),
    ("NCCL_NTHREADS", 22000, True),
    ("NCCL_P2P_LEVEL", None, True),
    ("NCCL_MAX_CTAS", None, True),        # cached, then re-applied to every comm
    ("NCCL_COLLNET_ENABLE", "2.26.2", False),
    ("NCCL_COLLNET_ENABLE", 22703, True),  # 2.27.0-2.27.4 made it an NCCL_PARAM
    ("NCCL_COLLNET_ENABLE", 22705, False),  # 2.27.5 re-reads it per comm again
    ("NCCL_COLLNET_ENABLE", None, False),
    ("NCCL_NET", None, False),
    ("NCCL_ENV_PLUGIN", 22806, None),      # not read before 2.28.7
    ("NCCL_ENV_PLUGIN", 22807, True),
    ("NCCL_NO_CACHE", 22905, None),
    ("NCCL_CUMEM_ENABLE", 21800, True),
    ("NCCL_NOT_A_VAR", None, None),
    ("NCCL_PROTO", "garbage", None),
])
def test_is_process_cached_by_version(var, version, expect):
    assert catalog.is_process_cached(var, version) is expect


def test_no_cache_lifts_param_caches_only_from_2_29_7_and_not_hand_written_ones():
    assert catalog.is_process_cached("NCCL_MAX_CTAS", 22907, no_cache="NCCL_MAX_CTAS") is False
    assert catalog.is_process_cached("NCCL_MAX_CTAS", 22809, no_cache="NCCL_MAX_CTAS") is True
    assert catalog.is_process_cached("NCCL_BUFFSIZE", None, no_cache="all") is False
    assert catalog.is_process_cached("NCCL_BUFFSIZE", None, no_cache="NCCL_NTHREADS") is True
    # P2P_LEVEL is a static global in paths.cc, outside NCCL_PARAM
    assert catalog.is_process_cached("NCCL_P2P_LEVEL", None, no_cache="ALL") is True


def test_collnet_readings_name_the_2_27_change():
    info = catalog.get("NCCL_COLLNET_ENABLE")
    assert [(r.since, r.mode) for r in info.readings] == [(0, COMM), (22700, PROCESS_APPLIED), (22705, COMM)]


def test_names_are_normalised():
    assert catalog.get("proto").name == "NCCL_PROTO"
    assert catalog.get(" nccl_max_nchannels=16 ").name == "NCCL_MAX_NCHANNELS"
    assert catalog.get("") is None and catalog.get(None) is None


@pytest.mark.parametrize("query,first", [
    ("NCCL_PROTOCOL", "NCCL_PROTO"), ("NCCL_BUFSIZE", "NCCL_BUFFSIZE"), ("SOCKET_IFNAM", "NCCL_SOCKET_IFNAME"),
    ("NCCL_MAXCTAS", "NCCL_MAX_CTAS"), ("nchannels", "NCCL_MIN_NCHANNELS"),
])
def test_suggest_nearest(query, first):
    assert catalog.suggest(query)[0] == first


def test_suggest_nothing_for_noise():
    assert catalog.suggest("zzzz") == [] and catalog.suggest("") == []


def test_version_code_parsing():
    assert catalog.version_code("2.27.5") == 22705
    assert catalog.version_code("v2.28.9-1") == 22809
    assert catalog.version_code("2.30") == 23000
    assert catalog.version_code("x.y") is None


def test_explain_known_and_overrides_in_data():
    res = explain("NCCL_CUMEM_ENABLE")
    assert res.exit_code() == 0
    var = res.to_json()["variable"]
    assert var["name"] == "NCCL_CUMEM_ENABLE" and var["process_cached"] is True
    assert {o["framework"] for o in var["overrides"]} >= {"SGLang", "vLLM", "verl"}
    ray = explain("NCCL_SOCKET_IFNAME").to_json()["variable"]["overrides"]
    assert ray[0]["framework"] == "Ray Train" and "^lo,docker,veth" in ray[0]["action"]


def test_explain_unknown_returns_usage_code_and_suggestions():
    res = explain("NCCL_PROTOCOL")
    assert res.exit_code() == 2
    data = res.to_json()
    assert data["variable"] is None and data["suggestions"][0] == "NCCL_PROTO"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "ncclprobe", *args], capture_output=True, text=True, timeout=60)


def test_cli_explain_proto_text():
    p = _cli("explain", "NCCL_PROTO")
    assert p.returncode == 0, p.stderr
    assert "NCCL_PROTO" in p.stdout and "re-read per communicator" in p.stdout


def test_cli_explain_list_json():
    p = _cli("explain", "--list", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["schema"] == "ncclprobe/2" and data["command"] == "explain"
    names = [v["name"] for v in data["variables"]]
    assert names == sorted(names) and len(names) == len(catalog.CATALOG)
    proto = next(v for v in data["variables"] if v["name"] == "NCCL_PROTO")
    assert proto["process_cached"] is False


def test_cli_unknown_variable_is_a_usage_error_on_stderr_with_suggestions():
    """Exit 2 (usage): the name typed is wrong, nothing about the system (3) is."""
    p = _cli("explain", "NCCL_PROTOO")
    assert (p.returncode, p.stdout) == (2, "")
    assert "'NCCL_PROTOO' is not in the catalog of NCCL variables; did you mean NCCL_PROTO?" in p.stderr
    p = _cli("explain", "NCCL_XYZZYQ")
    assert p.returncode == 2 and "`ncclprobe explain --list` lists them" in p.stderr and "did you mean" not in p.stderr
    pj = _cli("explain", "NCCL_BUFSIZE", "--json")
    data = json.loads(pj.stdout)
    assert pj.returncode == 2 and data["suggestions"][0] == "NCCL_BUFFSIZE"
    assert data["error"]["reason"] == "unknown_variable" and "did you mean one of NCCL_BUFFSIZE," in data["error"]["message"]


def test_cli_list_with_a_variable_is_a_usage_error():
    p = _cli("explain", "--list", "NCCL_PROTO")
    assert (p.returncode, p.stdout) == (2, "") and "not both" in p.stderr
