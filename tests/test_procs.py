"""The /proc reader on a fake /proc: parsing, tree walk, and every missing-data reason."""
import os
from pathlib import Path

import pytest

from ncclprobe.witnesses import procs
from fakeproc import BTIME, FailingReader, FakeProc, esrch


@pytest.fixture
def fake(tmp_path):
    return FakeProc(tmp_path)


def test_parse_stat_comm_with_spaces_and_parens():
    raw = b"42 (my (odd) name) S 7 42 42 0 -1 4194560 " + b" ".join([b"0"] * 12) + b" 555 " + \
        b" ".join([b"0"] * 25) + b" 11 12 13 14 0"  # fields 48-51: arg_start .. env_end
    st = procs.parse_stat(raw)
    assert (st.pid, st.comm, st.state, st.ppid, st.start_ticks) == (42, "my (odd) name", "S", 7, 555)
    assert st.env_span == (11, 12, 13, 14)


def test_parse_maps_dedups_and_marks_deleted():
    raw = (b"7f00-7f01 r--p 0 08:01 10 /lib/libnccl.so.2\n"
           b"7f01-7f02 r-xp 1 08:01 10 /lib/libnccl.so.2\n"
           b"7f02-7f03 r-xp 0 08:01 11 /opt/my dir/libx.so (deleted)\n"
           b"7f03-7f04 rw-p 0 00:00 0 [heap]\n"
           b"7f04-7f05 rw-s 0 00:05 12 /dev/zero\n")
    maps = procs.parse_maps(raw)
    by = {m.path: m for m in maps}
    assert by["/lib/libnccl.so.2"].executable and by["/lib/libnccl.so.2"].inode == 10
    assert by["/opt/my dir/libx.so"].deleted
    assert not by["/dev/zero"].executable
    assert len(maps) == 3


def test_walk_excludes_other_branches_and_orders_parents_first(fake):
    fake.add(1, 0, "init", env={})
    fake.add(10, 1, "server", env={"NCCL_PROTO": "LL"})
    fake.add(11, 10, "worker")
    fake.add(12, 11, "grandchild")
    fake.add(20, 1, "unrelated")
    tree = procs.walk(procs.ProcFS(fake.root), [10])
    assert list(tree.procs) == [10, 11, 12]
    assert 1 in tree.ancestors and 20 not in tree.procs
    assert tree.start_time(tree.procs[10]) == BTIME + 100 / os.sysconf("SC_CLK_TCK")


def test_thread_id_resolves_to_its_process(fake):
    fake.add(10, 1, "server")
    fake.add(13, 1, "server", tgid=10)  # a thread's /proc/<tid> is reachable but not listed
    assert procs.tgid_of(procs.ProcFS(fake.root), 13) == 10


def test_environ_permission_is_a_value(fake):
    fake.add(10, 1, env={"NCCL_PROTO": "LL"})
    fs = procs.ProcFS(fake.root, FailingReader({(10, "environ"): PermissionError}))
    block = fs.load(10).env
    assert (block.env, block.source, block.reason) == (None, "unreadable", "permission")


def test_hidepid_reason(fake):
    fake.add(10, 1, env={"NCCL_PROTO": "LL"})
    reader = FailingReader({(10, "environ"): PermissionError, (10, "status"): PermissionError})
    proc = procs.ProcFS(fake.root, reader).load(10)
    assert (proc.env.source, proc.env.reason) == ("unreadable", "hidepid")


def test_process_vanishing_mid_walk_is_skipped_with_a_note(fake):
    fake.add(10, 1)
    fake.add(11, 10)
    fake.add(12, 10)

    class GoneAfterScan(procs.Reader):
        """/proc/11 is seen by the scan, then exits before it is loaded."""
        stat_reads = 0

        def read_bytes(self, path):
            if Path(path).parts[-2:] == ("11", "stat"):
                self.stat_reads += 1
                if self.stat_reads > 1:
                    raise FileNotFoundError(2, "gone")
            if Path(path).parts[-2] == "11" and Path(path).name != "stat":
                raise ProcessLookupError(3, "gone")
            return super().read_bytes(path)

    fs = procs.ProcFS(fake.root, GoneAfterScan())
    fs_load = fs.load

    def load(pid, st=None, **kw):
        return fs_load(pid, None if pid == 11 else st, **kw)  # re-read stat at load, as a late reader would
    fs.load = load
    tree = procs.walk(fs, [10])
    assert list(tree.procs) == [10, 12]
    assert tree.skipped == [{"pid": 11, "reason": "vanished"}]


