"""Communicator ids (comm_hash, uid, comm and parent pointers) have one spelling, "0x" and 16 lowercase
hex digits: the reader normalises whatever wrote them (older probes dropped leading zeros and wrote
uid without "0x"; NCCL prints commId with %llx and pointers with %p), so witnesses still join."""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from ncclprobe import model

from ncclprobe.witnesses import nccllog_model
from ncclprobe.witnesses.events import EventLog

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402

H = "node1"
HASH = "0x0bdba985b4a6820a"  # the id of the flaky test: its leading zero was lost by one writer


@pytest.mark.parametrize("raw", [0x0BDBA985B4A6820A, "0x0bdba985b4a6820a", "0xbdba985b4a6820a", "0XBDBA985B4A6820A",
                                 "bdba985b4a6820a", "0bdba985b4a6820a", " 0xbdba985b4a6820a\n"])
def test_every_spelling_of_one_id_is_the_same_id(raw):
    assert model.comm_id(raw) == HASH


@pytest.mark.parametrize("raw,want", [(0, "0x0000000000000000"), ((1 << 64) - 1, "0xffffffffffffffff"),
                                      ("0x1", "0x0000000000000001")])
def test_bounds(raw, want):
    assert model.comm_id(raw) == want


@pytest.mark.parametrize("raw", [None, True, -1, 1 << 64, "", "0x", "u1", "0x" + "1" * 17, "0x-1", 1.0, [1]])
def test_what_is_no_id_is_none(raw):
    assert model.comm_id(raw) is None


@pytest.fixture(scope="module")
def id_text(tmp_path_factory):
    """The probe library's own id formatter (selfcheck.c), from a fresh build of the sources."""
    fn = ctypes.CDLL(str(ps.build_probe(tmp_path_factory.mktemp("probe_ids")))).ncclprobe_id_text
    fn.argtypes, fn.restype = [ctypes.c_uint64, ctypes.c_char_p], None

    def text(value: int) -> str:
        out = ctypes.create_string_buffer(19)
        fn(value, out)
        return out.value.decode()
    return text


@pytest.mark.parametrize("value", [0, 1, 0x1234, 0x0BDBA985B4A6820A, 0x00FFFFFFFFFFFFFF, 1 << 63, (1 << 64) - 1])
def test_the_c_probes_spell_an_id_as_the_reader_does(id_text, value):
    assert id_text(value) == model.comm_id(value) == f"0x{value:016x}"


def ev(kind, t, src, **kw):
    return {"ev": kind, "pid": 10, "t": t, "host": H, "src": src, **kw}


def old_and_foreign_log() -> list[dict]:
    """One communicator as three writers spell it: an older probe (comm_hash without its leading zero,
    uid without "0x"), a foreign writer (upper case) and the current probe (canonical pointer)."""
    return [ev("comm_init", 1.0, "preload", api="ncclCommInitRank", call=1, comm="0x55d0c0a8e2a0", rank=0,
               nranks=2, uid="0bdba985b4a6820a", env={}, rc=0, lib="/lib/libnccl.so.2", version=22809),
            ev("comm_plugin_init", 1.1, "profiler", comm_hash="0xbdba985b4a6820a", nranks=2, rank=0, env={},
               lib="/lib/libnccl.so.2", call=1),
            ev("coll_summary", 2.0, "profiler", comm_hash="0x0BDBA985B4A6820A", func="AllReduce", algo="RING",
               proto="LL", nchannels=2, bytes_min=8, bytes_max=8, count=3),
            ev("coll_summary", 3.0, "profiler", comm_hash="0xbdba985b4a6820a", func="AllReduce", algo="RING",
               proto="LL", nchannels=2, bytes_min=8, bytes_max=8, count=2),
            ev("comm_destroy", 4.0, "preload", api="ncclCommDestroy", comm="0x000055d0c0a8e2a0", rc=0)]


def test_reader_joins_one_communicator_whatever_spelled_its_ids():
    m = model.build(EventLog(events=old_and_foreign_log()))
    c, = m.comms
    assert (c.comm, c.comm_hash, c.uid) == ("0x000055d0c0a8e2a0", HASH, HASH)
    assert c.seen_by == {"preload", "profiler"} and c.destroyed
    assert [s.count for s in c.colls.values()] == [5]


def test_nccl_log_ids_printed_without_leading_zeros_join_the_probes(tmp_path):
    # NCCL's own format: comm %p, commId 0x%llx (src/init.cc): neither keeps leading zeros.
    log = tmp_path / "nccl.log"
    log.write_text(f"{H}:10:10 [0] NCCL INFO ncclCommInitRank comm 0x55d0c0a8e2a0 rank 0 nranks 2 cudaDev 0 "
                   "nvmlDev 0 busId 1000 commId 0xbdba985b4a6820a - Init COMPLETE\n"
                   f"{H}:11:11 [1] NCCL INFO ncclCommInitRank comm 0x1541a650 rank 1 nranks 2 cudaDev 1 "
                   "nvmlDev 1 busId 2000 commId 0xbdba985b4a6820a - Init COMPLETE\n")
    m = nccllog_model.merge(model.build(EventLog(events=old_and_foreign_log())), [log])
    joined = next(c for c in m.comms if c.comm == "0x000055d0c0a8e2a0")
    assert joined.seen_by == {"preload", "profiler", "nccl-log"}
    # The other rank (pid 11) only NCCL's log saw: its ids, too, in the one spelling.
    other, = [c for c in m.comms if c is not joined]
    assert (other.comm, other.comm_hash) == ("0x000000001541a650", HASH)


def test_a_name_that_is_no_hex_id_is_kept_as_written_and_still_joins():
    """A hand-made or foreign log may name communicators ("decode"): no other spelling of it exists."""
    evs = [ev("comm_init", 1.0, "preload", api="ncclCommInitRank", call=1, comm="comm-a", uid="decode", env={}, rc=0),
           ev("comm_destroy", 2.0, "preload", api="ncclCommDestroy", comm="comm-a", rc=0)]
    c, = model.build(EventLog(events=evs)).comms
    assert (c.comm, c.uid, c.group, c.destroyed) == ("comm-a", "decode", "uid:decode", True)
