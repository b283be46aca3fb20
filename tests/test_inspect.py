"""`inspect` end to end: rules on a fake /proc, live process trees, and the CLI."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ncclprobe.doc import Unexaminable
from ncclprobe.commands.inspection import inspect_processes
from fakeproc import FailingReader, FakeProc
from test_run_watch import wait_until

NO_NVML = lambda: ({}, "no NVML in this test")  # noqa: E731
LIB = "/opt/nccl/lib/libnccl.so.2"


def run_fake(fake, pids, **kw):
    kw.setdefault("gpu_lookup", NO_NVML)
    return inspect_processes(pids, proc_root=fake.root, **kw)


def codes(res):
    return sorted((f.code, f.severity, f.var) for f in res.findings)


def pids_by_var(res, code):
    """var -> pids of every `code` finding naming it (parent diffs group several variables)."""
    out: dict[str, tuple] = {}
    for f in res.findings:
        if f.code == code:
            for var in (f.evidence.get("vars") or {f.var: None}):
                out[var] = tuple(sorted({*out.get(var, ()), *f.pids}))
    return out


# -- rules on a fake /proc ---------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    """launcher (NCCL tuning) -> two GPU workers (one lost NCCL_PROTO, one changed NCCL_ALGO) and a
    tokenizer process without GPU."""
    fake = FakeProc(tmp_path)
    tuning = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "HOME": "/root", "API_TOKEN": "s3cret"}
    fake.add(100, 1, cmdline=["python", "serve.py"], env=tuning, exe="/usr/bin/python3")
    fake.add(101, 100, cmdline=["python", "-c", "spawn_main()"], env={**tuning, "NCCL_ALGO": "Tree"},
             fds=["/dev/nvidia0"], start=200)
    fake.add(102, 100, cmdline=["python", "-c", "spawn_main()"],
             env={k: v for k, v in tuning.items() if k != "NCCL_PROTO"}, fds=["/dev/nvidia1"], start=200)
    fake.add(103, 100, cmdline=["python", "tokenizer.py"], env={"HOME": "/root"}, start=200)
    return fake


def test_parent_diff_warnings_in_nccl_scope(server):
    res = run_fake(server, [100])
    assert codes(res) == [("ENV_CHANGED", "warning", "NCCL_ALGO"), ("ENV_MISSING", "warning", "NCCL_PROTO")]
    changed = next(f for f in res.findings if f.code == "ENV_CHANGED")
    assert changed.pids == (101,) and changed.edge["parent"] == 100 and changed.edge["kind"] == "curated_env"
    assert "serve.py" in changed.hint
    procs = {p["pid"]: p for p in res.data["processes"]}
    assert procs[103]["in_scope"] is False and procs[101]["gpus"] == [0]
    assert procs[102]["exec_env_diff"]["removed"] == ["NCCL_PROTO"]
    assert procs[101]["exec_env_diff"]["changed"] == {"NCCL_ALGO": {"parent": "Ring", "value": "Tree"}}


def test_scope_all_includes_processes_without_gpu(server):
    res = run_fake(server, [100], scope="all")
    missing = pids_by_var(res, "ENV_MISSING")
    assert missing["NCCL_PROTO"] == (102, 103) and missing["NCCL_ALGO"] == (103,)
    # one finding per parent and set of children: 103 lost both variables, 102 one
    assert sorted(len(f.evidence["vars"]) for f in res.findings if f.code == "ENV_MISSING") == [1, 2]


def test_expectations_are_errors_and_replace_parent_warnings(server):
    res = run_fake(server, [100], expect={"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "16"})
    errs = {(f.code, f.var): f for f in res.findings if f.severity == "error"}
    assert errs[("ENV_MISSING", "NCCL_PROTO")].pids == (102,)
    assert errs[("ENV_MISSING", "NCCL_PROTO")].edge["parent"] == 100  # the last process that had it
    assert errs[("ENV_MISSING", "NCCL_MAX_NCHANNELS")].pids == (101, 102)
    assert not [f for f in res.findings if f.severity == "warning" and f.var == "NCCL_PROTO"]
    assert res.exit_code() == 1


def test_no_unwatched_variable_unless_asked(server):
    blob = json.dumps(run_fake(server, [100]).to_json())
    assert "API_TOKEN" not in blob and "s3cret" not in blob and "HOME" not in blob
    blob = json.dumps(run_fake(server, [100], all_vars=True).to_json())
    assert "API_TOKEN" in blob and "s3cret" not in blob and "/root" in blob
    blob = json.dumps(run_fake(server, [100], all_vars=True, redact=False).to_json())
    assert "s3cret" in blob


def test_secret_in_a_command_line_is_redacted(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, cmdline=["bash", "-c", "HF_TOKEN=abc123 NCCL_PROTO=LL python x.py"], env={})
    res = run_fake(fake, [10])
    blob = json.dumps(res.to_json())
    assert "abc123" not in blob and "NCCL_PROTO=LL" in blob


def test_unreadable_rows_and_blind_root(server):
    res = run_fake(server, [100], reader=FailingReader({(102, "environ"): PermissionError}))
    unread = [f for f in res.findings if f.code == "ENV_UNREADABLE"]
    assert unread and unread[0].pids == (102,) and "CAP_SYS_PTRACE" in unread[0].hint
    rows = {p["pid"]: p for p in res.data["processes"]}
    assert (rows[102]["exec_env_source"], rows[102]["exec_env_reason"], rows[102]["exec_env"]) == ("unreadable", "permission", None)
    blind = FailingReader({(p, "environ"): PermissionError for p in (100, 101, 102, 103)})
    with pytest.raises(Unexaminable) as exc:
        run_fake(server, [100], reader=blind)
    assert exc.value.reason == "permission"


def test_no_such_pid_and_unreadable_root(server):
    with pytest.raises(Unexaminable) as exc:
        run_fake(server, [99999])
    assert exc.value.reason == "no_such_process"
    with pytest.raises(Unexaminable) as exc:
        run_fake(server, [100], reader=FailingReader({(100, "stat"): PermissionError}))
    assert exc.value.reason == "permission"


def test_fork_child_stale_and_not_checked(tmp_path):
    fake = FakeProc(tmp_path)
    env = {"NCCL_PROTO": "LL"}
    span = (1, 2, 3, 4)
    fake.add(10, 1, cmdline=["python", "srv.py"], env=env, span=span, fds=["/dev/nvidia0"])
    fake.add(11, 10, cmdline=["python", "srv.py"], env=env, span=span, fds=["/dev/nvidia0"], start=300)
    fake.add(12, 10, cmdline=["python", "srv.py"], env=env, span=(5, 6, 7, 8), fds=["/dev/nvidia0"], start=300)
    res = run_fake(fake, [10], expect={"NCCL_ALGO": "Ring"})
    stale = [f for f in res.findings if f.code == "EXEC_ENV_STALE"]
    assert len(stale) == 1 and stale[0].pids == (11,)  # 12 exec'ed again: new stack layout
    missing = next(f for f in res.findings if f.code == "ENV_MISSING")
    assert missing.pids == (10, 12)


def test_clobbered_block(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, env={"NCCL_PROTO": "LL"})
    fake.add(11, 10, env=b"\0" * 4000, cmdline=["sglang::scheduler_TP0"])
    res = run_fake(fake, [10])
    f = next(f for f in res.findings if f.code == "EXEC_ENV_STALE")
    assert f.pids == (11,) and "SPT_NOENV" in f.hint


def test_libraries_static_dynamic_multiple(tmp_path):
    fake = FakeProc(tmp_path)
    fake.add(10, 1, maps=[LIB, "/opt/other/libnccl.so.2"])
    fake.add(11, 10, maps=["/opt/new/libnccl.so.2.18.1"])
    res = run_fake(fake, [10])
    multi = [f for f in res.findings if f.code == "NCCL_MULTIPLE_LIBS"]
    assert {f.pids for f in multi} >= {(10,)}
    libs = res.data["processes"][0]["nccl_libs"]
    assert {lib["path"] for lib in libs} == {LIB, "/opt/other/libnccl.so.2"}
    assert all(lib["reason"] == "vanished" for lib in libs)  # not on this disk: a value, not a crash


def test_tree_document_and_plain_render(server):
    from io import StringIO

    from ncclprobe import render
    res = run_fake(server, [100])
    out = StringIO()
    render.render_text(res, out, width=120, color=False)
    text = out.getvalue()
    assert "100 python serve.py" in text and "- NCCL_PROTO (parent: LL)" in text
    assert "~ NCCL_ALGO: Ring -> Tree" in text and "[WARNING] ENV_MISSING" in text and "hint:" in text


# -- live trees --------------------------------------------------------------------------------
TREE = textwrap.dedent(r"""
    import multiprocessing as mp, os, subprocess, sys, time

    def sleeper():
        time.sleep(60)

    def titled():
        import setproctitle
        setproctitle.setproctitle("worker::titled")
        time.sleep(60)

    if __name__ == "__main__":
        os.environ["NCCL_LATE"] = "1"  # after exec: never in this process's /proc environ
        kids = {}
        for method in ("spawn", "fork", "forkserver"):
            p = mp.get_context(method).Process(target=sleeper)
            p.start()
            kids[method] = p.pid
        os.environ["NCCL_LATER"] = "1"  # after the forkserver started: its children never see it
        p = mp.get_context("forkserver").Process(target=sleeper); p.start(); kids["forkserver2"] = p.pid
        p = mp.get_context("spawn").Process(target=titled); p.start(); kids["titled"] = p.pid
        c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={"PATH": os.environ["PATH"], "NCCL_ALGO": "Tree"})
        kids["curated"] = c.pid
        print(repr(kids), flush=True)
        time.sleep(60)
