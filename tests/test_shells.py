"""The shell-prefix pitfall: parsing, and live `bash -c` trees."""
import os
import shlex
import signal
import subprocess
import sys

import pytest

from ncclprobe.witnesses import shells
from ncclprobe.commands.inspection import inspect_processes
from ncclprobe.model.launchers import FILTERS
from ncclprobe.model.watched import is_watched


def kinds(script, child, env=None):
    return [(p.var, p.kind) for p in shells.pitfalls(script, child, is_watched, env)]


def test_split_lists_and_redirections():
    cmds = shells.split_script("A=1 cd /srv && python s.py 2>&1 | tee log || echo x; sleep 1 &\nnohup env B=2 foo")
    assert [c.words[0] for c in cmds] == ["cd", "python", "tee", "echo", "sleep", "foo"]
    assert cmds[0].assignments == (("A", "1"),) and cmds[1].words == ("python", "s.py")
    assert cmds[-1].assignments == (("B", "2"),)


def test_prefix_on_another_command():
    script = "NCCL_PROTO=LL cd /srv && python server.py; echo stopped"
    assert kinds(script, ["python", "server.py"]) == [("NCCL_PROTO", "prefix")]


def test_prefix_on_the_command_itself_is_fine():
    assert kinds("cd /srv && NCCL_PROTO=LL python server.py; echo done", ["python", "server.py"]) == []
    assert kinds("NCCL_PROTO=LL nohup python server.py & wait", ["python", "server.py"]) == []


def test_unwatched_names_are_not_claimed():
    assert kinds("FOO=1 cd /srv && python server.py; true", ["python", "server.py"]) == []


def test_bare_assignment_is_unexported_only_when_the_shell_lacks_it():
    script = "NCCL_ALGO=Ring; python a.py; true"
    assert kinds(script, ["python", "a.py"], env={}) == [("NCCL_ALGO", "unexported")]
    assert kinds(script, ["python", "a.py"], env={"NCCL_ALGO": "Tree"}) == []  # inherited: exported
    assert kinds(script, ["python", "a.py"], env=None) == []  # unknown: claim nothing
    assert kinds("export NCCL_ALGO=Ring; python a.py; true", ["python", "a.py"], env={}) == []
    assert kinds("NCCL_ALGO=Ring; export NCCL_ALGO; python a.py", ["python", "a.py"], env={}) == []


def test_nothing_claimed_when_the_child_is_not_recognised():
    assert kinds("NCCL_PROTO=LL cd /srv && python server.py; echo", ["ruby", "x.rb"]) == []
    assert kinds("unbalanced 'quote", ["python"]) == []


def test_shell_script_detection():
    assert shells.shell_script(["bash", "-lc", "x"]) == "x"
    assert shells.shell_script(["-bash", "-c", "x"]) == "x"
    assert shells.shell_script(["/bin/sh", "-e", "-c", "y", "arg0"]) == "y"
    assert shells.shell_script(["python", "-c", "x"]) is None
    assert shells.shell_script(["bash", "run.sh", "-c"]) is None
    assert shells.script_file(["bash", "-e", "run.sh"]) == "run.sh"


# The worker says "up" once it runs: a child seen before then may still be the shell's fork, not yet
# exec'ed into the worker (seen under load: EXEC_ENV_STALE instead of SHELL_PREFIX_SCOPE).
WORKER = shlex.quote("import time; print('up', flush=True); time.sleep(30)")


def _inspect(pid):
    return inspect_processes([pid], scope="all", gpu_lookup=lambda: ({}, "test"))


