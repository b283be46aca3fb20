"""The live witness (`inspect --live`, witnesses/livemem.py) on real processes: the environment a
process holds now, read from its memory. Python (os.environ), C (setenv, putenv, unsetenv, clearenv,
`environ = newarray`), a reallocated array, a copy-relocated `environ`, static binaries, a writer
thread racing 1,000 reads, another mount namespace (a fake /proc root; a real `unshare --mount`
where the machine allows it), the ptrace-model reasons, secrets, and `inspect --live --json` end to
end. Each read runs three ways where it can: native/livemem.c asking the kernel for mappings
(PROCMAP_QUERY), the same reading maps files, and the Python reference.

Every test waits on its processes' own answers (a line on a pipe), never on time.
"""
from __future__ import annotations

import errno
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from fakeproc import FakeProc
from ncclprobe import schemas
from ncclprobe.model import LIVE_WHERE
from ncclprobe.witnesses import livemem, liveread, procaccess

SRC = Path(__file__).parent / "c" / "live_env.c"
MODES = ["native", "native-maps", "python"]
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]


# ------------------------------------------------------------------------------------- fixtures
def _cc(out: Path, *flags: str) -> Path | str:
    """The test program built with flags, or why it could not be."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler"
    r = subprocess.run([cc, "-O1", "-o", str(out), str(SRC), *flags], capture_output=True, text=True)
    return out if r.returncode == 0 else f"{' '.join(flags)}: {r.stderr.strip()[-300:]}"


@pytest.fixture(scope="module")
def progs(tmp_path_factory) -> dict[str, Path | str]:
    """The C program, built into a directory every user can enter (the permission tests run it as
    another user): plain (reaches the C library's environ through dlsym), copy-relocated (names
    `environ`: the executable defines it), static with symbols, static stripped."""
    d = Path(tempfile.mkdtemp(prefix="ncclprobe-live-"))
    os.chmod(d, 0o755)
    built = {"plain": _cc(d / "plain", "-ldl", "-lpthread"),
             "direct": _cc(d / "direct", "-DDIRECT", "-no-pie", "-lpthread"),
             "static": _cc(d / "static", "-DDIRECT", "-static", "-lpthread"),
             "stripped": _cc(d / "stripped", "-DDIRECT", "-static", "-s", "-lpthread")}
    if isinstance(built["plain"], str):
        pytest.skip(f"cannot build {SRC.name}: {built['plain']}")
    yield built
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=MODES)
def mode(request, monkeypatch) -> str:
    if request.param == "python":
        monkeypatch.setenv("NCCLPROBE_NATIVE_LIVE", "0")
    else:
        monkeypatch.setenv("NCCLPROBE_NATIVE_LIVE", "maps" if request.param == "native-maps" else "1")
        if liveread.load() is None:
            pytest.skip("native/livemem.c is not built (an uninstalled source tree)")
    return request.param


def read(pid: int, mode: str, **kw) -> livemem.LiveEnv:
    reading = livemem.Reading(kw.pop("watched", livemem.is_watched), kw.pop("expected", {}), **kw)
    assert reading.native == (mode != "python")
    return reading.read(pid)


class Proc:
    """A running test program: each command is answered with one line once it is done."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, **kw):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={"NCCL_START": "exec", **(env or {})}, **kw)
        line = self.p.stdout.readline().split()
        assert line and line[0] == "ready", line
        self.ready = line
        self.pid = int(line[1]) if len(line) > 1 else self.p.pid

    def __call__(self, command: str) -> str:
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        answer = self.p.stdout.readline().strip()
        assert answer.startswith("ok"), (command, answer)
        return answer

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@contextmanager
def running(argv, env=None, **kw):
    proc = Proc([str(a) for a in argv], env, **kw)
    try:
        yield proc
    finally:
        proc.stop()


PY_CHILD = r"""
import os, sys
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    op, _, rest = line.strip().partition(" ")
    if op == "set":
        k, _, v = rest.partition("=")
        os.environ[k] = v
    elif op == "unset":
        os.environ.pop(rest, None)
    elif op == "putenv":  # the C level only: os.environ does not see it
        k, _, v = rest.partition("=")
        os.putenv(k, v)
    print("ok", flush=True)
"""


