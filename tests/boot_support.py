"""Helpers for the boot-probe tests: throwaway venvs, real interpreters, event logs."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from ncclprobe.witnesses.events import read_dirs

PYTHON = sys.executable


def make_venv(path: Path, system_site: bool = False) -> Path:
    """A venv without pip; returns its python."""
    args = [PYTHON, "-m", "venv", "--without-pip", str(path)]
    if system_site:
        args.insert(4, "--system-site-packages")
    subprocess.run(args, check=True, capture_output=True)
    return path / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would wire a probe in by itself."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NCCLPROBE_") and k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(extra)
    return env


def run(args, env, cwd=None, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def events(log_dir: Path, kind: str | None = None) -> list[dict]:
    log = read_dirs([log_dir])
    assert log.skipped_total == 0, log.skipped
    return [e for e in log.events if kind is None or e["ev"] == kind]


def starts_by_pid(log_dir: Path) -> dict[int, dict]:
    return {e["pid"]: e for e in events(log_dir, "process_start")}


def raw_log_text(log_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(Path(log_dir).glob("*.jsonl")))


def snapshot(directory: Path) -> dict[str, tuple]:
    """Every entry under directory: (kind, mode, content hash) — for "restored exactly"."""
    out = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = Path(root) / name
            st = p.lstat()
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else ""
            out[str(p.relative_to(directory))] = (st.st_mode, digest)
    return out
