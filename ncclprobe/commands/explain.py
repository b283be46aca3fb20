"""`ncclprobe explain`: one entry of the catalog of NCCL variables (model/catalog.py), or the list of
them, as a user reads it."""
from __future__ import annotations

from ncclprobe.doc import Grid, Result, Table, Text, Title
from ncclprobe.model import catalog
from ncclprobe.model.catalog import VarInfo, version_text


def _cache_label(info: VarInfo) -> str:
    return "per process" if info.readings[-1].cached else "per communicator"


def _unknown(var: str) -> Result:
    """A usage error (exit 2): the name, not the system, is what is wrong."""
    names = catalog.suggest(var)
    msg = f"{var!r} is not in the catalog of NCCL variables"
    if not names:
        msg += " (`ncclprobe explain --list` lists them)"
    elif len(names) == 1:
        msg += f"; did you mean {names[0]}?"
    else:
        msg += f"; did you mean one of {', '.join(names)}?"
    return Result("explain", data={"variable": None, "query": var, "suggestions": names,
                                   "error": {"message": msg, "reason": "unknown_variable"}},
                  doc=[Text(msg, "warn")], code=2)


def explain(var: str) -> Result:
    info = catalog.get(var)
    if info is None:
        return _unknown(var)
    rows = [["affects", info.affects], ["default", info.default], ["values", info.values],
            ["read since", version_text(info.since)]]
    for r in info.readings:
        cached = "cached per process" if r.cached else "re-read per communicator"
        label = "NCCL ≤2.18 on" if r.since == 0 else f"NCCL {version_text(r.since)} on"
        rows.append([label, f"{cached} ({r.mode}): {r.how}"])
    if info.param:
        rows.append(["NCCL_NO_CACHE", "listing it makes NCCL re-read it per use (2.29.7+)"])
    rows.append(["source", info.source])
    doc = [Title(f"{info.name}  ({info.category}; {_cache_label(info)})"), Grid(rows)]  # label / text: no header
    if info.notes:
        doc.append(Text(info.notes, "note"))
    if info.overrides:
        doc.append(Table(["framework", "what it does", "where", "source"],
                         [[o.framework, o.action, o.where, o.source] for o in info.overrides],
                         title="Known framework overrides"))
    return Result("explain", data={"variable": info.to_json()}, doc=doc)


def explain_list() -> Result:
    infos = sorted(catalog.CATALOG.values(), key=lambda v: v.name)
    rows = [[v.name, _cache_label(v), v.default, v.affects] for v in infos]
    doc = [Title(f"NCCL variables ({len(rows)})"),
           Table(["variable", "read", "default", "affects"], rows,
                 caption="'per process': NCCL keeps the first value it reads; set it before the first "
                         "communicator. `ncclprobe explain VAR` for versions and sources.")]
    return Result("explain", data={"variables": [v.to_json() for v in infos]}, doc=doc)
