"""The profiler plugin role, driven by tests/c/prof_driver.c exactly as NCCL drives a plugin:
dlopen, dlsym("ncclProfiler_vN"), init per communicator, startEvent/stopEvent per collective with
real descriptors, finalize. Checks the coll_summary aggregation, flush at finalize, periodically
and at exit, threads, fork, the shape table bound, and silence."""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_profiler")
    return {"lib": ps.build_probe(d), "driver": ps.build_prof_driver(d)}


def drive(built, log, version, *args, **env):
    r = ps.run([built["driver"], built["lib"], version, *args], ps.probe_env(log, None, **env))
    assert r.returncode == 0, r.stderr
    return r


def h(value: int) -> str:
    """A 64-bit id as the probe writes it: "0x" and 16 lowercase hex digits, leading zeros kept."""
    return f"0x{value:016x}"


def totals(summaries):
    """(comm_hash, func, algo, proto, nchannels) -> [count, bytes_min, bytes_max] over all flushes."""
    acc = defaultdict(lambda: [0, None, None])
    for s in summaries:
        a = acc[(s["comm_hash"], s["func"], s["algo"], s["proto"], s["nchannels"])]
        a[0] += s["count"]
        a[1] = s["bytes_min"] if a[1] is None else min(a[1], s["bytes_min"])
        a[2] = s["bytes_max"] if a[2] is None else max(a[2], s["bytes_max"])
    return {k: tuple(v) for k, v in acc.items()}


@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_collectives_summarized_per_communicator_and_shape(built, tmp_path, version):
    log = tmp_path / "log"
    r = drive(built, log, version, "basic")
    assert "mask=0x2" in r.stdout  # only ncclProfileColl requested
    result = ps.read(log)
    assert result.skipped_total == 0
    summaries = ps.of_kind(result, "coll_summary")
    assert all(s["reason"] == "finalize" and s["src"] == "profiler" for s in summaries)
    assert totals(summaries) == {
        # 100 x 256 float32 + 50 x 1024 float32 + 5 x 512 bf16 (same text, other pointer)
        (h(0xabcdef), "AllReduce", "Ring", "LL", 2): (155, 1024, 4096),
        (h(0xabcdef), "AllGather", "Ring", "Simple", 4): (30, 10, 39),
        (h(0x1234), "ReduceScatter", "Tree", "LL128", 8): (10, 8 << 20, 8 << 20),
    }
    inits = ps.of_kind(result, "comm_plugin_init")
    assert [(i["comm_hash"], i["comm_name"], i["nranks"], i["rank"], i["nnodes"]) for i in inits] == [
        (h(0xabcdef), "tp", 2, 0, 1), (h(0x1234), None, 4, 3, 1)]
    assert inits[1]["comm_hash"] == "0x0000000000001234"  # leading zeros kept: one spelling with uid and comm
    assert all(i["plugin"] == f"ncclProfiler_v{version}" and i["call"] is None for i in inits)
    assert inits[0]["env"] == {"NCCLPROBE_DIR": str(log)}
    assert [f["comm_hash"] for f in ps.of_kind(result, "comm_plugin_finalize")] == [h(0xabcdef), h(0x1234)]
    load, = ps.of_kind(result, "plugin_load")
    assert load["plugin"] == f"ncclProfiler_v{version}"


def test_many_threads_each_with_its_communicator(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 5, "threads", "32", "3000")
    result = ps.read(log)
    assert result.skipped_total == 0
    t = totals(ps.of_kind(result, "coll_summary"))
    assert len(t) == 32
    for i in range(32):
        proto = "LL" if i & 1 else "Simple"
        assert t[(h(0x100 + i), "AllReduce", "Ring", proto, 2)] == (3000, 256, 256)


def test_periodic_flush_lines_add_up(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 6, "threads", "1", "1000", NCCLPROBE_FLUSH_S="0")
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    # The clock is read every 256 collectives: three periodic lines, then the rest at finalize.
    assert [(s["reason"], s["count"]) for s in summaries] == [
        ("periodic", 256), ("periodic", 256), ("periodic", 256), ("finalize", 232)]


def test_default_interval_does_not_flush_a_short_run(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 6, "threads", "1", "5000")
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert [(s["reason"], s["count"]) for s in summaries] == [("finalize", 5000)]


def test_exit_without_finalize_still_flushes(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 7, "exit")
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert [(s["comm_hash"], s["algo"], s["proto"], s["count"], s["reason"]) for s in summaries] == [
        (h(0xe1), "Tree", "Simple", 7, "exit")]


