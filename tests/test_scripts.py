"""Scripts read as scripts: real bash scripts under a real `ncclprobe run` (the kernel's process events
and the scan alone) and `ncclprobe inspect`, each way a script loses a variable on its way to the worker
(`env -i`, `env -u`, `exec env -i`, sudo, `su -`, an unexported assignment, a prefix of another command),
named at the script's line (FILE:LINE in the hint), by an absolute path, a relative one, from another
working directory, and after the script changed directory (bash's fd 255).

Each worker waits for a release file (polled, bounded); the test releases it once run's log directory
holds the watch's record of that worker, so what is checked is the script reading, not the watch's luck
with a short-lived process.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ncclprobe.commands.inspection import inspect_processes

PY = sys.executable
NCCLPROBE = [PY, "-m", "ncclprobe"]
WAIT_S = 60.0  # a bound on polled conditions, reached only when something is wrong
WORKER = ("import os, sys, time\n"
          "end = time.monotonic() + 60\n"
          "while not os.path.exists(sys.argv[1]) and time.monotonic() < end:\n"
          "    time.sleep(0.01)\n")
KERNEL = pytest.mark.parametrize("kernel", ["1", "0"], ids=["kernel", "scan"])


@pytest.fixture
def job(tmp_path):
    """(tmp, write(rel, text) -> path): a scratch directory with the worker (w.py) in it."""
    (tmp_path / "w.py").write_text(WORKER)

    def write(rel: str, text: str) -> Path:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        return path
    return tmp_path, write


def _seen(logdir: Path, word: str) -> bool:
    for f in logdir.glob("*.jsonl"):
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if any('"proc_seen"' in line and word in line for line in text.splitlines()):
            return True
    return False


def run(tmp: Path, argv: list[str], cwd: Path, kernel: str = "1", expect: str = "NCCL_PROTO=LL") -> dict:
    """`ncclprobe run --json --expect … -- argv` from cwd, the workers released once the watch saw one."""
    logdir, release = tmp / "logs", tmp / "release"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(RELEASE=str(release), NCCLPROBE_WATCH_KERNEL=kernel)
    p = subprocess.Popen([*NCCLPROBE, "run", "--json", "--dir", str(logdir), "--expect", expect, "--", *argv],
                         cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        end = time.monotonic() + WAIT_S
        while not _seen(logdir, str(tmp / "w.py")) and p.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        release.touch()
        out, err = p.communicate(timeout=WAIT_S)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert out, err
    return json.loads(out)


def errors(d: dict) -> list[dict]:
    return [f for f in d["findings"] if f["severity"] == "error" and "NCCL_PROTO" in (f.get("vars") or [f.get("var")])]


def one_error(d: dict) -> dict:
    found = errors(d)
    assert len(found) == 1, [(f["code"], f["message"]) for f in d["findings"]]
    return found[0]


def worker(tmp: Path) -> str:
    return f"{shlex.quote(PY)} {shlex.quote(str(tmp / 'w.py'))} \"$RELEASE\""


# ------------------------------------------------------------------ wrappers that filter the environment
@KERNEL
def test_env_i_after_export_is_named_with_its_line(job, kernel):
    tmp, write = job
    write("script.sh", "#!/bin/bash\n# the operator's value is exported, then dropped\n"
                       f"export NCCL_PROTO=LL; env -i PATH=\"$PATH\" {worker(tmp)}\n")
    f = one_error(run(tmp, ["bash", "script.sh"], tmp, kernel))
    assert f["code"] == "ENV_MISSING" and f["edge"]["kind"] == "curated_env", f
    assert f["edge"]["launcher"] == "env -i" and f["edge"]["where"] == "script.sh:3"
    assert f["hint"].startswith("script.sh:3: `env -i` starts the command with an empty environment"), f["hint"]
    assert "NCCL_PROTO=LL after `env -i`" in f["hint"]
    assert "in the environment that starts" not in f["hint"]
    assert "`env -i` (script.sh:3) started w.py with 1 variable (PATH)" in f["message"], f["message"]


def test_env_i_keeping_the_variable_is_healthy(job):
    tmp, write = job
    write("script.sh", f"#!/bin/bash\nexport NCCL_PROTO=LL\nenv -i PATH=\"$PATH\" NCCL_PROTO=LL {worker(tmp)}\n")
    assert errors(run(tmp, ["bash", "script.sh"], tmp)) == []


def test_env_u_is_named_with_its_line(job):
    tmp, write = job
    write("script.sh", f"#!/bin/bash\nexport NCCL_PROTO=LL\n\nenv -u NCCL_PROTO {worker(tmp)}\n")
    f = one_error(run(tmp, ["bash", "script.sh"], tmp))
    assert f["edge"]["launcher"] == "env -u" and f["edge"]["where"] == "script.sh:4", f
    assert f["hint"].startswith("script.sh:4: `env -u NCCL_PROTO` starts the command without NCCL_PROTO"), f["hint"]


@KERNEL
def test_exec_env_i_over_a_continued_line(job, kernel):
    """`exec env -i` replaces the shell: the pid that ran the script became the worker (no shell left)."""
    tmp, write = job
    write("script.sh", "#!/bin/bash\nexport NCCL_PROTO=LL\n# a comment: don't\nexec env -i \\\n"
                       f"    PATH=\"$PATH\" {worker(tmp)}\n")
    f = one_error(run(tmp, ["bash", "script.sh"], tmp, kernel))
    assert f["edge"]["launcher"] == "env -i" and f["edge"]["where"] == "script.sh:4", f
    assert f["hint"].startswith("script.sh:4: `env -i`"), f["hint"]


@pytest.mark.skipif(shutil.which("sudo") is None or os.geteuid() != 0, reason="needs sudo, run as root")
def test_sudo_is_named_with_its_line_and_preserve_env_is_healthy(job):
    tmp, write = job
    write("script.sh", f"#!/bin/bash\nexport NCCL_PROTO=LL\nsudo {worker(tmp)}\n")
    f = one_error(run(tmp, ["bash", "script.sh"], tmp))
    assert f["edge"]["launcher"] == "sudo" and f["edge"]["where"] == "script.sh:3", f
    assert f["hint"].startswith("script.sh:3: sudo resets the environment"), f["hint"]
    assert "--preserve-env=NCCL_PROTO" in f["hint"]
    write("script.sh", f"#!/bin/bash\nexport NCCL_PROTO=LL\nsudo --preserve-env=NCCL_PROTO {worker(tmp)}\n")
    shutil.rmtree(tmp / "logs")
    (tmp / "release").unlink()
    assert errors(run(tmp, ["bash", "script.sh"], tmp)) == []


@pytest.mark.skipif(shutil.which("su") is None or os.geteuid() != 0, reason="needs su, run as root")
def test_su_login_is_named_with_its_line(job):
    tmp, write = job
    # the script's shell expands $RELEASE inside the double quotes: su's login shell gets none of its variables.
    # `; true`: the login shell starts the worker as its child, not exec'ing into it (root's login profile may
    # start programs of its own, which would then be the worker's children, and it no endpoint)
    write("script.sh", f"#!/bin/bash\nexport NCCL_PROTO=LL\nsu - root -c \"{PY} {tmp / 'w.py'} $RELEASE; true\"\n")
    d = run(tmp, ["bash", "script.sh"], tmp)
    workers = {p["pid"] for p in d["processes"] if str(tmp / "w.py") in (p["argv"] or [])}
    (f,) = [f for f in errors(d) if workers & set(f["pids"])]  # (the profile's own programs may have theirs)
    assert f["edge"]["launcher"] == "su" and f["edge"]["where"] == "script.sh:3", f
    assert f["hint"].startswith("script.sh:3: `su -` (--login"), f["hint"]


# ------------------------------------------------------------------ assignments that never reach the worker
@KERNEL
@pytest.mark.parametrize("how", ["relative", "absolute", "other_cwd"])
def test_unexported_assignment_by_any_path(job, kernel, how):
    """examples/bash_prefix/fail_unexported.sh's shape: the script changes directory before the worker
    starts, so its relative path no longer resolves against the shell's cwd (fd 255, or the cwd the
    watch read at its exec)."""
    tmp, write = job
    script = write("sub/fail.sh", "#!/bin/bash\ncd \"${TMPDIR:-/tmp}\"\ncat <<'EOF' >/dev/null\n"
                                  "NCCL_PROTO=LL true   # a here-document, not a command\nEOF\nNCCL_PROTO=LL\n"
                                  f"{worker(tmp)}\n")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    argv, cwd = {"relative": (["bash", "sub/fail.sh"], tmp), "absolute": (["bash", str(script)], elsewhere),
                 "other_cwd": (["bash", "../sub/fail.sh"], elsewhere)}[how]
    f = one_error(run(tmp, argv, cwd, kernel))
    assert f["code"] == "SHELL_PREFIX_SCOPE" and f["edge"]["kind"] == "shell_prefix", f
    assert f["hint"] == "fail.sh:6: write `export NCCL_PROTO=LL` instead", f["hint"]


def test_prefix_of_another_command_in_a_wrapper_script_a_launcher_runs_by_relative_path(job):
    """examples/torchrun_wrapper's shape without torch: a Python launcher runs `sub/wrap.sh` (relative to
    its cwd), which execs the worker; the prefix went to `true` only."""
    tmp, write = job
    write("launch.py", "import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:]))\n")
    write("sub/wrap.sh", f"#!/bin/bash\nset -e\n\nNCCL_PROTO=LL true; exec {worker(tmp)}\n")
    f = one_error(run(tmp, [PY, "launch.py", "sub/wrap.sh"], tmp))
    assert f["code"] == "SHELL_PREFIX_SCOPE", f
    assert f["hint"].startswith("wrap.sh:4: export it for the whole script"), f["hint"]


# ------------------------------------------------------------------ inspect
def test_inspect_names_env_i_at_its_line_from_a_relative_script_that_changed_directory(job):
    tmp, write = job
    write("sub/run.sh", "#!/bin/bash\ncd /\nexport NCCL_PROTO=LL\n"
                        f"env -i PATH=\"$PATH\" {shlex.quote(PY)} -c \"print('up', flush=True); "
                        "import time; time.sleep(60)\"\necho stopped\n")
    sh = subprocess.Popen(["bash", "sub/run.sh"], cwd=tmp, env={"PATH": "/usr/bin:/bin"}, stdout=subprocess.PIPE,
                          text=True, start_new_session=True)
    try:
        assert sh.stdout.readline() == "up\n"
        res = inspect_processes([sh.pid], expect={"NCCL_PROTO": "LL"}, scope="all", gpu_lookup=lambda: ({}, "test"))
        found = [f for f in res.findings if f.severity == "error" and f.var == "NCCL_PROTO"]
        assert len(found) == 1, [(f.code, f.message) for f in res.findings]
        assert found[0].edge["launcher"] == "env -i" and found[0].edge["where"] == "run.sh:4", found[0].edge
        assert found[0].hint.startswith("run.sh:4: `env -i`"), found[0].hint
    finally:
        os.killpg(sh.pid, signal.SIGKILL)
        sh.wait()


# ------------------------------------------------------------------ the examples, as their READMEs give them
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def typed(argv: list[str], cwd: Path, exported: bool = False) -> dict:
    """`ncclprobe run --json --expect NCCL_PROTO=LL -- argv` from cwd, as typed (no --hold); python3 as an
    activated virtual environment gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env["PATH"] = f"{Path(PY).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    if exported:
        env["NCCL_PROTO"] = "LL"
    p = subprocess.run([*NCCLPROBE, "run", "--json", "--expect", "NCCL_PROTO=LL", "--", *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.stdout, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("argv,cwd", [(["bash", "bash_prefix/fail_unexported.sh"], "examples"),
                                      (["bash", "examples/bash_prefix/fail_unexported.sh"], "."),
                                      (["bash", "examples/bash_prefix/fail_prefix.sh"], ".")],
                         ids=["from-examples", "from-root", "prefix"])
def test_bash_prefix_examples_as_typed(argv, cwd):
    f = one_error(typed(argv, EXAMPLES.parent / cwd))
    assert f["code"] == "SHELL_PREFIX_SCOPE" and f["edge"]["kind"] == "shell_prefix", f
    assert f["hint"].startswith(f"{os.path.basename(argv[-1])}:"), f["hint"]


def test_env_i_example_as_typed():
    f = one_error(typed(["bash", "examples/env_i/fail.sh"], EXAMPLES.parent, exported=True))
    assert f["edge"]["kind"] == "curated_env" and f["edge"]["launcher"] == "env -i", f
    assert f["hint"].startswith("fail.sh:5: `env -i`"), f["hint"]


@pytest.mark.slow
def test_torchrun_wrapper_example_by_relative_path_as_typed():
    pytest.importorskip("torch")
    d = typed(["torchrun", "--standalone", "--nproc-per-node", "2", "--no-python", "examples/torchrun_wrapper/fail.sh"],
              EXAMPLES.parent)
    f = one_error(d)
    assert f["code"] == "SHELL_PREFIX_SCOPE" and len(f["pids"]) == 2, f
    assert f["hint"].startswith("fail.sh:5: export it for the whole script"), f["hint"]
