"""`ncclprobe topo` on fake-NVML scenarios (ok, no NVML, a GPU lost, fields not supported), compared as
whole rendered text at a fixed width, gpustat style; plus process_gpus and the pure topology rules."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from fake_nvml import LIBRARY_NOT_FOUND, FakeNvml, lost_scenario, not_supported_scenario, nvlink_pair, pcie_box
from ncclprobe import render, topo
from ncclprobe.cli import main
from ncclprobe.diagnose import topology as rules
from ncclprobe.doc import Unexaminable


def rendered(nvml, env=None, sys_root=Path("/nonexistent")) -> str:
    result = topo.topo_command(nvml, env or {}, sys_root)
    out = io.StringIO()
    render.render_text(result, out, width=100, color=False)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"




GOLDEN_OK = """\
GPU topology (NVML, driver 570.86.15)
+---------------------------------------------------------------------------------+
| GPU  | name        | bus id           | NUMA | PCIe gen now/max | width now/max |
|------+-------------+------------------+------+------------------+---------------|
| GPU0 | NVIDIA L40S | 00000000:17:00.0 | 0    | 4/4              | 16/16         |
| GPU1 | NVIDIA L40S | 00000000:37:00.0 | 0    | 4/4              | 16/16         |
| GPU2 | NVIDIA L40S | 00000000:57:00.0 | 1    | 4/4              | 16/16         |
| GPU3 | NVIDIA L40S | 00000000:77:00.0 | 1    | 4/4              | 16/16         |
+---------------------------------------------------------------------------------+
Links, as nvidia-smi topo -m
+----------------------------------+
|      | GPU0 | GPU1 | GPU2 | GPU3 |
|------+------+------+------+------|
| GPU0 | X    | PIX  | SYS  | SYS  |
| GPU1 | PIX  | X    | SYS  | SYS  |
| GPU2 | SYS  | SYS  | X    | PIX  |
| GPU3 | SYS  | SYS  | PIX  | X    |
+----------------------------------+
P2P read status (nvmlDeviceGetP2PStatus)
+----------------------------------+
|      | GPU0 | GPU1 | GPU2 | GPU3 |
|------+------+------+------+------|
| GPU0 | X    | OK   | CNS  | CNS  |
| GPU1 | OK   | X    | CNS  | CNS  |
| GPU2 | CNS  | CNS  | X    | OK   |
| GPU3 | CNS  | CNS  | OK   | X    |
+----------------------------------+
P2P write status
+----------------------------------+
|      | GPU0 | GPU1 | GPU2 | GPU3 |
|------+------+------+------+------|
| GPU0 | X    | OK   | CNS  | CNS  |
| GPU1 | OK   | X    | CNS  | CNS  |
| GPU2 | CNS  | CNS  | X    | OK   |
| GPU3 | CNS  | CNS  | OK   | X    |
+----------------------------------+
X = self, NV# = # NVLinks, PIX = one PCIe bridge, PXB = several PCIe bridges, PHB = a PCIe host
bridge (CPU), NODE = host bridges within a NUMA node, SYS = across NUMA nodes (SMP interconnect);
P2P: OK, CNS/GNS/TNS = chipset/GPU/topology not supported, RKD = disabled by registry key, NS = not
supported, U = unknown, ? = could not be read
P2P level NCCL default (PXB): 4 pair(s) go through host memory (SHM).