def test_fork_child_reports_only_its_own_communicator(built, tmp_path):
    log = tmp_path / "log"
    r = drive(built, log, 5, "fork")
    child_pid = int(next(line for line in r.stdout.splitlines() if line.startswith("child ")).split()[1])
    result = ps.read(log)
    assert len(result.files) == 2
    child = totals([s for s in ps.of_kind(result, "coll_summary") if s["pid"] == child_pid])
    parent = totals([s for s in ps.of_kind(result, "coll_summary") if s["pid"] != child_pid])
    assert child == {(h(0xcccc), "Broadcast", "Ring", "Simple", 1): (5, 400, 400)}
    assert parent == {(h(0xaaaa), "AllReduce", "Ring", "LL", 2): (20, 400, 400)}


def test_shape_table_is_bounded(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 5, "shapes", "300")  # 300 shapes (channels x size bucket), 256 kept
    result = ps.read(log)
    assert len(ps.of_kind(result, "coll_summary")) == 256
    err, = ps.of_kind(result, "probe_error")
    assert "44 collectives not summarized" in err["message"] and err["part"] == "coll_summary"
    assert err["message"].startswith(f"comm {h(0x5a)}: ")


def test_silent_without_log_dir_requests_no_events(built, tmp_path):
    r = drive(built, None, 5, "basic")
    assert "mask=0x0" in r.stdout and r.stderr == ""


