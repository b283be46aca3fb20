"""Whose directory: `inspect` merges the probe logs of the NCCLPROBE_DIR each inspected process's
environment names only where that directory is this user's (euid) or that process's own user's, and
passes DESIGN §4's discipline (a real directory, not a symlink, not group/other-writable, for root no
system directory); any other one is skipped, and the text and the JSON (in_process.skipped_dirs) say
so and why. A directory given with --dir is the user's own choice and is read.

Real processes of a real second user (tests/users.py), as root: the owner and mode checks mean nothing
without one. Every directory holds real probe logs (tests/data/demo-run), so a directory that was
read shows as communicators and probed processes, and one that was skipped shows as neither."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest

from ncclprobe import render, schemas
from ncclprobe.commands.inspection import inspect_processes
from users import made_dir, other_user  # noqa: F401  (a fixture)

NO_NVML = lambda: ({}, "no NVML in this test")  # noqa: E731
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
DEMO_LOGS = Path(__file__).parent / "data" / "demo-run"
SLEEP = shutil.which("sleep") or "/bin/sleep"
WAIT_S = 60
THIRD_UID = 2_000_000 + os.getpid() % 100_000  # no user: chown to a bare number is enough to be someone else's


def logs_in(d: Path, uid: int, mode: int = 0o700) -> Path:
    """d, made with mode and the demo's probe logs in it, all of it owned by uid."""
    made_dir(d, mode)
    for f in DEMO_LOGS.glob("*.jsonl"):
        shutil.copy(f, d / f.name)
        os.chown(d / f.name, uid, uid)
        os.chmod(d / f.name, 0o600)
    os.chown(d, uid, uid)
    return d


