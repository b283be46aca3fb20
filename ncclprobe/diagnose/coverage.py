"""Whether an expectation was checked at all. "Not checked" is never "fine": when no process that the
rules check could be checked (every endpoint of the tree is a client whose workers run under another
daemon, or no witness could read any of them), the verdict says so first and the command exits 3."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model import Model
from ncclprobe.model.launchers import client_of


@dataclass
class Unchecked:
    reason: str
    hint: str
    clients: list[dict[str, Any]] = field(default_factory=list)
    unread: list[int] = field(default_factory=list)  # processes known to have run whose environment no witness read
    partial: bool = False  # other processes were checked: an error-level finding on them decides the exit code

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "hint": self.hint, "clients": self.clients, "unread": self.unread}


def edge_only(p) -> bool:
    """Known only from its parent's record of the call that started it: no witness of its own saw it."""
    return p.started_by is not None and not (p.sources - {"edge"}) and p.live_env is None


def _unread(k, endpoints: list, expect: dict[str, str]) -> tuple[list, list[str]]:
    """The endpoints known to have run only from a spawn record on which some expected variable cannot be
    checked (the record holds only the watched variables, or none), and those variables."""
    unread, names = [], []
    for p in endpoints:
        if not edge_only(p):
            continue
        missed = [var for var in expect if not k.effective(p, var)[0]]
        if missed:
            unread.append(p)
            names += [v for v in missed if v not in names]
    return unread, names


def unchecked(m: Model, expect: dict[str, str], k=None) -> Unchecked | None:
    """Why the expectation was checked on no process, or None where one was checked. k: the model's
    propagation.Knowledge where the caller has one (its timelines are memoised)."""
    if not expect:
        return None
    if k is None:
        from ncclprobe.diagnose.propagation import Knowledge
        k = Knowledge.of(m)
    endpoints = k.endpoints()
    with_comm = {(c.host, c.pid) for c in m.comms if c.env is not None}
    # (one checked process is enough to know: not every endpoint is asked)
    checked = any(p.key in with_comm or (client_of(p.argv, p.exe) is None and k.timeline(p) is not None)
                  for p in endpoints)
    unread, names = _unread(k, endpoints, expect)
    if checked and not unread:
        return None
    if checked:  # some were checked; these are known to have run, and not read
        pids = sorted(p.pid for p in unread)
        sites = sorted({p.started_by.site for p in unread})
        return Unchecked(f"not checked: {len(pids)} process(es) known to have run ({', '.join(map(str, pids[:8]))}"
                         f"{'…' if len(pids) > 8 else ''}; started by {', '.join(sites[:3])}) whose environment no "
                         f"witness read ({', '.join(names)}): only the call that started them was recorded, and it "
                         "holds the watched variables alone",
                         "let the boot probe into them (pass PYTHONPATH and NCCLPROBE_DIR in the environment the call "
                         "gives them), or read them while they run: `ncclprobe run --live --hold -- CMD`",
                         unread=pids, partial=True)
    clients = [(p, client_of(p.argv, p.exe)) for p in endpoints]
    named = [{"pid": p.pid, "host": p.host, "program": c.program, "runs_under": c.runs_under, "reach": c.reach}
             for p, c in clients if c is not None]
    if named:
        first = named[0]
        what = ", ".join(sorted({f"{c['program']} (pid {c['pid']})" for c in named}))
        return Unchecked(f"not checked: the tree holds only {what}, a client; its workers run under "
                         f"{first['runs_under']}, outside this tree, and no witness read them",
                         first["reach"], named)
    if not endpoints:
        return Unchecked("not checked: the tree holds no process the expectation applies to",
                         "inspect the workers' PIDs, or run the job under `ncclprobe run -- CMD`")
    return Unchecked("not checked: no witness could read the environment of any worker "
                     f"({len(endpoints)} process(es))",
                     "see them from inside: `ncclprobe run -- CMD` (the boot probe records each Python process), "
                     "or read their memory: `ncclprobe inspect --live PID`")
