"""`inspect` at the edges a reviewer found: empty environments, zombies and kernel threads, secrets in
shell evidence, bad arguments, several PIDs, explicit log paths, ncclprobe inside its own target, multi-line
command lines, the simulated NCCL, and ncclprobe's own wiring in parent diffs. Live processes where the
point is live processes."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest

from ncclprobe import render
from ncclprobe.doc import Unexaminable
from ncclprobe.commands.inspection import UsageError, inspect_processes
from fakeproc import FakeProc
from test_run_watch import wait_until

NO_NVML = lambda: ({}, "no NVML in this test")  # noqa: E731
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]
SLEEP = shutil.which("sleep") or "/bin/sleep"


def cli(*args, env=None):
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=120, env=env)


def text_of(res) -> str:
    out = StringIO()
    render.render_text(res, out, width=200, color=False)
    return out.getvalue()


def argv(pid: int) -> list[str]:
    """pid's command line as /proc shows it ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def state(pid: int) -> str:
    """pid's state letter (proc(5): the field after the parenthesised comm)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def children(pid: int) -> list[int]:
    import psutil
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def started(cmd, **kw):
    """A live process, once /proc shows it running cmd (its exec done)."""
    p = subprocess.Popen(cmd, **kw)
    wait_until(lambda: argv(p.pid) == cmd, f"{cmd} never showed in /proc/{p.pid}/cmdline")
    return p


def stop(*ps):
    """Kill each process started here and everything it started (by pid, children first)."""
    import psutil
    for p in ps:
        try:
            kids = psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        for k in kids:
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
        p.kill()
        p.wait()


# -- 1: a child exec'ed with an empty environment ------------------------------------------------
def test_live_empty_environment_is_real_and_checked():
    """Popen(env={}) gives a 0-byte block: the exec-time environment really is empty. Not clobbered, not
    stale: the parent diff and --expect apply to it."""
    code = (f"import subprocess, sys, time; c = subprocess.Popen([{SLEEP!r}, '30'], env={{}}); "
            "print(c.pid, flush=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "NCCL_PROTO": "LL"})
    try:
        child = int(parent.stdout.readline())
        wait_until(lambda: argv(child) == [SLEEP, "30"], f"{child} never ran {SLEEP}")
        res = inspect_processes([parent.pid], expect={"NCCL_PROTO": "LL"}, scope="all", gpu_lookup=NO_NVML)
        row = next(p for p in res.data["processes"] if p["pid"] == child)
        assert (row["exec_env_source"], row["exec_env_reason"], row["exec_env"], row["exec_env_stale"]) == ("exec", "empty at exec", {}, None)
        assert not [f for f in res.findings if f.code == "EXEC_ENV_STALE"]
        (missing,) = [f for f in res.findings if f.code == "ENV_MISSING" and f.var == "NCCL_PROTO"]
        assert missing.severity == "error" and missing.pids == (child,)
        assert "empty at exec" in text_of(res)
        plain = inspect_processes([parent.pid], scope="all", gpu_lookup=NO_NVML)  # against the parent only
        assert [f.pids for f in plain.findings if f.code == "ENV_MISSING"] == [(child,)]
    finally:
        stop(parent)


def test_live_setproctitle_block_is_still_clobbered():
    """The other side of the distinction: setproctitle keeps the block's size and writes over it."""
    pytest.importorskip("setproctitle")
    code = "import setproctitle, time; setproctitle.setproctitle('w::titled'); print('ok', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={k: v for k, v in os.environ.items() if k != "SPT_NOENV"})
    try:
        assert p.stdout.readline().strip() == "ok"
        (row,) = inspect_processes([p.pid], gpu_lookup=NO_NVML).data["processes"]
        assert (row["exec_env_source"], row["exec_env_reason"], row["exec_env_stale"]) == ("empty", "clobbered", "clobbered")
    finally:
        stop(p)


SPT_CHILD = textwrap.dedent("""
    import os, sys, time
    os.environ["ZZ_MOVED"] = "in-process"  # setenv moves this string to the heap: the block's head ends here
    import setproctitle
    setproctitle.setproctitle(sys.argv[1] + "x" * int(sys.argv[2]))  # longer than the command line, if asked
    print("ok", flush=True)
    time.sleep(30)
""")


