"""The effective value, as NCCL reads it: the environment first, then NCCL_CONF_FILE or ~/.nccl.conf (the
home of the process's uid in the passwd file, not $HOME), then /etc/nccl.conf, each line applied with
setenv(..., 0) inside NCCL. Real processes that map the real libnccl (nvidia-nccl-cu12) are inspected: a
value only a conf file supplies satisfies an expectation and is shown with its file and line; a real
variable that shadows a conf file's value is named; a process NCCL does not run in gets nothing from it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from users import uuid_suffix

CC = shutil.which("cc") or shutil.which("gcc")
HOLDER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char** argv) {
  if (!dlopen(argv[1], RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  printf("ready\n"); fflush(stdout);
  sleep(60);
  return 0;
}
"""


def real_libnccl() -> Path:
    nccl = pytest.importorskip("nvidia.nccl", reason="the test extra (nvidia-nccl-cu12) is not installed")
    for base in nccl.__path__:
        p = Path(base) / "lib" / "libnccl.so.2"
        if p.exists():
            return p
    pytest.skip("nvidia-nccl-cu12 has no lib/libnccl.so.2")


@pytest.fixture(scope="module")
def shared_dir():
    """A directory every user may read (pytest's own tmp is root's, 0700): the holder binary, conf files."""
    d = Path(tempfile.mkdtemp(prefix="ncclprobe-eff-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def holder(shared_dir):
    """A C program that maps a library (dlopen, as ctypes does) and waits: NCCL is loaded in it."""
    if not CC:
        pytest.skip("needs a C compiler")
    (shared_dir / "holder.c").write_text(HOLDER)
    subprocess.run([CC, "-O1", "-o", str(shared_dir / "holder"), str(shared_dir / "holder.c"), "-ldl"],
                   check=True, capture_output=True)
    return shared_dir / "holder"


def start(argv, env, **kw) -> subprocess.Popen:
    p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, **kw)
    assert p.stdout.readline().strip() == "ready", "the holder did not map the library"
    return p


def inspect(pid: int, *args) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "ncclprobe", "inspect", str(pid), "--json", *args],
                         capture_output=True, text=True, timeout=120)
    return out.returncode, json.loads(out.stdout)


def groups(doc: dict, var: str) -> list[dict]:
    (row,) = [r for r in doc["verdict"]["variables"] if r["var"] == var]
    return row["groups"]


def base_env(**kw) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **kw}


def test_a_value_only_nccl_conf_file_supplies_satisfies_the_expectation(holder, shared_dir):
    conf = shared_dir / "job-nccl.conf"
    conf.write_text("NCCL_PROTO=LL\n")
    p = start([str(holder), str(real_libnccl())], base_env(NCCL_CONF_FILE=str(conf)))
    try:
        rc, doc = inspect(p.pid, "--expect", "NCCL_PROTO=LL")
    finally:
        p.kill()
        p.wait()
    assert rc == 0, doc["findings"]
    assert not [f for f in doc["findings"] if f["severity"] != "info"]
    (g,) = groups(doc, "NCCL_PROTO")
    assert g["value"] == "LL" and g["conf_files"] == [f"{conf}:1"] and g["pids"] == [p.pid]
    (info,) = [f for f in doc["findings"] if f["code"] == "CONF_FILE_VALUE"]
    assert info["evidence"]["file"] == str(conf) and info["pids"] == [p.pid]


def test_a_real_variable_shadowing_the_conf_file_is_named_and_wins(holder, shared_dir):
    conf = shared_dir / "shadowed-nccl.conf"
    conf.write_text("NCCL_PROTO=LL\n")
    p = start([str(holder), str(real_libnccl())], base_env(NCCL_CONF_FILE=str(conf), NCCL_PROTO="Simple"))
    try:
        rc, doc = inspect(p.pid, "--expect", "NCCL_PROTO=LL")
    finally:
        p.kill()
        p.wait()
    assert rc == 1
    (g,) = groups(doc, "NCCL_PROTO")
    assert g["value"] == "Simple" and g["conf_files"] == []
    (shadow,) = [f for f in doc["findings"] if f["code"] == "CONF_FILE_VALUE"]
    assert shadow["evidence"] == {"file": str(conf), "line": 1, "value": "LL", "environment": "Simple"}
    assert [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["ENV_CHANGED"]


def test_a_process_nccl_does_not_run_in_gets_nothing_from_the_conf_file(holder, shared_dir):
    conf = shared_dir / "unused-nccl.conf"
    conf.write_text("NCCL_PROTO=LL\n")
    p = start([str(holder), "libm.so.6"], base_env(NCCL_CONF_FILE=str(conf)))  # no libnccl: nothing applies it
    try:
        rc, doc = inspect(p.pid, "--expect", "NCCL_PROTO=LL")
    finally:
        p.kill()
        p.wait()
    assert rc == 1 and [f["code"] for f in doc["findings"] if f["severity"] == "error"] == ["ENV_MISSING"]
    (g,) = groups(doc, "NCCL_PROTO")
    assert g["value"] is None and g["conf_files"] == []


@pytest.fixture(scope="module")
def user_with_home(shared_dir):
    """A throwaway user whose passwd home is a directory of the test's (with a ~/.nccl.conf in it)."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("a user with a home of the test's needs root and useradd")
    home = shared_dir / "home"
    home.mkdir()
    name = f"ncph{os.getpid()}{uuid_suffix()}"
    made = subprocess.run(["useradd", "--system", "--home-dir", str(home), "--no-create-home", name],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    import pwd
    uid = pwd.getpwnam(name).pw_uid
    os.chown(home, uid, uid)
    try:
        yield uid, home
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_home_nccl_conf_is_the_passwd_home_of_the_process_uid_not_its_HOME(holder, shared_dir, user_with_home):
    uid, home = user_with_home
    (home / ".nccl.conf").write_text("NCCL_PROTO=LL\n")
    decoy = shared_dir / "decoy-home"
    decoy.mkdir()
    (decoy / ".nccl.conf").write_text("NCCL_PROTO=Simple\n")  # $HOME's: NCCL never reads it
    lib = Path(tempfile.mkdtemp(prefix="ncclprobe-lib-"))  # a copy every user can map
    os.chmod(lib, 0o755)
    shutil.copy(real_libnccl(), lib / "libnccl.so.2")
    p = start([str(holder), str(lib / "libnccl.so.2")], base_env(HOME=str(decoy)),
              preexec_fn=lambda: (os.setgid(uid), os.setuid(uid)))
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{p.pid}/status").read_text().split("Uid:")[1].split()[0] != str(uid):
            assert time.monotonic() < deadline, "the holder never ran as the user"
            time.sleep(0.01)
        rc, doc = inspect(p.pid, "--expect", "NCCL_PROTO=LL")
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(lib, ignore_errors=True)
    assert rc == 0, doc["findings"]
    (g,) = groups(doc, "NCCL_PROTO")
    assert g["value"] == "LL" and g["conf_files"] == [f"{home}/.nccl.conf:1"]
