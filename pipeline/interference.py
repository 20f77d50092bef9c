"""What else used the host while a trial ran: a measured reason to distrust a throughput, recorded with the trial.

CPU host: the host's busy CPU time (/proc/stat) minus the CPU time of this process and the children it reaped
(os.times(): the trial's ranks, started and waited for inside the window) is CPU time spent by *other* processes
during the window; divided by the window it is the number of cores they kept busy. Also recorded: hypervisor steal
time (a VM's vCPUs waiting for their physical cores), and the load average at both ends. GPU host: other processes
on the trial's GPUs, SM clocks and throttle reasons, through NVML where `pynvml` imports.

Hand-written because no maintained library gives "CPU time of everything but my process tree over a window" (psutil
gives per-process times, which would mean walking every process twice; /proc/stat is one read). Linux only; on other
systems the CPU fields are None and the trial is not flagged.
"""
from __future__ import annotations

import os
import time

DEFAULT_THRESHOLD = 0.25  # cores kept busy by other processes, on average, beyond which a trial is flagged


def _proc_stat() -> tuple[float, float] | None:
    """(busy, steal) CPU seconds of the whole host since boot; None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice (guest time is inside user already)
    v = [int(x) for x in fields[1:]] + [0] * 10
    hz = os.sysconf("SC_CLK_TCK")
    busy = v[0] + v[1] + v[2] + v[5] + v[6]
    return busy / hz, v[7] / hz


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Monitor:
    """`with Monitor() as m: ...run the trial...`, then `m.result()`: a flat dict of JSON-able numbers."""

    def __init__(self, devices_used: int, device_kind: str = "cpu", gpu_indices=(),
                 threshold: float = DEFAULT_THRESHOLD):
        self.devices_used, self.kind, self.threshold = devices_used, device_kind, threshold
        self.gpus = list(gpu_indices)
        self._start = self._end = None

    def __enter__(self):
        self._start = (time.monotonic(), _proc_stat(), _own_cpu(), os.getloadavg()[0])
        self._gpu_start = _gpu_sample(self.gpus) if self.kind == "cuda" else None
        return self

    def __exit__(self, *exc):
        self._end = (time.monotonic(), _proc_stat(), _own_cpu(), os.getloadavg()[0])
        self._gpu_end = _gpu_sample(self.gpus) if self.kind == "cuda" else None
        return False

    def result(self) -> dict:
        (t0, s0, own0, load0), (t1, s1, own1, load1) = self._start, self._end
        window = max(t1 - t0, 1e-9)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        out = {"window_s": round(window, 3), "host_cores": cores, "loadavg_start": round(load0, 2),
               "loadavg_end": round(load1, 2), "foreign_cpu_s": None, "foreign_cores": None, "steal_s": None}
        if s0 and s1:
            foreign = max(0.0, (s1[0] - s0[0]) - (own1 - own0))  # clock ticks make small negatives: floor at 0
            out.update(host_busy_cpu_s=round(s1[0] - s0[0], 3), own_cpu_s=round(own1 - own0, 3),
                       foreign_cpu_s=round(foreign, 3), foreign_cores=round(foreign / window, 3),
                       steal_s=round(s1[1] - s0[1], 3))
        reasons = []
        if out["foreign_cores"] is not None and out["foreign_cores"] > self.threshold:
            reasons.append(f"other processes kept {out['foreign_cores']:.2f} cores busy on average "
                           f"(threshold {self.threshold:.2f}; the trial used {self.devices_used} of {cores})")
        if out["steal_s"] and out["steal_s"] / window > self.threshold:
            reasons.append(f"the hypervisor took {out['steal_s'] / window:.2f} cores' time (steal)")
        if self.kind == "cuda":
            out.update(_gpu_summary(self._gpu_start, self._gpu_end))
            if out.get("gpu_other_processes"):
                reasons.append(f"{out['gpu_other_processes']} other process(es) on the trial's GPUs")
            if out.get("gpu_throttle"):
                reasons.append(f"GPU throttled: {out['gpu_throttle']}")
        out["interfered"] = bool(reasons)
        out["interference_reason"] = "; ".join(reasons)
        return out


# ----------------------------------------------------------------------------- GPU (NVML, optional)

_THROTTLE_NAMES = {0x4: "SW power cap", 0x8: "HW slowdown", 0x20: "SW thermal", 0x40: "HW thermal",
                   0x80: "HW power brake"}


def _gpu_sample(indices) -> dict | None:
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # no pynvml, no driver: GPU interference is not measured (and said so)
        return None
    own = {os.getpid()} | _children(os.getpid())
    sample = {"others": 0, "throttle": set(), "sm_mhz": []}
    for i in indices:
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        sample["others"] += sum(p.pid not in own for p in procs)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        sample["throttle"] |= {name for bit, name in _THROTTLE_NAMES.items() if reasons & bit}
        sample["sm_mhz"].append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
    return sample


def _gpu_summary(a, b) -> dict:
    if a is None or b is None:
        return {"gpu_monitor": "unavailable (pynvml or the NVIDIA driver missing)"}
    return {"gpu_monitor": "nvml", "gpu_other_processes": max(a["others"], b["others"]),
            "gpu_throttle": ", ".join(sorted(a["throttle"] | b["throttle"])),
            "gpu_sm_mhz_end": b["sm_mhz"]}


def _children(pid: int) -> set[int]:
    """Every descendant of pid, from /proc (the trial's ranks and their helpers)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out
