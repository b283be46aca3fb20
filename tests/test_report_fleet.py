"""A fleet's report (benchmarks/fleetgen.py: one job of 32 hosts × 8 ranks with planted causes, 32
replicas of the demo's job, rewritten from the kept demo run): one finding per planted cause naming
exactly its hosts, what every host shares said once, the answer first within a line budget."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ncclprobe import render
from ncclprobe.commands import report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import fleetgen  # noqa: E402

HOSTS = 32


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("job")
    return fleetgen.job(out, HOSTS), fleetgen.planted(HOSTS)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    return fleetgen.replicas(tmp_path_factory.mktemp("replicas"), HOSTS)


def _by_code(result, code):
    return [f for f in result.findings if f.code == code]


def test_each_planted_cause_is_one_finding_naming_its_hosts(job):
    dirs, plant = job
    result = report.build_report(dirs)
    divergent = _by_code(result, "COMM_RANKS_DIVERGENT")
    odd_hosts = sorted(h for h, _ in plant["odd"])
    by_hosts = {tuple(f.evidence["odd_hosts"]): f for f in divergent}
    assert set(by_hosts) == {tuple(odd_hosts), (plant["drop_host"],)}
    assert by_hosts[tuple(odd_hosts)].evidence["odd_ranks"] == sorted(r for _, r in plant["odd"])
    assert by_hosts[(plant["drop_host"],)].evidence["odd_ranks"] == list(range(
        int(plant["drop_host"][4:]) * 8, int(plant["drop_host"][4:]) * 8 + 8))
    missing = [f for f in _by_code(result, "ENV_MISSING") if f.hosts == [plant["drop_host"]]]
    assert len(missing) == 1 and missing[0].all_vars == ("NCCL_PROTO",)
    changed = _by_code(result, "ENV_CHANGED")
    assert [f.hosts for f in changed] == [odd_hosts]
    # the demo's own cause, on every host alike, is one finding
    alike = [f for f in _by_code(result, "ENV_MISSING") if len(f.hosts) == HOSTS]
    assert len(alike) == 1 and alike[0].evidence["fleet"]["hosts"] == HOSTS
    assert alike[0].message.startswith(f"on {HOSTS} hosts alike")


def test_replicas_fold_to_the_findings_of_one_copy(replicas):
    one = report.build_report([str(ROOT / "tests" / "data" / "demo-run")])
    many = report.build_report(replicas)
    assert sorted(f.code for f in many.findings) == sorted(f.code for f in one.findings)
    assert all(len(f.hosts) == HOSTS for f in many.findings)


def test_answer_first_within_the_line_budget(job):
    dirs, _ = job
    result = report.build_report(dirs)
    out = io.StringIO()
    render.render_text(result, out, width=100, color=False)
    lines = out.getvalue().splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("Verdict:"))
    end = next(i for i, line in enumerate(lines) if line.startswith("Each finding's evidence"))
    assert verdict < 8 and end - verdict <= 60, (verdict, end)  # the answer first, within 60 lines
    assert "--details" in "".join(lines[end:]) and len(lines) - end <= 2
    detailed = report.build_report(dirs, details=True)
    out = io.StringIO()
    render.render_text(detailed, out, width=100, color=False)
    assert "Communicators" in out.getvalue() and len(out.getvalue().splitlines()) > len(lines)


def test_json_keeps_everything_and_the_fleet_key(job):
    dirs, plant = job
    proc = subprocess.run([sys.executable, "-m", "ncclprobe", "report", "--json", *map(str, dirs)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(proc.stdout)
    from ncclprobe import schemas
    schemas.validate(doc)
    assert doc["fleet"]["hosts"] == HOSTS
    assert len(doc["processes"]) == HOSTS * 12
    alike = [f for f in doc["findings"] if f["evidence"].get("fleet")]
    assert alike and all(len(f["evidence"]["fleet"]["merged"]) >= 0 for f in alike)
    assert any(f["hosts"] == [plant["drop_host"]] and f["code"] == "ENV_MISSING" for f in doc["findings"])


def test_a_terminal_ends_with_the_answer_and_the_exit_status(job):
    """In a real terminal (a pty), the last line is the one-line answer and the exit status; piped, not."""
    import pty
    dirs, _ = job
    argv = [sys.executable, "-m", "ncclprobe", "report", *map(str, dirs[:4])]
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["COLUMNS"] = "100"
        os.execv(sys.executable, argv)
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    last = [line for line in text.splitlines() if line.strip()][-1]
    code = os.waitstatus_to_exitcode(status)
    assert code == 1
    want = render.answer_line(report.build_report(list(map(str, dirs[:4]))), 1)
    assert want.startswith("Answer: 8 causes (4 errors, 4 warnings)")
    assert re.sub(r"\x1b\[[0-9;]*m", "", last).strip() == want
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert piped.returncode == 1 and "Answer:" not in piped.stdout


def test_fold_keeps_what_differs_in_kind():
    """Only the same cause on other hosts folds: another value stays its own finding, and so do two
    findings of one host."""
    from ncclprobe.diagnose import fleet
    from ncclprobe.diagnose.findings import Finding, at

    def f(host, pid, value):
        return Finding("ENV_MISSING", "warning", f"1 process(es) ({pid}): NCCL_PROTO absent ('{value}' upstream)",
                       pids=(pid,), var="NCCL_PROTO", instances=(at(host, pid),))
    folded = fleet.fold([f("a", 10, "LL"), f("b", 20, "LL"), f("c", 30, "LL"), f("d", 40, "Simple")])
    assert [(x.hosts, x.evidence.get("fleet", {}).get("hosts")) for x in folded] == [(["a", "b", "c"], 3), (["d"], None)]
    assert folded[0].message.startswith("on 3 hosts alike, as on a: 1 process(es) (10)")
    same_host = fleet.fold([f("a", 10, "LL"), f("a", 11, "LL")])
    assert len(same_host) == 2
