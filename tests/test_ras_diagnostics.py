"""NCCL's RAS diagnostics (2.31+; witnesses/rasdiag.py, diagnose/rasenv.py) against a local server replaying
reports CONSTRUCTED from NCCL's source (tests/data/ras/README.md: no NCCL >= 2.31 job could be run here):
the report parsed into typed observations, refusals and misbehaving servers as reasons within a bounded
time, and `inspect --ras-diagnostics` of a real process tree whose pids the replayed reports name: the
NCCL_* mismatch becomes COMM_ENV_DIVERGENT on the process that holds the odd value, joined to the edge where
it lost it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ncclprobe import model
from ncclprobe.diagnose import rasenv
from ncclprobe.witnesses import ras, rasdiag
from rasserver import Server, recorded

STATUS_3 = recorded("constructed-2.31-json-status-3ranks.txt")
MISMATCH = recorded("constructed-2.31-diagnostics-env-mismatch.txt")
MANY = recorded("constructed-2.31-diagnostics-many-ranks.txt")
COMM = "0x5f3c9e0a1b2c3d4e"


@pytest.fixture
def servers():
    made: list[Server] = []
    yield made
    for s in made:
        s.close()


def serve(servers, *args, **kw) -> Server:
    s = Server(*args, **kw)
    servers.append(s)
    return s


def test_the_report_is_read_as_typed_observations_and_only_diagnostics_is_asked(servers):
    s = serve(servers, STATUS_3, diagnostics=MISMATCH)
    d = ras.read_diagnostics(s.address, timeout=5.0)
    assert d.ok and d.origin == "node042:2001" and d.completed_ms == 12.3, d.reason
    assert [(e.comm, e.var, e.nranks) for e in d.env] == [(COMM, "NCCL_DEBUG_FILE", 3), (COMM, "NCCL_PROTO", 3)]
    assert d.env[1].groups == (rasdiag.EnvGroup("LL", (0, 2), 2), rasdiag.EnvGroup(None, (1,), 1))
    assert [x.check for x in d.lines if x.tag == "OK"] == ["GPU inventory", "CUDA driver version", "ECC", "NVLink"]
    # text only (NCCL refuses DIAGNOSTICS in JSON), and nothing that changes the job (no CONTROL)
    assert s.heard == ["CLIENT PROTOCOL 2", "DIAGNOSTICS"]


def test_rank_sets_cut_by_nccl_partial_and_incomplete_checks_and_a_failed_summary(servers):
    d = ras.read_diagnostics(serve(servers, diagnostics=MANY).address, timeout=5.0)
    assert d.ok, d.reason
    [algo] = d.env
    assert algo.groups[0] == rasdiag.EnvGroup("Ring", (0, 1, 2, 3, 4, 5, 6, 8), 11) and algo.groups[1].ranks == (7,)
    assert d.partial_ranks == 1 and d.consistent == {model.comm_id("0xdef"): 4}
    assert d.incomplete == [{"check": "NCCL environment", "comm": model.comm_id("0x77"), "gathered": 3, "nranks": 4}]
    assert d.errors == ["ERROR: diagnostics summary failed (3)"]


@pytest.mark.parametrize("diagnostics, says", [
    (None, "NCCL < 2.31"),  # an older NCCL answers an error line and keeps the connection open
    ("BUSY: diagnostics already in progress\n", "busy"),
    ("ERROR: diagnostics only supports text output\n", "refused"),
    ("node042:1 NCCL DIAG === RAS Diagnostics ===\n", "ended before its completion line"),
    ("", "closed the connection without a diagnostics report"),
])
def test_a_server_without_a_report_gives_a_reason_at_once(servers, diagnostics, says):
    s = serve(servers, STATUS_3, diagnostics=diagnostics)
    t0 = time.monotonic()
    d = ras.read_diagnostics(s.address, timeout=10.0)
    assert not d.ok and says in d.reason and d.env == [], d.reason
    assert time.monotonic() - t0 < 5.0


@pytest.mark.parametrize("mode, says", [("silent", "timed out"), ("slow", "timed out"),
                                        ("garbage", "not a RAS server")])
def test_a_misbehaving_server_costs_a_bounded_time(servers, mode, says):
    s = serve(servers, STATUS_3, diagnostics=MISMATCH * 4, mode=mode)
    t0 = time.monotonic()
    d = ras.read_diagnostics(s.address, timeout=1.0)
    assert not d.ok and says in d.reason, d.reason
    assert time.monotonic() - t0 < 3.0


def test_a_server_that_keeps_the_connection_open_still_gives_its_report(servers):
    s = serve(servers, STATUS_3, diagnostics=MISMATCH, mode="no-close")
    t0 = time.monotonic()
    d = ras.read_diagnostics(s.address, timeout=10.0)
    assert d.ok and len(d.env) == 2 and time.monotonic() - t0 < 3.0


def test_an_endless_report_is_cut_at_the_byte_bound(servers, monkeypatch):
    monkeypatch.setattr(ras, "MAX_BYTES", 1 << 20)
    d = ras.read_diagnostics(serve(servers, diagnostics="x" * 65536, mode="huge").address, timeout=10.0)
    assert not d.ok and "over 1048576 bytes" in d.reason


def test_an_nccl_older_than_2_31_is_not_asked(servers):
    s = serve(servers, recorded("h200-2.28.9-json-status.txt"), diagnostics=MISMATCH)
    r = ras.read_window(s.address, None, diagnostics=True)
    assert r.ok and "NCCL 2.28.9 has no RAS diagnostics" in r.diagnostics.reason
    assert "DIAGNOSTICS" not in s.heard


def _model_with(status: str, report: str, servers) -> model.Model:
    s = serve(servers, status, diagnostics=report)
    m = model.Model()
    model.add_ras(m, ras.read_window(s.address, None, diagnostics=True), "here", {"192.0.2.2"})
    return m


def test_a_mismatch_where_no_process_is_in_the_model_names_the_ranks_without_an_edge(servers):
    """Every rank RAS lists, none of whose processes /proc showed: the odd rank is named by rank and pid,
    its edge unknown; a variable that is no tuning (NCCL_DEBUG_FILE) is kept in the model, no finding."""
    m = _model_with(STATUS_3, MISMATCH, servers)
    assert {c.rank: c.ras["env_diag"]["NCCL_PROTO"]["groups"][1]["ranks"] for c in m.comms} == {0: [1], 1: [1], 2: [1]}
    [f] = rasenv.comm_env_divergent(m)
    assert (f.code, f.severity, f.var, f.pids, f.edge) == ("COMM_ENV_DIVERGENT", "warning", "NCCL_PROTO", (2002,), None)
    assert "'LL' on rank(s) 0,2 (pid 2001, 4242); unset on rank(s) 1 (pid 2002)" in f.message
    assert f.evidence["reference"] == "LL" and f.evidence["basis"] == "the value most ranks hold"
    expect = {"NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}
    [f] = [f for f in rasenv.comm_env_divergent(m, expect) if f.var == "NCCL_DEBUG_FILE"]
    assert f.severity == "error" and f.pids == (2002, 4242)  # expected: the ranks without it, here or elsewhere
    assert rasenv.comm_env_divergent(_model_with(STATUS_3, MISMATCH.replace("{0,2}", "{0}"), servers))[0].evidence[
        "reference"] is None  # no value held by most ranks (1 and 1, one rank not named): no direction


# rank 0 (a) and rank 1 (b) of the replayed communicator; `curated`: both started by a launcher that holds
# NCCL_PROTO=LL, b with an environment of its own; `apart`: started by a root that never had it, a given it
LAUNCHER = r"""
import os, subprocess, sys
hold = [sys.executable, "-c", "import sys; sys.stdin.read()"]
mine = {k: v for k, v in os.environ.items() if k != "NCCL_PROTO"}
a = subprocess.Popen(hold, stdin=subprocess.PIPE, env={**os.environ, "NCCL_PROTO": "LL"})
b = subprocess.Popen(hold, stdin=subprocess.PIPE, env=mine)
os.write(1, f"{a.pid} {b.pid}\n".encode())
sys.stdin.read()
a.stdin.close(); b.stdin.close(); a.wait(); b.wait()
"""


def _tree(curated: bool) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL")}
    return subprocess.Popen([sys.executable, "-c", LAUNCHER], env={**env, "NCCL_PROTO": "LL"} if curated else env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _inspect(root: int, address: str, *more: str) -> tuple[int, dict]:
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(root), "--ras", address, *more, "--json"],
                       capture_output=True, text=True, timeout=120)
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("expect, remote_has, severity", [([], True, "warning"),
                                                          (["--expect", "NCCL_PROTO=LL"], False, "error")])
def test_inspect_ras_diagnostics_names_the_odd_rank_and_the_edge_where_it_lost_the_value(servers, expect, remote_has,
                                                                                          severity):
    """Ranks 0 and 1 started apart (rank 1 by a root that never had NCCL_PROTO), rank 2 on another node:
    the replayed diagnostics say rank 1 lacks NCCL_PROTO; the finding names rank 1's process and the edge
    the propagation rules locate for it (its root was started without it), which no other rule names
    without an expectation. With --expect, rank 2 on the other node lacking it too: that rank, which no
    /proc here shows, is named as well (error)."""
    tree = _tree(curated=False)
    try:
        pid_a, pid_b = map(int, tree.stdout.readline().split())
        def pids(text: str) -> str:
            return text.replace("2001", str(pid_a)).replace("2002", str(pid_b)).replace("192.0.2.2", "127.0.0.1")
        report = MISMATCH if remote_has else MISMATCH.replace("{0,2}", "{0}").replace("{1}", "{1,2}")
        s = serve(servers, pids(STATUS_3), diagnostics=pids(report))
        rc, out = _inspect(tree.pid, s.address, "--ras-diagnostics", *expect)
        [f] = [f for f in out["findings"] if f["code"] == "COMM_ENV_DIVERGENT"]
        odd = [1] if remote_has else [1, 2]
        assert f["severity"] == severity and f["var"] == "NCCL_PROTO" and f["ranks"] == odd, f
        assert f["pids"] == sorted([pid_b] + ([] if remote_has else [4242])) and f["communicators"] == [COMM]
        assert ("192.0.2.9" in f["hosts"]) is not remote_has and rc == 1
        assert f["edge"]["kind"] == "not_in_root" and f["edge"]["parent"] == tree.pid, f["edge"]
        assert f"pid {pid_b} was started without it by its root pid {tree.pid}" in f["message"]
        assert out["ras"]["diagnostics"]["origin"] == f"node042:{pid_a}"
        assert [e["var"] for e in out["ras"]["diagnostics"]["env_mismatches"]] == ["NCCL_DEBUG_FILE", "NCCL_PROTO"]
        assert all("NCCL_PROTO" in c["ras"]["env_diag"] for c in out["communicators"] if c["comm_hash"] == COMM)
        assert s.heard.count("DIAGNOSTICS") == 1
        _, plain = _inspect(tree.pid, s.address)
        assert "diagnostics" not in plain["ras"] and s.heard.count("DIAGNOSTICS") == 1  # asked only on request
    finally:
        tree.stdin.close()
        tree.wait(timeout=30)


def test_a_loss_the_propagation_rules_already_name_is_said_once(servers):
    """Rank 1 started by the launcher that holds NCCL_PROTO=LL with an environment of its own: ENV_MISSING
    names that edge; the RAS diagnostics' mismatch of the same process and variable adds no second finding."""
    tree = _tree(curated=True)
    try:
        pid_a, pid_b = map(int, tree.stdout.readline().split())
        def pids(text: str) -> str:
            return text.replace("2001", str(pid_a)).replace("2002", str(pid_b)).replace("192.0.2.2", "127.0.0.1")
        s = serve(servers, pids(STATUS_3), diagnostics=pids(MISMATCH))
        _, out = _inspect(tree.pid, s.address, "--ras-diagnostics")
        [lost] = [f for f in out["findings"] if f["edge"] and f["var"] == "NCCL_PROTO"]
        assert lost["pids"] == [pid_b] and lost["edge"]["kind"] == "curated_env"
        assert not [f for f in out["findings"] if f["code"] == "COMM_ENV_DIVERGENT"], out["findings"]
    finally:
        tree.stdin.close()
        tree.wait(timeout=30)
