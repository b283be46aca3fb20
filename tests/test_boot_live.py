"""The boot probe in real interpreters, wired in the ephemeral way (`ncclprobe run`): PYTHONPATH."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ncclprobe.commands import profile
from ncclprobe.commands.inject import ephemeral_env
from ncclprobe.witnesses.events import read_dirs
from boot_support import PYTHON, clean_env, events, make_venv, raw_log_text, run, site_packages, starts_by_pid

FRAMEWORK = """\
import os

os.environ["NCCL_PROTO"] = "Simple"  # what an engine does at import
PROTO_SEEN = os.environ["NCCL_PROTO"]
"""


@pytest.fixture
def wired(tmp_path):
    """(env, log_dir) for a probe-wired interpreter; call with a Profile to add one."""
    def make(prof=None, **base):
        log_dir = tmp_path / "log"
        env = clean_env(**base)
        env.update(ephemeral_env(env, log_dir, prof))
        return env, log_dir
    return make


@pytest.fixture
def framework(tmp_path):
    d = tmp_path / "fw"
    d.mkdir()
    (d / "engine.py").write_text(FRAMEWORK)
    return d


def test_process_start_fields(wired):
    env, log = wired(NCCL_ALGO="Ring", NOT_WATCHED="x")
    res = run([PYTHON, "-c", "import os; print(os.getpid())"], env)
    assert res.returncode == 0, res.stderr
    ev = starts_by_pid(log)[int(res.stdout)]
    assert ev["src"] == "boot" and ev["mode"] == "ephemeral" and ev["ppid"] == os.getpid()
    assert ev["argv"][-2:] == ["-c", "import os; print(os.getpid())"]
    assert ev["exe"] == PYTHON and ev["python"] == ".".join(map(str, __import__("sys").version_info[:3]))
    assert ev["env"]["NCCL_ALGO"] == "Ring" and "NOT_WATCHED" not in ev["env"]
    assert ev["exec_env"] == ev["env"] and ev["exec_env_differs"] is False
    assert oct(log.stat().st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in log.glob("*.jsonl"))


def test_framework_write_is_recorded_with_file_and_line(wired, framework):
    env, log = wired(NCCL_PROTO="LL")
    res = run([PYTHON, "-c", f"import sys; sys.path.insert(0, {str(framework)!r}); import engine; "
               "print(engine.PROTO_SEEN)"], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "Simple"
    (w,) = events(log, "env_write")
    assert (w["var"], w["old"], w["new"], w["op"], w["blocked"]) == ("NCCL_PROTO", "LL", "Simple", "set", False)
    assert w["where"] == f"{framework / 'engine.py'}:3 <module>"


def test_pinned_variable_keeps_its_value(wired, framework):
    env, log = wired(profile.from_cli(["NCCL_PROTO=LL"], [], ["NCCL_PROTO"]))
    res = run([PYTHON, "-c", f"import sys; sys.path.insert(0, {str(framework)!r}); import engine, os; "
               "os.putenv('NCCL_PROTO', 'Tree'); os.environ.pop('NCCL_PROTO'); "
               "print(engine.PROTO_SEEN, os.environ['NCCL_PROTO'])"], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["LL", "LL"]
    writes = events(log, "env_write")
    assert [(w["op"], w["new"], w["blocked"]) for w in writes] == [
        ("set", "Simple", True), ("putenv", "Tree", True), ("unset", None, True)]
    assert writes[0]["where"] == f"{framework / 'engine.py'}:3 <module>"
    (start,) = events(log, "process_start")
    assert start["pinned"] == {"NCCL_PROTO": "LL"}


def test_every_write_path_of_watched_variables(wired, tmp_path):
    code = textwrap.dedent("""\
        import os
        os.environ.setdefault("NCCL_ALGO", "Ring")
        os.environ.update(NCCL_DEBUG="INFO", OTHER_VAR="o")
        os.environb[b"NCCL_IB_DISABLE"] = b"1"
        os.putenv("NCCL_SHM_DISABLE", "1")
        os.unsetenv("NCCL_SHM_DISABLE")
        del os.environ["NCCL_DEBUG"]
        os.environ.pop("NCCL_MISSING", None)
        os.environ["UNWATCHED"] = "u"
        os.environ.clear()
        print(sorted(os.environ))
        """)
    script = tmp_path / "w.py"
    script.write_text(code)
    env, log = wired(NCCL_PROTO="LL")
    res = run([PYTHON, script], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    got = [(w["var"], w["op"], w["old"], w["new"], w["where"].rsplit(" ", 1)[0].rsplit(":", 1)[1])
           for w in events(log, "env_write")]
    assert got[:6] == [("NCCL_ALGO", "set", None, "Ring", "2"), ("NCCL_DEBUG", "set", None, "INFO", "3"),
                       ("NCCL_IB_DISABLE", "set", None, "1", "4"), ("NCCL_SHM_DISABLE", "putenv", None, "1", "5"),
                       ("NCCL_SHM_DISABLE", "unsetenv", "1", None, "6"), ("NCCL_DEBUG", "unset", "INFO", None, "7")]
    cleared = {v for v, op, *_ in got[6:] if op == "unset"}
    assert {"NCCL_ALGO", "NCCL_IB_DISABLE", "NCCL_PROTO", "PYTHONPATH", "NCCLPROBE_DIR"} <= cleared
    assert all(w["where"].startswith(str(script)) for w in events(log, "env_write"))
    assert "OTHER_VAR" not in raw_log_text(log) and "UNWATCHED" not in raw_log_text(log)


def test_secrets_and_unwatched_variables_never_logged(wired, tmp_path):
    prof = profile.from_cli(["NCCL_PROTO=LL", "HF_TOKEN=hunter2"], [], [])
    env, log = wired(prof, AWS_SECRET_ACCESS_KEY="s3cr3t", HOME_ISH="plain-value")
    script = tmp_path / "s.py"
    script.write_text("import os\nos.environ['API_PASSWORD'] = 'pw' + '123'\nos.environ['NCCL_X'] = '1'\n"
                      "print(os.environ['HF_TOKEN'])\n")
    res = run([PYTHON, script, "--api-key", "k3y"], env)
    assert res.returncode == 0 and res.stdout.strip() == "hunter2", res.stderr
    text = raw_log_text(log)
    for secret in ("hunter2", "s3cr3t", "pw123", "k3y", "HF_TOKEN", "AWS_SECRET", "API_PASSWORD",
                   "HOME_ISH", "plain-value"):
        assert secret not in text
    (start,) = events(log, "process_start")
    assert start["profile_unwatched"] == 1
    assert start["profile"] == [{"op": "set", "var": "NCCL_PROTO", "value": "LL", "previous": "LL", "applied": False}]
    assert all(k.startswith(("NCCL", "PYTHONPATH")) for k in start["env"])


def test_profile_reapplied_where_a_launcher_dropped_it(wired):
    # a launcher that keeps PYTHONPATH/NCCLPROBE_* but curates the rest: the probe re-applies the profile
    env, log = wired(profile.from_cli(["NCCL_PROTO=LL"], ["NCCL_ALGO=Ring"], []))
    curated = {k: v for k, v in env.items() if k not in ("NCCL_PROTO", "NCCL_ALGO")}
    res = run([PYTHON, "-c", "import os; print(os.environ['NCCL_PROTO'], os.environ['NCCL_ALGO'])"], curated)
    assert res.stdout.split() == ["LL", "Ring"], res.stderr
    (start,) = events(log, "process_start")
    assert [(p["var"], p["applied"], p["previous"]) for p in start["profile"]] == [
        ("NCCL_PROTO", True, None), ("NCCL_ALGO", True, None)]
    assert start["exec_env_differs"] is False  # compared before the profile: /proc agreed with os.environ


def test_flags_and_curated_env_lose_the_ephemeral_probe(wired):
    env, log = wired()
    pids = {}
    for flag in ("-E", "-I", "-S"):
        res = run([PYTHON, flag, "-c", "import os; print(os.getpid())"], env)
        pids[flag] = int(res.stdout)
    res = run([PYTHON, "-c", "import os, subprocess, sys; print(os.getpid()); sys.stdout.flush(); "
               "subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], env={})"], env)
    parent, child = map(int, res.stdout.split())
    starts = starts_by_pid(log)
    assert parent in starts
    assert child not in starts and not set(pids.values()) & set(starts)


def test_multiprocessing_children(wired, tmp_path):
    script = tmp_path / "mp_children.py"
    script.write_text(textwrap.dedent("""\
        import multiprocessing as mp, os

        def child(q):
            q.put((os.getpid(), os.environ.get("NCCL_PROTO")))

        if __name__ == "__main__":
            os.environ["NCCL_PROTO"] = "LL"   # after exec: /proc of fork children will not show it
            for method in ("spawn", "fork", "forkserver"):
                ctx = mp.get_context(method)
                q = ctx.Queue()
                p = ctx.Process(target=child, args=(q,))
                p.start()
                pid, proto = q.get(timeout=60)
                p.join()
                print(method, pid, proto)
        """))
    env, log = wired()
    res = run([PYTHON, script], env, timeout=120)
    assert res.returncode == 0, res.stderr
    children = {m: int(pid) for m, pid, proto in (line.split() for line in res.stdout.splitlines())}
    starts = starts_by_pid(log)
    main = next(p for p, e in starts.items() if e["argv"][-1] == str(script))
    spawn, fork, fserv = (starts[children[m]] for m in ("spawn", "fork", "forkserver"))
    assert "forked_from" not in spawn and spawn["env"]["NCCL_PROTO"] == "LL" and spawn["exec_env_differs"] is False
    assert fork["forked_from"] == main and fork["env"]["NCCL_PROTO"] == "LL"
    assert "NCCL_PROTO" not in fork["exec_env"] and fork["exec_env_differs"] is True
    server = starts[fserv["forked_from"]]  # the forkserver itself ran the probe (it is an exec'd python)
    assert "forkserver" in " ".join(server["argv"]) and server["ppid"] == main


def test_existing_sitecustomize_runs_after_the_probe(wired, tmp_path):
    user = tmp_path / "usersite"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['NCCL_ALGO'] = 'Tree'\nMARK = 'user'\n")
    env, log = wired()
    env["PYTHONPATH"] += os.pathsep + str(user)
    res = run([PYTHON, "-c", "import sitecustomize, sys, os; print(sitecustomize.MARK, sitecustomize.__file__, "
               "os.environ['NCCL_ALGO'], any('boot-' in p for p in sys.path))"], env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["user", str(user / "sitecustomize.py"), "Tree", "False"]
    start, write = events(log)
    assert start["ev"] == "process_start" and write["ev"] == "env_write"  # probe first, then the user's
    assert write["where"] == f"{user / 'sitecustomize.py'}:2 <module>"


def test_venv_sitecustomize_chained_in_isolated_venv(wired, tmp_path):
    py = make_venv(tmp_path / "venv")
    (site_packages(py) / "sitecustomize.py").write_text("MARK = 'venv'\n")
    env, log = wired()
    res = run([py, "-c", "import sitecustomize, os; print(sitecustomize.MARK, os.getpid())"], env)
    assert res.returncode == 0, res.stderr
    mark, pid = res.stdout.split()
    assert mark == "venv" and starts_by_pid(log)[int(pid)]["prefix"] == str(tmp_path / "venv")


def test_a_shell_parent_is_recorded_from_the_probes_first_part(wired, tmp_path):
    """A Python started by a shell records the shell (parent_seen: its command line, executable, script
    and exec-time environment) without loading the rest of the probe, unless the shell's command line
    holds something secret-looking: then it is redacted."""
    script = tmp_path / "launch.sh"
    script.write_text('unset NCCL_PROTO\n"$PY" -c "import os, sys; m = sys.modules[sys._ncclprobe_boot]; '
                      'print(os.getpid(), \'_guarded_write\' in vars(m))"\n')
    env, log = wired(NCCL_PROTO="LL", PY=PYTHON)
    for extra in ([], ["--api-key", "sk-live-0123456789abcdef"]):
        res = run(["bash", str(script), *extra], env)
        assert res.returncode == 0, res.stderr
        pid, rest_loaded = res.stdout.split()
        seen = [e for e in events(log, "parent_seen") if e["pid"] == int(pid)]
        assert len(seen) == 1
        parent = seen[0]
        assert parent["of"] == starts_by_pid(log)[int(pid)]["ppid"] and parent["ppid"] == os.getpid()
        assert parent["exe"].endswith("/bash") and parent["script"] == str(script)
        assert parent["exec_env"]["NCCL_PROTO"] == "LL" and parent["env_reason"] is None
        if extra:
            assert parent["argv"][:3] == ["bash", str(script), "--api-key"] and "sk-live" not in str(parent["argv"])
            assert rest_loaded == "True"  # the redaction's rules are in the rest
        else:
            assert parent["argv"] == ["bash", str(script)] and rest_loaded == "False"


def test_many_processes_one_log_dir(wired, tmp_path):
    script = tmp_path / "hammer.py"
    script.write_text(textwrap.dedent("""\
        import os, sys, threading
        def work(t):
            for i in range(150):
                os.environ["NCCL_HAMMER_%d" % t] = ("%d-%d-" % (os.getpid(), i)) + "v" * 3000
        ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        [t.start() for t in ts]; [t.join() for t in ts]
        if len(sys.argv) == 1:  # and a fork child writing the same directory
            pid = os.fork()
            if pid == 0:
                work(9)
                os._exit(0)
            os.waitpid(pid, 0)
        """))
    env, log = wired()
    # What is tested here is many writers, not stalls: a loaded machine may leave a process without the
    # CPU for seconds, which the probe may take for a stalled log filesystem (and then drop lines).
    env["NCCLPROBE_STALL_MS"] = str(10 ** 7)
    import subprocess
    procs = [subprocess.Popen([PYTHON, str(script)] + (["x"] if i % 2 else []), env=env) for i in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    writes = events(log, "env_write")  # events() fails on any torn or malformed line
    assert len(writes) == 8 * 4 * 150 + 4 * 150
    assert len(starts_by_pid(log)) == 8 + 4
    assert not [e for e in writes if "dropped" in e]


def test_threads_that_lose_lines_count_each_once(wired, tmp_path):
    """Four threads write while the log file cannot grow (RLIMIT_FSIZE: each write fails), then on together
    once it can: every line is written or counted as dropped, exactly once, whatever the interleaving (a
    count shared with += between threads was said by two lines at once, then as negative numbers)."""
    script = tmp_path / "limited.py"
    script.write_text(textwrap.dedent("""\
        import os, resource, signal, sys, threading
        os.environ["NCCL_PROTO"] = "first"  # the log file is made (and this line written)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), hard))
        limited, lifted = threading.Barrier(5), threading.Barrier(5)
        def work(t):
            for i in range(400):
                os.environ["NCCL_T%d" % t] = "limited-%d" % i
            limited.wait(); lifted.wait()
            for i in range(300):
                os.environ["NCCL_T%d" % t] = "lifted-%d" % i
        ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        [t.start() for t in ts]
        limited.wait()
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        lifted.wait()
        [t.join() for t in ts]
        os.environ["NCCL_PROTO"] = "last"
        """))
    env, log = wired()
    res = run([PYTHON, str(script), "8192"], env)
    assert res.returncode == 0, res.stderr
    read = read_dirs([log])
    # The write that reached the limit, cut there: one torn line. The next line starts with "\n" to end it,
    # but the probe takes no lock (it never blocks its host): another thread's line may end the torn one
    # first, and the "\n" is then an empty line of its own (counted by the reader, no line lost: at most
    # one per thread that popped a tear).
    damaged = dict(read.skipped) | dict(read.unknown) | dict(read.skipped_files)
    assert damaged.get("not JSON", 0) <= 1 and damaged.get("empty line", 0) <= 4, damaged
    assert set(damaged) <= {"not JSON", "empty line"}, damaged
    writes = [e for e in read.events if e["ev"] == "env_write"]
    assert writes[0]["new"] == "first" and writes[-1]["new"] == "last"
    assert all(e.get("dropped", 1) > 0 for e in writes)  # never a count of zero or less
    lost = 2 + 4 * 700 - len(writes)
    assert lost >= 4 * 300 and sum(e.get("dropped", 0) for e in writes) == lost
    assert len([e for e in writes if e["new"].startswith("lifted-")]) == 4 * 300  # none lost once it could grow


def test_unwritable_log_dir_is_one_line_then_silence(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "log", None))
    env["NCCLPROBE_DIR"] = str(blocker / "sub")  # ENOTDIR, even for root
    res = run([PYTHON, "-c", "import os; os.environ['NCCL_PROTO']='LL'; os.environ['NCCL_ALGO']='Ring'; "
               "print('ok', os.environ['NCCL_PROTO'])"], env)
    assert (res.returncode, res.stdout) == (0, "ok LL\n")
    assert res.stderr == f"ncclprobe: cannot log in {blocker / 'sub'}: not a directory; " \
                         "the boot probe stays silent\n"


def test_bad_profile_is_one_probe_error_and_the_process_goes_on(wired, tmp_path):
    env, log = wired(profile.from_cli(["NCCL_PROTO=LL"], [], []))
    Path(env["NCCLPROBE_PROFILE"]).write_text("set NCCL_PROTO=LL\nbogus line\n")
    res = run([PYTHON, "-c", "import os; os.environ['NCCL_ALGO']='Ring'; print('ok')"], env)
    assert (res.returncode, res.stdout, res.stderr) == (0, "ok\n", "")
    kinds = [e["ev"] for e in events(log)]
    assert kinds == ["probe_error", "process_start", "env_write"]
    err = events(log, "probe_error")[0]
    assert err["part"] == "profile" and ":2: unknown directive" in err["message"]


def test_off_switch(wired):
    env, log = wired()
    env["NCCLPROBE_BOOT"] = "off"
    res = run([PYTHON, "-c", "import os; os.environ['NCCL_PROTO']='LL'"], env)
    assert res.returncode == 0 and not list(log.glob("*.jsonl"))