Findings (1 cause)
[WARNING] P2P_LEVEL_LIMITS: 4 GPU pair(s) will not use P2P under NCCL default (PXB): NCCL moves
their data through host memory (SHM) instead
    pairs: GPU0-GPU2 (SYS is beyond the P2P level), GPU0-GPU3 (SYS is beyond the P2P level),
    GPU1-GPU2 (SYS is beyond the P2P level), GPU1-GPU3 (SYS is beyond the P2P level)
    hint: measure NCCL_P2P_LEVEL=SYS before adopting it: `ncclprobe bench --config
    p2psys:NCCL_P2P_LEVEL=SYS` (CPUs make poor PCI switches, NVIDIA/nccl#1603); AMD CPUs with at
    most 2 GPUs get P2P across PHB/SYS anyway
"""

GOLDEN_LOST = """\
GPU topology (NVML, driver 570.86.15)
+-----------------------------------------------------------------------------------------------+
| GPU  | name                      | bus id           | NUMA | PCIe gen now/max | width now/max |
|------+---------------------------+------------------+------+------------------+---------------|
| GPU0 | NVIDIA H200               | 00000000:18:00.0 | 0    | 1/5              | 16/16         |
| GPU1 | (unreadable: GPU is lost) |                  |      |                  |               |
+-----------------------------------------------------------------------------------------------+
PCIe generation below its maximum on GPU0: GPUs lower it while idle, so this alone is not a degraded
link; read it again under load.
Links, as nvidia-smi topo -m
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | ?    |
| GPU1 | ?    | X    |
+--------------------+
P2P read status (nvmlDeviceGetP2PStatus)
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | ?    |
| GPU1 | ?    | X    |
+--------------------+
P2P write status
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | ?    |
| GPU1 | ?    | X    |
+--------------------+
X = self, NV# = # NVLinks, PIX = one PCIe bridge, PXB = several PCIe bridges, PHB = a PCIe host
bridge (CPU), NODE = host bridges within a NUMA node, SYS = across NUMA nodes (SMP interconnect);
P2P: OK, CNS/GNS/TNS = chipset/GPU/topology not supported, RKD = disabled by registry key, NS = not
supported, U = unknown, ? = could not be read
P2P level NCCL default (PXB): every readable GPU pair uses P2P (1 pair(s) could not be read).

No findings.
"""

GOLDEN_NOT_SUPPORTED = """\
GPU topology (NVML, driver 570.86.15)
+---------------------------------------------------------------------------------+
| GPU  | name        | bus id           | NUMA | PCIe gen now/max | width now/max |
|------+-------------+------------------+------+------------------+---------------|
| GPU0 | NVIDIA H200 | 00000000:18:00.0 | N/A  | 1/N/A            | 16/16         |
| GPU1 | NVIDIA H200 | 00000000:2A:00.0 | 0    | 1/5              | 16/16         |
+---------------------------------------------------------------------------------+
PCIe generation below its maximum on GPU1: GPUs lower it while idle, so this alone is not a degraded
link; read it again under load.
Links, as nvidia-smi topo -m
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | NODE |
| GPU1 | NODE | X    |
+--------------------+
P2P read status (nvmlDeviceGetP2PStatus)
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | OK   |
| GPU1 | OK   | X    |
+--------------------+
P2P write status
+--------------------+
|      | GPU0 | GPU1 |
|------+------+------|
| GPU0 | X    | OK   |
| GPU1 | OK   | X    |
+--------------------+
X = self, NV# = # NVLinks, PIX = one PCIe bridge, PXB = several PCIe bridges, PHB = a PCIe host
bridge (CPU), NODE = host bridges within a NUMA node, SYS = across NUMA nodes (SMP interconnect);
P2P: OK, CNS/GNS/TNS = chipset/GPU/topology not supported, RKD = disabled by registry key, NS = not
supported, U = unknown, ? = could not be read
P2P level NCCL default (PXB): 1 pair(s) go through host memory (SHM).

Findings (2 causes)
[ERROR] LL128_ON_PCIE: NCCL_PROTO=LL128 (this environment) forces LL128, but 1 GPU pair(s) have no
NVLink: LL128 relies on 128-byte stores arriving in order, which PCIe does not guarantee
    pairs: GPU0-GPU1 (NODE)
    hint: drop LL128 from NCCL_PROTO (e.g. NCCL_PROTO=LL,Simple); if it must stay, validate every
    result (`ncclprobe bench --check`), since NCCL's docs warn it can corrupt data
[WARNING] P2P_LEVEL_LIMITS: 1 GPU pair(s) will not use P2P under NCCL default (PXB): NCCL moves
their data through host memory (SHM) instead
    pairs: GPU0-GPU1 (NODE is beyond the P2P level)
    hint: measure NCCL_P2P_LEVEL=SYS before adopting it: `ncclprobe bench --config
    p2psys:NCCL_P2P_LEVEL=SYS` (CPUs make poor PCI switches, NVIDIA/nccl#1603); AMD CPUs with at
    most 2 GPUs get P2P across PHB/SYS anyway
"""


GOLDEN_ONE_GPU = """\
GPU topology (NVML, driver 570.86.15)
+---------------------------------------------------------------------------------+
| GPU  | name        | bus id           | NUMA | PCIe gen now/max | width now/max |
|------+-------------+------------------+------+------------------+---------------|
| GPU0 | NVIDIA H200 | 00000000:18:00.0 | 0    | 5/5              | 8/16          |
+---------------------------------------------------------------------------------+
PCIe width below its maximum on GPU0: the slot, a riser or a power state can narrow it; read it
again under load before blaming the slot.
One GPU on this node: there are no GPU pairs here, so no NVLink/PCIe path or P2P question between
GPUs. This view reads only this node's GPUs, not the network (NICs, GPUDirect RDMA) a multi-node
job's NCCL traffic would take.

No findings.
"""


def one_gpu_scenario() -> FakeNvml:
    nv = nvlink_pair()
    nv.gpus = nv.gpus[:1]
    nv.gpus[0].nvlinks = []
    nv.gpus[0].gen, nv.gpus[0].width = (5, 5), (8, 16)
    return nv


def test_one_gpu_golden_claims_nothing_about_pairs_or_the_network():
    """One GPU: no 1x1 matrices of 'X', no P2P-level verdict, no claim that NCCL has no link choice at
    all (a multi-node job's traffic takes the network, which NVML does not show); a narrowed PCIe link
    is pointed out without calling it a fault."""
    assert rendered(one_gpu_scenario(), {"NCCL_PROTO": "LL128"}) == GOLDEN_ONE_GPU


def test_ok_pcie_box_golden():
    assert rendered(pcie_box()) == GOLDEN_OK


def test_gpu_lost_is_a_placeholder_row_golden():
    assert rendered(lost_scenario()) == GOLDEN_LOST


def test_not_supported_fields_are_na_golden():
    assert rendered(not_supported_scenario(), {"NCCL_PROTO": "LL128"}) == GOLDEN_NOT_SUPPORTED


def test_nvlink_pair_with_ll128_has_no_finding():
    result = topo.topo_command(nvlink_pair(), {"NCCL_PROTO": "LL128"}, Path("/nonexistent"))
    assert result.findings == []
    assert result.data["topology"]["links"] == [["X", "NV18"], ["NV18", "X"]]


def test_no_nvml_raises_unexaminable_with_reason():
    with pytest.raises(Unexaminable) as err:
        topo.topo_command(FakeNvml([], init_error=LIBRARY_NOT_FOUND), {})
    assert "NVML Shared Library Not Found" in str(err.value)
    assert err.value.data["topology"]["available"] is False


def test_no_nvml_cli_exit_3_and_json_reason(monkeypatch):
    monkeypatch.setattr(topo, "NVML_LOADER", lambda: FakeNvml([], init_error=LIBRARY_NOT_FOUND))
    res = CliRunner().invoke(main, ["topo", "--json"])
    assert res.exit_code == 3
    doc = json.loads(res.output)
    assert doc["command"] == "topo" and doc["error"]["reason"] == "no_nvml"
    assert "NVML Shared Library Not Found" in doc["error"]["topology"]["reason"]


def test_cli_topo_json_ok(monkeypatch):
    monkeypatch.setattr(topo, "NVML_LOADER", pcie_box)
    res = CliRunner().invoke(main, ["topo", "--json"])
    assert res.exit_code == 0  # P2P_LEVEL_LIMITS is a warning
    doc = json.loads(res.output)
    assert [f["code"] for f in doc["findings"]] == ["P2P_LEVEL_LIMITS"]
    gpu0 = doc["topology"]["gpus"][0]
    assert gpu0["bus_id"] == "00000000:17:00.0" and gpu0["pcie_gen_max"] == 4 and gpu0["unavailable"] == {}
    assert doc["shm_pairs"][0] == [0, 2, "SYS is beyond the P2P level"]


def test_missing_field_json_carries_reason():
    data = topo.collect(not_supported_scenario(), Path("/nonexistent")).to_json()
    assert data["gpus"][0]["numa_node"] is None
    assert data["gpus"][0]["unavailable"] == {"numa_node": "not supported", "pcie_gen_max": "not supported"}


def test_numa_falls_back_to_sysfs(tmp_path):
    dev = tmp_path / "bus" / "pci" / "devices" / "0000:18:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    nv = nvlink_pair()
    nv.gpus[0].numa = None
    assert topo.collect(nv, tmp_path).gpus[0].numa_node == 1


def test_process_gpus_merges_compute_and_graphics():
    assert topo.process_gpus(pcie_box()) == ({4242: [0, 1], 4343: [1], 777: [3]}, "")


def test_process_gpus_without_nvml_gives_reason():
    pids, reason = topo.process_gpus(FakeNvml([], init_error=LIBRARY_NOT_FOUND))
    assert pids == {} and "NVML Shared Library Not Found" in reason


def test_process_gpus_lost_gpu_is_a_reason_not_an_exception():
    nv = pcie_box()
    nv.gpus[0].lost = True
    pids, reason = topo.process_gpus(nv)
    assert pids == {4242: [1], 4343: [1], 777: [3]} and reason == "GPU0: GPU is lost"


def test_nvml_is_shut_down_after_collect():
    nv = pcie_box()
    topo.collect(nv)
    assert nv.shutdowns == 1


@pytest.mark.parametrize("env,expected", [
    ({}, ("PXB", "NCCL default (PXB)")),
    ({"NCCL_P2P_LEVEL": "sys"}, ("SYS", "NCCL_P2P_LEVEL=SYS")),
    ({"NCCL_P2P_LEVEL": "PHB"}, ("NODE", "NCCL_P2P_LEVEL=PHB")),
    ({"NCCL_P2P_LEVEL": "2"}, ("PXB", "NCCL_P2P_LEVEL=2")),
    ({"NCCL_P2P_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS"}, ("X", "NCCL_P2P_DISABLE")),
])
def test_p2p_level_parsing(env, expected):
    assert rules.p2p_level(env) == expected


@pytest.mark.parametrize("value,forced", [
    ("LL128", True), ("LL,LL128,Simple", True), ("allreduce:ll128", True), ("^LL128", False),
    ("LL", False), ("Simple", False), (None, False), ("", False)])
def test_forces_ll128(value, forced):
    assert rules.forces_ll128(value) is forced


def test_p2p_level_sys_leaves_only_nvml_vetoes():
    links = [["X", "PHB"], ["PHB", "X"]]
    assert rules.shm_pairs(links, [["X", "OK"], ["OK", "X"]], {}) == [(0, 1, "PHB is beyond the P2P level")]
    assert rules.shm_pairs(links, [["X", "OK"], ["OK", "X"]], {"NCCL_P2P_LEVEL": "SYS"}) == []
    assert rules.shm_pairs(links, [["X", "GNS"], ["GNS", "X"]], {"NCCL_P2P_LEVEL": "SYS"}) == [
        (0, 1, "NVML P2P read status GNS")]
