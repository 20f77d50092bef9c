"""What the host offers: its CUDA GPUs, or else its CPU cores (one 1-thread worker process per core)."""
from __future__ import annotations

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


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def probe() -> Host:
    """The devices of this host; CUDA wins when present."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return Host("cuda", torch.cuda.device_count(), torch.cuda.get_device_name(0), socket.gethostname(),
                    torch.__version__, torch.version.cuda or "")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Host("cpu", cores, _cpu_name(), socket.gethostname(), torch.__version__, "")


def device_for(host: Host, index: int) -> torch.device:
    """Device `index` of this host: cuda:index, or the CPU (a core is a process, not a torch device)."""
    return torch.device("cuda", index) if host.kind == "cuda" else torch.device("cpu")
