"""Hostile log directories, planted files and fd-reusing hosts, against the boot probe in real
interpreters (and the C probe for the directory rules they share): the host's output and exit code
never change, at most one `ncclprobe:` line goes to its stderr, and no probe line lands anywhere but
a private regular file of ours in a private directory of ours (DESIGN.md §4, log directory).

The cases are generated from small tables (directory tricks, things planted at the log file's name,
host programs), not stored: each one is a shell recipe or a few lines of Python."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from ncclprobe.commands.inject import ephemeral_env
from users import made_dir
from boot_support import PYTHON, clean_env, events, raw_log_text, starts_by_pid

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402

HOST = os.uname().nodename.replace("/", "_")  # the name both probes give their files
EXIT = 7  # the hosts exit with this, so that a probe that changed the exit code shows
TIMEOUT = 30  # a host the probe blocked (a FIFO at the log file's name) fails instead of hanging
# Prints its pid (to clean up after probes that wrote where they must not), writes a watched variable
# (an event after process_start), then its own line.
HOST_CODE = ("import os, sys; print(os.getpid()); os.environ['NCCL_PROTO'] = 'LL'; print('host ok'); "
             f"sys.exit({EXIT})")
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="only root owns the system directories and may write there")


def wired(tmp_path: Path, log_dir: Path | str | None = None) -> dict[str, str]:
    """An environment that runs the boot probe (as `ncclprobe run` wires it), logging into log_dir
    (default tmp_path/"log", which ephemeral_env creates private)."""
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "log", None))
    if log_dir is not None:
        env["NCCLPROBE_DIR"] = str(log_dir)
    return env


def host(env: dict[str, str], argv: list, plant: str | None = None) -> subprocess.CompletedProcess:
    """Run argv (a probed interpreter, or any program). With plant: a shell first runs that recipe
    with $F = the log file's name for its own pid, then execs argv, which keeps the pid."""
    if plant is not None:
        script = f'F="$NCCLPROBE_DIR/{HOST}-$$.jsonl"; {plant} || exit 99; exec "$@"'
        argv = ["sh", "-c", script, "sh", *argv]
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=TIMEOUT)


def warnings_of(res: subprocess.CompletedProcess) -> list[str]:
    """The host ran as without the probe (exit code, its own output) and the probe said at most one line."""
    assert res.returncode == EXIT and res.stdout.splitlines()[1:] == ["host ok"], (res.returncode, res.stdout,
                                                                                   res.stderr)
    lines = res.stderr.splitlines()
    assert len(lines) <= 1 and all(line.startswith("ncclprobe:") for line in lines), res.stderr
    return lines


def refused(res: subprocess.CompletedProcess, why: str) -> None:
    (line,) = warnings_of(res) or ["(no warning)"]
    assert why in line and "silent" in line, res.stderr




# ---------------------------------------------------------------------------- log directory tricks
# Each: (tmp_path, other uid) -> (NCCLPROBE_DIR, the directory that must stay empty or absent, the
# words of the refusal).



def _symlink(tmp, uid):
    real = made_dir(tmp / "real")
    (tmp / "link").symlink_to(real)
    return tmp / "link", real, "symlink"


def _other_users(tmp, uid):
    d = made_dir(tmp / "theirs")
    os.chown(d, uid, uid)
    return d, d, "another user"


def _mode(mode):
    def trick(tmp, uid):
        d = made_dir(tmp / "shared", mode)
        return d, d, "group or others can write"
    return trick


def _missing_parents(tmp, uid):
    return tmp / "missing" / "a" / "log", tmp / "missing", "does not exist"


def _leaf_in_shared_parent(tmp, uid):
    parent = made_dir(tmp / "shared", 0o777)  # others could swap our directory for theirs
    return parent / "log", parent / "log", "others can write to its parent"


DIR_TRICKS = {"symlink": _symlink, "other_user": _other_users, "mode_0777": _mode(0o777),
              "mode_1777": _mode(0o1777), "mode_0770": _mode(0o770), "missing_parents": _missing_parents,
              "leaf_in_0777_parent": _leaf_in_shared_parent}


