"""What a sweep measures of a strategy whose autocast type this host only emulates.

On a CPU without AVX-512-BF16/AMX, bf16 autocast converts through fp32 and a LeNet step runs several times slower
than fp32 (about 7x measured on an AVX2-only 2-core host), so `ddp_amp`'s full trials took most of the default
profile's time there. Such a trial is bounded, not hidden: it runs at most `sweep.emulated_max_steps` optimizer
steps (throughput measured on those steps, accuracy evaluated where it stopped), and its row's reason starts with
BOUNDED so the report and the MLflow run say so. 0 turns the bound off; hosts where the type is native are never
bounded. Torch-free: the analysis stage reads the label too.
"""

from __future__ import annotations

import dataclasses

BOUNDED = "bounded"  # the start of a bounded trial's reason (sweep table, MLflow tag parallax.bounded)


def bound(tcfg, dtype: str | None, caps: dict, limit: int):
    """(trial config, note): the trial's config with train.max_steps capped at `limit` when it autocasts to `dtype`
    and this host (`caps`: capabilities.host_capabilities) only emulates that type; note = "" when unchanged."""
    if not dtype or not limit or caps.get(dtype) != "emulated":
        return tcfg, ""
    current = tcfg.train.max_steps
    if current and current <= limit:
        return tcfg, ""
    dev = (caps.get("gpus") or [caps.get("cpu") or {}])[0]
    why = dev.get(f"{dtype}_why") or f"{dtype} is emulated"
    cpu = caps.get("cpu") or {}
    isa = cpu.get("isa_text") or ",".join(cpu.get("isa") or []) or "none"
    note = (
        f"{BOUNDED}: at most {limit} steps (sweep.emulated_max_steps) because {dtype} autocast is emulated on "
        f"this {caps.get('kind', 'host')} ({why}; ISA {isa}); throughput is measured on those steps, accuracy "
        f"is where training stopped, not after train.epochs={tcfg.train.epochs}"
    )
    # `limit` is a validated setting (sweep.emulated_max_steps, >= 0, like train.max_steps): nothing to check again
    return dataclasses.replace(tcfg, train=dataclasses.replace(tcfg.train, max_steps=limit)), note


def is_bounded(reason) -> bool:
    return isinstance(reason, str) and reason.startswith(f"{BOUNDED}:")
