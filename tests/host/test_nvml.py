"""NVML and nvidia-smi on a CPU host: which GPUs a trial's monitor and interconnect label describe, what an NVML error
does, and that the GPU is sampled while the trial runs.

Everything here is a contract test with fakes: a fake `pynvml` module in sys.modules, `torch.cuda`'s device
properties replaced by a stand-in that does what CUDA does with CUDA_VISIBLE_DEVICES (ordinal i is the i-th listed
GPU), and hand-written `nvidia-smi` outputs (tests/fixtures/topo/README.md). They check the intent (which handles are
asked for, which matrix rows are read, what degrades), not NVML's or CUDA's semantics: that the real driver returns
the same UUIDs to torch and NVML, what a MIG handle supports, and which PIDs NVML reports inside a container are for
a GPU host to show.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from pipeline.measure import interference
from pipeline.measure.interference import Monitor

TOPO = Path(__file__).parents[1] / "fixtures" / "topo"
NOT_A_PID = 2**22 + 5  # above Linux's largest pid_max: no process here has it (a PID from another namespace)
HW_THERMAL = 0x40


class NVMLError(Exception):
    pass


class FakeNvml(types.SimpleNamespace):
    """`pynvml` as far as the monitor uses it, over physical GPUs 0..n-1 (NVML's numbering, not CUDA's)."""

    NVML_CLOCK_SM = 1

    def __init__(self, uuids: list[str], buses: list[str]):
        super().__init__(
            NVMLError=NVMLError, uuids=uuids, buses=buses, fail=set(), asked=[], failed=[], phase="before", calls={}
        )
        self.procs = {}  # (phase, physical GPU) -> PIDs
        self.reasons = {}  # (phase, physical GPU) -> clock event reason bits
        self.sm = {}  # (phase, physical GPU) -> SM MHz

    def _call(self, name):
        self.calls[(self.phase, name)] = self.calls.get((self.phase, name), 0) + 1
        if name in self.fail:
            self.failed.append(name)
            raise NVMLError(f"{name}: Not Supported")

    def _handle(self, physical: int):
        self.asked.append(physical)
        return ("handle", physical)

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetHandleByIndex(self, i):  # NVML's index: PCI order, blind to CUDA_VISIBLE_DEVICES
        self._call("nvmlDeviceGetHandleByIndex")
        return self._handle(i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._call("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        if uuid in getattr(self, "migs", {}):  # a MIG instance's own handle: physical GPU migs[uuid]
            self.asked.append(self.migs[uuid])
            return ("mig", self.migs[uuid])
        if uuid not in self.uuids:
            raise NVMLError("Not Found")
        return self._handle(self.uuids.index(uuid))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h):
        self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return ("handle", h[1])

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self._call("nvmlDeviceGetHandleByPciBusId")
        bus = bus.decode() if isinstance(bus, bytes) else bus
        match = [i for i, b in enumerate(self.buses) if b.lower() == bus.lower()]
        if not match:
            raise NVMLError("Not Found")
        return self._handle(match[0])

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [types.SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in self.procs.get((self.phase, h[1]), [])]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._call("nvmlDeviceGetCurrentClocksEventReasons")
        return self.reasons.get((self.phase, h[1]), 0)

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._call("nvmlDeviceGetClockInfo")
        return self.sm.get((self.phase, h[1]), 1900 + h[1])


UUIDS = [f"GPU-0000000{i}-1111-2222-3333-44444444444{i}" for i in range(4)]
BUSES = [f"00000000:{b}:00.0" for b in ("1B", "43", "52", "61")]


def cuda_view(monkeypatch, visible: list[int], uuids=UUIDS, buses=BUSES, mig: dict | None = None):
    """torch.cuda as CUDA_VISIBLE_DEVICES=visible makes it: ordinal i is physical GPU visible[i]. `mig`: ordinal ->
    the MIG instance's UUID CUDA reports instead of its GPU's."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, visible)))

    def props(i):
        physical = visible[i]
        domain, bus, dev = (int(x, 16) for x in buses[physical].replace(".", ":").split(":")[:3])
        uuid = (mig or {}).get(i) or uuids[physical]
        return types.SimpleNamespace(
            uuid=uuid.split("-", 1)[1],
            pci_domain_id=domain,
            pci_bus_id=bus,
            pci_device_id=dev,
            name="NVIDIA H100",
            total_memory=80 * 2**30,
            multi_processor_count=132,
        )

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)