@pytest.mark.parametrize("trick", DIR_TRICKS)
def test_boot_probe_refuses_log_directory(tmp_path, request, trick):
    uid = request.getfixturevalue("other_user") if trick == "other_user" else None
    log_dir, untouched, why = DIR_TRICKS[trick](tmp_path, uid)
    res = host(wired(tmp_path, log_dir), [PYTHON, "-c", HOST_CODE])
    refused(res, why)
    assert not untouched.exists() or list(untouched.iterdir()) == []


def wrote_into(directory: str, res: subprocess.CompletedProcess) -> bool:
    """Whether a probe wrote the file of the host's pid into directory (removed again if so)."""
    pid = res.stdout.split("\n", 1)[0].strip()
    path = Path(directory, f"{HOST}-{pid}.jsonl")
    if not pid.isdigit() or not path.exists():
        return False
    path.unlink()
    return True


@ROOT_ONLY
@pytest.mark.parametrize("directory", ["/etc", "/usr/lib", "/var", "/"])
def test_boot_probe_refuses_system_directory(tmp_path, directory):
    res = host(wired(tmp_path, directory), [PYTHON, "-c", HOST_CODE])
    assert not wrote_into(directory, res)
    refused(res, "system directory")


@ROOT_ONLY
def test_boot_probe_never_creates_a_directory_in_a_system_directory(tmp_path):
    leaf = Path("/etc") / f"ncclprobe-hostile-{uuid.uuid4().hex[:12]}"
    try:
        res = host(wired(tmp_path, leaf), [PYTHON, "-c", HOST_CODE])
        assert not leaf.exists()
        refused(res, "system directory")
    finally:
        shutil.rmtree(leaf, ignore_errors=True)


@ROOT_ONLY
def test_system_directory_is_recognised_through_a_symlinked_parent(tmp_path):
    (tmp_path / "root").symlink_to("/")  # the leaf itself is no symlink: only its real path says /etc
    res = host(wired(tmp_path, tmp_path / "root" / "etc"), [PYTHON, "-c", HOST_CODE])
    assert not wrote_into("/etc", res)
    refused(res, "system directory")


@pytest.mark.parametrize("scratch", ["/var/tmp", "/dev/shm"])
def test_scratch_places_under_system_trees_are_fine(tmp_path, scratch):
    if not os.path.isdir(scratch):
        pytest.skip(f"no {scratch} here")
    parent = Path(tempfile.mkdtemp(prefix="ncclprobe-hostile-", dir=scratch))
    try:
        res = host(wired(tmp_path, parent / "log"), [PYTHON, "-c", HOST_CODE])  # the leaf created, as root too
        assert warnings_of(res) == []
        assert [e["ev"] for e in events(parent / "log")] == ["process_start", "env_write"]
    finally:
        shutil.rmtree(parent)


def test_boot_probe_creates_only_the_leaf_private(tmp_path):
    log = tmp_path / "fresh"
    res = host(wired(tmp_path, log), [PYTHON, "-c", HOST_CODE])
    assert warnings_of(res) == []
    assert stat.S_IMODE(log.stat().st_mode) == 0o700
    assert [e["ev"] for e in events(log)] == ["process_start", "env_write"]


# ---------------------------------------------------------------------------- planted at the log file's name
# Shell recipes run just before the interpreter starts (its pid is the shell's: exec). $F is the name,
# $OTHER a throwaway user's uid. The reader holds the FIFO on fd 3, which the host then inherits.

PLANTS = {
    "fifo": ('mkfifo -m 600 "$F"', "FIFO"),
    "fifo_with_reader": ('mkfifo -m 600 "$F" && exec 3<>"$F"', "FIFO"),
    "file_0644": (': > "$F" && chmod 644 "$F"', "not a private regular file"),
    "foreign_file": (': > "$F" && chmod 600 "$F" && chown "$OTHER" "$F"', "not a private regular file"),
}
# Reads what the probe may have written into the FIFO it was handed (fd 3): must be nothing.
READER_CODE = ("import os, sys; print(os.getpid()); os.environ['NCCL_PROTO'] = 'LL'; os.set_blocking(3, False)\n"
               "try:\n    n = len(os.read(3, 1 << 16))\nexcept BlockingIOError:\n    n = 0\n"
               f"print('host ok' if n == 0 else 'probe wrote %d bytes into the FIFO' % n); sys.exit({EXIT})")


