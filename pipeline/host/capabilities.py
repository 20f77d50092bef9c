"""What this host's devices can do natively: the facts that change results (ISA, native bf16/fp16, GPU compute
capability, library versions, the TF32 switches). A bf16 step on an AVX2-only CPU is emulated and several times
slower than fp32; on an AVX-512-BF16 or AMX CPU, or an Ampere-or-newer GPU, it is native. Read once, reported with
every doctor run.

TF32: PyTorch lets cuDNN convolutions use TF32 by default (2.11 torch/backends/cudnn/__init__.py:191,
`allow_tf32=True`) and keeps cuBLAS matmuls in IEEE fp32, so on Ampere and newer every "fp32" convolution is a TF32
one. `tf32_flags` records the switches; `fp32_pinned` turns both off for a run (the equivalence check, through
train.fp32_precision=ieee) and puts every switch back as it was.
"""

from __future__ import annotations

import contextlib
import os
import platform

import torch
import torch.distributed as dist

# the GPU topology, re-exported: callers read a host's facts from this module
from pipeline.host.topology import (  # noqa: F401
    LINK_ORDER,
    cuda_identity,
    gpu_table,
    gpu_topology,
    interconnect,
    trial_interconnect,
    trial_rows,
)

# CPU flags (from /proc/cpuinfo) that make a low-precision type native on the CPU: oneDNN uses them for bf16/fp16
# convolutions and matrix products; without them PyTorch converts to fp32 and back (emulation)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# fp16: AVX-512-FP16 alone does not count. On an AVX-512-FP16 Xeon an fp16-autocast LeNet step took 130-170x an fp32
# one (benchmarks/speed/amp_cost.py --dtype fp16; benchmarks/RESULTS.md, autocast costs): PyTorch's CPU fp16
# kernels for such a model did not use it. AMX-FP16 is taken as native from the flag alone (not measured: no such
# CPU was reached).
FP16_CPU_FLAGS = ("amx_fp16",)
FP16_NOT_ENOUGH = "avx512_fp16"
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")
# oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA; DNNL_MAX_CPU_ISA before oneDNN 2): below AVX512_CORE_BF16 oneDNN converts
# bf16 through fp32 even where the CPU has the instructions. benchmarks/speed/amp_cost.py, a bf16 LeNet step against an
# fp32 one (benchmarks/RESULTS.md, "What bf16 (and fp16) autocast costs"): on an AVX-512-BF16 EPYC 0.45x, 6.6-7.5x with
# ONEDNN_MAX_CPU_ISA=AVX2 (as on an AVX2-only CPU); on an AVX-512-BF16/FP16 Xeon 1.27x, 7.33x with AVX2 and 2.68x
# with AVX512_CORE. So the cap decides "native" as much as the flags do. oneDNN's documented order, lowest first:
ONEDNN_ISA_ORDER = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX10_1_512_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX10_2_512",
    "AVX10_2_512_AMX_2",
)
ONEDNN_ISA_ALIASES = {
    "AVX512_CORE_FP16": "AVX10_1_512",
    "AVX512_CORE_AMX": "AVX10_1_512_AMX",
    "AVX512_CORE_AMX_FP16": "AVX10_1_512_AMX_FP16",
}
NEEDS = {"bf16": "AVX512_CORE_BF16", "fp16": "AVX10_1_512"}  # the lowest cap that keeps each type native


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def onednn_isa_cap(env=None) -> str | None:
    """The oneDNN ISA cap this process's environment sets (upper-cased), None where none is set or it is ALL/DEFAULT."""
    env = os.environ if env is None else env
    v = (env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return None if v in ("", "ALL", "DEFAULT") else v


def _capped_below(cap: str | None, dtype: str) -> bool:
    """True when oneDNN's cap `cap` lies below what `dtype` needs; an unrecognised cap is not assumed to cap."""
    cap = ONEDNN_ISA_ALIASES.get(cap, cap)
    if cap not in ONEDNN_ISA_ORDER:
        return False
    return ONEDNN_ISA_ORDER.index(cap) < ONEDNN_ISA_ORDER.index(NEEDS[dtype])


def cpu_capabilities(flags: set[str] | None = None, env=None) -> dict:
    """The CPU's ISA flags and whether bf16/fp16 run natively, given the flags and oneDNN's cap in `env`."""
    flags = cpu_flags() if flags is None else flags
    cap = onednn_isa_cap(env)
    out = {
        "arch": platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "onednn_max_isa": cap,  # ONEDNN_MAX_CPU_ISA as set, None where unset
        # the kernels PyTorch dispatches to here (DEFAULT, AVX2, AVX512, ...)
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    for dtype, have_flags, missing in (
        ("bf16", BF16_CPU_FLAGS, "AVX-512-BF16/AMX-BF16"),
        ("fp16", FP16_CPU_FLAGS, "AMX-FP16"),
    ):
        have = [f for f in have_flags if f in flags]
        if have and _capped_below(cap, dtype):
            out[dtype], out[f"{dtype}_why"] = (
                "emulated",
                (
                    f"ONEDNN_MAX_CPU_ISA={cap} caps oneDNN below {NEEDS[dtype]} although the CPU has "
                    f"{', '.join(have)}: converted through fp32"
                ),
            )
        elif have:
            out[dtype], out[f"{dtype}_why"] = "native", f"CPU has {', '.join(have)}"
        elif dtype == "fp16" and FP16_NOT_ENOUGH in flags:
            out[dtype], out[f"{dtype}_why"] = (
                "emulated",
                (
                    "CPU has avx512_fp16 but no amx_fp16, and PyTorch's CPU fp16 kernels did not use AVX-512-FP16 on "
                    "such a CPU (an fp16 LeNet step 130x+ fp32, benchmarks/RESULTS.md, autocast costs)"
                ),
            )
        else:
            out[dtype], out[f"{dtype}_why"] = "emulated", f"no {missing}: converted through fp32"
    # as the sweep table, tags and reports show it: the flags, and oneDNN's cap where one is set
    out["isa_text"] = (",".join(out["isa"]) or "none") + (f" (oneDNN capped at {cap})" if cap else "")
    return out


def gpu_capabilities(index: int) -> dict:
    major, minor = torch.cuda.get_device_capability(index)
    props = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "compute_capability": f"{major}.{minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "multiprocessors": props.multi_processor_count,
        # tensor cores: bf16 from Ampere (8.0), fp16 from Volta (7.0)
        "bf16": "native" if major >= 8 else "emulated",
        "bf16_why": f"compute capability {major}.{minor}"
        + (" >= 8.0 (bf16 tensor cores)" if major >= 8 else " < 8.0: no bf16 tensor cores"),
        "fp16": "native" if major >= 7 else "slow",
        "fp16_why": f"compute capability {major}.{minor}"
        + (" >= 7.0 (fp16 tensor cores)" if major >= 7 else " < 7.0: no tensor cores"),
    }


def library_versions() -> dict:
    out = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda or "",
        "cudnn": "",
        "nccl": "",
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl_available": dist.is_available() and dist.is_nccl_available(),
    }
    if torch.cuda.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version() or "")
        try:
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):  # a build without NCCL
            out["nccl"] = ""
    return out