""")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    pytest.importorskip("setproctitle")
    d = tmp_path_factory.mktemp("live")
    (d / "tree.py").write_text(TREE)
    env = {**os.environ, "NCCL_PROTO": "LL", "MY_SECRET_TOKEN": "hunter2-planted", "PLAIN_SETTING": "zz9"}
    env.pop("SPT_NOENV", None)
    proc = subprocess.Popen([sys.executable, str(d / "tree.py")], stdout=subprocess.PIPE, text=True, env=env)
    kids = eval(proc.stdout.readline())  # noqa: S307 - our own child's repr of a dict of ints
    titled = Path(f"/proc/{kids['titled']}/cmdline")
    wait_until(lambda: titled.read_bytes().startswith(b"worker::titled"), "the titled worker never renamed itself")
    yield proc.pid, kids
    import psutil
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_live_start_methods(live):
    root, kids = live
    res = inspect_processes([root], scope="all", gpu_lookup=NO_NVML)
    rows = {p["pid"]: p for p in res.data["processes"]}
    assert set(kids.values()) <= set(rows)
    assert "NCCL_LATE" not in rows[root]["exec_env"]
    spawn = rows[kids["spawn"]]
    assert spawn["exec_env"]["NCCL_LATE"] == "1" and spawn["exec_env_stale"] is None
    assert rows[kids["fork"]]["exec_env_stale"] == "fork" and "NCCL_LATE" not in rows[kids["fork"]]["exec_env"]
    assert rows[kids["forkserver"]]["exec_env_stale"] == "forkserver"
    assert rows[kids["forkserver2"]]["exec_env_stale"] == "forkserver"
    assert "NCCL_LATER" not in rows[kids["forkserver2"]]["exec_env"]
    titled = rows[kids["titled"]]
    assert titled["exec_env_source"] == "empty" and titled["exec_env_stale"] == "clobbered"
    # /proc cannot show what a fork child or a clobbered block holds: stated, never checked; a forkserver
    # child's block is the server's, which is what it runs with: no blind spot
    stale = {pid for f in res.findings if f.code == "EXEC_ENV_STALE" for pid in f.pids}
    assert kids["fork"] in stale and kids["titled"] in stale
    assert kids["forkserver"] not in stale and kids["forkserver2"] not in stale
    curated = rows[kids["curated"]]
    assert curated["exec_env"] == {"NCCL_ALGO": "Tree"}
    missing = [f for f in res.findings if f.code == "ENV_MISSING" and "NCCL_PROTO" in f.evidence.get("vars", {})]
    assert missing and kids["curated"] in missing[0].pids and missing[0].severity == "warning"


def test_live_real_libnccl_through_ctypes(tmp_path):
    try:
        import nvidia.nccl
    except ImportError:
        pytest.skip("nvidia-nccl-cu12 not installed")
    lib = next(p for b in nvidia.nccl.__path__ for p in [os.path.join(b, "lib", "libnccl.so.2")] if os.path.exists(p))
    code = f"import ctypes, sys, time; ctypes.CDLL({lib!r}); print('ok', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ok"
        res = inspect_processes([p.pid], gpu_lookup=NO_NVML)
        (row,) = res.data["processes"]
        (libinfo,) = row["nccl_libs"]
        from ncclprobe.witnesses import elf
        assert libinfo["path"] == lib and libinfo["version_source"] == "rodata"
        assert libinfo["version"] == elf.scan(lib).version and libinfo["kind"] == "shared"
        assert libinfo["reached_by"].startswith("dlopen")  # ctypes: no object imports nccl symbols
        assert row["in_scope"] is True
    finally:
        p.kill()
        p.wait()


# -- CLI ---------------------------------------------------------------------------------------
NCCLPROBE = [sys.executable, "-m", "ncclprobe"]


def cli(*args):
    return subprocess.run([*NCCLPROBE, *args], capture_output=True, text=True, timeout=120)


def test_cli_nonexistent_pid_exits_3():
    r = cli("inspect", "999999999")
    assert r.returncode == 3 and "no such process" in r.stderr
    r = cli("inspect", "999999999", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["reason"] == "no_such_process"


def test_cli_malformed_expect_exits_2():
    r = cli("inspect", str(os.getpid()), "--expect", "NCCL_PROTO")
    assert r.returncode == 2


def test_cli_json_schema_and_secrets(live):
    root, kids = live
    r = cli("inspect", str(root), "--json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"] == "ncclprobe/2" and doc["command"] == "inspect"
    for row in doc["processes"]:
        assert {"pid", "ppid", "argv", "exec_env_source", "exec_env", "nccl_libs", "gpus"} <= set(row)
        assert row["exec_env_source"] in ("exec", "unreadable", "empty")
    for f in doc["findings"]:
        assert {"code", "severity", "message", "pids", "var", "evidence", "hint"} <= set(f)
    assert "MY_SECRET_TOKEN" not in r.stdout and "hunter2-planted" not in r.stdout and "zz9" not in r.stdout
    text = cli("inspect", str(root))
    assert "hunter2-planted" not in text.stdout and "MY_SECRET_TOKEN" not in text.stdout
    allv = cli("inspect", str(root), "--all-vars", "--json")
    assert "MY_SECRET_TOKEN" in allv.stdout and "hunter2-planted" not in allv.stdout and "zz9" in allv.stdout
    raw = cli("inspect", str(root), "--all-vars", "--no-redact", "--json")
    assert "hunter2-planted" in raw.stdout


def test_cli_pgrep(live):
    root, kids = live
    r = cli("inspect", "--pgrep", "tree\\.py", "--json")
    doc = json.loads(r.stdout)
    assert root in doc["roots"]


@pytest.mark.skipif(not shutil.which("ncclprobe"), reason="console script not installed")
def test_console_script_runs():
    r = subprocess.run(["ncclprobe", "inspect", str(os.getpid()), "--json"], capture_output=True, text=True)
    assert r.returncode in (0, 1) and json.loads(r.stdout)["processes"][0]["pid"] == os.getpid()