def test_files_vanishing_after_stat_leave_a_row_with_notes(fake):
    fake.add(10, 1)
    fake.add(11, 10, env={"NCCL_PROTO": "LL"})
    reader = FailingReader({(11, "owner"): FileNotFoundError, (11, "environ"): FileNotFoundError})
    tree = procs.walk(procs.ProcFS(fake.root, reader), [10])
    assert "owner: vanished" in tree.procs[11].notes and tree.procs[11].uid is None
    assert (tree.procs[11].env.source, tree.procs[11].env.reason) == ("unreadable", "vanished")


@pytest.mark.parametrize("kernel", ["0 bytes", "ESRCH"])
def test_empty_blocks_have_reasons(fake, kernel):
    """Zombies and kernel threads have no mm: older kernels read 0 bytes, Linux 6.x fails with ESRCH.
    Either way they are empty, never unreadable."""
    nomm = None if kernel == "0 bytes" else esrch()
    fake.add(10, 1, state="Z", env=b"", environ_error=nomm)
    fake.add(11, 2, comm="kworker/0:1", env=b"", flags=procs.PF_KTHREAD, environ_error=nomm)
    fake.add(12, 1, env=b"\0" * 1711)  # setproctitle zeroed the block
    fake.add(14, 1, env=b"sglang::scheduler\0\0\0")  # setproctitle wrote its title over it
    fs = procs.ProcFS(fake.root, fake.reader())
    assert (fs.load(10).env.source, fs.load(10).env.reason) == ("empty", "zombie")
    assert (fs.load(11).env.source, fs.load(11).env.reason) == ("empty", "kernel thread")
    assert fs.load(11).maps == [] and fs.load(10).maps == []
    assert (fs.load(12).env.source, fs.load(12).env.reason) == ("empty", "clobbered")
    assert (fs.load(14).env.source, fs.load(14).env.reason) == ("empty", "clobbered")


def test_zero_byte_block_is_an_empty_exec_environment(fake):
    """env -i / Popen(env={}): env_start == env_end, the block reads 0 bytes; setproctitle never
    shrinks a block, so this is the real exec-time environment, not a clobbered one."""
    fake.add(13, 1, env=b"", span=(100, 120, 120, 120))
    block = procs.ProcFS(fake.root).load(13).env
    assert (block.env, block.source, block.reason) == ({}, "exec", "empty at exec")


def test_zero_bytes_from_a_non_empty_block_means_it_exited(fake):
    """stat showed env_start < env_end, environ then read 0 bytes: the mm went away (older kernels)."""
    fake.add(13, 1, env=b"", span=(100, 120, 120, 400))
    block = procs.ProcFS(fake.root).load(13).env
    assert (block.source, block.reason) == ("unreadable", "vanished")


def test_environ_esrch_of_a_process_that_just_became_a_zombie(fake):
    """Alive at the walk's stat, a zombie by the environ read (ESRCH): empty (zombie), not vanished."""
    fake.add(10, 1, state="S", env={"NCCL_PROTO": "LL"}, environ_error=esrch())
    fs = procs.ProcFS(fake.root, fake.reader())
    st = fs.stat(10)
    (fake.root / "10" / "stat").write_text((fake.root / "10" / "stat").read_text().replace(") S ", ") Z "))
    assert (fs.load(10, st).env.source, fs.load(10, st).env.reason) == ("empty", "zombie")
    (fake.root / "10" / "stat").unlink()  # reaped: gone for good
    assert (fs.load(10, st).env.source, fs.load(10, st).env.reason) == ("unreadable", "vanished")


def test_partly_overwritten_block_keeps_the_readable_part(fake):
    fake.add(10, 1, env=b"sglang::scheduler_TP0 junk\0NCCL_PROTO=LL\0")
    block = procs.ProcFS(fake.root).load(10).env
    assert block.source == "exec" and block.reason == "partly overwritten"
    assert block.env == {"NCCL_PROTO": "LL"} and block.garbled == 1


