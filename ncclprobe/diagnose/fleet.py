"""Across hosts, one finding per cause: a rule speaks per process, rank or communicator, and on a fleet
(one job over many hosts, or many replicas of one job) the same cause comes back from every host with only
its host, pids, ranks, communicator ids and measured numbers changed. `fleet` folds those into one finding
that says on how many hosts it was seen alike; what differs in kind (another variable, value, file:line or
launcher) stays a finding of its own, so an outlier (one host's launcher, two odd ranks) is named alone.

`alike` is the one key every section uses for "the same thing on another host" (findings, the processes
table, communicator groups)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable

from ncclprobe.diagnose.findings import Finding, _fold

_HEX = re.compile(r"\b(?:uid:)?0x[0-9a-fA-F]{6,}\b")
_FLOAT = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")
_COUNT = re.compile(r"\b\d+ (process\(es\)|comms?|rank\(s\)|hosts?)\b")
_RANKS = re.compile(r"\branks? [\d,\- ]*\d")


def alike(text: str, hosts: Iterable[str] = (), pids: Iterable[int] = ()) -> str:
    """text with what changes from host to host masked: host names, pids, communicator ids, ranks,
    counts of processes, measured (decimal) numbers. Values of variables (integers, names) stay."""
    for h in sorted({h for h in hosts if h}, key=len, reverse=True):
        if h not in text:  # (no pattern to build: a text names one host or a few of a fleet's thousand)
            continue
        text = re.sub(rf"(?<![\w.-]){re.escape(h)}(?![\w-])", "<host>", text)  # the name, not inside a word
    text = _HEX.sub("<id>", text)
    text = _RANKS.sub("ranks <r>", text)
    text = _COUNT.sub(r"<n> \1", text)
    text = _FLOAT.sub("<x>", text)
    words = {str(p) for p in pids}
    if words:
        text = re.sub(r"\b\d+\b", lambda m: "<pid>" if m[0] in words else m[0], text)
    return text


def _key(f: Finding) -> tuple:
    hosts = [str(i.get("host")) for i in f.instances if i.get("host")]
    pids = {*f.pids, *(i["pid"] for i in f.instances if isinstance(i.get("pid"), int))}
    ppids = {int(p) for p in re.findall(r"\bpid (\d+)", f.message)}
    mask = lambda s: alike(s or "", hosts, pids | ppids)  # noqa: E731
    return (f.code, f.all_vars, mask(f.message), mask(f.hint), mask(f.culprit))


def fold(findings: list[Finding]) -> list[Finding]:
    """Findings of one cause on several hosts folded into one (the first host's words, every instance,
    `evidence.fleet`: how many hosts, each host's own evidence); findings alike on one host, or on hosts
    that overlap, stay as the rules gave them."""
    groups: dict[tuple, list[Finding]] = {}
    for f in findings:
        groups.setdefault(_key(f), []).append(f)
    out = []
    for group in groups.values():
        hosts_each = [set(f.hosts) for f in group]
        if len(group) == 1 or not all(hosts_each) or len(set().union(*hosts_each)) != sum(map(len, hosts_each)):
            out.extend(group)  # one host's findings stay its own: only the same cause on other hosts folds
            continue
        folded = _fold(group)
        hosts = folded.hosts
        evidence = {k: v for k, v in folded.evidence.items() if k != "merged"}
        evidence["fleet"] = {"hosts": len(hosts), "findings": len(group), "shown": group[0].hosts,
                             "merged": folded.evidence.get("merged", [])}
        out.append(replace(folded, evidence=evidence,
                           message=(f"on {len(hosts)} hosts alike, as on "
                                    f"{', '.join(group[0].hosts) or 'the first'}: {group[0].message}"
                                    if len(hosts) > 1 else group[0].message)))
    return out


def odd_ones(values: dict[str, dict[str, list[Any]]], key=lambda x: x) -> tuple[frozenset, dict[str, str]]:
    """COMM_RANKS_DIVERGENT: the ranks (key of each) whose value is not the most common one, and per
    variable, in words, their value beside the common one."""
    odd: set = set()
    said: dict[str, str] = {}
    for var, by_val in values.items():
        common = max(by_val, key=lambda v: len(by_val[v]))
        for val, who in by_val.items():
            if val != common:
                odd.update(map(key, who))
                said[var] = f"{val} where the others have {common}"
    return frozenset(odd), said
