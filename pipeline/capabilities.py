"""What this host's devices can do natively: the facts that change results (ISA, native bf16/fp16, GPU compute
capability, library versions). A bf16 step on an AVX2-only CPU is emulated and several times slower than fp32;
on an AVX-512-BF16 or AMX CPU, or an Ampere-or-newer GPU, it is native. Read once, reported with every doctor run.
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess

import torch
import torch.distributed as dist

# CPU flags (from /proc/cpuinfo) that make a low-precision type native on the CPU: oneDNN uses them for bf16/fp16
# convolutions and matrix products; without them PyTorch converts to fp32 and back (emulation)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
FP16_CPU_FLAGS = ("avx512_fp16", "amx_fp16")
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_capabilities(flags: set[str] | None = None) -> dict:
    flags = cpu_flags() if flags is None else flags
    bf16 = [f for f in BF16_CPU_FLAGS if f in flags]
    fp16 = [f for f in FP16_CPU_FLAGS if f in flags]
    return {
        "arch": platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        # the kernels PyTorch dispatches to here (DEFAULT, AVX2, AVX512, ...)
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16": "native" if bf16 else "emulated",
        "bf16_why": f"CPU has {', '.join(bf16)}" if bf16 else "no AVX-512-BF16/AMX-BF16: converted through fp32",
        "fp16": "native" if fp16 else "emulated",
        "fp16_why": f"CPU has {', '.join(fp16)}" if fp16 else "no AVX-512-FP16/AMX-FP16: converted through fp32",
    }


def gpu_capabilities(index: int) -> dict:
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    return {
        "index": index, "name": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}",
        "memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count,
        # tensor cores: bf16 from Ampere (8.0), fp16 from Volta (7.0)
        "bf16": "native" if major >= 8 else "emulated",
        "bf16_why": f"compute capability {major}.{minor}" + (" >= 8.0 (bf16 tensor cores)" if major >= 8 else
                                                                " < 8.0: no bf16 tensor cores"),
        "fp16": "native" if major >= 7 else "slow",
        "fp16_why": f"compute capability {major}.{minor}" + (" >= 7.0 (fp16 tensor cores)" if major >= 7 else
                                                                " < 7.0: no tensor cores"),
    }


def library_versions() -> dict:
    out = {"torch": torch.__version__, "python": platform.python_version(), "cuda": torch.version.cuda or "",
           "cudnn": "", "nccl": "", "gloo": dist.is_available() and dist.is_gloo_available(),
           "nccl_available": dist.is_available() and dist.is_nccl_available()}
    if torch.cuda.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version() or "")
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):  # a build without NCCL
            out["nccl"] = ""
    return out


# `nvidia-smi topo -m`'s link codes, fastest first (its legend): NV# = that many NVLinks; the rest are PCIe paths
LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def gpu_topology(timeout_s: float = 10.0) -> str | None:
    """`nvidia-smi topo -m`'s matrix as text; None where nvidia-smi is absent, fails or does not answer."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return _ANSI.sub("", out.stdout) if out.returncode == 0 and out.stdout.strip() else None


def interconnect(topo: str | None) -> str | None:
    """The GPU-to-GPU links of a `nvidia-smi topo -m` matrix, slowest first: "NV18" (NVLink), "PIX"/"PXB"/"PHB"
    (PCIe), "NODE"/"SYS" (across a host bridge or socket); "single GPU" for a one-GPU matrix; None without one."""
    if not topo:
        return None
    rows = [line.split() for line in topo.splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0].startswith("GPU0")), None)
    if header is None:  # nvidia-smi's header row starts with a tab: its first cell is GPU0
        return None
    gpus = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    links = set()
    for r in rows:
        if r and re.fullmatch(r"GPU\d+", r[0]) and r is not header:
            links.update(c for c in r[1:len(gpus) + 1] if c != "X")
    if len(gpus) < 2:
        return "single GPU" if gpus else None

    def rank(link):
        return next((i for i, p in enumerate(LINK_ORDER) if link.startswith(p)), len(LINK_ORDER))
    return "/".join(sorted(links, key=rank, reverse=True)) or None


def host_capabilities(host) -> dict:
    """Everything above for `host` (pipeline.devices.Host): the CPU always, each GPU where there are GPUs."""
    caps = {"kind": host.kind, "devices": host.n, "name": host.name, "hostname": host.hostname,
            "cpu": cpu_capabilities(), **library_versions()}
    caps["interconnect"] = None  # a CPU host's ranks talk through shared memory or loopback
    if host.kind == "cuda":
        caps["gpus"] = [gpu_capabilities(i) for i in range(host.n)]
        caps["interconnect"] = interconnect(gpu_topology())
    dev = caps["gpus"][0] if host.kind == "cuda" else caps["cpu"]
    caps["bf16"], caps["fp16"] = dev["bf16"], dev["fp16"]
    return caps
