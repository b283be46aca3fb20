"""NCCL's RAS service as a witness (witnesses/ras.py): the client against a local server that replays the
replies recorded from a real one (NCCL 2.28.9 on an H200, one torch rank: tests/data/ras), against servers
that misbehave (bounded time and memory, a reason instead of a traceback), and `inspect --ras` of a real
process whose pid the replayed report names: its communicators in the model, joined to the process, with
the values it holds, and --expect checked on them. The hash join with the probes is checked on the replies
and the profiler's records of the same job, recorded together."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclprobe import model
from ncclprobe.witnesses import ras
from rasserver import DATA, Server, recorded

JSON_BODY = recorded("h200-2.28.9-json-status.txt")
TEXT_BODY = recorded("h200-2.28.9-text-status.txt")


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


def test_the_recorded_json_report_is_read_whole(servers):
    s = serve(servers, JSON_BODY)
    r = ras.read(s.address)
    assert r.ok and r.format == "json" and r.nccl_version == "2.28.9", r.reason
    assert [c.hash for c in r.comms] == ["0x029ddfa57d16f728", "0x74c5b90845f7b8a8"]  # RAS drops leading zeros
    [k] = r.comms[0].ranks
    assert (k.rank, k.pid, k.cuda_dev, k.nvml_dev, k.host) == (0, 1001, 0, 0, "192.0.2.2")
    assert k.status["init_state"] == 0 and k.status["abort_flag"] is False
    assert k.counts["AllReduce"] == 0  # one rank: NCCL's shortcut runs no collective through the proxy
    # only the handshake, the format and the report were asked: nothing that changes the job
    assert s.heard == ["CLIENT PROTOCOL 2", "SET FORMAT json", "STATUS"]


def test_an_older_server_without_json_gives_the_text_report(servers):
    s = serve(servers, TEXT_BODY, json=False)
    r = ras.read(s.address)
    assert r.ok and r.format == "text" and r.nccl_version == "2.28.9" and "Job summary" in r.text
    assert r.comms == []


@pytest.mark.parametrize("mode, body, says", [
    ("silent", JSON_BODY, "timed out"),
    ("hello-only", JSON_BODY, "timed out"),
    ("slow", JSON_BODY, "timed out"),
    ("garbage", JSON_BODY, "not a RAS server"),
    ("", "{not json", "malformed JSON"),
    ("", JSON_BODY[:len(JSON_BODY) // 2], "malformed JSON"),
    ("", "[1, 2]", "not an object"),
])
def test_a_misbehaving_server_costs_a_bounded_time_and_gives_a_reason(servers, mode, body, says):
    s = serve(servers, body, mode=mode)
    t0 = time.monotonic()
    r = ras.read(s.address, timeout=1.0)
    assert time.monotonic() - t0 < 3.0
    assert not r.ok and says in r.reason and r.comms == [], r.reason


def test_a_server_that_keeps_the_connection_open_still_gives_its_report(servers):
    s = serve(servers, JSON_BODY, mode="no-close")
    t0 = time.monotonic()
    r = ras.read(s.address, timeout=5.0)
    assert r.ok and len(r.comms) == 2 and time.monotonic() - t0 < 2.0


def test_a_reply_without_end_is_cut_at_the_byte_bound(servers, monkeypatch):
    monkeypatch.setattr(ras, "MAX_BYTES", 1 << 20)
    s = serve(servers, "x" * 65536, mode="huge", json=False)
    r = ras.read(s.address, timeout=10.0)
    assert not r.ok and "over 1048576 bytes" in r.reason


def test_refused_protocol_and_address_are_said(servers):
    with __import__("socket").socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    r = ras.read(f"127.0.0.1:{port}", timeout=1.0)
    assert not r.ok and "connection refused" in r.reason and "NCCL_RAS_ENABLE=0" in r.reason
    s = serve(servers, JSON_BODY, protocol=1)
    assert "protocol" in ras.read(s.address, timeout=1.0).reason
    assert "bad address" in ras.read("localhost:99999").reason
    assert ras.parse_address("[::1]:28100") == ("::1", 28100) and ras.parse_address("node7") == ("node7", 28028)


def test_the_ras_hash_of_a_communicator_is_the_profilers_comm_hash():
    """Recorded together on the GPU: a torch job under `ncclprobe run` (two communicators: the default group
    and a split) and the RAS report of the same job. Each RAS communicator joins the probe's by hash."""
    cap = json.loads((DATA / "h200-2.28.9-capture.json").read_text())
    m = model.Model()
    for h in cap["profiler_hashes"]:
        c = model.CommView("gpu", h["pid"], 1.0, comm_hash=model.comm_id(h["comm_hash"]), nranks=h["nranks"])
        c.seen_by.add("profiler")
        m.comms.append(c)
    s = Server(recorded("h200-2.28.9-json-status-run.txt"))
    try:
        reading = ras.read(s.address)
    finally:
        s.close()
    assert reading.ok
    model.add_ras(m, reading, "gpu", {"192.0.2.2"})
    assert len(m.comms) == 2 and all(c.seen_by == {"profiler", "ras"} for c in m.comms), m.comms
    assert all(c.ras["status"]["init_state"] == 0 and c.ras["cuda_dev"] == 0 for c in m.comms)


