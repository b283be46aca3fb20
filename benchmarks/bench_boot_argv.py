"""Start-up cost of the boot probe against the size and shape of the interpreter's own argv (issue 21):
`python -c pass ARGS...` in a venv with the persistent probe installed (and, for reference, with the
ephemeral wiring of `ncclprobe run`) against the same command in an identical venv without it.

Argvs: none; a tiny one holding a secret (the probe redacts it); about 2 MB (15 arguments of 128 KB,
what ARG_MAX allows) of adversarial shapes: a long run of scheme characters before an '@' (what made the
old URL-password regex quadratic: minutes), names, quotes and blanks as dense as they come (the most
places a rule starts at), and text with no hint of a secret at all (the probe's check for hints reads it
all). Runs alternate between the interpreters so that drift hits all alike; each is measured as wall
time and as the child's CPU time (user + system, from wait4). The verdict is the ratio of median wall
times per argv. Goal: the persistent probe <= 1.05x on every argv.

With --instructions (needs valgrind), each case also runs once under callgrind with a fixed hash seed: its
user-space instruction count is the same from run to run whatever the machine's load (the kernel's share,
copying the argv and creating the log file, is not counted).

    python benchmarks/bench_boot_argv.py [--runs 60] [--only TEXT] [--instructions] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ncclprobe.commands import inject  # the installed package (its boot probe is built at install)

GOAL = 1.05
ARG = 131000  # under MAX_ARG_STRLEN (128 KiB); 15 of them fit ARG_MAX (2 MiB) beside the environment


def _fill(unit: str, n: int = ARG) -> str:
    return (unit * (n // len(unit) + 1))[:n]


# A case named "... by a shell" starts python from /bin/sh (not exec'd: sh stays its parent), as most
# are started: the probe then records its parent, not Python, as well. Its wall time counts sh's own
# start on both sides; its instruction count is the interpreter's alone.
SHELL = " by a shell"
ARGVS = {
    "none": [],
    "none" + SHELL: [],
    "tiny, a secret": ["--model", "m", "--api-key", "sk-12345", "--db", "postgres://u:pw@db/x"],
    "2 MB, scheme run then @": [_fill("a")[:-1] + "@"] * 15,
    "2 MB, dense places": [_fill("key: 'KEY'] = \"x\" TOKEN=a:b@ ")] * 15,
    "2 MB, no hint": [_fill("abc def ")] * 15,
}


def _venv(path: Path) -> str:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return str(path / "bin" / "python")


def _command(python: str, argv: list[str], shell: bool) -> list[str]:
    """`python -c pass ARGV...`, or `python -c pass` started by /bin/sh if shell (its command line holds no
    hint of a secret, such as the '@' of "$@": the probe would redact it)."""
    if shell:
        assert not argv
        return ["/bin/sh", "-c", '"$0" -c pass; exit $?', python]
    return [python, "-c", "pass", *argv]


def _time_once(python: str, argv: list[str], env: dict[str, str], shell: bool = False) -> tuple[float, float]:
    """(wall, cpu) seconds of one `python -c pass ARGV...` (and its sh, if shell)."""
    t0 = time.perf_counter()
    cmd = _command(python, argv, shell)
    pid = os.posix_spawn(cmd[0], cmd, env)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{python} -c pass failed")
    return wall, usage.ru_utime + usage.ru_stime


def _instructions(python: str, argv: list[str], env: dict[str, str], tmp: Path, shell: bool = False) -> int | None:
    """User-space instructions of one `python -c pass ARGV...` under callgrind (hash seed fixed: repeatable);
    with shell, started by sh (which callgrind does not count)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    tool = [valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp / 'callgrind.out'}"]
    cmd = ["/bin/sh", "-c", " ".join(tool) + ' "$0" -c pass; exit $?', python] if shell else [*tool, *_command(python, argv, False)]
    out = subprocess.run(cmd, env={**env, "PYTHONHASHSEED": "0"}, capture_output=True, text=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    return int(m.group(1)) if out.returncode == 0 and m else None


def _measure(interpreters: dict[str, tuple[str, dict]], argvs: dict[str, list[str]], runs: int) -> dict:
    """{argv name: {interpreter: [(wall, cpu)...]}}, runs alternating between interpreters and argvs."""
    times = {a: {i: [] for i in interpreters} for a in argvs}
    for a, argv in argvs.items():  # warm-up: page cache, .pyc files
        for py, env in interpreters.values():
            _time_once(py, argv, env, a.endswith(SHELL))
    for _ in range(runs):
        for a, argv in argvs.items():
            for i, (py, env) in interpreters.items():
                times[a][i].append(_time_once(py, argv, env, a.endswith(SHELL)))
    return times


def _summary(times: dict) -> dict:
    out = {}
    for a, per in times.items():
        wall = {i: statistics.median(w for w, _ in v) for i, v in per.items()}
        cpu = {i: statistics.median(c for _, c in v) for i, v in per.items()}
        out[a] = {"wall_ms": {i: round(v * 1e3, 2) for i, v in wall.items()},
                  "cpu_ms": {i: round(v * 1e3, 2) for i, v in cpu.items()},
                  "ratio": {i: round(wall[i] / wall["bare"], 3) for i in wall},
                  "cpu_ratio": {i: round(cpu[i] / cpu["bare"], 3) for i in cpu}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=60, help="timed runs per interpreter and argv")
    ap.add_argument("--only", action="append", metavar="TEXT", help="only the argvs whose name holds TEXT")
    ap.add_argument("--instructions", action="store_true",
                    help="also count each case's instructions under valgrind's callgrind (repeatable)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    argvs = {a: v for a, v in ARGVS.items() if not args.only or any(t in a for t in args.only)}
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("NCCLPROBE_") and k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory(prefix="ncclprobe-bench-") as tmp:
        tmp = Path(tmp)
        plain, probed = _venv(tmp / "plain"), _venv(tmp / "probed")
        inject.install(probed, log_dir=tmp / "log-persistent")
        eph_env = {**base_env, **inject.ephemeral_env(base_env, tmp / "log-ephemeral", None)}
        interpreters = {"bare": (plain, base_env), "persistent": (probed, base_env), "ephemeral": (plain, eph_env)}
        summary = _summary(_measure(interpreters, argvs, args.runs))
        for a, argv in argvs.items() if args.instructions else ():
            instr = {i: _instructions(py, argv, env, tmp, a.endswith(SHELL)) for i, (py, env) in interpreters.items()}
            summary[a]["instructions"] = instr
            if instr["bare"] and None not in instr.values():
                summary[a]["instructions_ratio"] = {i: round(v / instr["bare"], 4) for i, v in instr.items()}
        logged = [json.loads(line)["argv"] for p in sorted((tmp / "log-persistent").glob("*.jsonl"))
                  for line in p.read_text().splitlines() if '"process_start"' in line]
    worst = max(s["ratio"]["persistent"] for s in summary.values())
    worst_instr = max((s["instructions_ratio"]["persistent"] for s in summary.values() if "instructions_ratio" in s),
                      default=None)
    out = {"runs": args.runs, "goal": GOAL, "ok": worst <= GOAL, "worst_ratio": worst,
           "worst_instructions_ratio": worst_instr, "argvs": summary, "load": os.getloadavg(),
           "longest_logged_argv_chars": max((len(json.dumps(a)) for a in logged), default=0)}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0 if out["ok"] else 1
    print(f"python -c pass ARGV, median of {args.runs} runs each (alternating); load {os.getloadavg()[0]:.2f}")
    print(f"  {'argv':<26} {'bare':>9} {'persistent':>18} {'ephemeral':>18}   cpu ratio   instructions")
    for a, s in summary.items():
        w, r = s["wall_ms"], s["ratio"]
        ir = s.get("instructions_ratio")
        print(f"  {a:<26} {w['bare']:6.1f} ms {w['persistent']:6.1f} ms {r['persistent']:6.3f}x "
              f"{w['ephemeral']:6.1f} ms {r['ephemeral']:6.3f}x   {s['cpu_ratio']['persistent']:.3f}x"
              + (f"      {ir['persistent']:.4f}x {ir['ephemeral']:.4f}x" if ir else ""))
    print(f"longest argv the persistent probe logged: {out['longest_logged_argv_chars']} characters of JSON")
    print(f"worst persistent / bare = {worst:.3f}x wall"
          + (f", {worst_instr:.4f}x instructions" if worst_instr else "")
          + f" (goal <= {GOAL:.2f}x): {'ok' if out['ok'] else 'OVER'}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