def test_unwritable_dir(built, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = drive(built, blocker / "log", 5, "threads", "4", "100")
    assert r.stderr.count("ncclprobe:") == 1
    assert "mask=0x0" in r.stdout  # nothing can be written, so nothing is asked for


def test_fork_while_another_thread_finalizes_never_hangs_the_child(built, tmp_path):
    """A thread finalizes communicators (64 summary lines each) while the main thread forks children
    that exit() at once: the exit flush must never find the registry's lock held by a thread that
    does not exist in the child."""
    log = tmp_path / "log"
    r = ps.run([built["driver"], built["lib"], 5, "forkexit", 100], ps.probe_env(log), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "forks=100 hung=0" in r.stdout
    result = ps.read(log)
    assert result.skipped_total == 0
    assert {s["reason"] for s in ps.of_kind(result, "coll_summary")} == {"finalize"}


def test_silent_later_communicator_keeps_the_global_mask(built, tmp_path):
    """NCCL's event mask is one global: a communicator initialized once the probe went silent must
    not switch off the collection of the communicators before it."""
    log = tmp_path / "log"
    r = drive(built, log, 5, "maskkeep")
    assert "mask_a=0x2" in r.stdout and "mask_b=0x2" in r.stdout
    inits = ps.of_kind(ps.read(log), "comm_plugin_init")
    assert [i["comm_hash"] for i in inits] == [h(0xa1)]


def test_init_is_not_held_up_while_another_library_reports_its_version(built, tmp_path):
    """The probe asks a library its version (dlopen + its ncclGetVersion) the first time it meets
    it; no lock may be held meanwhile, or every other thread's init waits on a foreign function."""
    driver, slow = ps.build_lock_driver(tmp_path)
    log = tmp_path / "log"
    r = ps.run([driver, built["lib"], slow], ps.probe_env(log), timeout=60)
    assert r.returncode == 0, r.stderr
    blocked_ms = int(r.stdout.split("blocked_ms=")[1].split()[0])
    assert blocked_ms < 1000, r.stdout  # the slow version query waits for us for up to 2 s
    loads = {e["lib"]: e["nccl_version"] for e in ps.of_kind(ps.read(log), "plugin_load")}
    assert loads[str(slow)] == 22809  # released by us in time, and then recorded


def test_environment_keeps_every_variable_after_one_that_does_not_fit(built, tmp_path):
    log = tmp_path / "log"
    huge = "\x01" * 3000  # a 2048-byte cut escapes to 12 kB: the second of these cannot fit
    long_name = "NCCL_" + "N" * 5000
    env = {"NCCL_A_HUGE": huge, "NCCL_B_HUGE": huge, long_name: "x", "NCCL_SOCKET_IFNAME": "lo"}
    drive(built, log, 5, "basic", **env)
    result = ps.read(log)
    assert result.skipped_total == 0
    init = ps.of_kind(result, "comm_plugin_init")[0]
    assert init["truncated"] is True
    got = init["env"]
    assert got["NCCL_SOCKET_IFNAME"] == "lo" and got["NCCLPROBE_DIR"] == str(log)  # after the one left out
    assert got["NCCL_A_HUGE"] == "\x01" * 2048 and "NCCL_B_HUGE" not in got
    cut = [k for k in got if k.startswith("NCCL_NNN")]
    assert len(cut) == 1 and long_name.startswith(cut[0]) and len(cut[0]) <= 256 and got[cut[0]] == "x"


# ---- launch modes and GPU timing (issue 15), driven as NCCL 2.28 drives a plugin ------------------

def by_mode(summaries) -> dict:
    out: dict = {}
    for s in summaries:
        out[s["mode"]] = out.get(s["mode"], 0) + s["count"]
    return out


@pytest.mark.parametrize("version", [5, 6, 7])
def test_capture_without_proxy_ops_shows_once_inside_the_api_call(built, tmp_path, version):
    """No proxy ops, no KernelCh: NCCL fires the captured collectives' Coll events at capture, inside the
    capturing GroupApi, and none at replay; the eager ones racing the replays are eager."""
    log = tmp_path / "log"
    r = drive(built, log, version, "graph", "3", "5", "0")
    assert "callback=0" in r.stdout
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert by_mode(summaries) == {"captured": 3, "eager": 3}
    act = ps.of_kind(ps.read(log), "comm_activity")
    assert sum(a["api_captured"] for a in act) == 3 and sum(a["api_eager"] for a in act) == 3


@pytest.mark.parametrize("version", [5, 7])
def test_replays_from_the_callback_thread_are_replayed(built, tmp_path, version):
    """Proxy ops (a network): each replay's Coll comes from the callback thread, parented by the CollApi
    handle returned at capture, while eager collectives run on the main thread."""
    log = tmp_path / "log"
    r = drive(built, log, version, "graph", "4", "25", "1")
    assert "callback=1" in r.stdout
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert by_mode(summaries) == {"replayed": 100, "eager": 4}
    assert all("gpu_count" not in s for s in summaries)  # GPU timing off


def test_v4_has_no_launch_mode(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 4, "basic")
    assert {s["mode"] for s in ps.of_kind(ps.read(log), "coll_summary")} == {None}


def test_gpu_time_from_kernel_channels_on_another_thread(built, tmp_path):
    """KernelCh events from a proxy thread racing the next collectives: every collective is timed once, by
    its longest channel, and the sum is the driver's."""
    log = tmp_path / "log"
    r = drive(built, log, 5, "timed", "5000", NCCLPROBE_GPU_TIMING="1")
    assert "mask=0x42" in r.stdout  # Coll | KernelCh
    expected = int(r.stdout.split("gpu_ns_sum=")[1].split()[0])
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert sum(s["count"] for s in summaries) == 5000
    assert sum(s["gpu_count"] for s in summaries) == 5000 and sum(s["untimed"] for s in summaries) == 0
    assert sum(s["gpu_ns"] for s in summaries) == expected
    from ncclprobe.model import timing
    hist: dict = {}
    for s in summaries:
        for b, n in s["gpu_hist"]:
            hist[b] = hist.get(b, 0) + n
    # durations 10, 11, 12, 13 us, a quarter each: the median lies between 11 and 12 us
    assert 11000 * 0.9375 <= timing.quantile(hist, 0.5) <= 12000 * 1.0625


def test_gpu_timing_of_graph_replays(built, tmp_path):
    log = tmp_path / "log"
    drive(built, log, 5, "graph", "2", "10", "0", NCCLPROBE_GPU_TIMING="1")  # KernelCh: replays report
    summaries = ps.of_kind(ps.read(log), "coll_summary")
    assert by_mode(summaries) == {"replayed": 20, "eager": 2}
    replayed = [s for s in summaries if s["mode"] == "replayed"]
    assert sum(s["gpu_count"] for s in replayed) == 20
    assert sum(s["gpu_ns"] for s in replayed) == 10 * (10000 + 11000)


def test_gpu_timing_memory_stays_flat(built, tmp_path):
    log = tmp_path / "log"
    r = drive(built, log, 5, "loop", "300000", "kernelch", NCCLPROBE_GPU_TIMING="1")
    rss = [int(x) for x in r.stdout.split("rss_kb=")[1].split()[0].split(",")]
    assert max(rss[1:]) - rss[1] < 1024, rss  # no allocation per collective (kB)
