"""What the boot probe writes is bounded (issue 21, the shared log-bounding policy): no line longer
than NCCLPROBE_MAX_LINE (a shortened record stays valid JSON and says so), at most NCCLPROBE_MAX_BYTES
per process file (then one `log_budget` line), at most NCCLPROBE_MAX_FILES files per host in a directory
(counted in `<host>.files`; the first one past it holds one `log_budget` line), and a variable written
over and over is counted rather than logged line by line. Real interpreters, small limits set here."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ncclprobe.commands.inject import ephemeral_env
from ncclprobe.witnesses.events import read_dirs
from boot_support import PYTHON, clean_env

HOST = os.uname().nodename.replace("/", "_")


def wired(tmp_path: Path, **limits: int) -> dict[str, str]:
    env = clean_env()
    env.update(ephemeral_env(env, tmp_path / "log", None))
    env.update({f"NCCLPROBE_{k.upper()}": str(v) for k, v in limits.items()})
    return env


def run(env, *args, timeout=120) -> subprocess.CompletedProcess:
    res = subprocess.run([PYTHON, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-2000:]
    return res


def raw_lines(log: Path) -> list[bytes]:
    return [line for p in sorted(log.glob("*.jsonl")) for line in p.read_bytes().splitlines()]


def events(log: Path, kind: str) -> list[dict]:
    """The reader's events of one kind; nothing skipped but log_budget lines (a kind it may not know)."""
    read = read_dirs([log])
    assert not read.skipped and set(read.unknown) <= {"log_budget"}, (read.skipped, read.unknown)
    return [e for e in read.events if e["ev"] == kind]


def starts_by_pid(log: Path) -> dict[int, dict]:
    return {e["pid"]: e for e in events(log, "process_start")}


def budget_lines(log: Path) -> list[dict]:
    """log_budget records (the reader does not know the kind yet: read raw)."""
    return [json.loads(line) for line in raw_lines(log) if b'"ev":"log_budget"' in line]


# ---------------------------------------------------------------------------- the line cap

def test_a_huge_command_line_gives_a_start_record_that_stays_readable(tmp_path):
    """1.6 MB of arguments (readers skip lines over 1 MiB as torn): the default cap keeps it whole."""
    args = [f"{i:04d}-" + "a" * 3995 for i in range(400)]
    log = tmp_path / "log"
    out = run(wired(tmp_path), "-c", "import os; print(os.getpid())", *args)
    start = starts_by_pid(log)[int(out.stdout)]  # events() fails on a skipped line
    assert max(map(len, raw_lines(log))) <= 65536 and start["argv"]
    raw = json.loads(raw_lines(log)[0])
    kept = raw["argv"][3:]
    # what was not kept is said, never silently gone: the record cut to fit ("truncated", argv_dropped), or
    # the elements past what redaction reads of a long command line shown as "<not scanned: N chars>"
    unscanned = [a for a in kept if a.startswith("<not scanned:")]
    assert raw.get("truncated") is True or unscanned
    assert len(kept) + raw.get("argv_dropped", 0) == 400
    whole = [a for a in kept if a not in unscanned]
    assert 0 < len(whole) < 400 and [a[:5] for a in whole] == [f"{i:04d}-" for i in range(len(whole))]


def test_every_line_kind_stays_under_a_small_cap(tmp_path):
    """A start record with many long elements, a long watched value, a huge variable name."""
    limit = 4096
    code = ("import os; os.environ['NCCL_SOCKET_IFNAME'] = 'eth' + 'x' * 20000; "
            "os.environ['NCCL_' + 'N' * 9000] = 'v'; print(os.getpid())")
    env = wired(tmp_path, max_line=limit)
    env["NCCL_DEBUG_SUBSYS"] = "\u00e9" * 3000  # escapes make the JSON longer than the text
    out = run(env, "-c", code, *["--opt=" + "b" * 1000] * 30)
    lines = raw_lines(tmp_path / "log")
    assert [json.loads(line)["ev"] for line in lines] == ["process_start", "env_write", "env_write"]
    assert all(len(line) <= limit for line in lines), [len(line) for line in lines]
    start, long_value, long_name = map(json.loads, lines)
    assert all(rec["truncated"] is True and rec["pid"] == int(out.stdout) for rec in (start, long_value, long_name))
    assert start["argv_dropped"] > 0 and start["env"]["NCCL_DEBUG_SUBSYS"].startswith("\u00e9" * 10)
    assert long_value["var"] == "NCCL_SOCKET_IFNAME" and long_value["new"].startswith("ethxxx")
    assert long_name["var"].startswith("NCCL_NNN") and long_name["new"] == "v"