# ------------------------------------------------------------------------------- what is read
def test_python_os_environ_writes_are_read_as_the_process_holds_them(mode):
    with running([sys.executable, "-S", "-c", PY_CHILD],
                 {"NCCL_PROTO": "LL", "NCCL_GONE": "x", "SECRET_TOKEN": "hunter2-exec", "HOME": "/h"}) as p:
        assert read(p.pid, mode).env == {"NCCL_START": "exec", "NCCL_PROTO": "LL", "NCCL_GONE": "x"}
        p("set NCCL_PROTO=Simple")
        p("unset NCCL_GONE")
        p("set NCCL_NEW=1")
        p("set CUDA_VISIBLE_DEVICES=0,1")
        p("putenv NCCL_C_LEVEL=2")
        p("set SECRET_TOKEN=hunter2-now")
        got = read(p.pid, mode, expected={"SECRET_TOKEN": "hunter2-now", "HOME": "/elsewhere", "NCCL_NEW": "1"})
        assert got.reason is None and got.retries == 0 and got.bytes_read > 0 and got.t
        assert got.env == {"NCCL_START": "exec", "NCCL_PROTO": "Simple", "NCCL_NEW": "1",
                           "CUDA_VISIBLE_DEVICES": "0,1", "NCCL_C_LEVEL": "2"}
        # expected names outside the watched set: equal or not, never their value
        assert got.expected == {"SECRET_TOKEN": True, "HOME": False, "NCCL_NEW": True}
        assert "hunter2" not in repr(got)


def test_c_setenv_putenv_unsetenv(mode, progs):
    with running([progs["plain"]], {"NCCL_ALGO": "Ring"}) as p:
        p("set NCCL_A 1")
        p("put NCCL_P=2")
        p("unset NCCL_START")
        p("set NCCL_ALGO Tree")
        assert read(p.pid, mode).env == {"NCCL_A": "1", "NCCL_P": "2", "NCCL_ALGO": "Tree"}


@pytest.mark.parametrize("kind", ["plain", "direct"])
def test_direct_replacement_of_environ_and_clearenv(mode, progs, kind):
    """`environ = newarray` (the C library's slot through dlsym, or the executable's own copy), and
    clearenv(), which leaves environ NULL."""
    with running([progs[kind]], {"NCCL_ALGO": "Ring"}) as p:
        p("replace NCCL_R=1 OTHER=2 NCCL_S=3 NCCL_R=shadowed")
        assert read(p.pid, mode).env == {"NCCL_R": "1", "NCCL_S": "3"}  # the first of a name, as getenv
        p("clear")
        got = read(p.pid, mode)
        assert got.env == {} and got.reason is None


def test_a_reallocated_array(mode, progs):
    """glibc moves the exec-time array to the heap on the first new name, then reallocates it."""
    with running([progs["plain"]]) as p, open(f"/proc/{p.pid}/mem", "rb", buffering=0) as mem:
        _, slot, _ = livemem._locate(livemem.MemReader(), f"/proc/{p.pid}", {})
        at_exec = os.pread(mem.fileno(), 8, slot)
        p("many 10")
        moved = os.pread(mem.fileno(), 8, slot)
        p("many 700")
        assert len({at_exec, moved, os.pread(mem.fileno(), 8, slot)}) == 3  # moved to the heap, then grown
        got = read(p.pid, mode)
        assert got.env == {"NCCL_START": "exec", **{f"NCCL_MANY_{i}": "x" for i in range(700)}}


