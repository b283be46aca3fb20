"""Rules over the in-process model: what each communicator got, who changed it, what NCCL ran.

Pure functions from a Model to findings; every finding carries its evidence and a hint.
"""
from __future__ import annotations

from collections import defaultdict

from ncclprobe.model import tuning
from ncclprobe.diagnose.findings import Finding, at
from ncclprobe.diagnose.propagation import net_writes
from ncclprobe.model import CommView, Model, ProcessView, ranges

# Variables that legitimately differ between processes or communicators, or only steer diagnostics.
NOT_TUNING_PREFIXES = ("NCCL_DEBUG", "NCCLPROBE_", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN",
                       "NCCL_TUNER_PLUGIN", "NCCL_COMM_ID", "NCCL_HOSTID", "NCCL_LOCAL_RANK", "NCCL_INSPECTOR",
                       "NCCL_VERSION")  # NCCL_VERSION: a container image label, never read by NCCL


def is_tuning(var: str) -> bool:
    return var.startswith("NCCL_") and not var.startswith(NOT_TUNING_PREFIXES)


def process_cached(var: str, version: int | None = None) -> bool:
    """Whether NCCL caches var per process at first read (NCCL_PARAM); unknown NCCL_* count as cached,
    which is what NCCL does with every NCCL_PARAM (src/include/param.h)."""
    from ncclprobe.model import catalog
    cached = catalog.is_process_cached(var, version)
    return True if cached is None else bool(cached)


def _label(c: CommView) -> str:
    api = c.api or "an API no preload hook saw"
    return f"comm {c.ident} (pid {c.pid}, {api}, rank {c.rank}/{c.nranks})"


def _at(c: CommView) -> dict:
    return at(c.host, c.pid, c.rank, c.group or c.ident)


def _short_where(where: str) -> str:
    """`/long/path/engine.py:11 enable_speculative` -> `engine.py:11`: the culprit in a verdict line."""
    loc = where.split(" ")[0]
    return loc.rsplit("/", 1)[-1]


def _write_between(p: ProcessView | None, var: str, t0: float, t1: float):
    if p is None:
        return None
    hits = [w for w in p.writes if w.var == var and t0 <= w.t <= t1 and not w.blocked]
    return hits[-1] if hits else None


def env_at(p: ProcessView, t: float | None) -> dict[str, str] | None:
    """The process's watched environment at time t, as the boot probe saw it: its start environment
    plus the writes up to t (propagation.Timeline, which every rule reads)."""
    if p.start_env is None:
        return None
    from ncclprobe.diagnose.propagation import Timeline
    return dict(Timeline(p.start_env, [w for w in p.writes if not w.blocked], "boot", ("boot",), True).at(t))


def comm_tuning_divergent(m: Model) -> list[Finding]:
    """Communicators of one process created with different values of a variable NCCL re-reads per
    communicator (NCCL_PROTO, NCCL_ALGO, ...): their collectives run different tunings."""
    out = []
    by_proc: dict[tuple, list[CommView]] = defaultdict(list)
    for c in m.comms:
        if c.env is not None and c.ok:
            by_proc[(c.host, c.pid) if c.retired is None else (c.host, c.pid, c.retired)].append(c)
    for owner, comms in by_proc.items():
        comms.sort(key=lambda c: c.t)
        host, pid = owner[:2]
        p = m.processes.get(owner)
        names = sorted({v for c in comms for v in c.env if is_tuning(v) and not process_cached(v, c.version)})
        for var in names:
            values = [(c, c.env.get(var)) for c in comms]
            if len({v for _, v in values}) < 2:
                continue
            first_c, first_v = values[0]
            for c, v in values[1:]:
                if v == first_v:
                    continue
                w = _write_between(p, var, first_c.t, c.t)
                ev = {"first": _label(first_c), "first_value": first_v, "then": _label(c), "then_value": v,
                      "realized_first": _realized(first_c), "realized_then": _realized(c)}
                culprit = ""
                if w:
                    ev["changed_at"] = w.where
                    culprit = f" (set by {w.where})"
                out.append(Finding(
                    "COMM_TUNING_DIVERGENT", "error",
                    f"a later communicator was created with {_shown(var, v)}{culprit}, while an earlier one of "
                    f"the same process got {_shown(var, first_v)}: their collectives run different tunings",
                    pids=(pid,), var=var, evidence=ev, instances=(_at(c),),
                    culprit=_short_where(w.where) if w else "", cause=(var, first_v, v, w.where if w else None),
                    hint=(f"remove or guard the write at {w.where}, or pin it: ncclprobe run --pin {var}"
                          if w else f"set {var} once before the first communicator and leave it alone")))
    return out


