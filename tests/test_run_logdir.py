"""`run`'s own files under the log discipline the probes keep (DESIGN.md §4, issue 12): `run --dir`,
the default fresh directory, run.json, the boot probe's directory, `inject install --dir` and the
demo's NCCL logs. A refused directory costs exit 3 and nothing is written into it; nothing `run`
opens can block it. Real `ncclprobe` processes; another user's directory comes from a throwaway
user (CI runs as root; skipped otherwise)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from users import made_dir
from boot_support import PYTHON, make_venv, site_packages
from rundirs import run_files, run_meta

NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
TIMEOUT = 60  # a run that blocks (a FIFO opened for writing) fails instead of hanging the suite
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="only root owns the system directories and may write there")


def cli(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=TIMEOUT, env=env)


def refused(r: subprocess.CompletedProcess, why: str) -> None:
    assert r.returncode == 3, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert why in r.stderr and "Traceback" not in r.stderr, r.stderr






# ---------------------------------------------------------------------------- --dir tricks
# Each: (tmp_path, other uid) -> (--dir, the directory that must stay empty or absent, the refusal's words).

def _mode(mode):
    def trick(tmp, uid):
        d = made_dir(tmp / "shared", mode)
        return d, d, "group or others can write to it"
    return trick


def _symlink(tmp, uid):
    real = made_dir(tmp / "real")
    (tmp / "link").symlink_to(real)
    return tmp / "link", real, "it is a symlink"


def _missing_parents(tmp, uid):
    return tmp / "missing" / "a" / "log", tmp / "missing", "its parent does not exist"


def _leaf_in_shared_parent(tmp, uid):
    parent = made_dir(tmp / "shared", 0o777)  # others could swap our directory for theirs
    return parent / "log", parent / "log", "others can write to its parent"


def _other_users(tmp, uid):
    d = made_dir(tmp / "theirs")
    os.chown(d, uid, uid)
    return d, d, "it belongs to another user"


DIR_TRICKS = {"mode_0777": _mode(0o777), "mode_1777": _mode(0o1777), "mode_0770": _mode(0o770),
              "symlink": _symlink, "missing_parents": _missing_parents, "leaf_in_0777_parent": _leaf_in_shared_parent,
              "other_user": _other_users}


@pytest.mark.parametrize("trick", DIR_TRICKS)
def test_run_refuses_an_unfit_log_directory(tmp_path, request, trick):
    uid = request.getfixturevalue("other_user") if trick == "other_user" else None
    log_dir, untouched, why = DIR_TRICKS[trick](tmp_path, uid)
    r = cli("run", "--dir", str(log_dir), "--", PYTHON, "-c", "pass")
    refused(r, why)
    assert not untouched.exists() or list(untouched.iterdir()) == []
    js = cli("run", "--json", "--dir", str(log_dir), "--", PYTHON, "-c", "pass")
    assert js.returncode == 3 and json.loads(js.stdout)["error"]["reason"] == "bad_log_directory"


def test_run_creates_a_missing_leaf_private(tmp_path):
    r = cli("run", "--dir", str(tmp_path / "new"), "--", PYTHON, "-c", "pass")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "new").st_mode) == 0o700


def _entries(d: str) -> set[str]:
    """What ncclprobe would have written into d: the system's own files (useradd's *.lock, a package
    manager's) come and go under a test that runs beside others, and are not ours to compare."""
    return {n for n in os.listdir(d) if n.endswith(".jsonl") or n.startswith(("run-", "boot-", ".run-", "ncclprobe-"))}


@ROOT_ONLY
def test_run_refuses_etc_as_root():
    before = _entries("/etc")
    try:
        refused(cli("run", "--dir", "/etc", "--", PYTHON, "-c", "pass"), "it is a system directory")
        assert _entries("/etc") == before
    finally:  # what a run that accepted /etc wrote there (run-*.json, boot-*)
        for name in _entries("/etc") - before:
            if name.startswith(("run-", "boot-", ".run-")):
                path = Path("/etc", name)
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


@ROOT_ONLY
def test_run_never_creates_a_log_directory_in_a_system_directory():
    d = Path("/var/lib") / f"ncclprobe-test-{uuid.uuid4().hex[:12]}"
    try:
        refused(cli("run", "--dir", str(d), "--", PYTHON, "-c", "pass"), "it is a system directory")
        assert not d.exists()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@ROOT_ONLY
def test_run_may_log_below_var_tmp_as_root():
    d = Path("/var/tmp") / f"ncclprobe-test-{uuid.uuid4().hex[:12]}"
    try:
        r = cli("run", "--dir", str(d), "--", PYTHON, "-c", "pass")
        assert r.returncode == 0 and len(run_files(d)) == 1, r.stderr
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_run_uses_the_effective_uid(tmp_path, other_user):
    """A directory of the euid is ours, whatever the real uid (the probes compare with geteuid too)."""
    parent = Path(tempfile.mkdtemp(prefix="ncclprobe-euid-"))
    try:
        os.chmod(parent, 0o711)  # the other user reaches its directory inside
        d = made_dir(parent / "theirs")
        os.chown(d, other_user, other_user)
        code = ("import os, sys; from ncclprobe.commands import launch\n"
                f"os.setresuid(0, {other_user}, 0)\n"
                f"print(launch.make_log_dir({str(d)!r}))")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
        assert r.returncode == 0 and r.stdout.strip() == str(d), r.stderr
    finally:
        shutil.rmtree(parent, ignore_errors=True)


# ---------------------------------------------------------------------------- the default fresh directory

