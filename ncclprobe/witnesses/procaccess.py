"""Why the kernel refused to show us a process's /proc/<pid>/environ.

Reading it needs ptrace read access (fs/proc/base.c environ_read -> proc_mem_open -> mm_access ->
ptrace_may_access(PTRACE_MODE_READ_FSCREDS)). kernel/ptrace.c __ptrace_may_access grants it when our
fsuid equals the target's real, effective and saved uid and our fsgid its three gids, the target is
dumpable, and (security/commoncap.c cap_ptrace_access_check) its permitted capabilities are a subset
of our effective ones — or we hold CAP_SYS_PTRACE over its user namespace; a security module (SELinux,
AppArmor) decides last. Yama restricts only PTRACE_MODE_ATTACH, never this read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ncclprobe.witnesses import procs

OTHER_USER = "other user"
OTHER_GROUP = "other group"
NOT_DUMPABLE = "not dumpable"
CAPABILITIES = "capabilities"
REFUSED = "refused"  # every check above passes as far as /proc shows: a security module or a namespace
CAP_SYS_PTRACE = 19  # include/uapi/linux/capability.h


@dataclass(frozen=True)
class Viewer:
    """Who reads /proc: ncclprobe's own credentials (fsuid and fsgid are the effective ids here)."""
    uid: int
    gid: int
    caps: int | None  # CapEff; None when unknown

    @property
    def ptrace_capable(self) -> bool:
        return self.caps is not None and bool(self.caps >> CAP_SYS_PTRACE & 1)


def viewer(status: Path = Path("/proc/self/status")) -> Viewer:
    """This process's credentials (the real /proc, whatever /proc the inspection reads)."""
    caps = None
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        caps = None
    return Viewer(os.geteuid(), os.getegid(), caps)


def _ids(status: dict[str, str], key: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in status[key].split()[:3])  # real, effective, saved (fs follows effective)
    except (KeyError, ValueError):
        return ()


def denied_by(fs: procs.ProcFS, pid: int, uid: int | None, me: Viewer) -> str:
    """Which of __ptrace_may_access's conditions refused our read of pid's environ, as far as /proc
    shows it (uid: the owner of /proc/<pid>, the target's euid, used when its status cannot be read)."""
    if me.ptrace_capable:
        return REFUSED  # CAP_SYS_PTRACE overrides the uid, dumpable and capability checks
    try:
        status = fs.status(pid)
    except OSError:
        status = {}
    uids = _ids(status, "Uid") or ((uid,) if uid is not None else ())
    if any(u != me.uid for u in uids):
        return OTHER_USER
    if any(g != me.gid for g in _ids(status, "Gid")):
        return OTHER_GROUP
    try:  # a task that is not dumpable has its /proc files owned by root, its directory not (task_dump_owner)
        if fs.reader.owner(fs.path(pid, "environ")) != fs.reader.owner(fs.path(pid)):
            return NOT_DUMPABLE
    except OSError:
        pass
    try:
        theirs = int(status["CapPrm"], 16)
    except (KeyError, ValueError):
        theirs = None
    if theirs is not None and me.caps is not None and theirs & ~me.caps:
        return CAPABILITIES
    return REFUSED
