"""The GPU interconnect as NCCL will see it, read through NVML (the only NVML importer).

Collectors return frozen dataclasses; missing data is a value with a reason (gpustat/nvitop style):
the NVML init error is stored once, a GPU that cannot be read is a placeholder row, and a field the
driver does not support is `Missing("not supported")`, drawn as N/A. The NVML module is a parameter
(`nvml=`), or the module-level hook `NVML_LOADER`, so tests run on fake scenarios.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from ncclprobe.diagnose import topology as rules
from ncclprobe.doc import Result, Table, Text, Title, Unexaminable

# nvml.h values (stable ABI), so a fake NVML needs only functions and an error class with `.value`.
ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_GPU_IS_LOST, ERROR_FUNCTION_NOT_FOUND = 3, 4, 15, 13
TOPOLOGY_NAMES = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
P2P_CAPS_READ, P2P_CAPS_WRITE = 0, 1
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "RKD", 5: "NS", 6: "U"}
NVLINK_MAX_LINKS = 18
LEGEND = ("X = self, NV# = # NVLinks, PIX = one PCIe bridge, PXB = several PCIe bridges, "
          "PHB = a PCIe host bridge (CPU), NODE = host bridges within a NUMA node, SYS = across NUMA "
          "nodes (SMP interconnect); P2P: OK, CNS/GNS/TNS = chipset/GPU/topology not supported, "
          "RKD = disabled by registry key, NS = not supported, U = unknown, ? = could not be read")


def _load_pynvml():
    import pynvml  # nvidia-ml-py; imported only when topo or bench runs
    return pynvml


NVML_LOADER: Callable[[], Any] = _load_pynvml


@dataclass(frozen=True)
class Missing:
    """A value NVML could not give, and why."""
    reason: str

    def __str__(self) -> str:
        return "N/A"


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str | Missing
    bus_id: str | Missing
    numa_node: int | Missing
    pcie_gen: int | Missing
    pcie_gen_max: int | Missing
    pcie_width: int | Missing
    pcie_width_max: int | Missing
    lost: str = ""  # non-empty: the GPU could not be opened at all (placeholder row)


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...] = ()
    links: tuple[tuple[str, ...], ...] = ()
    p2p_read: tuple[tuple[str, ...], ...] = ()
    p2p_write: tuple[tuple[str, ...], ...] = ()
    driver: str | Missing = Missing("NVML not initialised")
    reason: str = ""  # non-empty: NVML unavailable, nothing else is filled

    @property
    def available(self) -> bool:
        return not self.reason

    def to_json(self) -> dict[str, Any]:
        def plain(v):
            return None if isinstance(v, Missing) else v

        gpus = []
        for g in self.gpus:
            d = {f.name: plain(getattr(g, f.name)) for f in fields(g)}
            d["unavailable"] = {f.name: getattr(g, f.name).reason for f in fields(g)
                                if isinstance(getattr(g, f.name), Missing)}
            gpus.append(d)
        return {"available": self.available, "reason": self.reason or None, "driver": plain(self.driver),
                "gpus": gpus, "links": [list(r) for r in self.links],
                "p2p_read": [list(r) for r in self.p2p_read], "p2p_write": [list(r) for r in self.p2p_write]}


def _reason(exc: BaseException) -> str:
    value = getattr(exc, "value", None)
    if value == ERROR_NOT_SUPPORTED:
        return "not supported"
    if value == ERROR_NO_PERMISSION:
        return "no permission"
    if value == ERROR_GPU_IS_LOST:
        return "GPU is lost"
    if isinstance(exc, AttributeError) or value == ERROR_FUNCTION_NOT_FOUND:
        return "not in this NVML"
    return str(exc) or type(exc).__name__


def _text(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class _Session:
    """One NVML session: calls that fail become Missing values instead of exceptions."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.error = getattr(nvml, "NVMLError", Exception)

    def get(self, fn: str, *args):
        try:
            return getattr(self.nvml, fn)(*args)
        except (self.error, AttributeError) as exc:
            return Missing(_reason(exc))


def _open(nvml) -> tuple[_Session | None, str]:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, OSError from ctypes...
        return None, f"NVML unavailable: {_reason(exc)}"
    return _Session(nvml), ""


def _numa_from_sysfs(bus_id: str, sys_root: Path) -> int | Missing:
    # NVML bus ids have an 8-digit domain ("00000000:17:00.0"); sysfs uses 4 and lower case.
    dom, _, rest = bus_id.partition(":")
    path = sys_root / "bus" / "pci" / "devices" / f"{dom[-4:]}:{rest}".lower() / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return Missing("not supported")
    return node if node >= 0 else Missing("no NUMA affinity")