@pytest.mark.parametrize("plant", PLANTS)
def test_boot_probe_refuses_what_was_planted_at_its_file_name(tmp_path, request, plant):
    recipe, why = PLANTS[plant]
    env = wired(tmp_path)
    if plant == "foreign_file":
        env["OTHER"] = str(request.getfixturevalue("other_user"))
    res = host(env, [PYTHON, "-c", READER_CODE if plant == "fifo_with_reader" else HOST_CODE], plant=recipe)
    refused(res, why)
    (planted,) = (tmp_path / "log").glob("*.jsonl")  # nothing else was created beside it
    if stat.S_ISREG(planted.lstat().st_mode):
        assert planted.read_bytes() == b""


def test_boot_probe_appends_to_its_own_private_file(tmp_path):
    """A file of ours at the name (pid reuse, or an interpreter that exec'd another) is re-opened."""
    res = host(wired(tmp_path), [PYTHON, "-c", HOST_CODE], plant='printf "old\\n" > "$F" && chmod 600 "$F"')
    assert warnings_of(res) == []
    text = raw_log_text(tmp_path / "log")
    assert text.startswith("old\n") and '"ev":"process_start"' in text and '"ev":"env_write"' in text


# ---------------------------------------------------------------------------- hosts that close and reuse fds

CLOSERANGE_HOST = """\
import os, sys
os.closerange(3, 4096)  # the probe's log fd too; the host's next file takes its number
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.environ["NCCL_PROTO"] = "LL"
os.write(fd, b"host line\\n")
print(os.getpid())
print("host ok")
sys.exit(%d)
""" % EXIT

FORK_HOST = """\
import os, sys
os.closerange(3, 4096)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # inherited by the child
pid = os.fork()
if pid == 0:
    os.environ["NCCL_ALGO"] = "Ring"
    os.write(fd, b"child line\\n")
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"parent line\\n")
print(pid)
print("host ok")
sys.exit(%d)
""" % EXIT


def test_host_that_reuses_the_probes_fd_never_gets_probe_lines(tmp_path):
    data = tmp_path / "data.txt"
    res = host(wired(tmp_path), [PYTHON, "-c", CLOSERANGE_HOST, data])
    assert warnings_of(res) == []
    assert data.read_bytes() == b"host line\n"
    (write,) = events(tmp_path / "log", "env_write")  # the probe re-opened its own file by name
    assert (write["var"], write["new"], write["pid"]) == ("NCCL_PROTO", "LL", int(res.stdout.split()[0]))


def test_fork_child_keeps_the_fd_it_inherited(tmp_path):
    data = tmp_path / "data.txt"
    res = host(wired(tmp_path), [PYTHON, "-c", FORK_HOST, data])
    assert warnings_of(res) == []
    assert data.read_bytes() == b"child line\nparent line\n"
    assert "child line" not in raw_log_text(tmp_path / "log").splitlines()  # (it is in argv, as code)
    child = starts_by_pid(tmp_path / "log")[int(res.stdout.split()[0])]
    assert "forked_from" in child
    assert [(w["var"], w["pid"]) for w in events(tmp_path / "log", "env_write")] == [("NCCL_ALGO", child["pid"])]


# ---------------------------------------------------------------------------- the C probe: the same directory rules

@pytest.fixture(scope="module")
def c_probe(tmp_path_factory):
    d = tmp_path_factory.mktemp("c_probe")
    return ps.build_probe(d), ps.build_env_driver(d)


def c_host(c_probe, log_dir) -> subprocess.CompletedProcess:
    """env_driver reads NCCL_PROTO through the env plugin (its init logs an event); prints its pid first."""
    lib, driver = c_probe
    env = ps.probe_env(log_dir, None, NCCL_PROTO="LL")
    return subprocess.run(["sh", "-c", 'echo $$; exec "$@"', "sh", str(driver), str(lib), "errno"], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT)


def c_refused(res, why: str) -> None:
    assert res.returncode == 0 and "NCCL_PROTO=LL" in res.stdout, res.stderr
    (line,) = [w for w in res.stderr.splitlines() if w.startswith("ncclprobe:")] or ["(no warning)"]
    assert why in line, res.stderr


@ROOT_ONLY
@pytest.mark.parametrize("directory", ["/etc", "/usr/lib", "/var"])
def test_c_probe_refuses_system_directory(c_probe, directory):
    res = c_host(c_probe, directory)
    assert not wrote_into(directory, res)
    c_refused(res, "system directory")


