"""NCCL_PROTO / NCCL_ALGO selectors as NCCL parses them, to check what a collective really ran.

Syntax (nccl src/graph/tuning.cc, docs env.rst): a comma list of names, case-insensitive; a leading
`^` excludes the listed names instead; since 2.24 a `;`-separated list of `function:list` entries
applies per collective (e.g. `allreduce:tree,ring;allgather:ring`), and functions not named keep all.
"""
from __future__ import annotations

# NCCL_* names NCCL never reads (container image labels): losing one at a spawn loses nothing
NOT_READ_BY_NCCL = frozenset({"NCCL_VERSION"})

PROTOS = ("LL", "LL128", "Simple")
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
_CANON = {n.lower(): n for n in PROTOS + ALGOS}


def canonical(name: str) -> str:
    """The NCCL_ALGO/NCCL_PROTO spelling of a name as NCCL prints it (RING, SIMPLE, COLLNET_DIRECT,
    NVLS_TREE in 2.24+ TUNING lines and profiler descriptors)."""
    return _CANON.get(name.replace("_", "").lower(), name)


def _names(text: str, universe: tuple[str, ...]) -> frozenset[str]:
    text = text.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    picked = {canonical(t.strip()) for t in text.split(",") if t.strip()}
    return frozenset(n for n in universe if n not in picked) if exclude else frozenset(picked)


def allowed(value: str | None, func: str, universe: tuple[str, ...]) -> frozenset[str] | None:
    """Names the selector allows for collective `func` (e.g. "AllReduce"); None = no constraint."""
    if value is None or not value.strip():
        return None
    if ":" not in value:
        return _names(value, universe)
    for entry in value.split(";"):
        if ":" not in entry:
            continue
        fn, lst = entry.split(":", 1)
        if fn.strip().lower() == func.lower():
            return _names(lst, universe)
    return None


def proto_allowed(value: str | None, func: str = "AllReduce") -> frozenset[str] | None:
    return allowed(value, func, PROTOS)


def algo_allowed(value: str | None, func: str = "AllReduce") -> frozenset[str] | None:
    return allowed(value, func, ALGOS)
