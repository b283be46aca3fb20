"""Why /proc/<pid>/environ was refused, on a fake /proc (the kernel's checks are read from status and
the files' owners, as procaccess reads them on a real one)."""
from ncclprobe.witnesses import procaccess, procs
from ncclprobe.witnesses.procaccess import Viewer
from fakeproc import FakeProc

PTRACE = 1 << procaccess.CAP_SYS_PTRACE


class Owned(procs.Reader):
    """/proc/<pid> owned by the task's euid (1000), its environ by environ_owner (root when the task is
    not dumpable: fs/proc/base.c task_dump_owner)."""

    def __init__(self, environ_owner: int):
        self.environ_owner = environ_owner

    def owner(self, path):
        return self.environ_owner if str(path).endswith("/environ") else 1000


def status(fake: FakeProc, pid: int, uids=(1000, 1000, 1000), gids=(1000, 1000, 1000), cap_prm=0):
    d = fake.root / str(pid)
    (d / "status").write_text(f"Name:\tpython\nState:\tS\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t1\n"
                              f"Uid:\t{' '.join(map(str, uids))}\t{uids[1]}\n"
                              f"Gid:\t{' '.join(map(str, gids))}\t{gids[1]}\nCapPrm:\t{cap_prm:016x}\n")


def test_each_condition_of_ptrace_access_is_named(tmp_path):
    fake = FakeProc(tmp_path)
    for pid in (10, 11, 12, 13, 14):
        fake.add(pid, 1, uid=1000)
    status(fake, 10, uids=(0, 0, 0))
    status(fake, 11, uids=(1000, 1000, 0))  # a saved uid of another user is enough to be refused
    status(fake, 12, gids=(1000, 50, 50))
    status(fake, 13, cap_prm=1 << 12)
    status(fake, 14)
    fs = procs.ProcFS(fake.root, Owned(1000))  # dumpable, as far as the owners say
    me = Viewer(1000, 1000, 0)
    got = {pid: procaccess.denied_by(fs, pid, 1000, me) for pid in (10, 11, 12, 13)}
    assert got == {10: "other user", 11: "other user", 12: "other group", 13: "capabilities"}
    # the same user, group and capabilities: the owner of its files says whether it is dumpable
    assert procaccess.denied_by(procs.ProcFS(fake.root, Owned(0)), 14, 1000, me) == "not dumpable"
    assert procaccess.denied_by(procs.ProcFS(fake.root, Owned(1000)), 14, 1000, me) == "refused"
    # CAP_SYS_PTRACE overrides all of them: what refuses then is not in /proc
    assert procaccess.denied_by(fs, 10, 1000, Viewer(1000, 1000, PTRACE)) == "refused"


def test_status_unreadable_falls_back_on_the_directory_owner(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, uid=0)
    fs = procs.ProcFS(fake.root, fake.reader({(10, "status"): PermissionError}))
    assert procaccess.denied_by(fs, 10, 0, Viewer(1000, 1000, 0)) == "other user"


def test_viewer_reads_this_process():
    me = procaccess.viewer()
    assert me.uid >= 0 and me.caps is not None
