"""The verdict (diagnose/verdict.py) as the document commands show first: one line per variable, its
values and who holds each, then the time in NCCL per rank. The verdict itself is data (JSON is its
to_json); drawing it is the commands' job, so diagnose/ never imports the document types."""
from __future__ import annotations

from ncclprobe.diagnose.verdict import Group, Verdict, short_id
from ncclprobe.doc import Grid, Text, Title
from ncclprobe.model import SPACE_MARK, ranges


def _who(g: Group) -> str:
    parts = []
    if g.comms:
        n = len(g.comms)
        names = g.names[:2] or [short_id(c) for c in g.comms[:2]]
        label = ", ".join(names) + ("…" if n > 2 else "")
        if g.ranks and max(g.nranks or {1}) > 1:
            label += f", ranks {ranges(g.ranks)}"
        elif len(g.pids) <= 2:
            label += ", pid " + ", ".join(str(p) for _, p in sorted(g.pids))
        parts.append(f"{n} comm{'s' if n != 1 else ''} ({label})")
    if g.processes:
        n = len(g.processes)
        pids = sorted({p for h, p in g.processes if SPACE_MARK not in h})
        inner = sorted({(h.split(SPACE_MARK)[1], p) for h, p in g.processes if SPACE_MARK in h})
        label = "pid " + ranges(pids) if len(pids) <= 8 else f"{len(pids)} pids"
        if inner:  # processes known only by their pid in a namespace of their own
            label = ", ".join(([label] if pids else []) + [f"pid {p} in pid ns {ns}" for ns, p in inner[:3]]
                              + ([f"{len(inner) - 3} more"] if len(inner) > 3 else []))
        parts.append(f"{n} process{'es' if n != 1 else ''} ({label})")
    hosts = {h.split(SPACE_MARK)[0] for h, _ in g.pids if h}
    text = " + ".join(parts)
    if len(hosts) > 1:
        text += f" on {len(hosts)} hosts"
    return text


def doc(v: Verdict) -> list:
    title = (f"Verdict: what each {'communicator' if v.holders == 'communicators' else 'process'} ended up "
             f"with (witnesses: {', '.join(v.witnesses) or 'none'})")
    out: list = [Title(title)]
    if v.unchecked is not None:
        out.append(Text(f"NOT CHECKED: {v.unchecked.reason[len('not checked: '):]}", "bad"))
        code = " (exit code 3: could not be examined)" if v.code is not None else ""
        out.append(Text(f"  to check it: {v.unchecked.hint}{code}", "warn"))
    if v.note:
        out.append(Text(v.note, "note"))
    if not v.rows:
        out.append(Text("No NCCL variable was set, expected (--expect) or named by a finding.", "dim"))
        return out + _time_doc(v)
    rows = []
    for r in v.rows:
        parts = []
        for g in r.groups:
            value = "unset" if g.value is None else g.value  # "?": no witness read it (its culprit says so)
            mark = " (expected)" if r.basis == "expected" and g.value == r.reference else ""
            via = f" (from {', '.join(g.conf)})" if g.conf else ""
            said = [x for x in (_who(g), g.culprit) if x]
            parts.append(f"{value}{mark}{via}: " + "; ".join(said))
        rows.append([r.var, " · ".join(parts)])
    out.append(Grid(rows))
    if v.more_vars:
        out.append(Text(f"+{v.more_vars} more variable(s): see --json (verdict.variables)", "dim"))
    return out + _time_doc(v)


def _time_doc(v: Verdict) -> list:
    if not v.time:
        return []
    out: list = [Text("Time in NCCL, per rank (profiler plugin; README: Time in NCCL):", "dim")]
    for line, t in v.time:
        out.append(Text("  " + line))
        out += [Text("    " + note, "dim") for note in t.notes]
    return out