def started(uid: int, probe_dir: str, wrapper: tuple[str, ...] = ()) -> subprocess.Popen:
    """`sleep` as uid with NCCLPROBE_DIR=probe_dir, once it has exec'ed (its comm says so)."""
    p = subprocess.Popen([*wrapper, SLEEP, "600"], env={"PATH": "/usr/bin:/bin", "NCCLPROBE_DIR": probe_dir},
                         user=uid if uid != os.geteuid() else None, cwd="/", stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + WAIT_S
    while Path(f"/proc/{p.pid}/comm").read_text() != "sleep\n":
        assert time.monotonic() < deadline, "sleep never exec'ed"
        time.sleep(0.01)
    return p


def stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def inspected(p: subprocess.Popen, **kw):
    return inspect_processes([p.pid], gpu_lookup=NO_NVML, **kw)


def text_of(res) -> str:
    out = StringIO()
    render.render_text(res, out, width=300, color=False)
    return out.getvalue()


def read_as_evidence(res) -> bool:
    """Whether the demo's logs were merged: its communicators and probed processes are in the result."""
    return bool(res.data.get("communicators")) and res.data.get("in_process", {}).get("processes", 0) > 0


def test_another_users_own_directory_is_read(tmp_path, other_user):
    os.chmod(tmp_path, 0o755)  # so that the other user's directory is reachable by path
    d = logs_in(tmp_path / "theirs", other_user)
    p = started(other_user, str(d))
    try:
        res = inspected(p)
    finally:
        stop(p)
    assert res.data["in_process"]["dirs"] == [str(d)] and read_as_evidence(res)
    assert "skipped_dirs" not in res.data["in_process"]


def test_this_users_own_directory_is_read(tmp_path):
    d = logs_in(tmp_path / "mine", os.geteuid())
    p = started(os.geteuid(), str(d))
    try:
        res = inspected(p)
    finally:
        stop(p)
    assert res.data["in_process"]["dirs"] == [str(d)] and read_as_evidence(res)


# (who runs the process, how its NCCLPROBE_DIR is made) -> the directory, and what the reason says
def _third_users(tmp_path, other):
    return str(logs_in(tmp_path / "third", THIRD_UID)), "belongs to uid"


def _group_writable(tmp_path, other):
    d = logs_in(tmp_path / "shared", other)
    os.chmod(d, 0o770)
    return str(d), "group or others can write"


def _symlink(tmp_path, other):
    d = logs_in(tmp_path / "real", other)
    link = tmp_path / "link"
    link.symlink_to(d)
    os.lchown(link, other, other)
    return str(link), "symlink"


def _missing(tmp_path, other):
    return str(tmp_path / "gone"), "no such directory"


def _relative(tmp_path, other):
    return "logs", "not an absolute path"


def _not_a_directory(tmp_path, other):
    f = tmp_path / "file"
    f.write_text("")
    os.chown(f, other, other)
    return str(f), "not a directory"


CASES = {
    "a third user's": (lambda uid: uid, _third_users),
    "group-writable": (lambda uid: uid, _group_writable),
    "a symlink": (lambda uid: uid, _symlink),
    "missing": (lambda uid: uid, _missing),
    "relative": (lambda uid: uid, _relative),
    "a file": (lambda uid: uid, _not_a_directory),
    "root's process, another user's": (lambda uid: os.geteuid(), lambda t, o: (str(logs_in(t / "u", o)), "belongs to uid")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_directory_that_is_neither_ours_nor_fit_is_skipped_and_said(tmp_path, other_user, case):
    os.chmod(tmp_path, 0o755)
    runs_as, make = CASES[case]
    d, why = make(tmp_path, other_user)
    p = started(runs_as(other_user), d)
    try:
        res = inspected(p)
        shown = text_of(res)
    finally:
        stop(p)
    skipped = res.data["in_process"]["skipped_dirs"]
    assert [(s["dir"], s["pids"]) for s in skipped] == [(d, [p.pid])] and why in skipped[0]["reason"], skipped
    assert res.data["in_process"].get("dirs", []) == [] and not read_as_evidence(res)
    assert f"NCCLPROBE_DIR {d}" in shown and why in shown, shown


def test_a_system_directory_of_root_is_skipped(tmp_path):
    p = started(os.geteuid(), "/etc")
    try:
        res = inspected(p)
    finally:
        stop(p)
    (s,) = res.data["in_process"]["skipped_dirs"]
    assert s["dir"] == "/etc" and "system directory" in s["reason"]


def test_a_directory_named_in_another_mount_namespace_is_not_ours(tmp_path):
    """The process resolves its NCCLPROBE_DIR in its own mount namespace: the same path here may be
    another directory altogether (a container's /logs is not the host's)."""
    unshare = shutil.which("unshare")
    if not unshare or subprocess.run([unshare, "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m is not available here")
    d = logs_in(tmp_path / "mine", os.geteuid())
    p = started(os.geteuid(), str(d), (unshare, "-m"))
    try:
        res = inspected(p)
    finally:
        stop(p)
    (s,) = res.data["in_process"]["skipped_dirs"]
    assert s["dir"] == str(d) and "mount namespace" in s["reason"] and not read_as_evidence(res)


def test_a_directory_given_with_dir_is_read_whoever_owns_it(tmp_path, other_user):
    """--dir is the user's own choice: a third user's directory is read (the discovered one is not)."""
    os.chmod(tmp_path, 0o755)
    d = logs_in(tmp_path / "third", THIRD_UID)
    p = started(os.geteuid(), str(tmp_path / "elsewhere"))
    try:
        res = inspected(p, log_dirs=[str(d)])
    finally:
        stop(p)
    assert res.data["in_process"]["dirs"] == [str(d)] and read_as_evidence(res)


def test_the_cli_says_it_in_json_that_fits_the_schema_and_in_text(tmp_path, other_user):
    os.chmod(tmp_path, 0o755)
    d = logs_in(tmp_path / "third", THIRD_UID)
    p = started(other_user, str(d))
    try:
        r = subprocess.run([*NCCLPROBE, "inspect", str(p.pid), "--json"], capture_output=True, text=True,
                           timeout=WAIT_S * 3)
        t = subprocess.run([*NCCLPROBE, "inspect", str(p.pid)], capture_output=True, text=True, timeout=WAIT_S * 3,
                           env={**os.environ, "COLUMNS": "400"})  # one line each: the note is matched whole
    finally:
        stop(p)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    (s,) = doc["in_process"]["skipped_dirs"]
    assert s["dir"] == str(d) and s["pids"] == [p.pid] and f"uid {THIRD_UID}" in s["reason"]
    assert not doc.get("communicators")
    assert t.returncode == 0 and f"NCCLPROBE_DIR {d}" in t.stdout and "not read" in t.stdout, t.stdout