def _shown(var: str, value: str | None) -> str:
    return f"{var} unset" if value is None else f"{var}={value!r}"


def _realized(c: CommView) -> str:
    if not c.colls:
        return "no collective seen"
    return ", ".join(sorted({f"{s.func} {s.algo}/{s.proto}" for s in c.colls.values()}))


def comm_ranks_divergent(m: Model) -> list[Finding]:
    """Ranks of one communicator (same commHash or unique id) created with different tuning: one
    finding per set of odd ranks (those whose value is not the most common one), naming the variables
    they differ on; the communicators of one odd set fold into it (diagnose/aggregate)."""
    from ncclprobe.diagnose.fleet import odd_ones
    out = []
    groups: dict[str, list[CommView]] = defaultdict(list)
    for c in m.comms:
        if c.group and c.env is not None:
            groups[c.group].append(c)
    for group, comms in groups.items():
        if len({(c.host, c.pid) for c in comms}) < 2:
            continue
        by_odd: dict[frozenset, dict[str, dict[str, list]]] = {}
        for var in sorted({v for c in comms for v in c.env if is_tuning(v)}):
            by_val: dict[str, list[CommView]] = defaultdict(list)
            for c in sorted(comms, key=lambda c: (c.rank is None, c.rank)):
                by_val["unset" if c.env.get(var) is None else c.env[var]].append(c)
            if len(by_val) > 1:
                odd, _ = odd_ones({var: by_val}, key=_who)
                by_odd.setdefault(odd, {})[var] = dict(by_val)
        now = any((c.env_source or "").startswith("held now") for c in comms)
        for odd, diverging in by_odd.items():
            out.append(_ranks_divergent(group, comms, odd, diverging, now))
    return out


def _who(c: CommView) -> tuple:
    return (c.host, c.pid, c.rank)


def _ranks_divergent(group: str, comms: list[CommView], odd: frozenset, diverging: dict, now: bool) -> Finding:
    from ncclprobe.diagnose.fleet import odd_ones
    odd_comms = sorted((c for c in comms if _who(c) in odd), key=lambda c: (c.host, c.rank is None, c.rank, c.pid))
    _, said = odd_ones(diverging, key=_who)
    hosts = sorted({c.host for c in odd_comms})
    ranks = sorted({c.rank for c in odd_comms if c.rank is not None})
    who = (f"rank(s) {ranges(ranks)} on {', '.join(hosts) if len(hosts) <= 3 else f'{len(hosts)} hosts'}"
           if ranks else f"{len(odd_comms)} process(es)")
    # a communicator only RAS listed has no environment at creation: say it is what they hold now
    parts = [f"{var} {text}" for var, text in said.items()]
    values = {var: {val: [f"rank {c.rank} (pid {c.pid})" for c in cs] for val, cs in vals.items()}
              for var, vals in diverging.items()}
    return Finding(
        "COMM_RANKS_DIVERGENT", "error",
        f"{who} of communicator {group} ({len(comms)} ranks seen) "
        + ("hold different tuning now (their values at creation are unknown) from the others — " if now else
           "were created with different tuning from the others — ") + " | ".join(parts),
        pids=tuple(sorted({c.pid for c in odd_comms})), var=next(iter(diverging)) if len(diverging) == 1 else None,
        vars=tuple(diverging) if len(diverging) > 1 else (), instances=tuple(_at(c) for c in odd_comms),
        evidence={"communicator": group, "odd_ranks": ranks, "odd_hosts": hosts,
                  "odd_pids": [{"host": c.host, "pid": c.pid, "rank": c.rank} for c in odd_comms],
                  "values": values},
        cause=(odd, tuple(sorted(said.items()))),
        hint="give every rank the same NCCL_* environment: check the launcher that started the odd rank(s)")


