"""What else used the host while a trial ran: a measured reason to distrust a throughput, recorded with the trial.

CPU host: the host's busy CPU time (psutil.cpu_times()) minus the CPU time of this process and the children it reaped
(os.times(): the trial's ranks, started and waited for inside the window) is CPU time spent by *other* processes
during the window; divided by the window it is the number of cores they kept busy. Also recorded: hypervisor steal
time (a VM's vCPUs waiting for their physical cores), and the load average at both ends.

GPU host, through NVML where `pynvml` (nvidia-ml-py) imports: a background thread samples the trial's GPUs every
SAMPLE_INTERVAL_S while the ranks run (a sample is three NVML calls per GPU; the process table is walked only when
NVML lists a PID not seen before, so an in-process trial sharing this process's interpreter pays a few NVML calls),
keeping the union of the foreign processes and clock event reasons it saw and each GPU's lowest SM clock.
- Which GPUs: NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER, so each CUDA
  ordinal is looked up by the UUID CUDA reports for it ("GPU-", or "MIG-" for a MIG instance), else by its PCI bus id
  (capabilities.cuda_identity). Clocks and reasons of a MIG instance are its GPU's.
- What flags a trial: a process on its GPUs outside the trial's process tree, and a slowdown caused from outside:
  HW slowdown, SW or HW thermal, HW power brake. SW power cap (the GPU holding its power limit under the trial's
  own load) is recorded in gpu_throttle but flags nothing.
- Containers: without the host's PID namespace NVML reports host PIDs, which this process cannot match to its
  own. A reported PID that does not exist here is counted in gpu_unattributed_processes and flags nothing (it may
  be one of the trial's own ranks); a PID that exists here and is not the trial's counts as foreign (a host PID
  that happens to number an unrelated process here would flag falsely: rare, and for a GPU host to show).
- Any NVML (or torch) error, at start or in any sample, stops the sampling and records `gpu_monitor: unavailable
  (the call: the error)` with no GPU figures: the monitor never fails a trial.

The host's CPU times, a helper's CPU times and a process's descendants come from psutil, on Linux and macOS alike.
The busy time counts user, nice, system, irq and softirq (the last two where the system has them: Linux). Steal is
Linux's (a VM's); elsewhere steal_s is None.
"""

from __future__ import annotations

import os
import threading
import time

import psutil

DEFAULT_THRESHOLD = 0.25  # cores kept busy by other processes, on average, beyond which a trial is flagged
SAMPLE_INTERVAL_S = 0.5  # between two NVML samples of the trial's GPUs


def _proc_stat() -> tuple[float, float | None] | None:
    """(busy, steal) CPU seconds of the whole host since boot; steal None where the system has none (macOS); None
    where the host's CPU times cannot be read."""
    try:
        t = psutil.cpu_times()
    except (psutil.Error, OSError):
        return None
    # guest time is inside user already (Linux)
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    steal = getattr(t, "steal", None)
    return busy, steal


def _own_cpu(helpers=()) -> float:
    """CPU seconds of this process, the children it reaped, and `helpers` (live children of this process that start
    the trial's ranks) with what they reaped: a forkserver (trial/start.py) reaps the ranks it forks, so their time is
    the server's until this process exits."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + sum(map(_process_cpu, helpers))


def _process_cpu(pid: int) -> float:
    """user + system + children's user + children's system CPU seconds of a live process (0 once it is gone; macOS
    does not count the children)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.Error, OSError):
        return 0.0
    return t.user + t.system + t.children_user + t.children_system