HOLDER = "import sys; sys.stdout.write('up\\n'); sys.stdout.flush(); sys.stdin.read()"


def _holder(env: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline() == "up\n"
    return p


@pytest.mark.parametrize("held, rc", [("LL", 0), (None, 1)])
def test_inspect_ras_joins_the_communicators_to_the_process_and_checks_them(servers, held, rc):
    """A running process (started without ncclprobe) that the replayed report names by its pid: inspect
    --ras lists its two communicators, with its GPU and status, and the value the process holds, labelled
    as held now; --expect is checked on them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL")}
    if held:
        env["NCCL_PROTO"] = held
    p = _holder(env)
    try:
        s = serve(servers, JSON_BODY.replace('"pid": 1001', f'"pid": {p.pid}').replace("192.0.2.2", "127.0.0.1"))
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--scope", "all",
                            "--ras", s.address, "--expect", "NCCL_PROTO=LL", "--json"], capture_output=True,
                           text=True, timeout=120)
        out = json.loads(r.stdout)
        assert r.returncode == rc, out["findings"]
        assert out["ras"]["address"] == s.address and out["ras"]["communicators"] == 2 and out["ras"]["ranks_joined"] == 2
        comms = out["communicators"]
        assert {c["pid"] for c in comms} == {p.pid} and all(c["seen_by"] == ["ras"] for c in comms)
        assert all(c["ras"]["cuda_dev"] == 0 and c["env_source"].startswith("held now") for c in comms)
        assert out["verdict"]["holders"] == "communicators"
        [row] = [v for v in out["verdict"]["variables"] if v["var"] == "NCCL_PROTO"]
        assert [g["value"] for g in row["groups"]] == [held] and len(row["groups"][0]["communicators"]) == 2
        text = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--ras", s.address],
                              capture_output=True, text=True, timeout=120).stdout
        assert f"RAS at {s.address}: 2 communicator(s) of NCCL 2.28.9" in " ".join(text.split())
        # `--ras PID`: the number is the PID (RAS then at the default address, where nothing listens here)
        bare = json.loads(subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", "--ras", str(p.pid), "--json"],
                                         capture_output=True, text=True, timeout=120).stdout)
        assert bare["roots"] == [p.pid] and bare["ras"]["address"] != str(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_inspect_without_a_ras_service_says_why(servers):
    with __import__("socket").socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    p = _holder(dict(os.environ))
    try:
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--ras", f"127.0.0.1:{port}",
                            "--json"], capture_output=True, text=True, timeout=120)
        out = json.loads(r.stdout)
        assert "connection refused" in out["ras"]["reason"] and out["ras"]["communicators"] == 0
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--no-ras", "--json"],
                           capture_output=True, text=True, timeout=120)
        assert "ras" not in json.loads(r.stdout)
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--no-ras", "--ras", "x:1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "contradict" in r.stderr
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_inspect_asks_ras_by_default_where_a_target_maps_libnccl_2_24_or_later(tmp_path):
    """A process that loaded the real libnccl (the nvidia-nccl-cu12 wheel): inspect asks RAS at its
    NCCL_RAS_ADDR unasked; here nothing listens there (no communicator was made), and the report says so."""
    nccl = pytest.importorskip("nvidia.nccl")
    lib = Path(list(nccl.__path__)[0]) / "lib" / "libnccl.so.2"
    if not lib.exists():
        pytest.skip("nvidia-nccl-cu12 wheel has no lib/libnccl.so.2")
    with __import__("socket").socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    code = (f"import ctypes, sys; v = ctypes.c_int(); ctypes.CDLL({str(lib)!r}).ncclGetVersion(ctypes.byref(v)); "
            "sys.stdout.write(str(v.value) + '\\n'); sys.stdout.flush(); sys.stdin.read()")
    env = {**os.environ, "NCCL_RAS_ADDR": f"127.0.0.1:{port}"}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        version = int(p.stdout.readline())
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--json"], capture_output=True,
                           text=True, timeout=120)
        out = json.loads(r.stdout)
        if version < 22400:
            assert "ras" not in out
        else:
            assert out["ras"]["address"] == f"127.0.0.1:{port}" and "connection refused" in out["ras"]["reason"]
    finally:
        p.stdin.close()
        p.wait(timeout=30)


@pytest.mark.parametrize("recorded_field, failing_field, says", [
    ('"async_error": 0', '"async_error": 5', "async error 5"),
    ('"abort_flag": false', '"abort_flag": true', "aborted"),
    ('"missing_ranks_count": 0', '"missing_ranks_count": 3', "3 rank(s) RAS could not reach"),
    ('"init_state": 0', '"init_state": 2', "still initialising"),
])
def test_a_rank_ras_reports_unhealthy_is_a_finding(servers, recorded_field, failing_field, says):
    """The recorded report with one rank's status as a failing job's would be: COMM_UNHEALTHY names the
    communicator, its rank and process (error for an async error or an abort, warning otherwise)."""
    p = _holder(dict(os.environ))
    try:
        body = JSON_BODY.replace('"pid": 1001', f'"pid": {p.pid}').replace("192.0.2.2", "127.0.0.1")
        first = body.index('"hash"')
        second = body.index('"hash"', first + 1)
        body = body[:first] + body[first:second].replace(recorded_field, failing_field) + body[second:]  # the first communicator only
        s = serve(servers, body)
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--ras", s.address, "--json"],
                           capture_output=True, text=True, timeout=120)
        out = json.loads(r.stdout)
        [f] = [f for f in out["findings"] if f["code"] == "COMM_UNHEALTHY"]
        level = "error" if "async" in says or "aborted" in says else "warning"
        assert f["severity"] == level and says in f["message"] and f["pids"] == [p.pid], f
        assert f["communicators"] == ["0x029ddfa57d16f728"] and r.returncode == (1 if level == "error" else 0)
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_two_readings_a_window_apart_give_each_communicators_collectives_per_second(servers):
    """--ras-window: one communicator ran 40 AllReduce between the two readings, the other none."""
    p = _holder(dict(os.environ))
    try:
        body = JSON_BODY.replace('"pid": 1001', f'"pid": {p.pid}').replace("192.0.2.2", "127.0.0.1")
        first = body.index('"hash"')
        second = body.index('"hash"', first + 1)
        later = body[:first] + body[first:second].replace('"AllReduce": 0', '"AllReduce": 40') + body[second:]
        s = serve(servers, body, later=later)
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--ras", s.address,
                            "--ras-window", "0.5", "--json"], capture_output=True, text=True, timeout=120)
        out = json.loads(r.stdout)
        assert s.served == 2 and 0.5 <= out["ras"]["window_s"] < 5
        rates = {c["comm_hash"]: c["ras"]["per_s"]["AllReduce"] for c in out["communicators"]}
        assert rates["0x74c5b90845f7b8a8"] == 0 and 40 / 5 < rates["0x029ddfa57d16f728"] <= 40 / 0.5, rates
        text = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(p.pid), "--ras", s.address,
                               "--ras-window", "0.5"], capture_output=True, text=True, timeout=120).stdout
        assert "idle over" in text and "AllReduce 40;" in " ".join(text.split())
    finally:
        p.stdin.close()
        p.wait(timeout=30)