def test_a_zeroed_head_is_partly_overwritten_and_what_it_covered_is_unknown(fake):
    """setproctitle zeroes the head of the block and leaves the tail (Ray's agents: ~1.6 KB of NULs):
    the tail's variables are kept, one that is not in the tail is unknown, never absent."""
    fake.add(10, 1, env=b"\0" * 1600 + b"VAR15=value15\0NCCL_ALGO=Ring\0")
    fake.add(11, 1, env=b"ray::IDLE\0" + b"\0" * 300 + b"NCCL_ALGO=Ring\0")  # the title, then NULs
    fake.add(12, 1, env=b"NCCL_ALGO=Ring\0" + b"\0" * 40)  # NULs over the end of it
    fake.add(13, 1, env=b"NCCL_ALGO=Ring\0OTHER=1\0")  # intact
    fs = procs.ProcFS(fake.root)
    for pid in (10, 11, 12):
        block = fs.load(pid).env
        assert (block.source, block.reason, block.partial) == ("exec", "partly overwritten", True), pid
        assert block.env["NCCL_ALGO"] == "Ring"
        assert block.lookup("NCCL_ALGO") == (True, "Ring") and block.lookup("NCCL_PROTO") == (False, None)
    whole = fs.load(13).env
    assert (whole.reason, whole.partial, whole.lookup("NCCL_PROTO")) == (None, False, (True, None))
    assert procs.zeroed_head(b"\0" * 1711) and not procs.zeroed_head(b"A=1\0B=2\0")


def test_non_utf8_is_escaped(fake):
    fake.add(10, 1, env=b"NCCL_SOCKET_IFNAME=eth\xff0\0BAD\xfeNAME=x\0")
    env = procs.ProcFS(fake.root).load(10).env.env
    assert env["NCCL_SOCKET_IFNAME"] == "eth\\xff0"
    assert env["BAD\\xfeNAME"] == "x"


def test_two_megabyte_environment(fake):
    big = {f"VAR_{i:06d}": "x" * 100 for i in range(20_000)}
    big["NCCL_ALGO"] = "Ring"
    fake.add(10, 1, env=big)
    block = procs.ProcFS(fake.root).load(10).env
    assert block.size > 2_000_000 and block.env["NCCL_ALGO"] == "Ring" and len(block.env) == 20_001


def test_thousand_process_tree(fake):
    fake.add(1, 0, "root", env={"NCCL_PROTO": "LL"})
    for pid in range(2, 1002):
        fake.add(pid, 1 if pid < 50 else pid // 20, env={"NCCL_PROTO": "LL"})
    tree = procs.walk(procs.ProcFS(fake.root), [1])
    assert len(tree.procs) == 1001 and not tree.skipped


def test_nvidia_fds(fake):
    fake.add(10, 1, fds=["/dev/null", "/dev/nvidiactl", "/dev/nvidia3", "/dev/nvidia0", "/dev/nvidia-uvm"])
    assert procs.ProcFS(fake.root).nvidia_fds(10) == [0, 3]


def test_in_root_uses_the_process_root(fake, tmp_path):
    fake.add(10, 1, root="/")
    fake.add(11, 1, root=str(tmp_path / "container"))
    fs = procs.ProcFS(fake.root)
    assert fs.in_root(fs.load(10), "/etc/nccl.conf") == Path("/etc/nccl.conf")
    assert fs.in_root(fs.load(11), "/etc/nccl.conf") == fake.root / "11" / "root" / "etc" / "nccl.conf"


def test_matching_pids(fake):
    fake.add(10, 1, cmdline=["python", "-m", "sglang.launch_server"])
    fake.add(11, 1, cmdline=["bash"])
    assert procs.matching_pids(procs.ProcFS(fake.root), r"sglang\.launch") == [10]


def test_real_proc_self():
    fs = procs.ProcFS()
    me = fs.load(os.getpid())
    assert me.env.source == "exec" and me.env.env.get("PATH") == os.environ.get("PATH")
    assert me.uid == os.geteuid()  # the owner of /proc/<pid>: the effective uid, as `ps -o user` shows
    assert any(m.path.endswith(".so") or "python" in m.path for m in me.maps)
