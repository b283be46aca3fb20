"""The native /proc reader (native/procread.c through ncclprobe.witnesses.procread) against the Python reader it
stands in for: the same processes with the same fields, on live trees and on a fake /proc, including
the cases it handles itself (children of every thread, zombies, buffers that must grow, maps rows
normalised for sharing)."""
import os

import pytest

from ncclprobe.witnesses import procread, procs
import livetree
from fakeproc import FakeProc


class PythonReader(procs.Reader):
    """The plain reader under another type: ProcFS then reads with Python, not the native reader."""


def both(roots, proc_root=procs.DEFAULT_PROC):
    native_fs = procs.ProcFS(proc_root)
    python_fs = procs.ProcFS(proc_root, PythonReader())
    assert native_fs._native is not None, "libprocread.so is not built (pip install .)"
    assert python_fs._native is None
    native, python = procs.walk(native_fs, roots), procs.walk(python_fs, roots)
    for tree, fs in ((native, native_fs), (python, python_fs)):
        for p in tree.procs.values():
            fs.resolve_root(p)  # the native reader read it during the walk, the Python one reads it now
    return native, python


def assert_same(native: procs.ProcTree, python: procs.ProcTree) -> None:
    assert list(native.procs) == list(python.procs)
    for pid, p in native.procs.items():
        q = python.procs[pid]
        for name in ("pid", "ppid", "name", "uid", "start_ticks", "flags", "env_span", "cmdline",
                     "cmdline_reason", "exe", "env", "maps", "maps_reason", "root", "root_reason", "same_mnt_ns",
                     "notes"):
            assert getattr(p, name) == getattr(q, name), (pid, name)
        assert p.state == q.state or {p.state, q.state} <= {"R", "S"}, pid  # read at two moments
    assert native.skipped == python.skipped and native.ancestors.keys() == python.ancestors.keys()