class Monitor:
    """`with Monitor() as m: ...run the trial...`, then `m.result()`: a flat dict of JSON-able numbers."""

    def __init__(
        self,
        devices_used: int,
        device_kind: str = "cpu",
        gpu_indices=(),
        threshold: float = DEFAULT_THRESHOLD,
        sample_s: float | None = None,
        helpers=tuple,
    ):
        """`helpers()`: the PIDs of live processes whose CPU time (and that of the children they reap) is the
        trial's own, read at the window's start and end (the forkserver the trial's ranks are forked from)."""
        self.devices_used, self.kind, self.threshold = devices_used, device_kind, threshold
        self.helpers = helpers
        self.gpus = list(gpu_indices)  # the trial's CUDA ordinals
        self.sample_s = sample_s
        self._start = self._end = self._gpu = None

    def __enter__(self):
        self._start = (time.monotonic(), _proc_stat(), _own_cpu(self.helpers()), os.getloadavg()[0])
        if self.kind == "cuda":
            self._gpu = GpuSampler(self.gpus, SAMPLE_INTERVAL_S if self.sample_s is None else self.sample_s)
            self._gpu.start()
        return self

    def __exit__(self, *exc):
        if self._gpu:
            self._gpu.stop()
        self._end = (time.monotonic(), _proc_stat(), _own_cpu(self.helpers()), os.getloadavg()[0])
        return False

    def result(self) -> dict:
        (t0, s0, own0, load0), (t1, s1, own1, load1) = self._start, self._end
        window = max(t1 - t0, 1e-9)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        out = {
            "window_s": round(window, 3),
            "host_cores": cores,
            "loadavg_start": round(load0, 2),
            "loadavg_end": round(load1, 2),
            "foreign_cpu_s": None,
            "foreign_cores": None,
            "steal_s": None,
        }
        if s0 and s1:
            foreign = max(0.0, (s1[0] - s0[0]) - (own1 - own0))  # clock ticks make small negatives: floor at 0
            out.update(
                host_busy_cpu_s=round(s1[0] - s0[0], 3),
                own_cpu_s=round(own1 - own0, 3),
                foreign_cpu_s=round(foreign, 3),
                foreign_cores=round(foreign / window, 3),
                steal_s=None if s0[1] is None or s1[1] is None else round(s1[1] - s0[1], 3),
            )
        reasons = []
        if out["foreign_cores"] is not None and out["foreign_cores"] > self.threshold:
            reasons.append(
                f"other processes kept {out['foreign_cores']:.2f} cores busy on average "
                f"(threshold {self.threshold:.2f}; the trial used {self.devices_used} of {cores})"
            )
        if out["steal_s"] and out["steal_s"] / window > self.threshold:
            reasons.append(f"the hypervisor took {out['steal_s'] / window:.2f} cores' time (steal)")
        if self._gpu:
            out.update(self._gpu.summary())
            if out.get("gpu_other_processes"):
                reasons.append(f"{out['gpu_other_processes']} other process(es) on the trial's GPUs")
            flagged = [] if self._gpu.error else sorted(self._gpu.throttle & FLAGGED_REASONS)
            if flagged:
                reasons.append(f"GPU throttled: {', '.join(flagged)}")
        out["interfered"] = bool(reasons)
        out["interference_reason"] = "; ".join(reasons)
        return out


# ----------------------------------------------------------------------------- GPU (NVML, optional)

# nvmlClocksEventReasons bits (nvml.h); GPU idle, application clocks, sync boost and display clocks are left out
_THROTTLE_NAMES = {
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "HW power brake",
}
FLAGGED_REASONS = {"HW slowdown", "SW thermal", "HW thermal", "HW power brake"}


class NvmlUnavailable(Exception):
    """An NVML (or torch) call the monitor needs failed: the message names the call and the error."""