def test_a_copy_relocated_environ_is_read_from_the_executable(mode, progs):
    readelf = shutil.which("readelf")
    if readelf:
        syms = subprocess.run([readelf, "-W", "--dyn-syms", str(progs["direct"])], capture_output=True, text=True).stdout
        defined = [line for line in syms.splitlines() if " environ@" in line and " UND " not in line]
        assert defined, syms  # the executable defines environ (R_X86_64_COPY)
        plain = subprocess.run([readelf, "-W", "--dyn-syms", str(progs["plain"])], capture_output=True, text=True).stdout
        assert "environ" not in plain
    with running([progs["direct"]]) as p:
        p("set NCCL_A 1")
        maps, slot, _ = livemem._locate(livemem.MemReader(), f"/proc/{p.pid}", {})
        exe = maps.lowest(os.fsencode(os.readlink(f"/proc/{p.pid}/exe")))
        assert exe[0] <= slot < exe[0] + (1 << 24)  # the slot is the executable's, not libc's stale one
        assert read(p.pid, mode).env == {"NCCL_START": "exec", "NCCL_A": "1"}


def test_static_binaries(mode, progs):
    if isinstance(progs["static"], str):
        pytest.skip(f"no static binary could be built here ({progs['static']})")
    with running([progs["static"]]) as p:
        p("set NCCL_A 1")
        assert read(p.pid, mode).env == {"NCCL_START": "exec", "NCCL_A": "1"}  # from its .symtab
    if isinstance(progs["stripped"], str):
        pytest.skip(f"no stripped static binary ({progs['stripped']})")
    with running([progs["stripped"]]) as p:
        got = read(p.pid, mode)
        assert got.env is None and got.reason == livemem.NO_SYMBOLS


def test_a_writer_thread_racing_1000_reads(mode, progs):
    """setenv in a loop on another thread (new names, unset names, the array reallocated) while the
    environment is read 1,000 times: every read is a consistent snapshot (the writer sets A then B
    to the same counter, so B is A or A - 1) or says it was torn, and both sides survive. The writer
    rests 100 us every 64 iterations (~200 us of writes): one that never rests changes the array
    faster than two reads of it can agree, and a read then succeeds only when the scheduler happens
    to stop the writer (on a busy 2-core machine, in some runs never)."""
    with running([progs["plain"]]) as p:
        p("stress 2000 64 100")  # 2 us of work between iterations, a 100 us rest every 64
        start = int(p("count").split()[1])
        reading = livemem.Reading(native=mode != "python")
        ok = torn = 0
        seen = set()
        for _ in range(1000):
            got = reading.read(p.pid)
            if got.env is None:
                assert got.reason == livemem.torn_reason(livemem.RETRIES), got
                torn += 1
                continue
            ok += 1
            a, b = int(got.env["NCCL_STRESS_A"]), int(got.env["NCCL_STRESS_B"])
            assert b in (a, a - 1), got.env
            seen.add(a)
            assert set(got.env) <= {"NCCL_START", "NCCL_STRESS_A", "NCCL_STRESS_B",
                                    *(f"NCCL_STRESS_N{i}" for i in range(64))}, got.env
            assert all(v.isdigit() for k, v in got.env.items() if k != "NCCL_START"), got.env
        assert int(p("count").split()[1]) > start and p.p.poll() is None  # it ran on, and still answers
        assert ok > 0, f"every read torn ({torn})"


# ----------------------------------------------------------------------------- other namespaces
def _fake_root(tmp_path: Path, pid: int, renames: dict[str, str]) -> Path:
    """A /proc whose <pid> shows its mapped files under other paths (renames: real -> as the process
    sees them), found only inside its root: another mount namespace as /proc shows it."""
    proc = tmp_path / "proc"
    d = proc / str(pid)
    rootfs = tmp_path / "rootfs"
    d.mkdir(parents=True)
    os.symlink(f"/proc/{pid}/mem", d / "mem")
    os.symlink(rootfs, d / "root")
    inodes = {}
    for real, seen in renames.items():
        copy = rootfs / seen.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(real, copy)
        inodes[real] = os.stat(copy).st_ino
    rows = []
    for row in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = row.split(None, 5)
        if len(parts) == 6 and parts[5] in renames:
            parts[4], parts[5] = str(inodes[parts[5]]), renames[parts[5]]
        rows.append(" ".join(parts))
    (d / "maps").write_text("\n".join(rows) + "\n")
    exe = os.readlink(f"/proc/{pid}/exe")
    os.symlink(renames.get(exe, exe), d / "exe")
    return proc