# A launcher with: exec'ed children alike, one with its own environment, one with none at all, one
# with non-UTF-8 bytes in it; a child started by a second thread (listed in that thread's children
# file); a zombie; and a child whose environment (~1.2 MB) is larger than the reader's first buffer.
TREE = r"""
import os, subprocess, sys, threading, time
sleep = [sys.executable, "-S", "-c", "import time; time.sleep(60)"]
def spawner():
    subprocess.Popen(sleep)
    ready.set()
    time.sleep(60)
ready = threading.Event()
threading.Thread(target=spawner, daemon=True).start()
ready.wait()
for _ in range(3):
    subprocess.Popen(sleep)
subprocess.Popen(sleep, env={**os.environ, "NCCL_PROTO": "Simple"})
subprocess.Popen(sleep, env={})
os.environb[b"NCCL_ODD"] = b"caf\xe9"
subprocess.Popen(sleep)
big = {**os.environ, **{f"BIG_{i}": "x" * 100_000 for i in range(12)}}
subprocess.Popen(sleep, env=big)
# a library mapped and then deleted: maps and PROCMAP_QUERY both name it "... (deleted)"
import _ctypes, shutil, tempfile
copy = os.path.join(tempfile.mkdtemp(), "libdeleted-copy.so")
shutil.copy(_ctypes.__file__, copy)
subprocess.Popen([sys.executable, "-S", "-c", "import ctypes, os, sys, time; ctypes.CDLL(sys.argv[1]); "
                  "os.unlink(sys.argv[1]); print(flush=True); time.sleep(60)", copy], stdout=subprocess.PIPE).stdout.readline()
zombie = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
time.sleep(1.0)
print("ready", zombie.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def live_tree():
    with livetree.running(TREE, env={**os.environ, "NCCL_PROTO": "LL"}) as (pid, words):
        assert words[0] == "ready"
        yield pid, int(words[1])


def test_live_tree_same_as_python(live_tree):
    root, zombie = live_tree
    native, python = both([root])
    assert_same(native, python)
    assert len(native.procs) == 1 + 1 + 3 + 5 + 1  # launcher, thread's child, 3 alike, 5 others, zombie
    deleted = [m for p in native.procs.values() for m in p.maps or () if m.deleted]
    assert [m.path.rsplit("/", 1)[1] for m in deleted] == ["libdeleted-copy.so"] and deleted[0].executable
    assert native.procs[zombie].state == "Z" and native.procs[zombie].env.reason == "zombie"
    envs = {pid: p.env for pid, p in native.procs.items()}
    assert sum(1 for e in envs.values() if e.env and e.env.get("BIG_0")) == 1
    assert any(e.reason == "empty at exec" for e in envs.values())
    assert any(e.env and e.env.get("NCCL_ODD") == "caf\\xe9" for e in envs.values())
    # exec'ed siblings alike share one parsed block, one command line and one list of mappings
    alike = [p for p in native.procs.values() if p.ppid == root and p.env.env and p.env.env.get("NCCL_PROTO") == "LL"
             and "NCCL_ODD" not in p.env.env and "BIG_0" not in p.env.env and p.state != "Z"]
    assert len(alike) == 4  # the thread's child and the 3 alike
    assert len({id(p.env) for p in alike}) == 1 and len({id(p.cmdline) for p in alike}) == 1
    assert len({id(p.maps) for p in alike}) == 1


def test_live_maps_rows_from_the_kernel_query_or_the_file(live_tree):
    """On Linux >= 6.11 the reader asks for the rows it needs (PROCMAP_QUERY); before, it reads maps.
    Either way the mappings are those of the maps file, as the Python reader parses them."""
    root, _ = live_tree
    flat, _ = procread.native().tree("/proc", [root])
    how = {flat[i + procread.O_MAPS_HOW] for i in range(0, len(flat), procread.PR_OUT)
           if flat[i + procread.O_ROLE] == procread.R_TREE and not flat[i + procread.O_ERR]} - {procread.M_NONE}
    release = tuple(int(x) for x in os.uname().release.split(".")[:2] if x.isdigit())
    assert how == ({procread.M_QUERY} if release >= (6, 11) else {procread.M_READ})
    fs = procs.ProcFS()
    for p in procs.walk(fs, [root]).procs.values():
        if p.maps:
            assert p.maps == procs.parse_maps(open(f"/proc/{p.pid}/maps", "rb").read()), p.pid


def test_live_maps_read_when_asked(live_tree, monkeypatch):
    """NCCLPROBE_NATIVE_PROC=maps: the same processes, from the maps files."""
    root, _ = live_tree
    monkeypatch.setenv("NCCLPROBE_NATIVE_PROC", "maps")
    flat, _ = procread.native().tree("/proc", [root])
    assert {flat[i + procread.O_MAPS_HOW] for i in range(0, len(flat), procread.PR_OUT)} - {procread.M_NONE} == \
        {procread.M_READ}
    native, python = both([root])
    assert_same(native, python)


def test_live_ancestors_and_self_excluded(live_tree):
    root, _ = live_tree
    native_fs = procs.ProcFS()
    tree = procs.walk(native_fs, [os.getpid(), root], exclude=frozenset({os.getpid()}))
    python = procs.walk(procs.ProcFS(reader=PythonReader()), [os.getpid(), root], exclude=frozenset({os.getpid()}))
    assert list(tree.procs) == list(python.procs) and tree.excluded == python.excluded
    assert list(tree.ancestors) == list(python.ancestors)


MAPS = (
    "{a}-{b} r--p 00000000 08:01 1000{pad}/usr/lib/libnccl.so.2\n"
    "{a}-{b} r-xp 00001000 08:01 1000{pad}/usr/lib/libnccl.so.2\n"
    "{a}-{b} r-xp 00000000 08:01 1001{pad}/opt/my dir/libx.so (deleted)\n"
    "{a}-{b} rw-p 00000000 00:00 0 \n"
    "{a}-{b} rw-p 00000000 00:00 0{pad}[heap]\n"
    "{a}-{b} rw-s 00000000 00:05 501{pad}/dev/nvidia0\n"
    "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n"
)


def test_fake_tree_same_as_python(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, comm="my (odd) name", env={"NCCL_PROTO": "LL"})
    fake.add(11, 10, env={"NCCL_PROTO": "LL", "BIG": "y" * (1 << 20)})  # grows the first buffer
    fake.add(12, 10, env=b"NCCL_ALGO=Ring\0garbled title\0caf\xe9=1\0")
    fake.add(16, 10, env=b"\0" * 1600 + b"NCCL_ALGO=Ring\0")  # setproctitle zeroed the head (parsed alike)
    fake.add(13, 10, state="Z", env={})
    fake.add(14, 10, flags=0x00200000, comm="kworker/0:1")  # a kernel thread
    fake.add(15, 10, env={}, exe="/bin/true", root="/srv/container")
    # the same mappings at other addresses, with the padding of another address width
    (fake.root / "11" / "maps").write_text(MAPS.format(a="7f0000000000", b="7f0000001000", pad=" " * 20))
    (fake.root / "12" / "maps").write_text(MAPS.format(a="00400000", b="00401000", pad=" " * 28))
    (fake.root / "15" / "maps").write_text(MAPS.format(a="7f0000000000", b="7f0000001000", pad=" ") + "\n")
    native, python = both([10], fake.root)
    assert_same(native, python)
    assert native.procs[10].name == "my (odd) name"
    assert native.procs[13].env.reason == "zombie" and native.procs[13].maps == []
    assert native.procs[14].env.reason == "kernel thread"
    assert (native.procs[16].env.reason, native.procs[16].env.partial) == ("partly overwritten", True)
    assert native.procs[15].root == "/srv/container"
    maps = native.procs[11].maps
    assert maps is native.procs[12].maps and maps is native.procs[15].maps  # one parse for the three
    assert {m.path: m.executable for m in maps} == {"/usr/lib/libnccl.so.2": True, "/opt/my dir/libx.so": True,
                                                   "/dev/nvidia0": False}
    assert [m.deleted for m in maps] == [False, True, False]
    assert procs.normalise_maps((fake.root / "11" / "maps").read_bytes()) == \
        procs.normalise_maps((fake.root / "12" / "maps").read_bytes())


def test_fake_tree_of_many_processes(tmp_path):
    """More processes than the reader's first output array holds."""
    fake = FakeProc(tmp_path)
    fake.add(2, 1, env={"NCCL_PROTO": "LL"})
    for pid in range(3, 1303):
        fake.add(pid, 2, env={"NCCL_PROTO": "LL"}, start=pid)
    native, python = both([2], fake.root)
    assert len(native.procs) == 1301
    assert_same(native, python)