class GpuSampler:
    """NVML samples of the GPUs behind some CUDA ordinals, on a background thread between start() and stop()."""

    def __init__(self, ordinals, interval_s: float):
        self.ordinals, self.interval_s = list(ordinals), interval_s
        self.nvml, self.error, self.samples, self.uuids = None, None, 0, []
        self.others, self.throttle, self.unattributed = set(), set(), 0
        self.sm_mhz_min: list = [None] * len(self.ordinals)
        self._stop, self._thread, self._handles = threading.Event(), None, []
        self._own, self._not_own = {os.getpid()}, set()  # PIDs already classified: a PID's owner does not change

    def start(self) -> None:
        try:
            import pynvml
        except ImportError:
            self.error = "pynvml not installed: pip install -e '.[gpu]' (nvidia-ml-py)"
            return
        self.nvml = pynvml
        self._reasons_call = (
            "nvmlDeviceGetCurrentClocksEventReasons"  # ThrottleReasons before nvidia-ml-py 12.535
            if hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        if not self._guard(self._call, "nvmlInit"):
            self.nvml = None  # nothing to shut down
            return
        if self._guard(self._open) and self._guard(self._sample):
            self._thread = threading.Thread(target=self._run, name="parallax-gpu-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
            if not self.error:
                self._guard(self._sample)  # the trial's last moments
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # nothing left to measure: a failing shutdown changes no figure
                pass

    def summary(self) -> dict:
        if self.error:
            return {"gpu_monitor": f"unavailable ({self.error})"}
        return {
            "gpu_monitor": "nvml",
            "gpu_devices": self.uuids,
            "gpu_samples": self.samples,
            "gpu_other_processes": len(self.others),
            "gpu_other_pids": sorted(self.others),
            "gpu_unattributed_processes": self.unattributed,
            "gpu_throttle": ", ".join(sorted(self.throttle)),
            "gpu_sm_mhz_min": self.sm_mhz_min,
        }

    def _guard(self, fn, *args) -> bool:
        """Run fn; any failure is recorded as the monitor's error (the monitor must never fail a trial)."""
        try:
            fn(*args)
            return True
        except NvmlUnavailable as e:
            self.error = str(e)
        except Exception as e:  # a torch or binding error outside the NVML calls
            self.error = f"{type(e).__name__}: {e}"
        return False

    def _call(self, name: str, *args):
        try:
            return getattr(self.nvml, name)(*args)
        except Exception as e:  # NVMLError: NotSupported, NoPermission, GpuIsLost, ...; or a binding without it
            raise NvmlUnavailable(f"{name}: {e}") from e

    def _open(self) -> None:
        """One (processes handle, clocks handle) per ordinal: the GPU itself, or a MIG instance and its GPU."""
        from pipeline.host.capabilities import cuda_identity

        for i in self.ordinals:
            try:
                ident = cuda_identity(i)
            except Exception as e:
                raise NvmlUnavailable(f"torch.cuda.get_device_properties({i}): {e}") from e
            self._handles.append(self._lookup(i, ident))

    def _lookup(self, ordinal: int, ident: dict):
        tries = [
            ("nvmlDeviceGetHandleByUUID", f"{prefix}{ident['uuid']}") for prefix in ("GPU-", "MIG-") if ident["uuid"]
        ]
        if ident["pci"]:
            tries.append(("nvmlDeviceGetHandleByPciBusId", "{:08X}:{:02X}:{:02X}.0".format(*ident["pci"])))
        error = f"CUDA device {ordinal}: no UUID or PCI bus id"
        for name, key in tries:
            try:
                h = self._call(name, key)
            except NvmlUnavailable as e:
                error = str(e)
                continue
            self.uuids.append(key)
            mig = key.startswith("MIG-")
            return h, self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h) if mig else h
        raise NvmlUnavailable(error)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._guard(self._sample):
                return

    def _sample(self) -> None:
        unattributed = 0
        for k, (procs_h, clocks_h) in enumerate(self._handles):
            pids = {p.pid for p in self._call("nvmlDeviceGetComputeRunningProcesses", procs_h)}
            reasons = self._call(self._reasons_call, clocks_h)
            mhz = self._call("nvmlDeviceGetClockInfo", clocks_h, self.nvml.NVML_CLOCK_SM)
            if pids - self._own - self._not_own:  # a new PID: is it one of the trial's (a rank started since)?
                self._own |= _children(os.getpid())
                self._not_own |= pids - self._own
            foreign = pids - self._own
            here = {p for p in foreign if psutil.pid_exists(p)}
            self.others |= here
            unattributed += len(foreign - here)
            self.throttle |= {name for bit, name in _THROTTLE_NAMES.items() if reasons & bit}
            self.sm_mhz_min[k] = mhz if self.sm_mhz_min[k] is None else min(self.sm_mhz_min[k], mhz)
        self.unattributed = max(self.unattributed, unattributed)
        self.samples += 1


def _children(pid: int) -> set[int]:
    """Every descendant of pid (the trial's ranks and their helpers)."""
    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except (psutil.Error, OSError):
        return set()
