"""What the host offers: its CUDA GPUs, or else its CPU cores (one 1-thread worker process per core)."""

from __future__ import annotations

import ctypes
import os
import platform
import socket
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Host:
    kind: str  # "cuda" | "cpu"
    n: int  # devices a trial may use
    name: str  # GPU model, or CPU model
    hostname: str
    torch: str
    cuda: str  # "" without CUDA

    def facts(self) -> dict:
        return {f"host_{k}" if k in ("kind", "n", "name") else k: v for k, v in asdict(self).items()}


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name with its family and model numbers, e.g. "AMD EPYC (family 23 model 1)": a hypervisor
    often shows one generic name ("AMD EPYC") for CPUs of different generations: the two EPYC hosts measured here
    (AVX2 only, and AVX-512-BF16) differ 2.3x in their fp32 LeNet step (benchmarks/RESULTS.md, "Hosts")."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def probe() -> Host:
    """The devices of this host; CUDA wins when present."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return Host(
            "cuda",
            torch.cuda.device_count(),
            torch.cuda.get_device_name(0),
            socket.gethostname(),
            torch.__version__,
            torch.version.cuda or "",
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Host("cpu", cores, cpu_name(), socket.gethostname(), torch.__version__, "")


def keep_freed_memory() -> None:
    """Ask glibc to keep freed tensor memory for reuse instead of unmapping it.

    Activations of a CPU training step are MB-sized; glibc serves those with mmap and returns them with munmap
    until its adaptive threshold catches up, so a fresh process page-faults through every step (measured by
    benchmarks/speed/ablations.py; PARALLAX_MALLOC_TUNING=0 turns this off for that comparison).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED or platform.system() != "Linux" or os.environ.get("PARALLAX_MALLOC_TUNING") == "0":
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD: glibc's maximum, 32 MiB on 64-bit
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: keep up to 1 GiB of freed heap
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        pass
    _MALLOC_TUNED = True


_MALLOC_TUNED = False


def device_for(host: Host, index: int) -> torch.device:
    """Device `index` of this host: cuda:index, or the CPU (a core is a process, not a torch device). An
    oversubscribed trial (train.oversubscribe, more ranks than GPUs) shares the GPUs round-robin."""
    return torch.device("cuda", index % host.n) if host.kind == "cuda" else torch.device("cpu")
