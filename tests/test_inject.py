"""Persistent mode (`ncclprobe inject install/status/uninstall`) in throwaway venvs, never the system
interpreter."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclprobe._lib import ncclprobe_boot as _boot
from ncclprobe.commands import inject, profile
from ncclprobe.doc import Unexaminable
from boot_support import clean_env, events, make_venv, run, site_packages, snapshot, starts_by_pid
from users import made_dir


@pytest.fixture
def venv(tmp_path):
    py = make_venv(tmp_path / "venv")
    return py, site_packages(py)


def test_install_files_and_survives_flags_and_curated_envs(venv, tmp_path):
    py, sp = venv
    log = tmp_path / "log"
    res = inject.install(str(py), profile=profile.from_cli(["NCCL_PROTO=LL"], [], ["NCCL_PROTO"]), log_dir=log)
    assert res.data["installed"] and res.data["site_packages"] == str(sp)
    assert (sp / inject.PTH).read_text() == "import _ncclprobe_boot; _ncclprobe_boot.start()\n"
    assert (sp / inject.START).read_text() == "_ncclprobe_boot:start\n"
    assert list((sp / "__pycache__").glob("_ncclprobe_boot.*.pyc"))  # compiled by the target now
    assert not [p for p in sp.iterdir() if "ncclprobe-tmp" in p.name]
    code = "import os; os.environ['NCCL_PROTO'] = 'Simple'; print(os.getpid(), os.environ['NCCL_PROTO'])"
    pids = {}
    for flags in ([], ["-I"], ["-E"], ["-S"]):
        out = run([py, *flags, "-c", code], clean_env(PYTHONPATH="/nonexistent")).stdout.split()
        pids[" ".join(flags)] = int(out[0])
        assert out[1] == ("Simple" if flags == ["-S"] else "LL")
    # a launcher that hands its worker an empty environment (no PYTHONPATH, no NCCLPROBE_*)
    out = run([py, "-c", f"import subprocess; subprocess.run([{str(py)!r}, '-c', {code!r}], env={{}})"],
              clean_env()).stdout.split()
    pids["env={}"] = int(out[0])
    starts = starts_by_pid(log)
    for what in ("", "-I", "-E", "env={}"):
        ev = starts[pids[what]]
        assert ev["mode"] == "persistent" and ev["prefix"] == str(tmp_path / "venv")
        assert ev["pinned"] == {"NCCL_PROTO": "LL"}
    assert pids["-S"] not in starts
    blocked = [w for w in events(log, "env_write") if w["pid"] == pids["env={}"]]
    assert [(w["var"], w["new"], w["blocked"]) for w in blocked] == [("NCCL_PROTO", "Simple", True)]


def test_status_shows_profile_seen_processes_and_those_without_the_probe(venv, tmp_path):
    py, sp = venv
    log = tmp_path / "log"
    inject.install(str(py), profile=profile.from_cli([], ["NCCL_ALGO=Ring"], []), log_dir=log)
    seen = run([py, "-c", "import os; print(os.getpid())"], clean_env())
    sleepers = [subprocess.Popen([str(py), *flags, "-c", "import time; time.sleep(60)"], env=clean_env())
                for flags in (["-S"], ["-I"])]
    other = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])  # not this venv
    try:
        deadline = time.time() + 10
        while time.time() < deadline and len(starts_by_pid(log)) < 2:
            time.sleep(0.05)
        res = inject.status(str(py))
    finally:
        for p in sleepers + [other]:
            p.kill()
            p.wait()
    d = res.data
    assert d["installed"] and d["log_dir"] == str(log)
    assert d["profile"] == {"set": {}, "default": {"NCCL_ALGO": "Ring"}, "pin": []}
    assert {s["pid"] for s in d["seen"]} == {int(seen.stdout), sleepers[1].pid}
    without = {w["pid"]: w for w in d["without_probe"]}
    assert set(without) == {sleepers[0].pid}
    assert without[sleepers[0].pid]["reason"] == "site disabled (-S)"
    assert res.doc  # something to draw


def test_uninstall_restores_exactly_and_is_idempotent(venv, tmp_path):
    py, sp = venv
    before = snapshot(sp)
    inject.install(str(py), log_dir=tmp_path / "log")
    inject.install(str(py), profile=profile.from_cli(["NCCL_PROTO=LL"], [], []), log_dir=tmp_path / "log",
                   replace=True)
    run([py, "-c", "pass"], clean_env())
    assert snapshot(sp) != before
    res = inject.uninstall(str(py))
    assert len(res.data["removed"]) >= 4
    assert snapshot(sp) == before
    again = inject.uninstall(str(py))
    assert again.data["removed"] == [] and "nothing to remove" in again.doc[0].text
    assert inject.status(str(py)).data["installed"] is False


def test_uninstall_keeps_a_pycache_that_was_there(venv, tmp_path):
    py, sp = venv
    (sp / "__pycache__").mkdir()
    (sp / "__pycache__" / "other.cpython-311.pyc").write_bytes(b"x")
    before = snapshot(sp)
    inject.install(str(py), log_dir=tmp_path / "log")
    inject.uninstall(str(py))
    assert snapshot(sp) == before


def test_refuses_unwritable_site_packages_with_nothing_written(venv, tmp_path, monkeypatch):
    py, sp = venv
    before = snapshot(sp)
    # root ignores file modes, so the refusal is triggered through the check install() makes
    monkeypatch.setattr(inject.os, "access", lambda path, mode: False)
    with pytest.raises(Unexaminable, match="not writable.*nothing was written") as err:
        inject.install(str(py), log_dir=tmp_path / "log")
    assert err.value.reason == "permission"
    assert snapshot(sp) == before


def test_failure_midway_leaves_nothing_half_written(venv, tmp_path):
    py, sp = venv
    # the second file's temporary name is taken: writing it fails after the first was written
    (sp / f".{inject.START}.{os.getpid()}.ncclprobe-tmp").mkdir()
    before = snapshot(sp)
    with pytest.raises(Unexaminable, match="nothing was written"):
        inject.install(str(py), log_dir=tmp_path / "log")
    assert snapshot(sp) == before


def test_not_an_interpreter(tmp_path):
    with pytest.raises(Unexaminable, match="cannot run the interpreter"):
        inject.status(str(tmp_path / "no-python"))


def test_a_program_that_is_not_python_is_named_so_and_the_query_never_shown():
    for exe in ("/bin/ls", "/bin/echo", "/bin/true"):
        res = subprocess.run([sys.executable, "-m", "ncclprobe", "inject", "install", "--python", exe],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert res.returncode == 3 and f"{exe} is not a Python interpreter" in res.stderr, (exe, res.stderr)
        assert "sysconfig" not in res.stdout + res.stderr and "import json" not in res.stdout + res.stderr


def test_a_second_install_with_another_profile_is_refused_unless_replace(venv, tmp_path):
    """The installed profile is never lost silently: another --set/--pin (or --dir) is refused, naming
    the installed variables but none of their values; --replace replaces it whole (no merge); the same
    profile again just rewrites the files."""
    py, sp = venv
    first = profile.from_cli(["NCCL_PROTO=LL", "HF_TOKEN=hf_sekrit"], [], ["NCCL_PROTO"])
    inject.install(str(py), profile=first, log_dir=tmp_path / "log")
    before = snapshot(sp)
    cli = [sys.executable, "-m", "ncclprobe", "inject", "install", "--python", str(py)]
    for extra in (["--set", "NCCL_ALGO=Ring", "--dir", str(tmp_path / "log")],
                  ["--set", "NCCL_PROTO=LL", "--set", "HF_TOKEN=hf_sekrit", "--pin", "NCCL_PROTO"]):  # no --dir
        res = run([*cli, *extra], clean_env())
        assert res.returncode == 2, res.stderr
        assert "already installed" in res.stderr and "set NCCL_PROTO, HF_TOKEN; pin NCCL_PROTO" in res.stderr
        assert "--replace" in res.stderr and "hf_sekrit" not in res.stderr + res.stdout
    assert snapshot(sp) == before
    with pytest.raises(inject.InstalledDiffers):
        inject.install(str(py), profile=profile.from_cli([], ["NCCL_ALGO=Ring"], []), log_dir=tmp_path / "log")
    again = inject.install(str(py), profile=first, log_dir=tmp_path / "log")
    assert again.data["replaced"] is None
    res = run([*cli, "--set", "NCCL_ALGO=Ring", "--dir", str(tmp_path / "log"), "--replace"], clean_env())
    assert res.returncode == 0 and "Replaced what was installed: set NCCL_PROTO, HF_TOKEN; pin NCCL_PROTO" in \
        " ".join(res.stdout.split())  # wrapped at 80 columns
    assert "hf_sekrit" not in res.stdout
    status = inject.status(str(py)).data
    assert status["profile"] == {"set": {"NCCL_ALGO": "Ring"}, "default": {}, "pin": []}
    assert "--replace" in run([*cli, "--help"], clean_env()).stdout


def _pid(py, **env) -> int:
    res = run([py, "-c", "import os; print(os.getpid())"], clean_env(**env))
    assert res.returncode == 0 and res.stderr == "", res.stderr
    return int(res.stdout)


def test_default_log_dir_is_private_per_user(venv, tmp_path, monkeypatch):
    """No name in a shared place (the old /tmp/ncclprobe-<uid>, which anyone could create first): the
    user's runtime directory where it has one (a login session), else its home; install makes both."""
    py, sp = venv
    home, runtime = made_dir(tmp_path / "home", 0o755), made_dir(tmp_path / "runtime", 0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    res = inject.install(str(py))
    session, other = runtime / "ncclprobe", home / ".ncclprobe-logs"
    assert res.data["log_dir"] == str(session)
    assert [oct(d.stat().st_mode & 0o777) for d in (session, other)] == ["0o700", "0o700"]
    assert _pid(py) in starts_by_pid(session)
    shutil.rmtree(session)  # a reboot or the last logout empties the runtime directory: the probe makes it again
    assert _pid(py) in starts_by_pid(session)
    assert oct(session.stat().st_mode & 0o777) == "0o700"
    if not os.path.isdir(f"/run/user/{os.geteuid()}"):  # a daemon, a cron job: no runtime directory
        without = _pid(py, XDG_RUNTIME_DIR="")
        assert without in starts_by_pid(other)
        assert without in {s["pid"] for s in inject.status(str(py)).data["seen"]}
    inject.uninstall(str(py))


def test_default_log_dir_is_never_a_place_others_can_write(tmp_path, monkeypatch, other_user):
    shared = made_dir(tmp_path / "shared", 0o1777)  # like /tmp
    theirs = made_dir(tmp_path / "theirs", 0o700)
    os.chown(theirs, other_user, other_user)
    for runtime in (shared, theirs, made_dir(tmp_path / "open", 0o755)):
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        monkeypatch.setenv("HOME", str(shared))
        got = _boot.default_log_dir(None)
        home = pwd.getpwuid(os.geteuid()).pw_dir  # where $HOME is no private place, the passwd entry's
        assert got is None or got.startswith(f"/run/user/{os.geteuid()}/") or got == home + "/.ncclprobe-logs"
        assert _boot.default_log_dir("home") in (None, home + "/.ncclprobe-logs")


def test_status_of_a_probe_installed_with_the_old_default_names_it(venv, tmp_path, monkeypatch):
    """A probe installed by an older ncclprobe logs into /tmp/ncclprobe-<uid> (its own copy says so):
    status says that directory, and that installing again moves it."""
    py, sp = venv
    monkeypatch.setenv("HOME", str(made_dir(tmp_path / "home", 0o700)))
    inject.install(str(py))
    module = sp / f"{inject.MODULE}.py"
    module.write_text(module.read_text().replace(f"'default_log_dir': '{inject.DEFAULT_SCHEME}', ", ""))
    res = inject.status(str(py))
    assert res.data["log_dir"] == f"/tmp/ncclprobe-{os.geteuid()}"
    assert "older ncclprobe" in " ".join(getattr(d, "text", "") for d in res.doc)
    inject.uninstall(str(py))


def test_a_user_without_the_default_directory_gets_no_output(venv, tmp_path, monkeypatch):
    """Another user of a shared interpreter (no runtime directory, no ~/.ncclprobe-logs): silence."""
    py, sp = venv
    monkeypatch.setenv("HOME", str(made_dir(tmp_path / "installer", 0o700)))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    inject.install(str(py))
    if os.path.isdir(f"/run/user/{os.geteuid()}"):
        pytest.skip("this user has a runtime directory here")
    other_home = made_dir(tmp_path / "other", 0o700)
    res = run([py, "-c", "import os; os.environ['NCCL_PROTO'] = 'LL'; print('ok')"], clean_env(HOME=str(other_home)))
    assert (res.returncode, res.stdout, res.stderr) == (0, "ok\n", "")
    assert list(other_home.iterdir()) == []
    inject.uninstall(str(py))


def test_ephemeral_on_top_of_persistent_boots_once(venv, tmp_path):
    py, sp = venv
    inject.install(str(py), profile=profile.from_cli(["NCCL_ALGO=Ring"], [], []), log_dir=tmp_path / "inst")
    env = clean_env()
    env.update(inject.ephemeral_env(env, tmp_path / "run", profile.from_cli([], [], ["NCCL_ALGO"])))
    out = run([py, "-c", "import os; os.environ['NCCL_ALGO'] = 'Tree'; print(os.getpid(), os.environ['NCCL_ALGO'])"], env)
    pid, algo = out.stdout.split()
    assert algo == "Ring"
    (start,) = events(tmp_path / "run", "process_start")  # NCCLPROBE_DIR of the run wins
    assert start["pid"] == int(pid) and start["mode"] == "persistent" and start["pinned"] == {"NCCL_ALGO": "Ring"}
    assert list((tmp_path / "inst").iterdir()) == []  # made (0700) by install, never written to


def test_cli_usage_errors_exit_2(venv):
    py, _ = venv
    for args, words in ((["--set", "NCCL_PROTO"], "--set NCCL_PROTO: expected NAME=VALUE"),
                        (["--pin", "HOME"], "HOME is not a watched variable")):
        res = run([sys.executable, "-m", "ncclprobe", "inject", "install", "--python", py, *args], clean_env())
        assert res.returncode == 2 and words in res.stderr, res.stderr
    assert not (site_packages(py) / inject.PTH).exists()


def test_rest_of_the_probe_loaded_on_first_use(venv, tmp_path):
    """A persistent start loads only the hot module; a guarded write (here in a fork child) runs the
    second file, and without it the write still happens, recorded as one probe_error."""
    py, sp = venv
    log = tmp_path / "log"
    inject.install(str(py), profile=profile.from_cli([], [], ["NCCL_PROTO"]), log_dir=log)
    assert (sp / f"{inject.REST}.py").exists() and list((sp / "__pycache__").glob(f"{inject.REST}.*.pyc"))
    code = ("import os, sys; print('rest' if 'parse_profile' in vars(sys.modules['_ncclprobe_boot']) else 'hot');"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.environ['NCCL_ALGO'] = 'Tree'; os.environ['NCCL_PROTO'] = 'LL'; os._exit(0)\n"
            "os.waitpid(pid, 0); print(pid)")
    out = run([py, "-c", code], clean_env()).stdout.split()
    assert out[0] == "hot"
    child = int(out[1])
    writes = [(w["var"], w["new"], w["blocked"]) for w in events(log, "env_write") if w["pid"] == child]
    assert writes == [("NCCL_ALGO", "Tree", False), ("NCCL_PROTO", "LL", True)]
    assert starts_by_pid(log)[child]["pinned"] == {"NCCL_PROTO": None}
    (sp / f"{inject.REST}.py").unlink()
    for f in (sp / "__pycache__").glob(f"{inject.REST}.*.pyc"):
        f.unlink()
    res = run([py, "-c", "import os; os.environ['NCCL_ALGO'] = 'Tree'; print(os.getpid(), os.environ['NCCL_ALGO'])"],
              clean_env())
    pid, algo = res.stdout.split()
    assert algo == "Tree" and res.returncode == 0 and not res.stderr
    errors = [e for e in events(log, "probe_error") if e["pid"] == int(pid)]
    assert [e["part"] for e in errors] == ["guard"]
    inject.uninstall(str(py))
    assert not list(sp.glob("*ncclprobe*")) and not list((sp / "__pycache__").glob("*ncclprobe*"))