# the TF32 switches: the legacy booleans (every supported torch), then the per-operation fp32_precision strings
# (the newer API; read and restored where this torch has it). Each is (record key, object path, attribute).
TF32_LEGACY = (("cudnn_allow_tf32", "cudnn", "allow_tf32"), ("matmul_allow_tf32", "cuda.matmul", "allow_tf32"))
TF32_PRECISION = (
    ("cudnn_conv_fp32_precision", "cudnn.conv", "fp32_precision"),
    ("cudnn_rnn_fp32_precision", "cudnn.rnn", "fp32_precision"),
    ("matmul_fp32_precision", "cuda.matmul", "fp32_precision"),
)


def _backend(path: str):
    obj = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
    return obj


def tf32_flags() -> dict:
    """Every TF32 switch this torch has, as this process has it now. A legacy boolean reads None where torch refuses
    to read it (a state set through the fp32_precision API that the boolean cannot express)."""
    out = {}
    for key, path, attr in TF32_LEGACY + TF32_PRECISION:
        try:
            out[key] = getattr(_backend(path), attr)
        except AttributeError:  # a torch without this switch
            continue
        except RuntimeError:  # "you have used a mix of the legacy and new APIs to set the TF32 flags"
            out[key] = None
    return out


def tf32_text(flags: dict) -> str:
    """ "cuDNN conv TF32, matmul fp32" and the like: what the switches mean for convolutions and matmuls."""

    def tf32(legacy, precision):
        v = flags.get(legacy)
        return v if isinstance(v, bool) else flags.get(precision) == "tf32"

    conv = tf32("cudnn_allow_tf32", "cudnn_conv_fp32_precision")
    mm = tf32("matmul_allow_tf32", "matmul_fp32_precision")
    return f"cuDNN conv {'TF32' if conv else 'fp32'}, matmul {'TF32' if mm else 'fp32'}"


