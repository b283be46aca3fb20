"""The watched set: the only environment variables ncclprobe ever logs or prints by default.

DESIGN.md §4: everything else stays out of logs and output unless the user asks (--all-vars), and
then secret-looking names are redacted unless --no-redact.
"""
from __future__ import annotations

from collections.abc import Mapping

WATCHED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NCCLPROBE_")
WATCHED_NAMES = frozenset({
    "TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "PYTHONPATH",
    "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH",
})
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")
REDACTED = "<redacted>"


def is_watched(name: str) -> bool:
    return name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES)


def looks_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def select(env: Mapping[str, str] | None, all_vars: bool = False, redact: bool = True) -> dict[str, str] | None:
    """The part of env that may be shown: the watched set, or everything with secrets redacted."""
    if env is None:
        return None
    if not all_vars:
        return {k: v for k, v in env.items() if is_watched(k)}
    return {k: (REDACTED if redact and looks_secret(k) and not is_watched(k) else v) for k, v in env.items()}