@pytest.fixture
def shell_tree():
    procs = []

    def start(script):
        p = subprocess.Popen(["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        procs.append(p)
        assert p.stdout.readline() == "up\n"
        return p
    yield start
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)  # the shell and its worker
        p.wait()


def test_live_shell_prefix_pitfall(shell_tree, tmp_path):
    import psutil
    py = shlex.quote(sys.executable)
    sh = shell_tree(f"NCCL_PROTO=LL cd {tmp_path} && {py} -c {WORKER}; echo stopped")
    (child,) = psutil.Process(sh.pid).children()
    for target in (sh.pid, child.pid):  # from the shell, and from the worker (the shell is its ancestor)
        res = _inspect(target)
        found = [f for f in res.findings if f.code == "SHELL_PREFIX_SCOPE"]
        assert len(found) == 1, res.findings
        f = found[0]
        assert f.var == "NCCL_PROTO" and f.pids == (child.pid,) and f.severity == "warning"
        assert f.evidence["shell"] == sh.pid and f.evidence["assigned_in"].startswith("NCCL_PROTO=LL cd")
        proc = {p["pid"]: p for p in res.data["processes"]}[child.pid]
        assert "NCCL_PROTO" not in proc["exec_env"]


def test_live_exec_of_last_command_claims_nothing(shell_tree, tmp_path):
    py = shlex.quote(sys.executable)
    # bash 5 execs the last command of the list: once the worker is up, the shell's command line is gone
    sh = shell_tree(f"NCCL_PROTO=LL cd {tmp_path} && {py} -c {WORKER}")
    res = _inspect(sh.pid)
    assert res.data["processes"][0]["argv"][0] == sys.executable
    assert not [f for f in res.findings if f.code == "SHELL_PREFIX_SCOPE"]


@pytest.fixture
def script_tree():
    procs = []

    def start(argv, cwd):
        p = subprocess.Popen(argv, cwd=cwd, env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        procs.append(p)
        assert p.stdout.readline() == "up\n"
        return p
    yield start
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)  # the shell and its worker
        p.wait()


def test_live_relative_script_that_changed_directory_is_read_from_fd_255(script_tree, tmp_path):
    """`cd a && bash ./run.sh` where run.sh does `cd b`: ./run.sh against the shell's cwd now names b's
    run.sh (here a decoy that assigns nothing). bash reads its script on fd 255, which still names a's."""
    import psutil
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    py = shlex.quote(sys.executable)
    (tmp_path / "a" / "run.sh").write_text(f"cd {shlex.quote(str(tmp_path / 'b'))}\n"
                                          f"NCCL_PROTO=LL cd . && {py} -c {WORKER}; echo stopped\n")
    (tmp_path / "b" / "run.sh").write_text("echo a decoy: the path argv names, resolved against the cwd\n")
    sh = script_tree(["bash", "./run.sh"], tmp_path / "a")
    assert os.readlink(f"/proc/{sh.pid}/fd/255") == str(tmp_path / "a" / "run.sh")  # what bash really does
    assert os.readlink(f"/proc/{sh.pid}/cwd") == str(tmp_path / "b")
    (child,) = psutil.Process(sh.pid).children()
    for target in (sh.pid, child.pid):
        (f,) = [f for f in _inspect(target).findings if f.code == "SHELL_PREFIX_SCOPE"]
        assert f.var == "NCCL_PROTO" and f.pids == (child.pid,)
        assert f.evidence["shell"] == sh.pid and f.evidence["assigned_in"].startswith("NCCL_PROTO=LL cd")


def test_live_symlinked_script_falls_back_to_the_path_argv_names(script_tree, tmp_path):
    """fd 255 names the link's target, not the name argv gives: not taken as the script; the argv path,
    against the shell's cwd, still finds it."""
    py = shlex.quote(sys.executable)
    real = tmp_path / "real.sh"
    real.write_text(f"NCCL_ALGO=Ring cd . && {py} -c {WORKER}; echo stopped\n")
    (tmp_path / "link.sh").symlink_to(real)
    sh = script_tree(["bash", "link.sh"], tmp_path)
    assert os.readlink(f"/proc/{sh.pid}/fd/255") == str(real)
    (f,) = [f for f in _inspect(sh.pid).findings if f.code == "SHELL_PREFIX_SCOPE"]
    assert f.var == "NCCL_ALGO"


# ------------------------------------------------------------------ the lexer
def test_lexer_quotes_and_substitutions_are_one_word():
    (cmd,) = shells.split_script('here=$(cd "$(dirname "$0")" && pwd) python3 "$here/w.py" \'a b\' x\\ y `echo ;`')
    assert cmd.assignments == (("here", '$(cd "$(dirname "$0")" && pwd)'),)
    assert cmd.words == ("python3", "$here/w.py", "a b", "x y", "`echo ;`")
    (cmd,) = shells.split_script('echo "a \\"b\\" $(printf \')\') c" \'it\'"s"')
    assert cmd.words == ("echo", 'a "b" $(printf \')\') c', "its")


def test_lexer_lines_continuations_and_comments():
    script = ("#!/bin/bash\n# don't: a quote in a comment\nA=1 \\\n  true # trailing 'comment\n"
              "x=\"two\nlines\"; python3 w.py\n")
    cmds = shells.split_script(script)
    assert [(c.line, c.words) for c in cmds] == [(3, ("true",)), (5, ()), (6, ("python3", "w.py"))]
    assert cmds[1].assignments == (("x", "two\nlines"),)


def test_lexer_skips_here_documents():
    script = ("cat <<EOF >/dev/null\nNCCL_PROTO=LL true\n$(not a command)\nEOF\n"
              "cat <<-'END'\n\tenv -i python3 w.py\n\tEND\npython3 w.py\n")
    cmds = shells.split_script(script)
    assert [(c.line, c.words) for c in cmds] == [(1, ("cat",)), (5, ("cat",)), (8, ("python3", "w.py"))]
    assert kinds(script, ["python3", "w.py"]) == []


def test_lexer_lists_and_pipes():
    cmds = shells.split_script("a && b || c | d |& e; f & g ;; h\n(i); { j; }")
    assert [c.words[0] for c in cmds if c.words] == list("abcdefghij")  # (`}` alone: a keyword, no command)


def test_unbalanced_quotes_and_substitutions_claim_nothing():
    for script in ("echo 'x", 'echo "x', "echo $(x", "echo `x", "echo ${x"):
        with pytest.raises(ValueError):
            shells.split_script(script)
        assert kinds(script + "\npython3 w.py", ["python3", "w.py"]) == []


def filters(script, child):
    return [(p.kind, p.var, p.kept, p.line) for p in shells.pitfalls(script, child, is_watched, {})
            if p.kind in FILTERS]


def test_env_i_and_env_u_in_exec_and_nested_wrappers():
    child = ["python3", "w.py"]
    assert filters("export NCCL_PROTO=LL; env -i PATH=$PATH python3 w.py", child) == [("env -i", "*", ("PATH",), 1)]
    assert filters("true\nexec env -i \\\n  A=1 nice -n 5 env B=2 python3 w.py", child) == [
        ("env -i", "*", ("A", "B"), 2)]
    assert filters("exec env - python3 w.py", child) == [("env -i", "*", (), 1)]
    assert filters("nohup env --ignore-environment python3 w.py &", child) == [("env -i", "*", (), 1)]
    assert filters("env -u NCCL_PROTO -uNCCL_ALGO --unset=HOME python3 w.py", child) == [
        ("env -u", "NCCL_PROTO", (), 1), ("env -u", "NCCL_ALGO", (), 1)]  # HOME is not watched
    assert filters("env -u NCCL_PROTO NCCL_PROTO=LL python3 w.py", child) == []  # given back after
    assert filters("env A=1 python3 w.py; python3 other.py", child) == []
    # `bash -c` inside the script: its own string is another script, not this one's command
    assert filters("bash -c 'env -i python3 w.py'", child) == []


@pytest.mark.parametrize("argv, runs", [
    (["env"], []), (["env", "-i"], []), (["env", "-i", "A=1", "python3", "w.py"], ["python3", "w.py"]),
    (["env", "-u", "X"], []), (["env", "-C", "/tmp", "python3"], ["python3"]),
    (["env", "-S", "python3 -u", "w.py"], ["python3", "-u", "w.py"]), (["env", "-S", "'unclosed"], []),
    (["/usr/bin/env", "--", "python3"], ["python3"]), (["env", "--"], []),
    (["taskset", "0x3", "python3"], ["python3"]), (["taskset", "ff", "x"], ["x"]),
    (["taskset", "-c", "0-3", "python", "x"], ["python", "x"]), (["taskset", "-c", "0-3"], []),
    (["chrt", "10", "python3"], ["python3"]), (["chrt", "-r", "5", "python3", "y"], ["python3", "y"]),
    (["chrt", "-f", "10"], []), (["timeout", "10", "python3"], ["python3"]),
    (["numactl", "-m", "0", "python3"], ["python3"]), (["numactl", "--cpunodebind=0", "python3"], ["python3"]),
    (["nice", "-n", "5", "python3"], ["python3"]), (["nice"], []), (["ionice", "-c", "2", "-n", "0", "python3"], ["python3"]),
    (["stdbuf", "-oL", "python3", "a.py"], ["python3", "a.py"]), (["setsid", "python3"], ["python3"]),
])
def test_what_a_wrapper_runs_is_read_alike_from_a_script_and_from_an_exec(argv, runs):
    """A wrapper's mask, priority or duration is no program (`taskset 0x3 CMD` runs CMD, not 0x3), and `env -S`
    splits its string: one table (model/images) for a shell's line and for an exec's argv."""
    from ncclprobe.model.images import wraps_a_program
    assert shells.wrapped_command(argv) == runs
    assert wraps_a_program(argv) is bool(runs)


def test_sudo_and_su_filters(monkeypatch):
    monkeypatch.setattr(shells, "sudo_policy", lambda: (True, ()))  # sudo's default, whatever this host's sudoers say
    child = ["python3", "w.py"]
    assert filters("sudo -u bob python3 w.py", ["sudo", "-u", "bob", "python3", "w.py"]) == [("sudo", "*", (), 1)]
    assert filters("sudo --preserve-env=NCCL_PROTO,NCCL_ALGO python3 w.py", child) == [
        ("sudo", "*", ("NCCL_PROTO", "NCCL_ALGO"), 1)]
    assert filters("sudo -E python3 w.py", child) == []
    assert filters("sudo --preserve-env python3 w.py", child) == []
    assert filters("su - bob -c 'python3 w.py'", ["su", "-", "bob", "-c", "python3 w.py"]) == [
        ("su", "*", ("TERM",), 1)]
    assert filters("su --login -w NCCL_PROTO bob -c 'python3 w.py'", child) == [("su", "*", ("NCCL_PROTO", "TERM"), 1)]
    assert filters("su bob -c 'python3 w.py'", child) == []  # without --login su keeps the environment
    monkeypatch.setattr(shells, "sudo_policy", lambda: (True, ("NCCL_*",)))
    assert filters("sudo python3 w.py", child) == [("sudo", "*", ("NCCL_*",), 1)]
    monkeypatch.setattr(shells, "sudo_policy", lambda: (False, ()))  # Defaults !env_reset
    assert filters("sudo python3 w.py", child) == []


def test_a_command_leads_to_a_child_by_its_program():
    """`cd "$(dirname "$0")"` is no worker, however its expansion could match the worker's arguments."""
    script = 'here=$(cd "$(dirname "$0")" && pwd)\ncd "${TMPDIR:-/tmp}"\nNCCL_PROTO=LL\npython3 "$here/w.py" "$@"\n'
    pits = shells.pitfalls(script, ["python3", "/srv/w.py"], is_watched, {})
    assert [(p.var, p.kind, p.line) for p in pits] == [("NCCL_PROTO", "unexported", 3)]
    assert kinds("NCCL_PROTO=LL true; exec python w.py", ["python3.11", "w.py"]) == [("NCCL_PROTO", "prefix")]


def test_lexer_bounds_hostile_scripts():
    """A script is a target's input: deep nesting is refused (claims nothing), long input stays linear."""
    import time
    deep = 'echo "' + "$(" * 5000 + "x" + ")" * 5000 + '"\npython3 w.py'
    with pytest.raises(ValueError):
        shells.split_script(deep)
    assert kinds(deep, ["python3", "w.py"]) == []
    long = "NCCL_PROTO=LL true; " + "echo \"$(a 'b' `c`) ${d}\" \\\n" * 20000 + "\npython3 w.py\n"
    t0 = time.process_time()
    assert kinds(long, ["python3", "w.py"]) == [("NCCL_PROTO", "prefix")]
    assert time.process_time() - t0 < 5.0  # linear: ~0.3 s here; quadratic would take minutes


def test_sudoers_env_keep_and_env_reset(tmp_path):
    (tmp_path / "sudoers").write_text('Defaults\tenv_reset\n# Defaults env_keep += "NCCL_ALGO"\n'
                                      'Defaults:%sudo env_keep += "NCCL_PROTO LC_*"\nDefaults env_keep -= "LC_*"\n')
    d = tmp_path / "sudoers.d"
    d.mkdir()
    (d / "nccl").write_text('Defaults env_keep += "NCCL_IB_*"\n')
    (d / "ignored.bak").write_text("Defaults !env_reset\n")  # sudo skips names with a dot
    paths = (str(tmp_path / "sudoers"), str(d))
    assert shells.sudo_policy(paths) == (True, ("NCCL_PROTO", "NCCL_IB_*"))
    (d / "open").write_text("Defaults !env_reset\n")
    assert shells.sudo_policy((str(tmp_path / "sudoers"), str(d), "")) == (False, ("NCCL_PROTO", "NCCL_IB_*"))
    assert shells.sudo_policy((str(tmp_path / "missing"),)) == (True, ())
