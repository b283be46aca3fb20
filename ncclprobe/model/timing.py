"""Time in NCCL per communicator, from the profiler plugin's counts (probes/ncclprobe/profiler.c):
how many collectives of which sizes ran per second of wall, how they were launched (eager, captured
into a CUDA graph, replayed from one) and, where GPU timing was on, their GPU time (median, p90,
total), bus bandwidth and share of the wall.

The witness is the profiler plugin alone. Launch modes need profiler v5 (NCCL 2.28+): NCCL 2.27's
v4 has no API events (mode unknown). A graph's replays are reported by NCCL only where the plan has
proxy ops: network collectives, or GPU timing on (KernelCh events add one to every collective); an
intra-node graph without GPU timing shows its collectives once, at capture. GPU time is the longest
channel's %globaltimer interval of each collective (as NCCL's Inspector takes it), kept in a
histogram whose bins are 1/8 of an octave: a median or p90 read from it is within 6.25 %.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ncclprobe.model import ranges

# the plugin's histogram (profiler.c NP_OCT_LO / NP_OCT_HI): 8 bins per octave, 2^8 .. 2^34 ns
OCT_LO, OCT_HI = 8, 33
BINS = (OCT_HI - OCT_LO + 1) * 8
MODES = ("eager", "captured", "replayed")
SMALL_SHARE = 0.10  # NCCL GPU time under this share of the wall: tuning NCCL can buy little
MIN_WALL_S = 0.05   # a shorter window (first to latest collective) gives no rate or share: one kernel's lag swamps it


def bin_bounds(b: int) -> tuple[float, float]:
    """The [lo, hi) of bin b in ns (the edge bins also hold what is below 2^8 ns or above 2^34)."""
    octave, sub = OCT_LO + b // 8, b % 8
    lo = (1 << octave) * (1 + sub / 8)
    return lo, (1 << octave) * (1 + (sub + 1) / 8)


def quantile(hist: Mapping[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of a histogram, in ns, interpolated within its bin; None when empty."""
    total = sum(hist.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for b in sorted(hist):
        n = hist[b]
        if n <= 0:
            continue
        if seen + n >= rank:
            lo, hi = bin_bounds(b)
            return lo + (hi - lo) * ((rank - seen) / n)
        seen += n
    lo, hi = bin_bounds(max(hist))
    return hi


def bus_factor(func: str, nranks: int) -> float:
    """busbw / algbw per collective, as nccl-tests (v2.19.6 src/<coll>.cu GetBw): all-reduce
    2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, send/recv 1."""
    if nranks <= 1:
        return 0.0
    f = func.lower().replace("_", "")
    if f == "allreduce":
        return 2.0 * (nranks - 1) / nranks
    if f in ("allgather", "reducescatter", "alltoall", "gather", "scatter"):
        return (nranks - 1) / nranks
    return 1.0


def algo_bytes(func: str, nbytes: float, nranks: int) -> float:
    """The bytes nccl-tests' algbw divides by, from the profiler's (count x element size): NCCL's
    all-gather and reduce-scatter descriptors count one rank's part (research-15 §7, §8)."""
    f = func.lower().replace("_", "")
    return nbytes * nranks if f in ("allgather", "reducescatter") and nranks > 0 else nbytes


@dataclass
class Activity:
    """A communicator's comm_activity lines, merged (one rank)."""
    first_t: float | None = None
    last_t: float | None = None
    api_eager: int = 0
    api_captured: int = 0
    timing: str | None = None      # "gpu" | "off"
    flush_s: float | None = None
    last_reason: str | None = None  # "periodic" | "finalize" | "exit"
    last_flush_t: float | None = None
    flushes: int = 0

    def add(self, e: Mapping[str, Any]) -> None:
        for key in ("first_t", "last_t"):
            v = e.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                cur = getattr(self, key)
                setattr(self, key, v if cur is None else (min(cur, v) if key == "first_t" else max(cur, v)))
        for key in ("api_eager", "api_captured"):
            v = e.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                setattr(self, key, getattr(self, key) + v)
        if e.get("timing") in ("gpu", "off"):
            self.timing = e["timing"]
        if isinstance(e.get("flush_s"), (int, float)):
            self.flush_s = float(e["flush_s"])
        t = e.get("t")
        if isinstance(t, (int, float)) and (self.last_flush_t is None or t >= self.last_flush_t):
            self.last_flush_t, self.last_reason = float(t), e.get("reason")
        self.flushes += 1

    @property
    def ended(self) -> bool:
        """Its last line is a finalize or exit flush: nothing it ran is missing."""
        return self.last_reason in ("finalize", "exit")

    @property
    def wall_s(self) -> float | None:
        if self.first_t is None or self.last_t is None:
            return None
        return max(self.last_t - self.first_t, 0.0)


@dataclass
class CommTime:
    """One communicator (all its ranks the plugin saw) in time."""
    ident: str
    name: str | None
    ranks: list[int]
    nranks: int | None
    simulated: bool
    t: float = 0.0                                     # its creation (the earliest rank's)
    per_func: dict[str, dict[str, Any]] = field(default_factory=dict)
    modes: Counter = field(default_factory=Counter)    # collectives per mode, summed over ranks
    api: Counter = field(default_factory=Counter)      # CollApi calls: eager / captured (summed over ranks)
    timing: str | None = None                          # "gpu" where every rank had it on, "off", None (v4...)
    wall_s: float | None = None                        # per rank, mean: first to latest collective
    gpu_s: float | None = None                         # per rank, mean: GPU time of its collectives
    share: float | None = None                         # gpu_s / wall_s
    unflushed: list[int] = field(default_factory=list)  # ranks whose last flush was periodic (killed?)
    flush_s: float | None = None
    count: int = 0                                     # collectives, summed over ranks
    notes: list[str] = field(default_factory=list)

    @property
    def graphed(self) -> bool:
        return bool(self.modes["captured"] or self.modes["replayed"] or self.api["captured"])

    @property
    def eager_only(self) -> bool:
        return bool(self.modes["eager"]) and not self.graphed

    def to_json(self) -> dict[str, Any]:
        return {"communicator": self.ident, "name": self.name, "ranks": self.ranks, "nranks": self.nranks,
                "simulated": self.simulated, "timing": self.timing, "collectives": self.count,
                "modes": dict(self.modes), "api_calls": dict(self.api), "wall_s": _r(self.wall_s, 6),
                "gpu_s": _r(self.gpu_s, 9), "gpu_share": _r(self.share, 6), "per_func": self.per_func,
                "unflushed_ranks": self.unflushed, "flush_s": self.flush_s, "notes": self.notes}


def _r(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


def comm_times(comms: Iterable[Any]) -> list[CommTime]:
    """Per communicator group (CommView.group: all its ranks), the time figures; only communicators
    the profiler plugin counted collectives for."""
    groups: dict[str, list[Any]] = {}
    for c in comms:
        if c.activity is not None:
            groups.setdefault(c.group or f"{c.host}:{c.pid}:{c.ident}", []).append(c)
    out = []
    for key, cs in groups.items():
        out.append(_one(key, cs))
    return sorted(out, key=lambda t: (t.t, t.ident))


def _one(key: str, cs: list[Any]) -> CommTime:
    first = cs[0]
    ranks = sorted({c.rank for c in cs if c.rank is not None})
    nranks = first.nranks
    t = CommTime(first.comm_hash or first.group or first.ident, first.comm_name, ranks, nranks,
                 any(c.simulated for c in cs), min(c.t for c in cs))
    timings = {c.activity.timing for c in cs}
    t.timing = "gpu" if timings == {"gpu"} else ("off" if "off" in timings or "gpu" in timings else None)
    walls, gpus = [], []
    for c in cs:
        a = c.activity
        t.api["eager"] += a.api_eager
        t.api["captured"] += a.api_captured
        if not a.ended and c.rank is not None:
            t.unflushed.append(c.rank)
        t.flush_s = a.flush_s if a.flush_s is not None else t.flush_s
        if a.wall_s is not None:
            walls.append(a.wall_s)
        gpu_ns = 0
        for s in c.colls.values():
            t.count += s.count
            t.modes[s.mode or "unknown"] += s.count
            gpu_ns += s.gpu_ns
            f = t.per_func.setdefault(s.func, {"count": 0, "bytes_min": None, "bytes_max": None, "bytes_sum": 0,
                                               "gpu_count": 0, "gpu_ns": 0, "untimed": 0, "hist": Counter(),
                                               "algo_proto": Counter(), "modes": Counter()})
            f["count"] += s.count
            f["bytes_min"] = s.bytes_min if f["bytes_min"] is None else min(f["bytes_min"], s.bytes_min)
            f["bytes_max"] = s.bytes_max if f["bytes_max"] is None else max(f["bytes_max"], s.bytes_max)
            f["bytes_sum"] += s.bytes_sum
            f["gpu_count"] += s.gpu_count
            f["gpu_ns"] += s.gpu_ns
            f["untimed"] += s.untimed
            f["hist"].update(s.gpu_hist)
            f["algo_proto"][f"{s.algo}/{s.proto}"] += s.count
            f["modes"][s.mode or "unknown"] += s.count
        gpus.append(gpu_ns / 1e9)
    n = len(cs)
    t.wall_s = sum(walls) / len(walls) if walls else None
    if t.timing == "gpu":
        t.gpu_s = sum(gpus) / n
        t.share = t.gpu_s / t.wall_s if t.wall_s and t.wall_s >= MIN_WALL_S else None
    t.unflushed.sort()
    for name, f in t.per_func.items():
        hist = f.pop("hist")
        f["algo_proto"], f["modes"] = dict(f["algo_proto"]), dict(f["modes"])
        f["per_rank"] = f["count"] / n
        f["rate_per_s"] = f["per_rank"] / t.wall_s if t.wall_s and t.wall_s >= MIN_WALL_S else None
        f["gpu_median_ns"] = _r(quantile(hist, 0.5), 1)
        f["gpu_p90_ns"] = _r(quantile(hist, 0.9), 1)
        f["gpu_hist"] = sorted(hist.items())
        if f["gpu_count"] and f["gpu_ns"] and f["count"]:
            mean_bytes = f["bytes_sum"] / f["count"]
            algbw = algo_bytes(name, mean_bytes, nranks or 1) / (f["gpu_ns"] / f["gpu_count"])  # bytes/ns = GB/s
            f["algbw_gbs"], f["busbw_gbs"] = round(algbw, 3), round(algbw * bus_factor(name, nranks or 1), 3)
        else:
            f["algbw_gbs"] = f["busbw_gbs"] = None
    t.notes = _notes(t)
    return t


def _notes(t: CommTime) -> list[str]:
    notes = []
    if not t.count:
        return notes
    if t.modes["unknown"]:
        notes.append(f"launch mode unknown for {t.modes['unknown']} collective(s): no collective-API event tied them "
                     "to a call (NCCL 2.27's profiler v4 has none)")
    if t.modes["captured"] and t.timing != "gpu":
        notes.append("collectives captured into a CUDA graph show once, at capture: NCCL reports no replay of an "
                     "intra-node graph unless GPU timing is on (NCCLPROBE_GPU_TIMING=1)")
    if t.unflushed:
        every = f"{t.flush_s:g} s" if t.flush_s else "one flush interval"
        notes.append(f"rank(s) {ranges(t.unflushed)} ended without a final flush (killed?): their counts stop at "
                     f"their last periodic flush; at most the last {every} of collectives is missing")
    if t.share is not None and t.share > 1:
        notes.append("GPU time exceeds the wall: collectives overlap (several streams), or NCCL's kernels ran past "
                     "the latest collective's launch")
    untimed = sum(f["untimed"] for f in t.per_func.values())
    if t.timing == "gpu" and untimed:
        notes.append(f"{untimed} collective(s) got no complete GPU timing (channels unseen)")
    return notes


# ---- words -----------------------------------------------------------------------------------

FUNC_WORDS = {"allreduce": "all-reduce", "allgather": "all-gather", "reducescatter": "reduce-scatter",
              "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all-to-all", "send": "send", "recv": "recv"}


def func_words(func: str, n: float) -> str:
    word = FUNC_WORDS.get(func.lower().replace("_", ""), func)
    return word + ("s" if round(n) != 1 else "")


def size_words(n: float) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            v = n / div
            return f"{v:.0f} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{int(n)} B"


def percent(share: float) -> str:
    """0.0452 -> '4.5 %', 0.000452 -> '0.045 %'."""
    pct = 100 * share
    return f"{pct:.2g} %" if pct < 1 else f"{pct:.1f} %"


def size_range(lo: float, hi: float) -> str:
    """14 KB, 14-56 KB, 512 B-2 MB."""
    a, b = size_words(lo), size_words(hi)
    if a == b:
        return a
    if a.split(" ")[1] == b.split(" ")[1]:
        return f"{a.split(' ')[0]}-{b}"
    return f"{a}-{b}"


def duration_words(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def mode_words(modes: Mapping[str, int], api: Mapping[str, int]) -> str:
    total = sum(modes.values())
    if not total:
        return "launch unknown"
    named = {"eager": "eager", "captured": "captured into a CUDA graph", "replayed": "replayed from a CUDA graph",
             "unknown": "launch unknown"}
    short = {"eager": "eager", "captured": "graph captures", "replayed": "graph replays", "unknown": "launch unknown"}
    parts = [(k, n) for k, n in modes.items() if n and k in named]
    if len(parts) == 1:
        return named[parts[0][0]]
    return ", ".join(f"{100 * n / total:.0f} % {short[k]}" for k, n in sorted(parts, key=lambda p: -p[1]))


def time_line(t: CommTime, label: str) -> str:
    """`verify comm (ranks 0-7): 122 all-reduces per second of wall of 14-56 KB, eager, 4.1 ms GPU time
    per 100 ms wall (4 %)`."""
    if not t.count:
        why = ("a one-rank communicator takes NCCL's shortcut: NCCL reports none of its collectives"
               if t.nranks == 1 else "none ran, or NCCL reported none")
        return f"{label}: no collective reported ({why})" + (" [simulated]" if t.simulated else "")
    parts = []
    for func, f in sorted(t.per_func.items(), key=lambda kv: -kv[1]["count"]):
        sizes = size_range(f["bytes_min"] or 0, f["bytes_max"] or 0)
        if f["rate_per_s"] is not None:
            parts.append(f"{f['rate_per_s']:.0f} {func_words(func, f['rate_per_s'])} per second of wall of {sizes}")
        else:
            parts.append(f"{f['per_rank']:.0f} {func_words(func, f['per_rank'])} of {sizes}")
    text = f"{label}: " + "; ".join(parts) + ", " + mode_words(t.modes, t.api)
    if t.timing == "gpu" and t.share is not None:
        text += f", {duration_words(t.share * 1e8)} GPU per 100 ms wall ({percent(t.share)})"
    elif t.timing == "gpu":
        text += (f", {duration_words((t.gpu_s or 0) * 1e9)} GPU time in {duration_words((t.wall_s or 0) * 1e9)} "
                 f"(too short a window for a share)")
    else:
        text += "; GPU time not measured (ncclprobe run --gpu-timing)"
    if t.simulated:
        text += " [simulated]"
    return text
