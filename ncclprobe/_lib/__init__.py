"""Native probe library, simulated NCCL and boot probe, built from probes/ at install time."""
from pathlib import Path

LIB_DIR = Path(__file__).resolve().parent


def lib_path(name: str) -> Path:
    """Path of a file built into this folder (it may not exist in an uninstalled source tree)."""
    return LIB_DIR / name