@pytest.fixture
def nvml(monkeypatch):
    fake = FakeNvml(UUIDS, BUSES)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(interference, "SAMPLE_INTERVAL_S", 0.01, raising=False)
    cuda_view(monkeypatch, [3, 1])
    return fake


def _wait_for(cond, what: str):
    """Wait until cond() holds (a bound on a hung test, not a timing assertion)."""
    deadline = time.monotonic() + 20
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


# ------------------------------------------------------------------------------------------------ G7: which GPUs


def test_nvml_is_asked_about_the_trials_gpus_not_the_cuda_ordinals(nvml):
    """CUDA_VISIBLE_DEVICES=3,1: CUDA ordinals 0 and 1 are NVML's GPUs 3 and 1. Proves the monitor asks NVML for
    those (by UUID) and reports them in ordinal order; a GPU host shows whether torch's and NVML's UUIDs agree."""
    with Monitor(2, "cuda", [0, 1]) as m:
        pass
    r = m.result()
    assert set(nvml.asked) == {3, 1}, f"NVML was asked about physical GPUs {sorted(set(nvml.asked))}"
    assert r["gpu_monitor"] == "nvml" and r["gpu_devices"] == [UUIDS[3], UUIDS[1]]
    assert r["gpu_sm_mhz_min"] == [1903, 1901]  # ordinal 0 is GPU 3
    assert "nvmlDeviceGetHandleByIndex" not in {name for _, name in nvml.calls}


def test_a_failed_uuid_lookup_falls_back_to_the_pci_bus_id(nvml):
    """Contract: where the UUID lookup fails, the PCI bus id from torch's device properties finds the same GPUs."""
    nvml.fail = {"nvmlDeviceGetHandleByUUID"}
    with Monitor(2, "cuda", [0, 1]) as m:
        pass
    r = m.result()
    assert set(nvml.asked) == {3, 1} and r["gpu_monitor"] == "nvml" and r["gpu_sm_mhz_min"] == [1903, 1901]


CALLS = [
    ("nvmlInit",),
    ("nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByPciBusId"),
    ("nvmlDeviceGetComputeRunningProcesses",),
    ("nvmlDeviceGetCurrentClocksEventReasons",),
    ("nvmlDeviceGetClockInfo",),
]


@pytest.mark.parametrize("calls", CALLS, ids=lambda c: c[-1])
def test_an_nvml_error_from_any_call_is_recorded_not_raised(nvml, calls):
    """An NVMLError (NotSupported or NoPermission under MIG or in a container) from each call the monitor makes:
    the trial is not failed, its record says `unavailable (the call: the error)`, and no GPU reason flags it."""
    nvml.fail = set(calls)
    with Monitor(2, "cuda", [0, 1], threshold=1e9) as m:
        pass
    r = m.result()
    assert r["gpu_monitor"].startswith("unavailable (") and calls[-1] in r["gpu_monitor"], r["gpu_monitor"]
    assert not r["interfered"]


def test_an_nvml_error_mid_trial_degrades_and_a_failing_shutdown_is_ignored(nvml):
    """An error first raised by a sample the background thread takes mid-trial ends that thread and is recorded;
    nvmlShutdown failing at the end changes nothing."""
    nvml.fail = {"nvmlShutdown"}
    with Monitor(2, "cuda", [0, 1]) as m:
        nvml.fail = {"nvmlShutdown", "nvmlDeviceGetClockInfo"}
        _wait_for(lambda: "nvmlDeviceGetClockInfo" in nvml.failed, "the sampler never sampled during the trial")
    assert m.result()["gpu_monitor"].startswith("unavailable (nvmlDeviceGetClockInfo")
    nvml.fail = {"nvmlShutdown"}
    with Monitor(2, "cuda", [0, 1]) as m:
        pass
    assert m.result()["gpu_monitor"] == "nvml"