def test_short_lines_are_not_marked(tmp_path):
    run(wired(tmp_path, max_line=4096), "-c", "import os; os.environ['NCCL_PROTO'] = 'LL'")
    assert not [line for line in raw_lines(tmp_path / "log") if b"truncated" in line]


# ---------------------------------------------------------------------------- the byte budget

BYTES_HOST = """\
import os
for i in range(1000):  # one variable: a fork child's start record stays short
    os.environ["NCCL_TEST"] = "%d-" % i + "x" * 100
pid = os.fork()  # a fork child has its own file and its own budget
if pid == 0:
    os.environ["NCCL_CHILD"] = "1"
    os._exit(0)
os.waitpid(pid, 0)
print(os.getpid(), pid)
"""


def test_a_process_writes_at_most_its_byte_budget_then_one_log_budget_line(tmp_path):
    limit = 20000
    log = tmp_path / "log"
    parent, child = map(int, run(wired(tmp_path, max_bytes=limit), "-c", BYTES_HOST).stdout.split())
    mine = log / f"{HOST}-{parent}.jsonl"
    assert limit - 1024 - 512 <= mine.stat().st_size <= limit  # up to the line that would cross limit - 1 KiB
    lines = mine.read_bytes().splitlines()
    last = json.loads(lines[-1])
    assert last["ev"] == "log_budget" and (last["reached"], last["limit"], last["pid"]) == ("bytes", limit, parent)
    assert len(budget_lines(log)) == 1 and len(lines) < 1000
    assert [w["var"] for w in events(log, "env_write") if w["pid"] == child] == ["NCCL_CHILD"]


# ---------------------------------------------------------------------------- the file budget

FORKS_HOST = """\
import os, sys
for i in range(int(sys.argv[1])):  # a fork-per-request server
    pid = os.fork()
    if pid == 0:
        os.environ["NCCL_REQUEST"] = str(i)
        os._exit(0)
    os.waitpid(pid, 0)
print(os.getpid())
"""


def test_fork_per_request_host_makes_at_most_the_file_budget(tmp_path):
    limit, forks = 50, 200
    log = tmp_path / "log"
    run(wired(tmp_path, max_files=limit), "-c", FORKS_HOST, forks, timeout=300)
    files = list(log.glob("*.jsonl"))
    assert len(files) == limit + 1  # the parent, 49 children, and one that says the budget is reached
    (budget,) = budget_lines(log)
    assert (budget["reached"], budget["limit"]) == ("files", limit)
    (last,) = [f for f in files if f.read_bytes().count(b"\n") == 1 and b"log_budget" in f.read_bytes()]
    assert last.name == f"{HOST}-{budget['pid']}.jsonl"
    counter = log / f"{HOST}.files"
    assert counter.stat().st_size == limit + 1 and oct(counter.stat().st_mode & 0o777) == "0o600"
    assert len(starts_by_pid(log)) == limit


def test_a_planted_counter_means_no_new_files(tmp_path):
    """A counter that is not a private regular file of ours counts as a budget reached."""
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    counter = log / f"{HOST}.files"
    counter.write_bytes(b"")
    counter.chmod(0o644)
    run(wired(tmp_path), "-c", "import os; os.environ['NCCL_PROTO'] = 'LL'")
    assert list(log.glob("*.jsonl")) == [] and counter.read_bytes() == b""


# ---------------------------------------------------------------------------- a variable written over and over

def test_a_variable_written_over_and_over_is_counted_not_logged_line_by_line(tmp_path):
    """A scheduler setting CUDA_VISIBLE_DEVICES per task: the first 1000 writes of a variable are logged,
    then only its 1024th, 2048th, 4096th, ... write, each with how many were not logged before it."""
    code = ("import os\nfor i in range(5000):\n    os.environ['CUDA_VISIBLE_DEVICES'] = str(i)\n"
            "os.environ['NCCL_PROTO'] = 'LL'")
    run(wired(tmp_path), "-c", code)
    writes = events(tmp_path / "log", "env_write")
    assert len([w for w in writes if w["var"] == "CUDA_VISIBLE_DEVICES"]) == 1000 + 3
    assert writes[-1]["var"] == "NCCL_PROTO"  # other variables are still logged
    raw = [json.loads(line) for line in raw_lines(tmp_path / "log") if b'"CUDA_VISIBLE_DEVICES"' in line]
    assert [r["new"] for r in raw[:1000]] == [str(i) for i in range(1000)]
    assert raw[999]["coalescing"] is True and not [r for r in raw[:999] if "coalescing" in r or "repeats" in r]
    assert [(r["new"], r["repeats"]) for r in raw[1000:]] == [("1023", 23), ("2047", 1023), ("4095", 2047)]
