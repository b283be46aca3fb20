"""What `ncclprobe run` leaves in a log directory, as tests read it: its metadata file(s),
run-<host>-<run id>.json (one per run)."""
from __future__ import annotations

import json
from pathlib import Path


def run_files(d: Path) -> list[Path]:
    """The run metadata files of d, in name order."""
    return sorted(Path(d).glob("run-*.json"))


def run_meta(d: Path) -> dict:
    """The metadata of the one run d holds (a test that expects one run fails on more)."""
    (path,) = run_files(d)
    return json.loads(path.read_text())
