"""The tree read from /proc/<pid>/task/<tid>/children against the scan of every stat it replaces: the
same processes in the same order, on a live tree and on a fake /proc, and the scan whenever a children
file is missing."""
from pathlib import Path

import pytest

from ncclprobe.witnesses import procs
import livetree
from fakeproc import FakeProc


class NoChildren(procs.Reader):
    """A kernel without CONFIG_PROC_CHILDREN: every children file is absent."""

    def read_bytes(self, path):
        if Path(path).name == "children":
            raise FileNotFoundError(2, "no such file", str(path))
        return super().read_bytes(path)


class Counting(procs.Reader):
    """Counts which files are read, to tell the children walk from the scan."""

    def __init__(self, refuse: set[int] = frozenset()):
        self.children_reads = 0
        self.listed_root = False
        self.refuse = refuse

    def read_bytes(self, path):
        parts = Path(path).parts
        if parts[-1] == "children":
            self.children_reads += 1
        if parts[-1] == "stat" and len(parts) >= 2 and parts[-2].isdigit() and int(parts[-2]) in self.refuse:
            raise PermissionError(13, "not in the tree: never read", str(path))
        return super().read_bytes(path)

    def listdir(self, path):
        if Path(path).name == "proc":
            self.listed_root = True
        return super().listdir(path)


def shape(tree: procs.ProcTree) -> list[tuple]:
    return [(p.pid, p.ppid, p.name, p.start_ticks) for p in tree.procs.values()]


# A parent with a thread that starts a child and stays alive (that child is listed in the thread's
# children file, not the main thread's), a forked child with a grandchild, and exec'ed children. It says
# "ready" once every one of them has exec'd (each Popen returns after its child's exec), never on a clock.
TREE = r"""
import os, subprocess, sys, threading, time
ready = threading.Event()
def spawner():
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    ready.set()
    time.sleep(60)
threading.Thread(target=spawner, daemon=True).start()
ready.wait()
started, done = os.pipe()
if os.fork() == 0:
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    os.write(done, b"x")  # Popen returns once its child has exec'd: the fork child's subtree is complete
    time.sleep(60)
    os._exit(0)
os.close(done)
for _ in range(3):
    subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
assert os.read(started, 1) == b"x"  # EOF instead: the fork child died before its child ran
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def live_tree():
    with livetree.running(TREE) as (pid, words):
        assert words == ["ready"]
        yield pid


def test_live_children_walk_gives_the_scanned_tree(live_tree):
    counting = Counting()
    walked = procs.walk(procs.ProcFS(reader=counting), [live_tree])
    scanned = procs.walk(procs.ProcFS(reader=NoChildren()), [live_tree])
    assert counting.children_reads >= len(walked.procs) and not counting.listed_root
    assert shape(walked) == shape(scanned)
    assert len(walked.procs) == 1 + 1 + 2 + 3  # parent, thread's child, fork child and its child, 3 children
    root = walked.procs[live_tree]
    assert procs.ProcFS().stat(live_tree).threads == 2
    assert sorted(walked.children(live_tree)) == sorted(scanned.children(live_tree))
    assert len(walked.children(live_tree)) == 5 and list(walked.procs)[0] == root.pid
    assert list(walked.ancestors) == list(scanned.ancestors) and not walked.skipped


@pytest.fixture
def fake(tmp_path):
    return FakeProc(tmp_path)


def write_children(fake: FakeProc, pid: int, kids: list[int], tid: int | None = None) -> None:
    d = fake.root / str(pid) / "task" / str(tid or pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "children").write_text("".join(f"{k} " for k in kids))


def set_threads(fake: FakeProc, pid: int, n: int) -> None:
    path = fake.root / str(pid) / "stat"
    head, _, tail = path.read_text().rpartition(")")
    f = tail.split()
    f[17] = str(n)  # num_threads, field 20 (proc(5))
    path.write_text(head + ") " + " ".join(f) + "\n")


def build(fake: FakeProc) -> dict[int, list[int]]:
    """10 -> 11 (-> 13, 14), 12; 20 and 21 are outside the tree."""
    tree = {10: [11, 12], 11: [13, 14], 12: [], 13: [], 14: [], 20: [21], 21: []}
    parent = {k: p for p, kids in tree.items() for k in kids}
    for pid in tree:
        fake.add(pid, parent.get(pid, 1), comm=f"p{pid}", start=pid)
    return tree


def test_fake_children_walk_reads_only_the_tree(fake):
    tree = build(fake)
    for pid, kids in tree.items():
        write_children(fake, pid, kids)
    reader = Counting(refuse={20, 21})  # a scan would read (and be refused) their stat
    walked = procs.walk(procs.ProcFS(fake.root, reader), [10])
    scanned = procs.walk(procs.ProcFS(fake.root, NoChildren()), [10])
    assert shape(walked) == shape(scanned)
    assert list(walked.procs) == [10, 11, 13, 14, 12]
    assert reader.children_reads == 5 and not reader.listed_root


def test_fake_threads_children_files_are_all_read(fake):
    build(fake)
    write_children(fake, 10, [12])
    write_children(fake, 10, [11], tid=15)  # 11 was started by thread 15 of process 10
    set_threads(fake, 10, 2)
    for pid, kids in {11: [13, 14], 12: [], 13: [], 14: []}.items():
        write_children(fake, pid, kids)
    walked = procs.walk(procs.ProcFS(fake.root), [10])
    scanned = procs.walk(procs.ProcFS(fake.root, NoChildren()), [10])
    assert list(walked.procs) == list(scanned.procs) == [10, 11, 13, 14, 12]


def test_fake_missing_children_file_falls_back_to_the_scan(fake):
    tree = build(fake)
    for pid, kids in tree.items():
        if pid != 11:  # 11's is missing: what is under it is only seen by the scan
            write_children(fake, pid, kids)
    reader = Counting()
    walked = procs.walk(procs.ProcFS(fake.root, reader), [10])
    assert list(walked.procs) == [10, 11, 13, 14, 12]
    assert reader.listed_root


def test_fake_without_children_files_scans(fake):
    build(fake)
    reader = Counting()
    walked = procs.walk(procs.ProcFS(fake.root, reader), [10, 20])
    assert list(walked.procs) == [10, 11, 13, 14, 12, 20, 21] and reader.listed_root