def _libc_of(pid: int) -> str:
    return next(r.split(None, 5)[5] for r in Path(f"/proc/{pid}/maps").read_text().splitlines()
                if "/libc.so" in r or "/libc-" in r)


def test_a_fake_proc_root_whose_files_are_only_inside_the_process_root(mode, progs, tmp_path):
    with running([progs["direct"]]) as p, running([sys.executable, "-S", "-c", PY_CHILD]) as py:
        p("set NCCL_A 1")
        py("set NCCL_B=2")
        for proc, want in ((p, {"NCCL_START": "exec", "NCCL_A": "1"}), (py, {"NCCL_START": "exec", "NCCL_B": "2"})):
            exe, libc = os.readlink(f"/proc/{proc.pid}/exe"), _libc_of(proc.pid)
            base = tmp_path / str(proc.pid)
            fake = _fake_root(base, proc.pid, {exe: "/ctr/bin/prog", libc: "/ctr/lib/libc.so.6"})
            assert not os.path.exists("/ctr/lib/libc.so.6")
            assert read(proc.pid, mode, proc_root=fake).env == want
            shutil.rmtree(base / "rootfs")  # the root gone: the files cannot be found, and that is said
            got = read(proc.pid, mode, proc_root=fake)
            assert got.env is None and "not at its path" in got.reason, got


def test_a_real_mount_namespace(mode, progs, tmp_path):
    """The copy-relocated program run from a tmpfs mounted in a mount namespace of its own: its
    executable's path does not exist in ours, only through /proc/<pid>/root."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) for a mount namespace")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = 'mount -t tmpfs tmpfs "$1" && cp "$2" "$1/prog" && exec "$1/prog"'
    proc = subprocess.Popen([unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(mnt),
                             str(progs["direct"])], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"NCCL_START": "exec"})
    try:
        line = proc.stdout.readline().split()
        if not line:
            proc.wait()
            pytest.skip(f"unshare --mount is not allowed here: {proc.stderr.read().strip()[-200:]}")
        pid = int(line[1])
        assert os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")
        assert not (mnt / "prog").exists()  # not in our namespace
        proc.stdin.write("set NCCL_A 1\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "ok"
        assert read(pid, mode).env == {"NCCL_START": "exec", "NCCL_A": "1"}
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------ reasons
class Refused(livemem.MemReader):
    def open_mem(self, path):
        raise PermissionError(errno.EACCES, "Permission denied", path)


def test_yama_and_ptrace_reasons_on_a_fake_proc(tmp_path):
    """Opening /proc/<pid>/mem needs ptrace attach access: Yama's ptrace_scope first (1: descendants
    only, 2: CAP_SYS_PTRACE, 3: nobody), then procaccess's conditions."""
    me = os.getpid()
    fake = FakeProc(tmp_path)
    fake.add(40, 1, uid=os.geteuid())              # not ours
    fake.add(41, 42, uid=os.geteuid())             # our grandchild
    fake.add(42, me, uid=os.geteuid())
    fake.add(43, 1, uid=os.geteuid() + 1)          # another user's
    for pid, uid in ((40, os.geteuid()), (41, os.geteuid()), (43, os.geteuid() + 1)):
        (fake.root / str(pid) / "status").write_text(f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{os.getegid()}\t"
                                                    f"{os.getegid()}\t{os.getegid()}\t{os.getegid()}\nCapPrm:\t0\n")
    no_caps = procaccess.Viewer(os.geteuid(), os.getegid(), 0)
    ptracer = procaccess.Viewer(os.geteuid(), os.getegid(), 1 << procaccess.CAP_SYS_PTRACE)

    def reason(pid, viewer=no_caps):
        got = livemem.Reading(proc_root=fake.root, reader=Refused(), viewer=viewer).read(pid)
        assert got.env is None
        return got.reason

    assert livemem.yama_scope(fake.root) is None
    assert reason(43) == "permission: other user"
    assert reason(40) == "permission: refused"
    yama = fake.root / "sys" / "kernel" / "yama"
    yama.mkdir(parents=True)
    (yama / "ptrace_scope").write_text("1\n")
    assert reason(40).startswith("permission: ptrace_scope 1 ")
    assert reason(41) == "permission: refused"      # a descendant: Yama lets it through
    assert reason(40, ptracer) == "permission: refused"
    (yama / "ptrace_scope").write_text("2\n")
    assert reason(41).startswith("permission: ptrace_scope 2 ")
    assert reason(41, ptracer) == "permission: refused"
    (yama / "ptrace_scope").write_text("3\n")
    assert reason(41, ptracer).startswith("permission: ptrace_scope 3 ")