@ROOT_ONLY
def test_c_probe_never_creates_a_directory_in_a_system_directory(c_probe):
    leaf = Path("/etc") / f"ncclprobe-hostile-{uuid.uuid4().hex[:12]}"
    try:
        res = c_host(c_probe, leaf)
        assert not leaf.exists()
        c_refused(res, "system directory")
    finally:
        shutil.rmtree(leaf, ignore_errors=True)


def test_c_probe_names_a_symlinked_directory(c_probe, tmp_path):
    real = made_dir(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    c_refused(c_host(c_probe, tmp_path / "link"), "it is a symlink")
    assert list(real.iterdir()) == []


def test_c_probe_refuses_a_leaf_in_a_shared_parent(c_probe, tmp_path):
    parent = made_dir(tmp_path / "shared", 0o777)
    c_refused(c_host(c_probe, parent / "log"), "others can write to its parent")
    assert not (parent / "log").exists()


# ---------------------------------------------------------------------------- profiles holding secrets

def test_malformed_profile_is_logged_without_its_values(tmp_path):
    env = wired(tmp_path)
    bad = tmp_path / "profile"
    bad.write_text("set NCCL_PROTO=LL\nset HF_TOKEN hunter2\n")
    env["NCCLPROBE_PROFILE"] = str(bad)
    assert warnings_of(host(env, [PYTHON, "-c", HOST_CODE])) == []
    (err,) = events(tmp_path / "log", "probe_error")
    assert err["part"] == "profile" and f"{bad}:2:" in err["message"]
    assert "hunter2" not in raw_log_text(tmp_path / "log")


PROFILE_GONE_HOST = """\
import os, sys
os.unlink(os.environ["NCCLPROBE_PROFILE"])  # as `run` removes it once CMD has ended
pid = os.fork()
if pid == 0:
    os.environ["NCCL_PROTO"] = "Simple"  # pinned: the child enforces what its parent read at start
    os._exit(0 if os.environ["NCCL_PROTO"] == "LL" else 1)
print(pid)
print("host ok" if os.waitpid(pid, 0)[1] == 0 else "pin lost")
sys.exit(%d)
""" % EXIT


def test_profile_file_is_not_needed_after_start(tmp_path):
    from ncclprobe.commands import profile
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "log", profile.from_cli(["NCCL_PROTO=LL", "HF_TOKEN=hunter2"], [],
                                                                     ["NCCL_PROTO"])))
    assert warnings_of(host(env, [PYTHON, "-c", PROFILE_GONE_HOST])) == []
    assert events(tmp_path / "log", "probe_error") == []
    assert [(w["var"], w["blocked"]) for w in events(tmp_path / "log", "env_write")] == [("NCCL_PROTO", True)]
    assert "hunter2" not in raw_log_text(tmp_path / "log")


# ---------------------------------------------------------------------------- hosts started with stdio closed
# The probe's log fd must never take 0-2 (nor any low number a host dup2()s onto): what the host later
# writes to its "stdout" must not land in the log. The host reports into a file named in argv.

CLOSED_STDIO_HOST = """\
import os, sys
try:
    os.write(1, b"host " + b"stdout line\\n")  # (not as one string: argv holds this code)
    wrote = "written"
except OSError as exc:
    wrote = exc.errno
os.environ["NCCL_PROTO"] = "LL"  # an event after the start: the log is open now
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass
with open(sys.argv[1], "w") as out:
    out.write(repr((os.getpid(), wrote, fds)))
"""