@pytest.mark.parametrize("longer", [0, 1000])
def test_live_setproctitle_zeroing_the_head_keeps_the_tail_and_is_not_absence(longer):
    """What setproctitle really does when a variable changed before the title was set (Ray's agents):
    it takes over the block only up to that variable, zeroes (or writes its title over) that head and
    leaves the tail as it was at exec. NCCL_PROTO sat in the head: unknown, not missing; NCCL_ALGO sat
    in the tail: still read."""
    pytest.importorskip("setproctitle")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "SPT_"))}
    pad = {f"ZZ_PAD{i}": "v" * 40 for i in range(40)}
    env = {"NCCL_PROTO": "LL", **pad, "ZZ_MOVED": "1", **base, "NCCL_ALGO": "Ring"}
    p = subprocess.Popen([sys.executable, "-c", SPT_CHILD, "ray::IDLE", str(longer)], stdout=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "ok"
        raw = Path(f"/proc/{p.pid}/environ").read_bytes()
        assert b"NCCL_PROTO=LL" not in raw and b"\0ZZ_MOVED=1\0" in raw and b"NCCL_ALGO=Ring" in raw  # the real shape
        # a short title leaves NULs over the head; a long one runs from the command line's place into it
        assert raw.startswith(b"xxxx") if longer else raw.startswith(b"\0" * 1000)
        res = inspect_processes([p.pid], expect={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}, gpu_lookup=NO_NVML)
        (row,) = res.data["processes"]
        assert (row["exec_env_source"], row["exec_env_reason"], row["exec_env_stale"]) == ("exec", "partly overwritten", "clobbered")
        assert row["exec_env"].get("NCCL_ALGO") == "Ring" and "NCCL_PROTO" not in row["exec_env"]
        assert not [f for f in res.findings if f.code in ("ENV_MISSING", "ENV_CHANGED")], res.findings
        (stale,) = [f for f in res.findings if f.code == "EXEC_ENV_STALE"]
        assert stale.pids == (p.pid,) and "setproctitle" in stale.message  # a stated blind spot, not a cause
    finally:
        stop(p)


# -- 2: zombies and kernel threads ---------------------------------------------------------------
def test_live_zombie_is_empty_not_unreadable():
    code = "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nprint(pid, flush=True)\ntime.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())
        wait_until(lambda: state(zombie) == "Z", f"{zombie} never exited (its parent does not reap it)")
        res = inspect_processes([parent.pid], gpu_lookup=NO_NVML)
        row = next(p for p in res.data["processes"] if p["pid"] == zombie)
        assert row["state"] == "Z" and (row["exec_env_source"], row["exec_env_reason"]) == ("empty", "zombie")
        assert not [f for f in res.findings if f.code in ("ENV_UNREADABLE", "EXEC_ENV_STALE")]
    finally:
        stop(parent)


@pytest.mark.skipif(not os.path.exists("/proc/2/stat"), reason="no kthreadd visible (PID namespace)")
def test_live_kernel_threads_are_empty_not_unreadable():
    try:
        comm = Path("/proc/2/comm").read_text().strip()
    except OSError:
        pytest.skip("pid 2 not readable")
    if comm != "kthreadd":
        pytest.skip("pid 2 is not kthreadd here (PID namespace)")
    res = inspect_processes([2], gpu_lookup=NO_NVML)
    rows = res.data["processes"]
    assert rows and all((r["exec_env_source"], r["exec_env_reason"]) == ("empty", "kernel thread") for r in rows)
    assert not [f for f in res.findings if f.code == "ENV_UNREADABLE"]


# -- 3: secrets in the shell-prefix evidence -----------------------------------------------------
def test_live_shell_prefix_evidence_shows_only_watched_assignments():
    script = "HF_TOKEN=sekrit123 PLAIN_SETTING=zz9 NCCL_ALGO=Ring cd /tmp && sleep 20; echo x"
    shell = started(["bash", "-c", script], env={**os.environ, "NCCL_PROTO": "LL"})
    try:
        wait_until(lambda: any(argv(k) == ["sleep", "20"] for k in children(shell.pid)), "bash never ran sleep 20")
        res = inspect_processes([shell.pid], gpu_lookup=NO_NVML)
        (f,) = [f for f in res.findings if f.code == "SHELL_PREFIX_SCOPE"]
        assert f.var == "NCCL_ALGO" and "NCCL_ALGO=Ring" in f.evidence["assigned_in"]
        shown = json.dumps(res.to_json()) + text_of(res)
        assert "sekrit123" not in shown
        assert "zz9" not in json.dumps(f.to_json())  # the tree shows command lines; findings only watched values
        assert "HF_TOKEN=<redacted>" in f.evidence["assigned_in"] and "PLAIN_SETTING=<redacted>" in f.message
        allv = inspect_processes([shell.pid], gpu_lookup=NO_NVML, all_vars=True)
        (f,) = [f for f in allv.findings if f.code == "SHELL_PREFIX_SCOPE"]
        assert "PLAIN_SETTING=zz9" in f.evidence["assigned_in"] and "sekrit123" not in json.dumps(allv.to_json())
        raw = inspect_processes([shell.pid], gpu_lookup=NO_NVML, all_vars=True, redact=False)
        (f,) = [f for f in raw.findings if f.code == "SHELL_PREFIX_SCOPE"]
        assert "HF_TOKEN=sekrit123" in f.evidence["assigned_in"]
    finally:
        stop(shell)


# -- 4, 5, 6: arguments --------------------------------------------------------------------------
def test_malformed_pgrep_is_a_usage_error():
    with pytest.raises(UsageError):
        inspect_processes([], pgrep="(", gpu_lookup=NO_NVML)
    r = cli("inspect", "--pgrep", "(")
    assert r.returncode == 2 and "regular expression" in r.stderr


def test_one_missing_pid_among_valid_ones():
    p = started([SLEEP, "30"])
    try:
        res = inspect_processes([p.pid, 999999999], gpu_lookup=NO_NVML)
        assert [r["pid"] for r in res.data["processes"]] == [p.pid]
        assert {"pid": 999999999, "reason": "no_such_process", "given": True} in res.data["skipped"]
        assert "pid 999999999 (given) not examined: no such process" in text_of(res)
        assert res.exit_code() == res.exit_code(strict=True) == 3 and res.data["missing_pids"] == [999999999]
        # a named PID that is not there fails the command (3, as for one PID), the others still shown
        r = cli("inspect", "999999999", str(p.pid), "--json")
        doc = json.loads(r.stdout)
        assert r.returncode == 3 and [row["pid"] for row in doc["processes"]] == [p.pid]
        assert doc["missing_pids"] == [999999999]
        r = cli("inspect", "999999999", str(p.pid))
        assert r.returncode == 3 and f"{p.pid} {SLEEP} 30" in r.stdout
        assert "pid 999999999 (given) not examined: no such process (exit code 3)" in " ".join(r.stdout.split())
        r = cli("inspect", "999999998", "999999999")
        assert r.returncode == 3 and "no such process" in r.stderr
        assert inspect_processes([p.pid], gpu_lookup=NO_NVML).data["missing_pids"] == []
    finally:
        stop(p)


def test_no_redact_without_all_vars_is_a_usage_error():
    r = cli("inspect", str(os.getpid()), "--no-redact")
    assert r.returncode == 2 and "--no-redact needs --all-vars" in r.stderr and not r.stdout


def test_explicit_missing_log_paths_exit_3(tmp_path):
    p = started([SLEEP, "30"])
    try:
        with pytest.raises(Unexaminable) as exc:
            inspect_processes([p.pid], log_dirs=[str(tmp_path / "nope")], gpu_lookup=NO_NVML)
        assert exc.value.reason == "no_log_directory"
        r = cli("inspect", str(p.pid), "--dir", str(tmp_path / "nope"))
        assert r.returncode == 3 and "no such log directory" in r.stderr
        r = cli("inspect", str(p.pid), "--nccl-log", str(tmp_path / "nope.log"), "--json")
        assert r.returncode == 3 and json.loads(r.stdout)["error"]["reason"] == "no_nccl_log"
    finally:
        stop(p)


def test_discovered_missing_log_dir_is_a_note(tmp_path):
    """NCCLPROBE_DIR found in the target's environment, not given by the user: best effort, a note."""
    p = started([SLEEP, "30"], env={**os.environ, "NCCLPROBE_DIR": str(tmp_path / "gone")})
    try:
        r = cli("inspect", str(p.pid), "--json")
        assert r.returncode == 0, r.stderr
        (skipped,) = json.loads(r.stdout)["in_process"]["skipped_dirs"]  # tests/test_inspect_logdirs.py: why
        assert skipped["dir"] == str(tmp_path / "gone") and skipped["reason"] == "no such directory"
    finally:
        stop(p)


# -- 7: ncclprobe inside its own target ----------------------------------------------------------
def test_live_ncclprobe_leaves_itself_out_of_an_ancestor_tree():
    code = textwrap.dedent(f"""
        import json, os, subprocess, sys
        r = subprocess.run({NCCLPROBE!r} + ["inspect", str(os.getpid()), "--json", "--scope", "all"],
                           capture_output=True, text=True)
        print(json.dumps({{"me": os.getpid(), "rc": r.returncode, "out": r.stdout}}))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    got = json.loads(r.stdout)
    doc = json.loads(got["out"])
    assert [row["pid"] for row in doc["processes"]] == [got["me"]]  # ncclprobe's own process is not a row
    assert len(doc["excluded"]) == 1 and doc["excluded"][0] != got["me"]
    assert not [f for f in doc["findings"] if got["me"] not in f["pids"]]


def test_a_root_that_is_ncclprobe_itself_is_still_shown():
    res = inspect_processes([os.getpid()], gpu_lookup=NO_NVML)
    assert res.data["processes"][0]["pid"] == os.getpid() and res.data["excluded"] == []


# -- 8: multi-line command lines -----------------------------------------------------------------
def test_live_multiline_command_line_is_shown_on_one_line():
    p = started([sys.executable, "-c", "import time\ntime.sleep(30)"])
    try:
        res = inspect_processes([p.pid], gpu_lookup=NO_NVML)
        (row,) = res.data["processes"]
        assert "\n" not in row["command"] and "import time\\ntime.sleep(30)" in row["command"]
        assert row["argv"][-1] == "import time\ntime.sleep(30)"  # the data keeps the argument as it is
        tree_line = next(line for line in text_of(res).splitlines() if line.startswith(str(p.pid)))
        assert "time.sleep(30)" in tree_line
    finally:
        stop(p)


def test_multiline_commands_in_hints_are_one_line(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, cmdline=["python", "-c", "import os\nos.execv(...)"], env={"NCCL_PROTO": "LL"})
    fake.add(11, 10, cmdline=["python", "w.py"], env={})
    res = inspect_processes([10], scope="all", proc_root=fake.root, gpu_lookup=NO_NVML)
    (f,) = [f for f in res.findings if f.code == "ENV_MISSING"]
    assert "\n" not in f.hint and "import os\\nos.execv" in f.hint


# -- 9: the simulated NCCL -----------------------------------------------------------------------
def sim_lib() -> Path | None:
    import ncclprobe
    p = Path(ncclprobe.__file__).parent / "_lib" / "sim" / "libnccl.so.2"
    return p if p.exists() else None


@pytest.mark.skipif(sim_lib() is None, reason="simulated NCCL not built (pip install .)")
def test_live_simulated_nccl_is_labelled_simulated():
    code = f"import ctypes, time; ctypes.CDLL({str(sim_lib())!r}); print('ok', flush=True); time.sleep(30)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        res = inspect_processes([p.pid], gpu_lookup=NO_NVML)
        (lib,) = res.data["processes"][0]["nccl_libs"]
        assert lib["simulated"] is True and lib["version"] == "2.28.9"
        assert "libnccl 2.28.9 (simulated NCCL)" in text_of(res)
    finally:
        stop(p)


# -- 10: ncclprobe's own wiring is not a dropped variable ----------------------------------------
def test_probe_wiring_is_not_reported_as_dropped(tmp_path):
    fake = FakeProc(tmp_path)
    lib = "/site/ncclprobe/_lib/libncclprobe.so"
    fake.add(10, 1, cmdline=["ncclprobe-run"], env={"NCCL_PROTO": "LL", "NCCL_PROFILER_PLUGIN": lib,
                                                     "NCCL_ENV_PLUGIN": lib, "LD_PRELOAD": lib})
    fake.add(11, 10, cmdline=["python", "w.py"], env={"NCCL_PROTO": "LL"})
    fake.add(12, 10, cmdline=["python", "v.py"], env={"NCCL_PROTO": "LL", "LD_PRELOAD": f"{lib}:/x/libjemalloc.so"})
    fake.add(13, 10, cmdline=["python", "u.py"], env={})
    res = inspect_processes([10], scope="all", proc_root=fake.root, gpu_lookup=NO_NVML)
    named = {v for f in res.findings if f.code in ("ENV_MISSING", "ENV_CHANGED")
             for v in (f.evidence.get("vars") or {f.var: None})}
    assert named == {"NCCL_PROTO"}


# -- 11: a refused environment names its real cause; a process gone mid-scan is a note ----------
def test_a_process_that_exited_during_the_scan_is_a_note_not_a_warning(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, cmdline=["python", "serve.py"], env={"NCCL_PROTO": "LL"})
    fake.add(11, 10, cmdline=["python", "w.py"], env={"NCCL_PROTO": "LL"}, environ_error=FileNotFoundError)
    res = inspect_processes([10], proc_root=fake.root, reader=fake.reader(), gpu_lookup=NO_NVML)
    row = next(r for r in res.data["processes"] if r["pid"] == 11)
    assert (row["exec_env_source"], row["exec_env_reason"]) == ("unreadable", "vanished")
    assert not [f for f in res.findings if f.code == "ENV_UNREADABLE"] and res.exit_code(strict=True) == 0
    assert "Exited during the scan (environment not read): pid 11." in text_of(res)


STRANGER = 4242  # a uid no process of this machine is expected to use


def as_stranger(cmd: list[str]) -> list[str]:
    """cmd as an unprivileged user; CAP_DAC_READ_SEARCH only lets it read the interpreter wherever it
    is installed (ptrace access, which /proc/<pid>/environ and root need, ignores it)."""
    return ["setpriv", f"--reuid={STRANGER}", f"--regid={STRANGER}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--", *cmd]


def ready(cmd: list[str]) -> subprocess.Popen:
    """A live process, once it says it is ready."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd="/")
    assert p.stdout.readline().strip() == "ok"
    return p


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")
def test_live_refusals_name_their_cause_and_conf_files_behind_them_are_unknown():
    """As an unprivileged user: root's process is another user's (and its root, with its nccl.conf, is
    out of sight); the user's own process that made itself non-dumpable is refused for that reason."""
    wait = "import time; print('ok', flush=True); time.sleep(60)"
    undumpable = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); " + wait  # PR_SET_DUMPABLE = 4
    procs_ = [ready([sys.executable, "-c", wait]), ready(as_stranger([sys.executable, "-c", wait])),
              ready(as_stranger([sys.executable, "-c", undumpable]))]
    rootp, mine, hidden = (p.pid for p in procs_)
    try:
        r = subprocess.run(as_stranger([*NCCLPROBE, "inspect", str(rootp), str(mine), str(hidden), "--json",
                                        "--scope", "all"]), capture_output=True, text=True, timeout=120, cwd="/")
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        rows = {row["pid"]: row for row in doc["processes"]}
        assert (rows[rootp]["exec_env_denied_by"], rows[hidden]["exec_env_denied_by"], rows[mine]["exec_env_source"]) == \
            ("other user", "not dumpable", "exec")
        unread = {tuple(f["pids"]): f for f in doc["findings"] if f["code"] == "ENV_UNREADABLE"}
        assert set(unread) == {(rootp,), (hidden,)}
        assert "another user (root)" in unread[(rootp,)]["message"]
        assert "not dumpable" in unread[(hidden,)]["message"] and "another user" not in unread[(hidden,)]["message"]
        confs = rows[rootp]["conf_files"]
        assert confs and all(c["exists"] is None and "cannot tell whether it exists" in c["reason"] for c in confs)
        text = subprocess.run(as_stranger([*NCCLPROBE, "inspect", str(rootp), str(mine), "--scope", "all"]),
                              capture_output=True, text=True, timeout=120, cwd="/").stdout
        assert "/etc/nccl.conf: cannot tell whether it exists" in text and "Permission denied" not in text
    finally:
        stop(*procs_)