def test_default_directory_refuses_a_tmpdir_others_can_write(tmp_path):
    shared = made_dir(tmp_path / "shared", 0o777)  # not sticky: anyone may rename our directory away
    refused(cli("run", "--", PYTHON, "-c", "pass", env={**os.environ, "TMPDIR": str(shared)}),
            "others can write to its parent")
    assert list(shared.iterdir()) == []


@ROOT_ONLY
def test_default_directory_refuses_a_system_tmpdir_as_root():
    before = _entries("/etc")
    try:
        refused(cli("run", "--", PYTHON, "-c", "pass", env={**os.environ, "TMPDIR": "/etc"}),
                "it is a system directory")
        assert _entries("/etc") == before
    finally:
        for name in _entries("/etc") - before:
            if name.startswith("ncclprobe-"):
                shutil.rmtree(Path("/etc", name), ignore_errors=True)


def test_default_directory_in_a_sticky_tmpdir_is_fresh_and_private(tmp_path):
    sticky = made_dir(tmp_path / "tmp", 0o1777)  # like /tmp
    r = cli("run", "--json", "--", PYTHON, "-c", "pass", env={**os.environ, "TMPDIR": str(sticky)})
    assert r.returncode == 0, r.stderr
    d = Path(json.loads(r.stdout)["log_dir"])
    st = os.lstat(d)
    assert d.parent == sticky and stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()


# ---------------------------------------------------------------------------- run-<host>-<run id>.json

def _run_with_fifo_at_its_temp_name(d: Path) -> subprocess.CompletedProcess:
    """`run` exec'd by a shell that first plants FIFOs where its temporary file could be named: beside
    .run-<host>-*.json.<its own pid>.* (the run id and the suffix are random), the old .run.json.<pid>."""
    script = ('mkfifo "$1/.run.json.$$" "$1/.run-$(hostname)-x.json.$$" "$1/.run-$(hostname)-x.json.$$.0" || exit 99; '
              'shift; exec "$@"')
    return subprocess.run(["sh", "-c", script, "sh", str(d), *NCCLPROBE, "run", "--dir", str(d), "--", "true"],
                          capture_output=True, text=True, timeout=TIMEOUT)


def test_a_fifo_at_the_temporary_name_never_blocks_run(tmp_path):
    d = made_dir(tmp_path / "log")
    r = _run_with_fifo_at_its_temp_name(d)
    assert r.returncode == 0, r.stderr
    (meta,) = run_files(d)
    assert stat.S_ISREG(os.lstat(meta).st_mode)
    assert run_meta(d)["status"] == "exited with code 0"
    planted = [p for p in d.iterdir() if p.name.startswith((".run.json.", ".run-"))]  # left as they were
    assert len(planted) == 3 and all(stat.S_ISFIFO(os.lstat(p).st_mode) for p in planted)


def test_a_fifo_in_a_shared_directory_is_refused_at_once(tmp_path):
    d = made_dir(tmp_path / "shared", 0o1777)
    r = _run_with_fifo_at_its_temp_name(d)
    refused(r, "group or others can write to it")


def test_run_metadata_is_never_written_through_a_symlink(tmp_path):
    """A symlink at an older version's run.json, or at a run-*.json name, is neither followed nor read."""
    d = made_dir(tmp_path / "log")
    victim = tmp_path / "victim"
    victim.write_text("the user's file\n")
    (d / "run.json").symlink_to(victim)
    (d / f"run-{os.uname().nodename}-x.json").symlink_to(victim)
    r = cli("run", "--dir", str(d), "--append", "--", "true")
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "the user's file\n" and (d / "run.json").is_symlink()
    (meta,) = [p for p in run_files(d) if not p.is_symlink()]
    assert stat.S_IMODE(os.stat(meta).st_mode) == 0o600


def test_boot_directory_and_its_bytecode_cache_are_private(tmp_path):
    d = tmp_path / "log"
    r = cli("run", "--dir", str(d), "--", PYTHON, "-c", "pass")
    assert r.returncode == 0, r.stderr
    (boot,) = d.glob("boot-*")
    for path in (boot, boot / "__pycache__"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    assert list((boot / "__pycache__").iterdir())  # it is used
    for f in boot.rglob("*"):
        assert not stat.S_IMODE(os.stat(f).st_mode) & 0o077, f


# ---------------------------------------------------------------------------- inject install --dir

@pytest.fixture
def venv(tmp_path):
    py = make_venv(tmp_path / "venv")
    return py, site_packages(py)


@pytest.mark.parametrize("trick", ["mode_0777", "mode_1777", "symlink", "missing_parents", "leaf_in_0777_parent"])
def test_inject_install_refuses_an_unfit_log_directory(tmp_path, venv, trick):
    py, sp = venv
    (tmp_path / "t").mkdir()
    log_dir, untouched, why = DIR_TRICKS[trick](tmp_path / "t", None)
    r = cli("inject", "install", "--python", str(py), "--dir", str(log_dir))
    refused(r, why)
    assert "nothing was installed" in r.stderr
    assert not list(sp.glob("*ncclprobe*")) and (not untouched.exists() or list(untouched.iterdir()) == [])


def test_inject_install_creates_its_log_directory_private(tmp_path, venv):
    py, sp = venv
    r = cli("inject", "install", "--python", str(py), "--dir", str(tmp_path / "log"))
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "log").st_mode) == 0o700


# ---------------------------------------------------------------------------- the demo's NCCL logs

def test_demo_nccl_debug_files_are_private():
    r = subprocess.run([*NCCLPROBE, "demo", "--keep", "--json"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    d = Path(json.loads(r.stdout)["log_dir"])
    try:
        logs = list(d.glob("nccl-debug*"))
        assert logs
        assert {f.name: stat.S_IMODE(os.stat(f).st_mode) for f in logs} == {f.name: 0o600 for f in logs}
    finally:
        shutil.rmtree(d, ignore_errors=True)
