"""Which GPUs a trial runs on, placed by UUID or PCI bus id in nvidia-smi's topology: its interconnect label, its host
facts and the memory figure NVML gives for its own GPUs.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from pipeline.host import capabilities, topology
from pipeline.host.devices import Host
from tests.host.test_nvml import BUSES, TOPO, UUIDS, FakeNvml, cuda_view  # noqa: F401 (shared with test_nvml.py)


def _fixture(name):
    topo = (TOPO / f"{name}.topo.txt").read_text()
    table = (TOPO / f"{name}.gpus.csv").read_text()
    rows = [line.split(", ") for line in table.splitlines()]
    return topo, table, [r[1] for r in rows], [r[2] for r in rows]


@pytest.mark.parametrize(
    "name, visible, expected",
    [
        ("dgx_h100", [0, 1, 2, 3, 4, 5, 6, 7], "NV18"),
        ("dgx_h100", [6, 2], "NV18"),  # the NIC columns are not GPU links
        ("pcie_node_sys", [0, 1], "PIX"),
        ("pcie_node_sys", [1, 2], "NODE"),
        ("pcie_node_sys", [0, 3], "SYS"),
        ("pcie_node_sys", [0, 1, 2, 3], "SYS/NODE/PIX"),
        ("pcie8_pairs", [5, 4], "PIX"),  # an 8-GPU host with a 2-GPU CUDA_VISIBLE_DEVICES
        ("pcie8_pairs", [2, 5], "SYS"),
        ("pcie8_pairs", [7], "single GPU"),
    ],
)
def test_the_interconnect_covers_only_the_trials_gpus(monkeypatch, name, visible, expected):
    """topo -m numbers GPUs in PCI order whatever CUDA_VISIBLE_DEVICES holds: each CUDA ordinal is placed in the
    matrix by its UUID. Hand-written fixtures: a real capture is for a GPU host."""
    topo, table, uuids, buses = _fixture(name)
    cuda_view(monkeypatch, visible, uuids, buses)
    assert capabilities.trial_interconnect(range(len(visible)), topo, table) == expected


def test_a_mig_instance_is_placed_by_its_gpus_pci_bus_id(monkeypatch):
    """CUDA reports a MIG instance's own UUID, which no topo -m row carries: the instance is placed on its GPU's row
    by PCI bus id; two instances of one GPU share its memory, not a link."""
    topo, table, uuids, buses = _fixture("mig_a100")
    mig = "MIG-5c1f2a3b-0000-5e6f-8a9b-0c1d2e3f4a5b"
    cuda_view(monkeypatch, [1], uuids, buses, mig={0: mig})
    assert capabilities.trial_rows([0], table) == [1]
    assert capabilities.trial_interconnect([0], topo, table) == "single GPU"
    cuda_view(monkeypatch, [1, 1], uuids, buses, mig={0: mig, 1: mig.replace("5c1f", "6d20")})
    assert capabilities.trial_interconnect([0, 1], topo, table) == "same GPU"


def test_unplaceable_gpus_give_no_label(monkeypatch):
    """A GPU nvidia-smi does not list (another host's table, or no table at all): no interconnect is claimed."""
    topo, table, uuids, buses = _fixture("pcie8_pairs")
    other_uuids = [u.replace("GPU-", "GPU-f") for u in uuids]
    cuda_view(monkeypatch, [0, 1], other_uuids, [b.replace("00000000", "00000001") for b in buses])
    assert capabilities.trial_interconnect([0, 1], topo, table) is None
    cuda_view(monkeypatch, [0, 1], uuids, buses)
    assert capabilities.trial_interconnect([0, 1], topo, None) is None


def test_host_capabilities_label_the_visible_gpus_not_every_host_gpu(monkeypatch):
    """An 8-GPU PCIe host with CUDA_VISIBLE_DEVICES=4,5: the host's record says PIX (the pair's link), not the links
    of all eight GPUs. nvidia-smi and torch.cuda are stand-ins."""
    topo, table, uuids, buses = _fixture("pcie8_pairs")
    cuda_view(monkeypatch, [4, 5], uuids, buses)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (8, 9))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA L40S")
    monkeypatch.setattr(topology.shutil, "which", lambda name: "/usr/bin/nvidia-smi")

    def smi(cmd, **kw):
        out = topo if cmd[1:] == ["topo", "-m"] else table if any("--query-gpu" in c for c in cmd) else ""
        return subprocess.CompletedProcess(cmd, 0 if out else 6, out, "")

    monkeypatch.setattr(topology.subprocess, "run", smi)
    host = Host("cuda", 2, "NVIDIA L40S", "box", torch.__version__, "13.0")
    assert capabilities.host_capabilities(host)["interconnect"] == "PIX"
    assert capabilities.host_capabilities(host, devices=[1])["interconnect"] == "single GPU"


def test_the_memory_figure_asks_nvml_about_the_trials_gpus(monkeypatch):
    """G3/G7: the per-device "used memory as NVML sees it" (metrics.nvml_used_bytes) looks each CUDA device up as the
    monitor does, by its UUID: with CUDA_VISIBLE_DEVICES=3,1, cuda:0 and cuda:1 are physical GPUs 3 and 1, and an
    NVML error leaves the optional figure None. Intent only: the real driver's memory figures need a GPU."""
    from pipeline.measure import memory

    nvml = FakeNvml(UUIDS, BUSES)
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(h[1] + 1) * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cuda_view(monkeypatch, [3, 1])
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert memory.nvml_used_bytes(devices) == [4 * 2**30, 2 * 2**30]
    assert nvml.asked == [3, 1]
    nvml.fail.add("nvmlDeviceGetHandleByUUID")
    nvml.fail.add("nvmlDeviceGetHandleByPciBusId")
    assert memory.nvml_used_bytes(devices) is None


def test_a_trials_host_facts_describe_its_own_gpus(monkeypatch):
    """G17: the record's host facts of a k-GPU trial on a larger host are those of CUDA ordinals 0..k-1 (the trial's
    GPUs, devices.device_for), read once per device count; a CPU host has no ordinals to name. Intent only."""
    from pipeline.trial import launch

    asked = []
    monkeypatch.setattr(
        launch,
        "host_capabilities",
        lambda host, ordinals=None: asked.append(None if ordinals is None else list(ordinals)) or {"kind": host.kind},
    )
    monkeypatch.setattr(launch, "capability_fields", lambda caps: dict(caps))
    launch.host_fields.cache_clear()
    try:
        gpus = Host("cuda", 8, "NVIDIA H100", "node", torch.__version__, "12.8")
        launch.host_fields(gpus, 2)
        launch.host_fields(gpus, 2)
        launch.host_fields(gpus, 16)
        launch.host_fields(Host("cpu", 2, "cpu", "box", torch.__version__, ""), 2)
    finally:
        launch.host_fields.cache_clear()
    assert asked == [[0, 1], list(range(8)), None]
