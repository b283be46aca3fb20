"""The native edge witness (issue 23 item 1): libncclprobe.so writes one `spawn` line where a probed native
process execs or spawns, on real processes (tests/c/spawn_driver.c): every exec variant and posix_spawn*,
fork + exec, vfork + exec, from many threads at once, a failed exec, a 200k-variable environment; with the
watched part of the environment actually passed, argv redacted, and what the call gives back unchanged."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "c"))
import probe_support as ps  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GIVEN = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}  # the watched part of the driver's own envp (+ NCCLPROBE_DIR)
ENV_GIVEN = ("execve", "execvpe", "execle", "fexecve", "execveat", "posix_spawn", "posix_spawnp")
INHERITED = ("execv", "execvp", "execl", "execlp")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe_spawn")
    return {"lib": ps.build_probe(d), "driver": ps.cc(d / "spawn_driver", [ps.HERE / "spawn_driver.c"], "-lpthread")}


def logdir(tmp_path: Path) -> Path:
    tmp_path.mkdir(exist_ok=True)
    d = tmp_path / "log"
    d.mkdir(mode=0o700)
    return d


def spawns(log_dir: Path) -> list[dict]:
    log = ps.read(log_dir)
    lines = ps.of_kind(log, "spawn")
    assert not log.skipped_total and not log.dropped
    return lines


def drive(built, tmp_path, *args, preload=True, **extra):
    log = logdir(tmp_path)
    env = ps.probe_env(log, built["lib"] if preload else None, NCCL_PROTO="Simple", UNWATCHED_SECRET="s3cr3t", **extra)
    r = ps.run([built["driver"], *args], env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r, log


@pytest.mark.parametrize("variant", ENV_GIVEN + INHERITED)
def test_each_variant_writes_one_line_with_the_passed_environment(built, tmp_path, variant):
    r, log = drive(built, tmp_path, variant)
    base, _ = drive(built, tmp_path / "base", variant, preload=False)
    (line,) = spawns(log)
    assert line["call"] == variant and line["src"] == "preload" and line["where"] is None
    assert line["argv"] == [str(built["driver"]), "print", "<redacted>", "<redacted>"]  # --api-key hunter2
    assert line["exec"] is (not variant.startswith("posix_spawn"))
    assert line["env_given"] is (variant in ENV_GIVEN)
    assert line["exe"] == str(built["driver"])
    assert "rc" not in line
    if variant in ENV_GIVEN:
        assert line["env"] == {**GIVEN, "NCCLPROBE_DIR": str(log)}
        assert line["env_count"] == 5
    else:
        assert line["env"] == {"NCCL_PROTO": "Simple", "NCCLPROBE_DIR": str(log), "LD_PRELOAD": str(built["lib"])}
    text = (log / next(p.name for p in log.iterdir() if p.suffix == ".jsonl")).read_text()
    assert "s3cr3t" not in text and "zzz" not in text and "hunter2" not in text and "HOME" not in text
    # the child's environment and what the call gave back: byte-identical to a run without the probe
    if variant.startswith("posix_spawn"):
        assert line["child"] == int(r.stdout.rsplit("child=", 1)[1])
        assert line["pid"] != line["child"]
    else:
        assert line["child"] is None
    strip = (lambda out: out.replace(str(log), "LOG").replace(str(tmp_path / "base" / "log"), "LOG")
             .replace(f"LD_PRELOAD={built['lib']}\0", "").split("child=")[0])
    assert strip(r.stdout) == strip(base.stdout)


@pytest.mark.parametrize("how", ["fork_exec", "vfork_exec"])
def test_a_fork_or_vfork_child_writes_its_exec_itself(built, tmp_path, how):
    r, log = drive(built, tmp_path, how)
    (line,) = spawns(log)
    child = int(r.stdout.rsplit("child=", 1)[1])
    assert line["pid"] == child and line["call"] == "execve" and line["env"] == {**GIVEN, "NCCLPROBE_DIR": str(log)}
    assert line["ppid"] != child
    assert (log / f"{__import__('socket').gethostname()}-{child}.jsonl").exists()
    assert r.stdout.split("child=")[0] == f"NCCL_PROTO=LL\0HOME=/nowhere\0SECRET_TOKEN=zzz\0NCCL_ALGO=Ring\0NCCLPROBE_DIR={log}\0"


def test_a_failed_exec_says_its_errno_and_the_call_gives_back_the_same(built, tmp_path):
    r, log = drive(built, tmp_path, "fail")
    base, _ = drive(built, tmp_path / "base", "fail", preload=False)
    assert r.stdout == base.stdout == "rc=-1 errno=2\nrc=2 errno=2 child=0\n"
    lines = spawns(log)
    ex = [e for e in lines if e["call"] == "execve"]
    sp = [e for e in lines if e["call"] == "posix_spawn"]
    # the exec: what was tried, then its failure (the exec does not come back when it works)
    assert [e.get("rc") for e in ex] == [None, 2] and ex[0]["argv"] == ["/nonexistent/prog"]
    assert len(sp) == 1 and sp[0]["rc"] == 2 and sp[0]["child"] is None


def test_many_threads_forking_and_execing_at_once(built, tmp_path):
    r, log = drive(built, tmp_path, "threads", "8", "6")
    lines = spawns(log)
    assert len(lines) == 48 and len({e["pid"] for e in lines}) == 48
    assert all(e["argv"] == [str(built["driver"]), "quiet"] and e["env_count"] == 5 for e in lines)


def test_a_huge_environment(built, tmp_path):
    r, log = drive(built, tmp_path, "bench", "3", "200000")
    lines = spawns(log)
    assert len(lines) == 3
    assert all(e["env_count"] == 200005 and e["env"] == {**GIVEN, "NCCLPROBE_DIR": str(log)} for e in lines)


def test_the_hints_are_the_boot_probes():
    """spawn.c's hint list (its argv redaction's trigger) is the boot probe's _ARGV_HINTS, in order."""
    src = (ROOT / "probes" / "ncclprobe" / "spawn.c").read_text()
    body = re.search(r"hints\[\] = \{(.*?)\};", src, re.S).group(1)
    c = [ast.literal_eval(s.replace("\\0", "\\x00")) for s in re.findall(r'"(?:[^"\\]|\\.)*"', body)]
    boot = ast.literal_eval(re.search(r"_ARGV_HINTS = (\(.*?\))\n", (ROOT / "probes" / "ncclprobe_boot.py").read_text(),
                                      re.S).group(1))
    assert tuple(c) == boot
    lens = [int(x) for x in re.search(r"hint_len\[\] = \{(.*?)\};", src, re.S).group(1).replace("\n", "").split(",")]
    assert lens == [len(h) for h in boot]


