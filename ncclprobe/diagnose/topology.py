"""Topology rules: which GPU pairs NCCL will not use P2P between, and LL128 forced where there is no
NVLink. Pure functions over link-type matrices (as `nvidia-smi topo -m` prints them); no NVML here."""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ncclprobe.diagnose.findings import Finding

# Link types from closest to farthest. NV# (any NVLink count) is closest. nvidia-smi's NODE (across
# host bridges of one NUMA node) is what NCCL calls PATH_PHB; SYS crosses the inter-socket link.
LINK_ORDER = ("X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS")
# NCCL_P2P_LEVEL accepts names or the legacy integers 0..5 (src/graph/paths.cc ncclGetLevel).
P2P_LEVEL_NAMES = {"LOC": "X", "NVL": "NV", "PIX": "PIX", "PXB": "PXB", "PHB": "NODE", "SYS": "SYS"}
P2P_LEVEL_INTS = {"0": "X", "1": "PIX", "2": "PXB", "3": "NODE", "4": "SYS", "5": "SYS"}
DEFAULT_P2P_LEVEL = "PXB"  # PATH_PXB by default (src/graph/paths.cc)
_FALSE = ("", "0", "false", "no", "off")


def link_rank(link: str) -> int:
    """Position of a link type in LINK_ORDER ('NV12' counts as 'NV'); unknown types count as SYS."""
    if link.startswith("NV"):
        return LINK_ORDER.index("NV")
    return LINK_ORDER.index(link) if link in LINK_ORDER else LINK_ORDER.index("SYS")


def p2p_level(env: Mapping[str, str]) -> tuple[str, str]:
    """(the farthest link type NCCL still uses P2P over, where that came from)."""
    if env.get("NCCL_P2P_DISABLE", "").strip().lower() not in _FALSE:
        return "X", "NCCL_P2P_DISABLE"
    raw = env.get("NCCL_P2P_LEVEL", "").strip().upper()
    if raw in P2P_LEVEL_NAMES:
        return P2P_LEVEL_NAMES[raw], f"NCCL_P2P_LEVEL={raw}"
    if raw in P2P_LEVEL_INTS:
        return P2P_LEVEL_INTS[raw], f"NCCL_P2P_LEVEL={raw}"
    return P2P_LEVEL_NAMES[DEFAULT_P2P_LEVEL], f"NCCL default ({DEFAULT_P2P_LEVEL})"


def shm_pairs(links: Sequence[Sequence[str]], p2p_read: Sequence[Sequence[str]] | None,
              env: Mapping[str, str]) -> list[tuple[int, int, str]]:
    """GPU pairs (i<j) where NCCL falls back to SHM through host memory, with the reason."""
    limit, _ = p2p_level(env)
    out = []
    n = len(links)
    for i in range(n):
        for j in range(i + 1, n):
            link = links[i][j]
            if not link or link == "?":
                continue
            if link_rank(link) > link_rank(limit):
                out.append((i, j, f"{link} is beyond the P2P level"))
            elif p2p_read is not None and p2p_read[i][j] not in ("OK", "X", "?"):
                # NVML's P2P status can veto P2P whatever the level (e.g. GeForce without P2P).
                out.append((i, j, f"NVML P2P read status {p2p_read[i][j]}"))
    return out


def p2p_level_findings(links, p2p_read, env: Mapping[str, str]) -> list[Finding]:
    pairs = shm_pairs(links, p2p_read, env)
    if not pairs:
        return []
    _, source = p2p_level(env)
    shown = ", ".join(f"GPU{i}-GPU{j} ({why})" for i, j, why in pairs[:8])
    more = f" and {len(pairs) - 8} more" if len(pairs) > 8 else ""
    return [Finding(
        "P2P_LEVEL_LIMITS", "warning",
        f"{len(pairs)} GPU pair(s) will not use P2P under {source}: NCCL moves their data through "
        f"host memory (SHM) instead",
        var="NCCL_P2P_LEVEL",
        evidence={"pairs": shown + more, "p2p_level": source},
        hint="measure NCCL_P2P_LEVEL=SYS before adopting it: `ncclprobe bench --config "
             "p2psys:NCCL_P2P_LEVEL=SYS` (CPUs make poor PCI switches, NVIDIA/nccl#1603); AMD CPUs "
             "with at most 2 GPUs get P2P across PHB/SYS anyway")]


def forces_ll128(proto_value: str | None) -> bool:
    """True when NCCL_PROTO enables LL128 explicitly, which bypasses NCCL's NVLink-only check
    (src/graph/tuning.cc enables LL128 by default only when typeIntra <= PATH_NVB)."""
    if not proto_value:
        return False
    value = proto_value.strip()
    if value.startswith("^"):
        return False
    return any(tok.strip().lower() == "ll128" for tok in re.split(r"[,;:]", value))


def pairs_without_nvlink(links: Sequence[Sequence[str]]) -> list[tuple[int, int, str]]:
    n = len(links)
    return [(i, j, links[i][j]) for i in range(n) for j in range(i + 1, n)
            if links[i][j] and links[i][j] != "?" and not links[i][j].startswith("NV")]


def ll128_findings(links, proto_value: str | None, where: str) -> list[Finding]:
    """LL128_ON_PCIE when NCCL_PROTO forces LL128 and some GPU pair has no NVLink."""
    if not forces_ll128(proto_value):
        return []
    pairs = pairs_without_nvlink(links)
    if not pairs:
        return []
    shown = ", ".join(f"GPU{i}-GPU{j} ({link})" for i, j, link in pairs[:8])
    return [Finding(
        "LL128_ON_PCIE", "error",
        f"NCCL_PROTO={proto_value} ({where}) forces LL128, but {len(pairs)} GPU pair(s) have no NVLink: "
        f"LL128 relies on 128-byte stores arriving in order, which PCIe does not guarantee",
        var="NCCL_PROTO",
        evidence={"pairs": shown, "where": where},
        hint="drop LL128 from NCCL_PROTO (e.g. NCCL_PROTO=LL,Simple); if it must stay, validate every "
             "result (`ncclprobe bench --check`), since NCCL's docs warn it can corrupt data")]