def _gpu(s: _Session, i: int, sys_root: Path):
    handle = s.get("nvmlDeviceGetHandleByIndex", i)
    if isinstance(handle, Missing):
        lost = Missing(handle.reason)
        return None, Gpu(i, lost, lost, lost, lost, lost, lost, lost, lost=handle.reason)
    name = s.get("nvmlDeviceGetName", handle)
    pci = s.get("nvmlDeviceGetPciInfo", handle)
    bus_id = pci if isinstance(pci, Missing) else _text(getattr(pci, "busId", "")) or Missing("not supported")
    numa = s.get("nvmlDeviceGetNumaNodeId", handle)
    if isinstance(numa, Missing) and isinstance(bus_id, str):
        numa = _numa_from_sysfs(bus_id, sys_root)
    return handle, Gpu(
        index=i, name=name if isinstance(name, Missing) else _text(name), bus_id=bus_id, numa_node=numa,
        pcie_gen=s.get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_gen_max=s.get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        pcie_width=s.get("nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_width_max=s.get("nvmlDeviceGetMaxPcieLinkWidth", handle))


def _nvlinks(s: _Session, handle, bus_ids: dict[str, int]) -> tuple[dict[int, int], int]:
    """(active NVLinks to each peer GPU index, active NVLinks to anything else: an NVSwitch)."""
    peers: dict[int, int] = {}
    switch = 0
    for link in range(NVLINK_MAX_LINKS):
        state = s.get("nvmlDeviceGetNvLinkState", handle, link)
        if isinstance(state, Missing):
            if state.reason != "not supported":
                continue
            break  # no NVLink on this GPU, or no more links
        if state != 1:
            continue
        remote = s.get("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        rid = None if isinstance(remote, Missing) else _text(getattr(remote, "busId", "")).lower()
        if rid in bus_ids:
            peers[bus_ids[rid]] = peers.get(bus_ids[rid], 0) + 1
        else:
            switch += 1
    return peers, switch


def collect(nvml=None, sys_root: Path = Path("/sys")) -> Topology:
    """Read the topology; never raises for NVML trouble (the reason is in the result)."""
    try:
        nvml = nvml if nvml is not None else NVML_LOADER()
    except ImportError as exc:
        return Topology(reason=f"nvidia-ml-py is not installed ({exc})")
    s, reason = _open(nvml)
    if s is None:
        return Topology(reason=reason)
    try:
        count = s.get("nvmlDeviceGetCount")
        if isinstance(count, Missing):
            return Topology(reason=f"NVML cannot count GPUs: {count.reason}")
        driver = s.get("nvmlSystemGetDriverVersion")
        driver = driver if isinstance(driver, Missing) else _text(driver)
        handles, gpus = [], []
        for i in range(count):
            h, g = _gpu(s, i, sys_root)
            handles.append(h)
            gpus.append(g)
        bus_ids = {g.bus_id.lower(): g.index for g in gpus if isinstance(g.bus_id, str)}
        nv = [_nvlinks(s, h, bus_ids) if h is not None else ({}, 0) for h in handles]
        links, p2p_r, p2p_w = [], [], []
        for i in range(count):
            row, rrow, wrow = [], [], []
            for j in range(count):
                if i == j:
                    row.append("X"), rrow.append("X"), wrow.append("X")
                    continue
                if handles[i] is None or handles[j] is None:
                    row.append("?"), rrow.append("?"), wrow.append("?")
                    continue
                direct = nv[i][0].get(j, 0)
                via_switch = min(nv[i][1], nv[j][1])
                if direct or via_switch:
                    row.append(f"NV{direct or via_switch}")
                else:
                    anc = s.get("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
                    row.append("?" if isinstance(anc, Missing) else TOPOLOGY_NAMES.get(anc, "?"))
                for caps, out in ((P2P_CAPS_READ, rrow), (P2P_CAPS_WRITE, wrow)):
                    st = s.get("nvmlDeviceGetP2PStatus", handles[i], handles[j], caps)
                    out.append("?" if isinstance(st, Missing) else P2P_STATUS.get(st, "U"))
            links.append(tuple(row)), p2p_r.append(tuple(rrow)), p2p_w.append(tuple(wrow))
        return Topology(tuple(gpus), tuple(links), tuple(p2p_r), tuple(p2p_w), driver=driver)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # shutting down a half-initialised NVML must not hide the result
            pass


def findings(topo: Topology, env: Mapping[str, str], where: str = "this environment"):
    """P2P_LEVEL_LIMITS and LL128_ON_PCIE for this topology under env."""
    if not topo.available:
        return []
    return (rules.p2p_level_findings(topo.links, topo.p2p_read, env)
            + rules.ll128_findings(topo.links, env.get("NCCL_PROTO"), where))


def _pcie(cur, top) -> str:
    return f"{cur}/{top}" if not (isinstance(cur, Missing) and isinstance(top, Missing)) else "N/A"


def _below_max(gpus, field: str) -> list[str]:
    """GPUs whose current PCIe `field` (pcie_gen, pcie_width) reads lower than its maximum."""
    return [f"GPU{g.index}" for g in gpus if isinstance(getattr(g, field), int)
            and isinstance(getattr(g, field + "_max"), int) and getattr(g, field) < getattr(g, field + "_max")]


def document(topo: Topology, env: Mapping[str, str]) -> list:
    """Title, GPU table, link matrix, P2P matrices and what NCCL's P2P level implies."""
    doc: list = [Title(f"GPU topology (NVML, driver {topo.driver})")]
    rows = []
    for g in topo.gpus:
        if g.lost:
            rows.append([f"GPU{g.index}", f"(unreadable: {g.lost})", "", "", "", ""])
            continue
        rows.append([f"GPU{g.index}", str(g.name), str(g.bus_id), str(g.numa_node),
                     _pcie(g.pcie_gen, g.pcie_gen_max), _pcie(g.pcie_width, g.pcie_width_max)])
    doc.append(Table(["GPU", "name", "bus id", "NUMA", "PCIe gen now/max", "width now/max"], rows))
    gen, width = _below_max(topo.gpus, "pcie_gen"), _below_max(topo.gpus, "pcie_width")
    if gen:
        doc.append(Text(f"PCIe generation below its maximum on {', '.join(gen)}: GPUs lower it while idle, so "
                        f"this alone is not a degraded link; read it again under load.", "note"))
    if width:
        doc.append(Text(f"PCIe width below its maximum on {', '.join(width)}: the slot, a riser or a "
                        f"power state can narrow it; read it again under load before blaming the slot.", "note"))
    if len(topo.gpus) < 2:
        # A 1x1 matrix holds only "X": nothing to show, and nothing to claim beyond this node.
        doc.append(Text("One GPU on this node: there are no GPU pairs here, so no NVLink/PCIe path or P2P "
                        "question between GPUs. This view reads only this node's GPUs, not the network "
                        "(NICs, GPUDirect RDMA) a multi-node job's NCCL traffic would take.", "note"))
        return doc
    names = [f"GPU{g.index}" for g in topo.gpus]
    for title, matrix in (("Links, as nvidia-smi topo -m", topo.links),
                          ("P2P read status (nvmlDeviceGetP2PStatus)", topo.p2p_read),
                          ("P2P write status", topo.p2p_write)):
        doc.append(Text(title))
        doc.append(Table([""] + names, [[names[i]] + list(r) for i, r in enumerate(matrix)]))
    doc.append(Text(LEGEND, "dim"))
    _, source = rules.p2p_level(env)
    pairs = rules.shm_pairs(topo.links, topo.p2p_read, env)
    unread = sum(1 for i, r in enumerate(topo.links) for j, v in enumerate(r) if i < j and v == "?")
    unread_note = f" ({unread} pair(s) could not be read)" if unread else ""
    if pairs:
        doc.append(Text(f"P2P level {source}: {len(pairs)} pair(s) go through host memory (SHM){unread_note}.",
                        "warn"))
    else:
        doc.append(Text(f"P2P level {source}: every readable GPU pair uses P2P{unread_note}.",
                        "good" if not unread else "warn"))
    return doc


def topo_command(nvml=None, env: Mapping[str, str] | None = None, sys_root: Path = Path("/sys")) -> Result:
    env = os.environ if env is None else env
    topo = collect(nvml, sys_root)
    if not topo.available:
        raise Unexaminable(f"cannot read the GPU topology: {topo.reason}", "no NVML",
                           {"hint": "run on a machine with an NVIDIA driver (nvidia-smi must work)",
                            "topology": topo.to_json()})
    if not topo.gpus:
        raise Unexaminable("NVML reports no GPU", "no GPU", {"topology": topo.to_json()})
    _, source = rules.p2p_level(env)
    data = {"topology": topo.to_json(), "p2p_level": source,
            "shm_pairs": [[i, j, why] for i, j, why in rules.shm_pairs(topo.links, topo.p2p_read, env)]}
    return Result("topo", findings=findings(topo, env), data=data, doc=document(topo, env))


def process_gpus(nvml=None) -> tuple[dict[int, list[int]], str]:
    """pid -> indices of the GPUs it runs on (compute and graphics contexts), and a reason when NVML
    could not say ('' when it could). Used by `inspect`."""
    try:
        nvml = nvml if nvml is not None else NVML_LOADER()
    except ImportError as exc:
        return {}, f"nvidia-ml-py is not installed ({exc})"
    s, reason = _open(nvml)
    if s is None:
        return {}, reason
    out: dict[int, set[int]] = {}
    problems = []
    try:
        count = s.get("nvmlDeviceGetCount")
        if isinstance(count, Missing):
            return {}, f"NVML cannot count GPUs: {count.reason}"
        for i in range(count):
            handle = s.get("nvmlDeviceGetHandleByIndex", i)
            if isinstance(handle, Missing):
                problems.append(f"GPU{i}: {handle.reason}")
                continue
            for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                procs = s.get(fn, handle)
                if isinstance(procs, Missing):
                    if procs.reason != "not supported":
                        problems.append(f"GPU{i} {fn[len('nvmlDeviceGet'):]}: {procs.reason}")
                    continue
                for p in procs:
                    out.setdefault(int(p.pid), set()).add(i)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # see collect()
            pass
    return {pid: sorted(ix) for pid, ix in out.items()}, "; ".join(problems)


__all__ = ["Gpu", "Missing", "Topology", "collect", "document", "findings", "process_gpus", "topo_command",
           "NVML_LOADER"]