def test_the_quick_filter_passes_every_watched_name(built):
    """spawn.c skips an entry on its first two characters: every watched name and prefix starts with a pair it
    lets through."""
    src = (ROOT / "probes" / "ncclprobe" / "spawn.c").read_text()
    pairs = {a + b for a, b in re.findall(r"case '(\w)': return b == '(\w)';", src)}
    from ncclprobe.model import watched
    names = [*watched.WATCHED_PREFIXES, *watched.WATCHED_NAMES]
    assert names and all(n[:2] in pairs for n in names)


@pytest.mark.parametrize("how", ["fork_exec", "vfork_exec"])
def test_run_names_what_a_native_child_was_execed_with(built, tmp_path, how):
    """End to end: `ncclprobe run` with the library it builds; the driver's child is exec'd with NCCL_PROTO=LL
    against an expected Simple, and lives a few milliseconds."""
    import json
    import subprocess
    env = ps.probe_env(None, NCCL_PROTO="Simple")
    r = subprocess.run([sys.executable, "-m", "ncclprobe", "run", "--json", "--dir", str(tmp_path / "run"),
                        "--expect", "NCCL_PROTO=Simple", "--", str(built["driver"]), how],
                       env=env, capture_output=True, text=True, timeout=120)
    child = int(r.stderr.rsplit("child=", 1)[1]) if "child=" in r.stderr else int(r.stdout.rsplit("child=", 1)[1])
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout[:r.stdout.rindex("}") + 1] if r.stdout.lstrip().startswith("{") else r.stdout)
    assert any(f["code"] == "ENV_CHANGED" and child in f["pids"] for f in out["findings"])
    lines = [json.loads(x) for p in (tmp_path / "run").glob("*.jsonl") for x in p.read_text().splitlines()]
    assert [e["pid"] for e in lines if e["ev"] == "spawn"] == [child]


def test_a_python_interpreter_leaves_its_edges_to_the_boot_probe(built, tmp_path):
    """A Python process (Py_IsInitialized defined) writes no native spawn line: the boot probe records its
    edges with file:line, and one exec would otherwise stand twice."""
    log = logdir(tmp_path)
    r = ps.run([sys.executable, "-S", "-c", "import os, subprocess; subprocess.run(['/bin/true']); "
                "os.execv('/bin/true', ['true'])"], ps.probe_env(log, built["lib"]))
    assert r.returncode == 0, r.stderr
    assert spawns(log) == []
