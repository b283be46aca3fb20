"""Which probe log directories that the inspected processes' environments name (NCCLPROBE_DIR) are read
as evidence: any user in the tree chooses its own, so one is read only if the inspecting user or a process
that names it owns it and it passes DESIGN §4's log discipline (ncclprobe_boot's own rules); the others are
said, with the reason."""
from __future__ import annotations

import os
import stat

from ncclprobe._lib import ncclprobe_boot as _boot  # the probes' log-directory rules (DESIGN §4)
from ncclprobe.witnesses import procs


def readable_dirs(fs: procs.ProcFS, tree: procs.ProcTree) -> tuple[list[str], list[dict]]:
    """The NCCLPROBE_DIRs the inspected processes' environments name that are read as evidence, and
    the others ({"dir", "pids", "reason"}): any user in the tree chooses its own NCCLPROBE_DIR, so one
    is read only if this user (euid) or a process that names it owns it, and it passes the log
    discipline of DESIGN §4; a path the process resolves in another root or mount namespace is not ours."""
    named: dict[str, list[procs.Proc]] = {}
    for p in tree.procs.values():
        d = p.env.env.get("NCCLPROBE_DIR") if p.env and p.env.env else None
        if d:
            named.setdefault(d, []).append(p)
    read, skipped = [], []
    for d, ps in sorted(named.items()):
        here = [p for p in ps if _our_root(fs, p)]
        why = (_unfit_evidence(d, {os.geteuid(), *(p.uid for p in here if p.uid is not None)}) if here else
               "a path in the process's own root or mount namespace")
        if why is None:
            read.append(d)
        else:
            skipped.append({"dir": d, "pids": sorted(p.pid for p in ps), "reason": why})
    return read, skipped


def _our_root(fs: procs.ProcFS, p: procs.Proc) -> bool:
    fs.resolve_root(p)
    return p.same_mnt_ns and p.root == "/"


def _unfit_evidence(d: str, owners: set[int]) -> str | None:
    """Why the directory d is not read as evidence, or None: it must be a real directory (O_NOFOLLOW:
    its last component no symlink) of one of the owners that group and others cannot write to and, if
    root's, no system directory (the probes' own rules: ncclprobe_boot._system_dir)."""
    if not d.startswith("/"):
        return "not an absolute path (the process resolves it in its own working directory)"
    try:
        fd = os.open(d, _boot._DIR_FLAGS)
    except OSError as exc:
        return _open_refusal(exc, d)
    try:
        st = os.fstat(fd)
        if st.st_uid not in owners:
            return f"it belongs to uid {st.st_uid}, neither this user nor the process's"
        if st.st_mode & 0o022:
            return "group or others can write to it"
        if st.st_uid == 0 and _boot._system_dir(fd, d):
            return "it is a system directory"
        return None
    finally:
        os.close(fd)


def _open_refusal(exc: OSError, d: str) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such directory"
    if isinstance(exc, NotADirectoryError):  # O_NOFOLLOW|O_DIRECTORY gives ENOTDIR on a symlink too
        try:
            return "it is a symlink" if stat.S_ISLNK(os.lstat(d).st_mode) else "not a directory"
        except OSError:
            return "not a directory"
    return exc.strerror or str(exc)