def test_missing_or_unreadable_roots(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1)
    native, python = both([10, 999], fake.root)
    assert_same(native, python)
    assert native.skipped == [{"pid": 999, "reason": "vanished"}]


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("NCCLPROBE_NATIVE_PROC", "0")
    assert procread.native() is None and procs.ProcFS()._native is None
    monkeypatch.delenv("NCCLPROBE_NATIVE_PROC")
    assert procs.ProcFS()._native is not None


def test_fake_tree_order_exclusion_and_ancestors(tmp_path):
    """With children files (the native walk's own path, no scan): walk's order, a left-out subtree,
    a root inside another root's tree, and the ancestors above the roots."""
    fake = FakeProc(tmp_path)
    tree = {1: [5], 5: [10], 10: [13, 11, 12], 11: [20, 21], 12: [30], 13: [], 20: [], 21: [], 30: [40], 40: []}
    parent = {k: p for p, kids in tree.items() for k in kids}
    for pid, kids in tree.items():
        fake.add(pid, parent.get(pid, 0), comm=f"p{pid}", start=pid, env={"NCCL_PROTO": "LL"})
        d = fake.root / str(pid) / "task" / str(pid)
        d.mkdir(parents=True)
        (d / "children").write_text("".join(f"{k} " for k in kids))
    for roots, exclude in (([10], frozenset({11})), ([10, 30], frozenset({12})), ([30, 10], frozenset())):
        native_fs, python_fs = procs.ProcFS(fake.root), procs.ProcFS(fake.root, PythonReader())
        native = procs.walk(native_fs, roots, exclude=exclude)
        python = procs.walk(python_fs, roots, exclude=exclude)
        for t, fs in ((native, native_fs), (python, python_fs)):
            for p in [*t.procs.values(), *t.ancestors.values()]:
                fs.resolve_root(p)
        assert_same(native, python)
        assert native.excluded == python.excluded and list(native.ancestors) == list(python.ancestors)
        for a in native.ancestors:
            assert native.ancestors[a].__dict__ == python.ancestors[a].__dict__
    assert list(native.procs) == [30, 40, 10, 11, 20, 21, 12, 13] and list(native.ancestors) == [5, 1]
    native = procs.walk(procs.ProcFS(fake.root), [10], exclude=frozenset({11}))
    assert list(native.procs) == [10, 12, 30, 40, 13] and native.excluded == [11]


def test_incomplete_tree_does_not_use_what_was_read_of_an_ancestor(tmp_path):
    """Roots 10 and 13 with 10 -> 11 -> 12 -> 13 and 11's children file missing: the native walk
    reads 12 as 13's ancestor (no environ, no maps), then the tree is read again from a scan, which
    lists 12 as a process of the tree: its environment and mappings must be read, not taken as empty."""
    fake = FakeProc(tmp_path)
    for pid, ppid, kids in ((10, 1, [11]), (11, 10, [12]), (12, 11, [13]), (13, 12, [])):
        fake.add(pid, ppid, comm=f"p{pid}", env={"NCCL_PROTO": "LL"}, maps=["/usr/lib/libnccl.so.2"])
        if pid != 11:
            d = fake.root / str(pid) / "task" / str(pid)
            d.mkdir(parents=True)
            (d / "children").write_text("".join(f"{k} " for k in kids))
    native, python = both([10, 13], fake.root)
    assert_same(native, python)
    assert native.procs[12].env.env == {"NCCL_PROTO": "LL"} and [m.path for m in native.procs[12].maps] == \
        ["/usr/lib/libnccl.so.2"]


def test_odd_fake_proc_files(tmp_path):
    """A children file naming pid 0 or a number beyond any pid, a FIFO for maps (never opened
    blocking), a stat line too short to parse: each process is read or skipped, nothing hangs."""
    fake = FakeProc(tmp_path)
    fake.add(5, 1)
    fake.add(6, 5)
    fake.add(7, 5)
    d = fake.root / "5" / "task" / "5"
    d.mkdir(parents=True)
    (d / "children").write_text("0 4294967296 99999999999999999999 6 7 ")
    (fake.root / "6" / "maps").unlink()
    os.mkfifo(fake.root / "6" / "maps")
    (fake.root / "7" / "stat").write_text("77 (x) S 1 2\n")
    tree = procs.walk(procs.ProcFS(fake.root), [5])
    assert list(tree.procs) == [5, 6]
    assert tree.procs[6].maps == []  # a FIFO reads as empty, without blocking
