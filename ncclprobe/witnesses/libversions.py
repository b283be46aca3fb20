"""The version of each libnccl copy a model names, from the strongest witness that knows it: what a
probe reported, else what NCCL told its plugins, else the copy's ELF (read as `inspect` reads it)."""
from __future__ import annotations

from dataclasses import dataclass

from ncclprobe.model import Model


@dataclass(frozen=True)
class LibVersion:
    """The version of one libnccl copy and where it was learnt: "probe" (the preload hook asked it),
    "plugin" (NCCL told the plugins it loaded), "file" (its ELF, as `inspect` reads it)."""
    code: int
    source: str
    simulated: bool = False


FILE_READS_MAX = 16  # library files one report reads for a version (a hand-made log may name thousands)


def lib_versions(m: Model) -> dict[tuple[str, str], LibVersion]:
    """(host, path) -> the version of every libnccl copy the model names (CommView.lib, ProcessView.libs):
    what a probe reported, else what NCCL told its plugins, else the file's ELF where the copy is on this
    host (another host's path names another file). Unknown copies are left out; nothing here raises."""
    import socket
    from ncclprobe.model import catalog
    from ncclprobe.witnesses import elf
    out: dict[tuple[str, str], LibVersion] = {}
    for c in m.comms:
        if c.lib and c.version:
            out.setdefault((c.host, c.lib), LibVersion(c.version, "probe", c.simulated))
    for p in m.processes.values():
        for load in p.plugins:
            lib, code = load.get("lib"), load.get("nccl_version")
            if isinstance(lib, str) and isinstance(code, int) and not isinstance(code, bool) and code > 0:
                out.setdefault((p.host, lib), LibVersion(code, "plugin", "simulated" in str(load.get("nccl_suffix"))))
    here = socket.gethostname()
    named = {(c.host, c.lib) for c in m.comms if c.lib} | {(p.host, lib) for p in m.processes.values() for lib in p.libs}
    unknown = sorted(k for k in named if k not in out and k[0] == here and k[1].startswith("/"))
    for key in unknown[:FILE_READS_MAX]:
        info = elf.file_version(key[1])
        code = catalog.version_code(info.version) if info is not None else None
        if code:
            out[key] = LibVersion(code, "file", info.simulated)
    return out

