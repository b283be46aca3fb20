"""NCCL's own INFO log as one more witness in the model: what NCCL says it read ("set by
environment"), the communicators it initialised, and the algorithm/protocol its tuner picked."""
from __future__ import annotations

import math

from ncclprobe import nccllog
from ncclprobe.tuning import canonical
from ncclprobe.model import CollStat, CommView, Model, NcclRead, ProcessView, comm_id


def _process(m: Model, host: str | None, pid: int | None) -> ProcessView | None:
    if pid is None:
        return None
    # NCCL cuts the host name at the first '.'; the probes keep it whole.
    for (h, p), view in m.processes.items():
        if p == pid and (host is None or h == host or h.split(".")[0] == host):
            return view
    return m.process(host or "?", pid)


def merge(m: Model, paths) -> Model:
    log = nccllog.parse_files(paths)
    m.nccl_log = log
    for rec in log.records:
        at = getattr(rec, "at", None)
        if at is None:
            continue
        p = _process(m, at.host, at.pid)
        if p is None:
            continue
        p.sources.add("nccl-log")
        if isinstance(rec, nccllog.EnvSetting):
            # The log carries no time we can order against env writes: never "earlier" than one.
            p.reads.setdefault(("nccl-log", rec.var, rec.value), NcclRead(rec.var, rec.value, "nccl-log", math.inf, "nccl-log"))
        elif isinstance(rec, nccllog.VersionLine):
            p.nccl_version = rec.code
            p.simulated_nccl = rec.simulated
        elif isinstance(rec, nccllog.PluginLoaded):
            p.plugins.append({"plugin": f"{rec.kind}:{rec.name}", "version": rec.version, "src": "nccl-log"})
        elif isinstance(rec, nccllog.CommInit) and rec.phase == "COMPLETE":
            _comm(m, p, rec)
        elif isinstance(rec, nccllog.Tuning):
            p.tuning.append(rec)
    for p in m.processes.values():
        if p.tuning:
            comms = m.comms_of(p.host, p.pid)
            if len(comms) == 1:  # TUNING lines name no communicator: attach only where unambiguous
                for t in p.tuning:
                    _add_tuning(comms[0], t)
        if p.simulated_nccl:
            for c in m.comms_of(p.host, p.pid):
                c.simulated = True
    return m


def _comm(m: Model, p: ProcessView, rec) -> None:
    # commId in Init lines is comm->commHash from 2.26, the profiler's id: join on it or on the pointer
    h, ptr = comm_id(rec.comm_id), comm_id(rec.comm)  # NCCL prints both without leading zeros (%llx, %p)
    c = next((c for c in m.comms_of(p.host, p.pid)
              if (ptr and c.comm == ptr) or (h and c.comm_hash == h)), None)
    if c is None:
        c = CommView(p.host, p.pid, math.inf, api=rec.api, comm=ptr, rank=rec.rank, nranks=rec.nranks,
                     parent=comm_id(rec.parent), color=rec.color, key=rec.key, dev=rec.cuda_dev)
        m.comms.append(c)
    c.seen_by.add("nccl-log")
    c.api = c.api or rec.api  # NCCL names the API even where no preload hook saw the call
    c.comm = c.comm or ptr
    c.comm_hash = c.comm_hash or h
    c.version = c.version or p.nccl_version


def _add_tuning(c: CommView, t) -> None:
    ch = (t.channel_hi - t.channel_lo + 1) if t.channel_hi is not None and t.channel_lo is not None else 0
    key = (t.func or "?", canonical(t.algo), canonical(t.proto or "?"), ch)
    s = c.colls.get(key)
    if s is None:
        c.colls[key] = CollStat(*key, t.nbytes, t.nbytes, 1)
    else:
        s.bytes_min, s.bytes_max, s.count = min(s.bytes_min, t.nbytes), max(s.bytes_max, t.nbytes), s.count + 1
