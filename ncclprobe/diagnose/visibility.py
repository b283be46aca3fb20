"""What the witnesses could not see: environments /proc refused (ENV_UNREADABLE), and the hints that
say how to see more. Pure functions from the model to findings; the /proc witness's refusals are in
each process's `proc_env_source`/`proc_env_reason`/`proc_denied_by`."""
from __future__ import annotations

from collections import defaultdict

from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.model import Model

LIVE_VIEW = ("`ncclprobe inspect --live PID` reads the environment each process holds now from its memory; "
             "`ncclprobe run --live -- CMD` reads it while CMD runs, and `ncclprobe run -- CMD` (or `ncclprobe inject "
             "install`) records it from inside each Python process")
NOT_SHOWN = "<not shown: outside the watched set>"
PTRACE_HINT = ("run ncclprobe as the processes' user, as root, or with CAP_SYS_PTRACE; in a container "
               "run it inside the same PID namespace (docker --pid=host / kubectl debug --target)")

# Why /proc/<pid>/environ was refused (procaccess.denied_by): what the message says, and the hint.
_DENIED = {
    "other user": ("they run as another user ({users}), and /proc/<pid>/environ needs the same user or "
                   "CAP_SYS_PTRACE", PTRACE_HINT),
    "other group": ("they run as ncclprobe's user but with another group (a setgid program, sg/newgrp), and "
                    "/proc/<pid>/environ needs the same uids and gids or CAP_SYS_PTRACE",
                    "run ncclprobe with the processes' group (sg GROUP ncclprobe ...), as root, or with CAP_SYS_PTRACE"),
    "not dumpable": ("they run as ncclprobe's user but are not dumpable (a setuid, setgid or file-capability "
                     "program, or prctl(PR_SET_DUMPABLE, 0)), so /proc/<pid>/environ needs CAP_SYS_PTRACE",
                     "run ncclprobe as root or with CAP_SYS_PTRACE, or see the live values: " + LIVE_VIEW),
    "capabilities": ("they run as ncclprobe's user but hold capabilities ncclprobe lacks, so "
                     "/proc/<pid>/environ needs CAP_SYS_PTRACE",
                     "run ncclprobe with CAP_SYS_PTRACE (or with the processes' capabilities)"),
    "refused": ("the kernel refused although, as far as /proc shows, ncclprobe passes ptrace's checks (same "
                "user and group, dumpable, capabilities, or CAP_SYS_PTRACE): a security module (SELinux, "
                "AppArmor) or a user-namespace boundary denies it",
                "check the security module's denials (audit log, dmesg), run ncclprobe with CAP_SYS_PTRACE in "
                "the processes' own user namespace (inside their container), or see the live values: " + LIVE_VIEW),
}


def _why(reason: str, denied: str | None, users: list[str]) -> tuple[str, str, dict]:
    """What the message says of a refusal, its hint, and what the evidence adds."""
    if reason == "permission" and denied in _DENIED:
        what, hint = _DENIED[denied]
        return what.format(users=", ".join(users)), hint, {"denied_by": denied, "users": users}
    if reason == "permission":  # not classified: the plain ptrace requirement
        return "reading /proc/<pid>/environ needs ptrace access to them", PTRACE_HINT, {}
    if reason == "hidepid":
        return "/proc is mounted with hidepid, which hides other users' processes", PTRACE_HINT, {}
    return reason, "inspect again while it runs", {}


def env_unreadable(m: Model) -> list[Finding]:
    """ENV_UNREADABLE per reason /proc refused the environment. A process that exited while it was
    read is no finding: there is nothing left to read (inspect notes it)."""
    groups: dict[tuple[str, str | None], list] = defaultdict(list)
    for p in m.processes.values():
        if p.proc_env_source == "unreadable" and p.proc_env_reason != "vanished":
            reason = p.proc_env_reason or "unknown"
            groups[(reason, p.proc_denied_by if reason == "permission" else None)].append(p)
    out = []
    for (reason, denied), members in groups.items():
        members.sort(key=lambda p: (p.host, p.pid))
        users = sorted({p.proc_user if p.proc_user is not None else "?" for p in members})
        what, hint, more = _why(reason, denied, users)
        out.append(Finding("ENV_UNREADABLE", "warning",
                           f"exec-time environment of {len(members)} process(es) unreadable: {what}",
                           tuple(p.pid for p in members), None, {"reason": reason, **more}, hint,
                           instances=tuple(at(p.host, p.pid) for p in members), cause=(reason, denied)))
    return out
