"""inspect's /proc snapshot of a tree: what a record of one process says about how far its exec-time
block can be trusted."""
from __future__ import annotations

from collections.abc import Mapping

from ncclprobe.model.images import runs_forkserver


def stale_kind(rec: Mapping, parent: Mapping | None) -> str | None:
    """Why this process's exec-time block is known not to be its live environment, or None.

    fork copies the parent's memory, so a child that never exec'ed shows the parent's block: same
    block, same executable and command line, and (when the kernel shows it) the same env_start/end
    addresses, which a fresh exec would have randomised (ASLR)."""
    source, reason = rec.get("env_source"), rec.get("env_reason")
    if reason == "partly overwritten" or (reason == "clobbered" and source == "empty"):
        return "clobbered"
    if parent is None or source != "exec" or parent.get("env_source") != "exec":
        return None
    block = rec.get("_hash")
    if block is None or block != parent.get("_hash"):  # not the same block
        return None
    span, pspan = rec.get("_span") or (0, 0, 0, 0), parent.get("_span") or (0, 0, 0, 0)
    if tuple(span) != tuple(pspan) and any(span) and any(pspan):  # a block laid out elsewhere: exec'ed again
        return None  # (most children of a launcher)
    layout = None if not any(span) or not any(pspan) else True
    if (rec.get("_start") or 0) < (parent.get("_start") or 0):
        return None
    same_program = rec.get("exe") == parent.get("exe") and rec.get("cmdline") == parent.get("cmdline")
    if same_program or layout:
        return "forkserver" if runs_forkserver(parent.get("cmdline")) else "fork"
    return None