def _as_user(uid: int, gid: int, pid: int, native: bool) -> str:
    """livemem's reason for pid, read by a fork of this process that became uid/gid (no capability
    left: the kernel drops them with the uids)."""
    liveread.load()  # the library loaded before the fork
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.close(r)
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            got = livemem.live_env(pid, native=native)
            os.write(w, json.dumps([got.reason, got.env]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        out = fh.read()
    os.waitpid(child, 0)
    reason, env = json.loads(out)
    assert env is None
    return reason


@pytest.mark.parametrize("native", [True, False])
def test_permission_of_another_user_and_of_a_process_that_is_not_dumpable(progs, other_user, native):
    if native and liveread.load() is None:
        pytest.skip("native/livemem.c is not built")
    gid = pwd.getpwuid(other_user).pw_gid
    with running([progs["plain"]]) as root_proc:  # root's: another user's for other_user
        assert _as_user(other_user, gid, root_proc.pid, native) == "permission: other user"

    def become():
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(other_user, other_user, other_user)
    with running([progs["plain"]], preexec_fn=become) as theirs:
        theirs("undump")
        assert _as_user(other_user, gid, theirs.pid, native) == "permission: not dumpable"


def test_gone_zombie_and_kernel_thread(mode, progs):
    p = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    p.wait()
    assert read(p.pid, mode).reason == livemem.GONE
    z = subprocess.Popen([sys.executable, "-S", "-c", "import sys; sys.stdout.write('x'); sys.stdout.flush()"],
                         stdout=subprocess.PIPE)
    z.stdout.read(1)
    z.stdout.read()  # EOF: it has exited and is a zombie until waited for
    try:
        assert read(z.pid, mode).reason == livemem.NO_MEMORY
    finally:
        z.wait()
    try:
        kthread = int(Path("/proc/2/stat").read_text().rpartition(")")[2].split()[6]) & 0x00200000
    except (OSError, ValueError, IndexError):
        kthread = 0
    if kthread:  # kthreadd, where this PID namespace shows the kernel's threads
        assert read(2, mode).reason == livemem.NO_MEMORY


class Tearing(livemem.MemReader):
    """The environ slot reads differently every second time, `tears` times: setenv moving the array."""

    def __init__(self, slot: int, tears: int):
        self.slot, self.tears, self.count = slot, tears, 0

    def pread(self, fd, n, addr):
        data = super().pread(fd, n, addr)
        if addr == self.slot and self.tears:
            self.count += 1
            if self.count % 2 == 0:
                self.tears -= 1
                return bytes(b ^ 0xFF for b in data)
        return data


def test_a_torn_read_is_retried_and_then_given_up(progs):
    with running([progs["plain"]]) as p:
        p("set NCCL_A 1")
        _, slot, _ = livemem._locate(livemem.MemReader(), f"/proc/{p.pid}", {})
        got = livemem.live_env(p.pid, reader=Tearing(slot, 2))
        assert got.env == {"NCCL_START": "exec", "NCCL_A": "1"} and got.retries == 2
        got = livemem.live_env(p.pid, reader=Tearing(slot, 1000))
        assert got.env is None and got.reason == "torn after 5 retries" and got.retries == 5


def test_reads_are_bounded(progs, monkeypatch):
    with running([progs["plain"]]) as p:
        p("many 2000")
        monkeypatch.setattr(livemem, "MAX_BYTES", 4096)
        got = livemem.live_env(p.pid, native=False)
        assert got.env is None and got.reason == livemem.BOUNDED and got.bytes_read <= 4096


def test_the_native_and_the_python_reads_agree(progs):
    if liveread.load() is None:
        pytest.skip("native/livemem.c is not built")
    with running([progs["plain"]]) as c, running([progs["direct"]]) as d, \
            running([sys.executable, "-S", "-c", PY_CHILD], {"TOKEN_X": "t"}) as py:
        c("many 50")
        d("replace NCCL_R=1 TOKEN_X=t")
        py("set NCCL_P=3")
        pids = [c.pid, d.pid, py.pid, 2, 1 << 22]
        for watched in (livemem.is_watched, ["NCCL_R", "NCCL_MANY_7", "HOME"]):
            results = []
            for native in (True, False):
                reading = livemem.Reading(watched, {"TOKEN_X": "t", "NCCL_P": "4"}, native=native)
                results.append([(g.env, g.expected, g.reason) for g in reading.read_many(pids)])
            assert results[0] == results[1]


# --------------------------------------------------------------------------------- the model
def _rules(parent_live: dict | None, child_live: dict | None, child_stale: str | None = "fork"):
    """The propagation rules on a Python parent (exec-time block without NCCL_X) and its child (a fork
    child, started at t=50), with what --live read at t=100; NCCL_X=1 expected."""
    from ncclprobe import diagnose
    from ncclprobe.model import Model
    m = Model()
    parent, child = m.process("h", 10), m.process("h", 11)
    for p, argv in ((parent, ["python3", "serve.py"]), (child, ["python3", "serve.py"])):
        p.sources.add("proc")
        p.argv, p.exe, p.proc_exec_env, p.proc_expected = argv, "/usr/bin/python3", {}, {}
        p.nccl_user, p.live_reason = p is child, None
    parent.proc_start, child.proc_start, child.ppid, child.proc_stale = 1.0, 50.0, 10, child_stale
    for p, live in ((parent, parent_live), (child, child_live)):
        p.live_env, p.live_t = live, (100.0 if live is not None else None)
        p.live_reason = None if live is not None else "permission: other user"
    return diagnose.rules(m, {"NCCL_X": "1"})


def test_the_model_takes_the_live_values_as_the_values_now():
    # the child set it itself (an initializer): nothing is missing
    assert not [f for f in _rules({}, {"NCCL_X": "1"}, None) if f.code.startswith("ENV_")]
    # the parent has it now, the child (exec'ed at 50) does not: written after the child started
    late = [f for f in _rules({"NCCL_X": "1"}, {}, None) if f.code == "ENV_SET_AFTER_START"]
    assert late and late[0].edge["where"] == LIVE_WHERE and late[0].edge["parent"] == 10
    # a fork child whose memory could not be read: when its parent wrote the value is not known (before
    # the fork, the child has it), so the child stays a stated blind spot, not a guess
    found = _rules({"NCCL_X": "1"}, None)
    assert [f.code for f in found if f.pids == (11,)] == ["EXEC_ENV_STALE"], [(f.code, f.message) for f in found]


# ------------------------------------------------------------------------------------- inspect
def inspect_json(*args) -> dict:
    r = subprocess.run([*NCCLPROBE, "inspect", *map(str, args), "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    return doc


PARENT = r"""
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-S", "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True)
child.stdout.readline()                  # the child has started and written its own value
os.environ["NCCL_LATE"] = "1"            # ... before this write of its parent
print("ready", os.getpid(), child.pid, flush=True)
sys.stdin.read()
"""
CHILD = r"""
import os, sys
os.environ["NCCL_IN_CHILD"] = "1"        # an initializer that sets what it needs itself
os.environ.pop("NCCL_GONE")
os.environ["NCCL_FROM_CONF"] = "7"       # as NCCL applies its nccl.conf at init (setenv)
print("up", flush=True)
sys.stdin.read()
"""


def test_inspect_live_json_end_to_end(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_FROM_CONF=7\n")
    env = {**os.environ, "NCCL_GONE": "x", "NCCL_CONF_FILE": str(conf)}
    with running([sys.executable, "-S", "-c", PARENT, CHILD], env) as parent:
        child = int(parent.ready[2])
        expect = ["--expect", "NCCL_IN_CHILD=1", "--expect", "NCCL_LATE=1", "--scope", "all"]
        plain = inspect_json(parent.pid, *expect)
        assert "live" not in plain and all(r["live_env"] is None for r in plain["processes"])
        codes = {(f["code"], (f["edge"] or {}).get("kind")) for f in plain["findings"]}
        assert ("ENV_MISSING", "not_in_root") in codes  # blind to both writes

        doc = inspect_json(parent.pid, *expect, "--live")
        assert doc["live"]["read"] == 2 and doc["live"]["unread"] == 0
        assert doc["live"]["ptrace_scope"] == livemem.yama_scope()
        recs = {r["pid"]: r for r in doc["processes"]}
        assert recs[parent.pid]["live_env"]["NCCL_LATE"] == "1"
        assert recs[parent.pid]["live_diff"]["set"] == {"NCCL_LATE": "1"}
        mine = recs[child]["live_diff"]
        assert mine["set"] == {"NCCL_IN_CHILD": "1", "NCCL_FROM_CONF": "7"} and mine["unset"] == ["NCCL_GONE"]
        assert mine["conf"] == {"NCCL_FROM_CONF": f"{conf}:1"}
        late = [f for f in doc["findings"] if f["code"] == "ENV_SET_AFTER_START"]
        assert late and late[0]["edge"]["where"] == LIVE_WHERE and late[0]["edge"]["parent"] == parent.pid
        assert child in late[0]["pids"] and "live" in late[0]["edge"]["witnesses"]
        # the child set its own value: nothing is missing there any more
        assert not [f for f in doc["findings"] if f["code"] == "ENV_MISSING" and f.get("var") == "NCCL_IN_CHILD"]
        rows = {row["var"]: row for row in doc["verdict"]["variables"]}
        assert "live" in doc["verdict"]["witnesses"]  # the verdict takes the values as held now
        assert [g["value"] for g in rows["NCCL_IN_CHILD"]["groups"] if child in g["pids"]] == ["1"]


def test_inspect_live_tree_and_secrets():
    env = {**os.environ, "SECRET_TOKEN": "exec-secret-123", "PLAIN_VAR": "shown-with-all-vars"}
    script = PY_CHILD
    with running([sys.executable, "-S", "-c", script], env) as p:
        p("set MY_API_KEY=live-secret-456")
        p("set NCCL_NOW=1")
        text = subprocess.run([*NCCLPROBE, "inspect", str(p.pid), "--live", "--expect", "MY_API_KEY=wrong"],
                              capture_output=True, text=True, timeout=120)
        shown = " ".join(text.stdout.split())  # wrapped at 80 columns
        assert "live (read from memory)" in shown and "+ NCCL_NOW=1 (set in-process)" in shown
        everything = [text.stdout + text.stderr]
        for extra in ([], ["--all-vars"], ["--expect", "MY_API_KEY=live-secret-456"]):
            r = subprocess.run([*NCCLPROBE, "inspect", str(p.pid), "--live", "--json", *extra],
                               capture_output=True, text=True, timeout=120)
            everything.append(r.stdout + r.stderr)
            doc = json.loads(r.stdout)
            live = doc["processes"][0]["live_env"]
            if extra == ["--all-vars"]:
                assert live["MY_API_KEY"] == "<redacted>" and live["SECRET_TOKEN"] == "<redacted>"
                assert live["PLAIN_VAR"] == "shown-with-all-vars"
            else:
                assert set(live) == {"NCCL_START", "NCCL_NOW"}
        out = "\n".join(everything)
        assert "exec-secret-123" not in out and "live-secret-456" not in out
        assert "differs" in everything[0]  # the wrong expectation is reported, the value never shown


def test_the_benchmark_tree_is_read_whole():
    """benchmarks/bench_inspect_live.py's assertions on a small tree (the ratio is the benchmark's)."""
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_inspect_live.py"
    r = subprocess.run([sys.executable, str(bench), "--procs", "8", "--repeat", "1"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ratio live/plain" in r.stdout