def fp32_label(caps: dict) -> str:
    """How an fp32 result on the host `caps` (host_capabilities) is labelled: "fp32 (TF32 convs)" where cuDNN
    convolutions run in TF32 (a CUDA host with the switch on and a GPU of compute capability >= 8.0, where TF32's
    tensor cores start), else "fp32"."""
    tf32 = (
        caps.get("kind") == "cuda"
        and "conv TF32" in (caps.get("tf32_text") or "")
        and any(int(str(g.get("compute_capability", "0")).split(".")[0] or 0) >= 8 for g in caps.get("gpus") or [])
    )
    return "fp32 (TF32 convs)" if tf32 else "fp32"


@contextlib.contextmanager
def fp32_pinned(enabled: bool = True, tf32: bool = False):
    """IEEE fp32 for cuDNN convolutions and RNNs and for cuBLAS matmuls inside (tf32=True: TF32 for all of them,
    train.fp32_precision=tf32, the other side of the first GPU run's comparison); every switch restored afterwards.

    Pins through the legacy booleans (present at the 2.11 floor; inside the pin they still read False) unless
    torch refuses to read them (a mixed state set through the fp32_precision API), then through fp32_precision.
    Restores the booleans, then the fp32_precision strings, so every switch reads as before."""
    if not enabled:
        yield
        return
    before = tf32_flags()
    legacy = [(_backend(p), a, before[k]) for k, p, a in TF32_LEGACY if isinstance(before.get(k), bool)]
    precision = [(_backend(p), a, before[k]) for k, p, a in TF32_PRECISION if k in before]
    try:
        for obj, attr, off in (
            [(o, a, tf32) for o, a, _ in legacy]
            if len(legacy) == len(TF32_LEGACY)
            else [(o, a, "tf32" if tf32 else "ieee") for o, a, _ in precision]
        ):
            setattr(obj, attr, off)
        yield
    finally:
        for obj, attr, value in legacy + precision:
            setattr(obj, attr, value)


def host_capabilities(host, devices=None) -> dict:
    """Everything above for `host` (pipeline.host.devices.Host): the CPU always, each GPU where there are GPUs. The
    interconnect is that of `devices` (a trial's CUDA ordinals; None: every GPU this process sees)."""
    caps = {
        "kind": host.kind,
        "devices": host.n,
        "name": host.name,
        "hostname": host.hostname,
        "cpu": cpu_capabilities(),
        **library_versions(),
        "tf32": tf32_flags(),
    }
    # the switches mean something only to cuDNN and cuBLAS: a CPU host's text is None (no tag, "—" in the report)
    caps["tf32_text"] = tf32_text(caps["tf32"]) if host.kind == "cuda" else None
    caps["interconnect"] = None  # a CPU host's ranks talk through shared memory or loopback
    if host.kind == "cuda":
        caps["gpus"] = [gpu_capabilities(i) for i in range(host.n)]
        caps["interconnect"] = trial_interconnect(range(host.n) if devices is None else devices)
    dev = caps["gpus"][0] if host.kind == "cuda" else caps["cpu"]
    caps["bf16"], caps["fp16"] = dev["bf16"], dev["fp16"]
    return caps