@pytest.mark.parametrize("closed", ["0 1 2", "1", "1 2"])
def test_log_fd_never_takes_a_low_number_a_host_writes_to(tmp_path, closed):
    report = tmp_path / "report.txt"
    env = wired(tmp_path)
    close = " ".join(f"{fd}>&-" for fd in closed.split())
    res = subprocess.run(["sh", "-c", f'exec {close} "$@"', "sh", PYTHON, "-c", CLOSED_STDIO_HOST, str(report)],
                         env=env, capture_output=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    pid, wrote, fds = eval(report.read_text())  # the host's own repr of ints and strings
    log = tmp_path / "log"
    assert "host stdout line" not in raw_log_text(log)
    assert wrote == 9  # EBADF: fd 1 stayed closed, as the host left it
    mine = [fd for fd, target in fds.items() if target.startswith(str(log)) and target.endswith(".jsonl")]
    assert mine and all(fd >= 200 for fd in mine), fds
    assert not [fd for fd in fds if str(fd) in closed.split()], fds  # closed it was, closed it stays
    (write,) = events(log, "env_write")
    assert write["pid"] == pid


REOPEN_HOST = """\
import os, sys
os.closerange(0, 4096)  # stdio too: the probe's file must not come back on 0-2 when it is opened again
os.environ["NCCL_PROTO"] = "LL"
fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        fds[int(name)] = os.readlink("/proc/self/fd/" + name)
    except OSError:
        pass
with open(sys.argv[1], "w") as out:
    out.write(repr(fds))
"""


def test_a_log_reopened_after_the_host_closed_everything_stays_high(tmp_path):
    report = tmp_path / "report.txt"
    res = subprocess.run([PYTHON, "-c", REOPEN_HOST, str(report)], env=wired(tmp_path), capture_output=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    fds = eval(report.read_text())
    mine = [fd for fd, target in fds.items() if target.endswith(".jsonl")]
    assert mine and all(fd >= 200 for fd in mine), fds
    assert [w["new"] for w in events(tmp_path / "log", "env_write")] == ["LL"]


DUP2_FORK_HOST = """\
import os, sys
def target(n):
    try:
        return os.readlink("/proc/self/fd/" + n)
    except OSError:  # the descriptor listdir itself had open
        return ""
(probe_fd,) = [int(n) for n in os.listdir("/proc/self/fd") if target(n).endswith(".jsonl")]  # the probe's
os.closerange(3, 4096)  # a daemon's close-all, then its own file on the very number the probe had
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.dup2(fd, probe_fd)
os.close(fd)
kids = []
for i in range(3):
    pid = os.fork()
    if pid == 0:
        os.environ["NCCL_ALGO"] = "Ring"  # the child's probe logs into its own file
        os.write(probe_fd, b"child %%d\\n" %% i)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
os.write(probe_fd, b"parent\\n")
print(probe_fd)
print("host ok")
sys.exit(%d)
""" % EXIT


def test_fork_children_keep_the_hosts_fd_on_the_probes_old_number(tmp_path):
    data = tmp_path / "data.txt"
    res = host(wired(tmp_path), [PYTHON, "-c", DUP2_FORK_HOST, data])
    assert warnings_of(res) == []
    assert sorted(data.read_text().splitlines()) == ["child 0", "child 1", "child 2", "parent"]
    assert len([e for e in events(tmp_path / "log", "process_start") if "forked_from" in e]) == 3


# ---------------------------------------------------------------------------- a refusal: once per process tree
# A parent, its fork child, a subprocess interpreter and that one's re-exec: one `ncclprobe:` line in all.

TREE_HOST = """\
import os, subprocess, sys
if len(sys.argv) == 1:  # the parent: a fork child, then an interpreter that re-execs itself
    pid = os.fork()
    if pid == 0:
        os.environ["NCCL_ALGO"] = "Ring"
        os._exit(0)
    os.waitpid(pid, 0)
    subprocess.run([sys.executable, __file__, "child"], check=True)
elif sys.argv[1] == "child":
    os.environ["NCCL_PROTO"] = "LL"
    os.execv(sys.executable, [sys.executable, __file__, "exec"])
else:
    os.environ["NCCL_PROTO"] = "Simple"
print("host ok", sys.argv[1:])
"""


@pytest.mark.parametrize("quiet", [False, True])
def test_refusal_is_said_once_per_process_tree_and_never_when_quiet(tmp_path, quiet):
    squatted = made_dir(tmp_path / "squatted", 0o777)  # as anyone could leave a directory in /tmp
    script = tmp_path / "tree.py"
    script.write_text(TREE_HOST)
    env = wired(tmp_path, squatted)
    if quiet:
        env["NCCLPROBE_QUIET"] = "1"
    res = subprocess.run([PYTHON, str(script)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert res.returncode == 0 and res.stdout.splitlines() == ["host ok ['exec']", "host ok []"], res
    lines = res.stderr.splitlines()
    if quiet:
        assert lines == []
    else:
        (line,) = lines
        assert line.startswith("ncclprobe: cannot log in") and "group or others can write" in line
    assert list(squatted.iterdir()) == []