def algo_proto_mismatch(m: Model) -> list[Finding]:
    """A communicator whose collectives ran an algorithm or protocol its NCCL_ALGO/NCCL_PROTO at
    creation excludes: the setting did not take effect."""
    out = []
    for c in m.comms:
        for var, universe, pick in (("NCCL_PROTO", tuning.PROTOS, lambda s: s.proto),
                                    ("NCCL_ALGO", tuning.ALGOS, lambda s: s.algo)):
            wanted = (c.env or {}).get(var)
            if not wanted:
                continue
            bad = []
            for s in c.colls.values():
                if pick(s) not in universe:  # a copy-engine or symmetric kernel: no NCCL_ALGO/PROTO choice
                    continue
                allowed = tuning.allowed(wanted, s.func, universe)
                if allowed is not None and pick(s) not in allowed and pick(s) not in ("", "None", "?"):
                    bad.append(s)
            if bad:
                ran = sorted({f"{s.func} {s.algo}/{s.proto}" for s in bad})
                out.append(Finding(
                    "ALGO_PROTO_MISMATCH", "error",
                    f"{var}={wanted} was asked, but collectives ran " + ", ".join(ran),
                    pids=(c.pid,), var=var, instances=(_at(c),), cause=(var, wanted, tuple(ran)),
                    evidence={"communicator": c.ident, "asked": wanted, "env_at_creation": (c.env or {}).get(var),
                              "realized": [s.__dict__ for s in bad]},
                    hint=f"make sure {var} is in the environment before this communicator is created "
                         "(it is read at communicator init), and that the value is valid for this topology"))
    return out


def env_overridden(m: Model) -> list[Finding]:
    out = []
    for p in m.processes.values():
        for w in net_writes(p):
            if w.old is None or w.old == w.new:
                continue
            what = "tried to change" if w.blocked else "changed"
            out.append(Finding(
                "ENV_OVERRIDDEN", "warning",
                f"{w.where} {what} {w.var} from {w.old!r} to "
                f"{'unset' if w.new is None else repr(w.new)}" + (" (blocked by --pin)" if w.blocked else ""),
                pids=(p.pid,), var=w.var, instances=(at(p.host, p.pid),), culprit=_short_where(w.where),
                cause=(w.var, w.old, w.new, w.where, w.blocked),
                evidence={"where": w.where, "old": w.old, "new": w.new, "op": w.op, "blocked": w.blocked, "t": w.t},
                hint=(f"the pin kept {w.var}={w.old}" if w.blocked else
                      f"remove the assignment at {w.where} or make it conditional "
                      f"(os.environ.setdefault), or pin it: ncclprobe run --pin {w.var}")))
    return out


def env_late(m: Model) -> list[Finding]:
    """A write to a variable NCCL caches per process, after NCCL first read it in that process."""
    out = []
    for p in m.processes.values():
        comms = sorted(m.comms_of(p.host, p.pid, p.retired), key=lambda c: c.t)
        for w in p.writes:
            if w.blocked or not w.var.startswith("NCCL_") or not process_cached(w.var):
                continue
            read = p.first_read(w.var)
            if read is not None:
                basis, t_read, seen = "NCCL's first read of it (env plugin)", read.t, read.value
            elif comms:
                basis, t_read, seen = "the first communicator init", comms[0].t, (comms[0].env or {}).get(w.var)
            else:
                continue
            if t_read >= w.t or seen == w.new:
                continue
            later = [c for c in comms if c.t > w.t]
            out.append(Finding(
                "ENV_LATE", "error",
                f"{w.where} set {w.var}={w.new!r} after NCCL had already read it "
                f"({'unset' if seen is None else repr(seen)}); NCCL caches it per process, so "
                "later communicators still use the first value",
                pids=(p.pid,), var=w.var, instances=tuple(_at(c) for c in later) or (at(p.host, p.pid),),
                culprit=f"set late at {_short_where(w.where)}", cause=(w.var, w.where, seen, w.new),
                evidence={"where": w.where, "written_at": w.t, "read_at": t_read, "basis": basis,
                          "value_read": seen, "value_written": w.new,
                          "later_comms": [c.ident for c in later]},
                hint=f"set {w.var} before the process creates its first communicator (launcher "
                     f"environment or ncclprobe run --set {w.var}={w.new})"))
    return out


def all_rules(m: Model) -> list[Finding]:
    """The rules on communicators and on NCCL's reads; where values went along the process tree is
    propagation's."""
    return [*comm_tuning_divergent(m), *comm_ranks_divergent(m), *algo_proto_mismatch(m), *env_overridden(m),
            *env_late(m)]
