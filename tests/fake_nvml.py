"""A fake NVML (the subset ncclprobe.topo calls) built from a scenario description, gpustat style."""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NOT_SUPPORTED, GPU_IS_LOST, LIBRARY_NOT_FOUND, INVALID_ARGUMENT = 3, 15, 12, 2
_MESSAGES = {NOT_SUPPORTED: "Not Supported", GPU_IS_LOST: "GPU is lost",
             LIBRARY_NOT_FOUND: "NVML Shared Library Not Found", INVALID_ARGUMENT: "Invalid Argument"}
_ANCESTOR = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(_MESSAGES.get(value, f"NVML error {value}"))
        self.value = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    bus_id: str = "00000000:17:00.0"
    numa: int | None = 0          # None: nvmlDeviceGetNumaNodeId not supported
    gen: tuple = (5, 5)           # current, max; None in a slot: not supported
    width: tuple = (16, 16)
    lost: bool = False
    nvlinks: list = field(default_factory=list)  # remote bus ids, one per active link
    procs: list = field(default_factory=list)    # compute pids
    gprocs: list = field(default_factory=list)   # graphics pids


class FakeNvml:
    def __init__(self, gpus, links=None, p2p=None, init_error: int | None = None, driver="570.86.15"):
        self.gpus = gpus
        self.links = links or {}   # (i, j) -> PIX|PXB|PHB|NODE|SYS
        self.p2p = p2p or {}       # (i, j) -> NVML P2P status (default 0 = OK)
        self.init_error = init_error
        self.driver = driver
        self.NVMLError = NVMLError
        self.shutdowns = 0

    def nvmlInit(self):
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].lost:
            raise NVMLError(GPU_IS_LOST)
        return i

    def nvmlDeviceGetName(self, h):
        return self.gpus[h].name

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self.gpus[h].bus_id.encode())

    def nvmlDeviceGetNumaNodeId(self, h):
        if self.gpus[h].numa is None:
            raise NVMLError(NOT_SUPPORTED)
        return self.gpus[h].numa

    def _slot(self, value):
        if value is None:
            raise NVMLError(NOT_SUPPORTED)
        return value

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._slot(self.gpus[h].gen[0])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._slot(self.gpus[h].gen[1])

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._slot(self.gpus[h].width[0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._slot(self.gpus[h].width[1])

    def nvmlDeviceGetNvLinkState(self, h, link):
        if not self.gpus[h].nvlinks:
            raise NVMLError(NOT_SUPPORTED)
        if link >= len(self.gpus[h].nvlinks):
            raise NVMLError(INVALID_ARGUMENT)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.gpus[h].nvlinks[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return _ANCESTOR[self.links.get((min(a, b), max(a, b)), "SYS")]

    def nvmlDeviceGetP2PStatus(self, a, b, caps):
        return self.p2p.get((min(a, b), max(a, b)), 0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in self.gpus[h].procs]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        if not self.gpus[h].gprocs:
            raise NVMLError(NOT_SUPPORTED)
        return [SimpleNamespace(pid=p, usedGpuMemory=None) for p in self.gpus[h].gprocs]


def bus(n: int) -> str:
    return f"00000000:{n:02X}:00.0"


def pcie_box() -> FakeNvml:
    """4 GPUs: 0,1 behind one PCIe switch and 2,3 behind another, on two sockets; P2P across the
    sockets reported as chipset-not-supported."""
    gpus = [FakeGpu(name="NVIDIA L40S", bus_id=bus(0x17 + 0x20 * i), numa=i // 2, gen=(4, 4),
                    width=(16, 16)) for i in range(4)]
    gpus[0].procs = [4242]
    gpus[1].procs = [4242, 4343]
    gpus[3].gprocs = [777]
    links = {(0, 1): "PIX", (2, 3): "PIX", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS"}
    p2p = {(0, 2): 1, (0, 3): 1, (1, 2): 1, (1, 3): 1}
    return FakeNvml(gpus, links, p2p)


def nvlink_pair() -> FakeNvml:
    """2 H200s with 18 NVLinks between them, PCIe Gen5 idle at Gen1 (power saving)."""
    a, b = bus(0x18), bus(0x2A)
    return FakeNvml([FakeGpu(bus_id=a, gen=(1, 5), nvlinks=[b.lower()] * 18),
                     FakeGpu(bus_id=b, numa=0, gen=(1, 5), nvlinks=[a.lower()] * 18)],
                    links={(0, 1): "NODE"})


def lost_scenario() -> FakeNvml:
    nv = nvlink_pair()
    nv.gpus[1].lost = True
    return nv


def not_supported_scenario() -> FakeNvml:
    nv = nvlink_pair()
    nv.gpus[0].numa = None
    nv.gpus[0].gen = (1, None)
    nv.gpus[0].nvlinks = []
    nv.gpus[1].nvlinks = []
    return nv
