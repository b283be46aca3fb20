"""The quick start where a newcomer types it: from the repository root, a source checkout whose
`ncclprobe/` has no built native parts, without the test session's PYTHONSAFEPATH."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _newcomer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH" and not k.startswith("NCCL")}
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the source tree as a clone has it: no ncclprobe/_lib/*.so, nothing installed there."""
    dst = tmp_path_factory.mktemp("clone") / "ncclprobe-src"
    shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(".git", "*.so", "__pycache__", "build", "*.egg-info",
                                                             "sim", ".pytest_cache"))
    assert (dst / "ncclprobe" / "__init__.py").is_file() and not list((dst / "ncclprobe" / "_lib").glob("*.so"))
    return dst


def test_demo_from_a_source_checkout_runs_the_installed_package(checkout):
    exe = shutil.which("ncclprobe")
    assert exe, "the ncclprobe script is installed with the package"
    r = subprocess.run([exe, "demo", "--json"], cwd=checkout, env=_newcomer_env(), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["ok"] is True and out["missed"] == [] and out["unplanted"] == []
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_bench_gloo_from_a_source_checkout_runs_the_installed_package(checkout):
    pytest.importorskip("torch")
    r = subprocess.run([shutil.which("ncclprobe"), "bench", "--backend", "gloo", "--ranks", "2", "-b", "1K", "-e", "4K",
                        "-n", "2", "-w", "1", "--json"], cwd=checkout, env=_newcomer_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["configs"] and all(c["status"] == "ok" for c in out["configs"]), out["configs"]
    assert "Traceback" not in r.stderr