@pytest.mark.parametrize("case", ["no pynvml", "torch"])
def test_no_pynvml_or_no_device_properties_degrade(nvml, monkeypatch, case):
    """No nvidia-ml-py installed, or torch unable to describe a device: recorded as unavailable, never raised."""
    if case == "no pynvml":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    else:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: (_ for _ in ()).throw(RuntimeError("x")))
    with Monitor(2, "cuda", [0, 1]) as m:
        pass
    assert m.result()["gpu_monitor"].startswith("unavailable (")


def test_a_mig_instance_is_asked_by_its_mig_uuid_and_clocked_by_its_gpu(nvml, monkeypatch):
    """CUDA_VISIBLE_DEVICES=MIG-...: CUDA reports the instance's UUID; NVML is asked for the "MIG-" handle (its
    processes) and the GPU's handle (clocks and reasons). What a real MIG handle supports is for a GPU host to show."""
    mig = "MIG-5c1f2a3b-0000-5e6f-8a9b-0c1d2e3f4a5b"
    nvml.migs = {mig: 2}
    cuda_view(monkeypatch, [2], mig={0: mig})
    with Monitor(1, "cuda", [0]) as m:
        pass
    r = m.result()
    assert r["gpu_monitor"] == "nvml" and r["gpu_devices"] == [mig] and r["gpu_sm_mhz_min"] == [1902]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_trials_own_processes_are_not_foreign_and_other_namespaces_are_not_attributed(nvml):
    """NVML lists this process and a child (the trial's own ranks), PID 1 (visible here: someone else's) and a PID
    from another PID namespace (a container sees the host's PIDs: its own ranks look like strangers). Proves only PID
    1 counts as foreign and the unmatched PID is recorded apart without flagging; what NVML reports inside a real
    container is for a GPU host to show."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for phase in ("before", "during", "after"):
            nvml.procs[(phase, 3)] = [os.getpid(), child.pid, NOT_A_PID]
            nvml.procs[(phase, 1)] = [child.pid, 1]
        with Monitor(2, "cuda", [0, 1], threshold=1e9) as m:
            pass
    finally:
        child.kill()
        child.wait()
    r = m.result()
    assert r["gpu_other_processes"] == 1 and r["gpu_unattributed_processes"] == 1
    assert r["interfered"] and "1 other process(es)" in r["interference_reason"]


# ------------------------------------------------------------------------------------------------ G8: during


def test_a_throttle_and_a_process_seen_only_mid_trial_flag_the_trial(nvml):
    """The fake reports HW thermal slowdown, a 600 MHz SM clock and a foreign process (PID 1) only between the
    monitor's enter and exit. Proves the sampler runs while the trial runs and keeps the union of what it saw and the
    minimum clock; whether a real GPU throttles is for hardware to show."""
    nvml.reasons[("during", 1)] = HW_THERMAL
    nvml.sm[("during", 1)] = 600
    nvml.procs[("during", 3)] = [1]
    with Monitor(2, "cuda", [0, 1], threshold=1e9) as m:
        nvml.phase = "during"
        _wait_for(
            lambda: nvml.calls.get(("during", "nvmlDeviceGetClockInfo"), 0) >= 4,
            "the GPU was not sampled while the trial ran",
        )
        nvml.phase = "after"
    r = m.result()
    assert "HW thermal" in r["gpu_throttle"] and r["gpu_other_processes"] == 1
    assert r["gpu_sm_mhz_min"] == [1903, 600] and r["gpu_samples"] >= 3
    assert r["interfered"] and "GPU throttled" in r["interference_reason"]


def test_a_power_cap_is_recorded_but_does_not_flag(nvml):
    """SW power cap is the GPU holding its own power limit under the trial's load, not something else on the host:
    recorded in gpu_throttle, not a reason to distrust the throughput."""
    for phase in ("before", "during", "after"):
        nvml.reasons[(phase, 3)] = 0x4
    with Monitor(2, "cuda", [0, 1], threshold=1e9) as m:
        pass
    r = m.result()
    assert r["gpu_throttle"] == "SW power cap" and not r["interfered"]


# ------------------------------------------------------------------------------------------------ G17: topology
