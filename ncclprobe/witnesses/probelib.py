"""The native probe library (libncclprobe.so): find it, load it, and check it before use.

The library is plain C with no Python API; ctypes asks it three things: its probe ABI version
(must equal PROBE_ABI below, which the C side defines as NCCLPROBE_ABI in probes/ncclprobe/probe.h),
and which roles it really exports (bit 1 preload hooks, 2 NCCL profiler plugin, 4 NCCL env plugin,
found through the library's own symbol table). `ncclprobe run` refuses a library that fails.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

from ncclprobe import _lib

LIB_NAME = "libncclprobe.so"
PROBE_ABI = "1"

ROLE_PRELOAD = 1
ROLE_PROFILER = 2
ROLE_ENVPLUGIN = 4
ALL_ROLES = ROLE_PRELOAD | ROLE_PROFILER | ROLE_ENVPLUGIN
ROLE_NAMES = {ROLE_PRELOAD: "preload", ROLE_PROFILER: "profiler", ROLE_ENVPLUGIN: "envplugin"}


@dataclass(frozen=True)
class ProbeLib:
    path: str
    version: str | None
    roles: int
    ok: bool
    reason: str  # "" when ok

    @property
    def role_names(self) -> tuple[str, ...]:
        return tuple(name for bit, name in ROLE_NAMES.items() if self.roles & bit)


def lib_path() -> Path:
    return _lib.lib_path(LIB_NAME)


def load(path: Path | str | None = None) -> ctypes.CDLL:
    """The library loaded into this process (RTLD_LOCAL: its hooks never interpose here)."""
    lib = ctypes.CDLL(str(path or lib_path()), mode=ctypes.RTLD_LOCAL)
    lib.ncclprobe_version.restype = ctypes.c_char_p
    lib.ncclprobe_version.argtypes = []
    lib.ncclprobe_roles.restype = ctypes.c_uint
    lib.ncclprobe_roles.argtypes = []
    lib.ncclprobe_watched.restype = ctypes.c_int
    lib.ncclprobe_watched.argtypes = [ctypes.c_char_p]
    lib.ncclprobe_json_escape.restype = ctypes.c_size_t
    lib.ncclprobe_json_escape.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    return lib


def self_check(path: Path | str | None = None) -> ProbeLib:
    """Version and roles of the library at path (default: the one built into the package)."""
    p = Path(path) if path is not None else lib_path()
    if not p.is_file():
        return ProbeLib(str(p), None, 0, False, "not built (pip install -e . or python probes/build.py)")
    try:
        lib = load(p)
    except OSError as exc:
        return ProbeLib(str(p), None, 0, False, f"cannot load: {exc}")
    except AttributeError as exc:
        return ProbeLib(str(p), None, 0, False, f"not a ncclprobe library: {exc}")
    raw = lib.ncclprobe_version()
    version = raw.decode("ascii", "replace") if raw else None
    roles = int(lib.ncclprobe_roles())
    if version != PROBE_ABI:
        return ProbeLib(str(p), version, roles, False, f"probe ABI {version!r}, this ncclprobe needs {PROBE_ABI!r}")
    missing = [name for bit, name in ROLE_NAMES.items() if not roles & bit]
    if missing:
        return ProbeLib(str(p), version, roles, False, "missing roles: " + ", ".join(missing))
    return ProbeLib(str(p), version, roles, True, "")
