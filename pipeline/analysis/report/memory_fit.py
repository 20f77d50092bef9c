"""Memory, measured beside modelled: per measured point, the largest per-device peak the trials recorded beside the
memory model's (pipeline/scaling/memory.py) for the same strategy, model, k, batch, optimizer and figure (its
mem_basis), and the model's error; where dp cannot run (a CPU host), its device-0 excess projected, labelled
modelled. The model counts the activations once per model and batch (the `meta` device, or the CPU under
autocast): the section is the one part of the report that may load torch, and only when it is built."""

from __future__ import annotations

import math

import pandas as pd

from pipeline import catalog
from pipeline.analysis.tables.points import MIB

COLUMNS = [
    "strategy",
    "model",
    "k",
    "batch_size",
    "optimizer",
    "mem_basis",
    "peak_mem_mib",
    "modelled_mib",
    "error_pct",
]
BASES = {"memtracker_step": "cpu", "steady_step_above_resident": "gpu"}  # the figures the model predicts, by mem_basis
# the rows whose device 0 holds more than the others (nn.DataParallel's designs, CUDA only)
DEVICE0 = tuple(s.name for s in catalog.STRATEGIES if s.comm in ("dp_gather_logits", "dp_gather_losses"))


def _flag(v) -> bool:
    """A knob's on/off as the analysis rows hold it: text ('True', 'False'; '' where a table lacks the column, a
    table from before the knob, when it was off), or a bool in a frame built by hand."""
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def compared(mem: pd.DataFrame) -> pd.DataFrame:
    """One row per measured point of a basis the model predicts, of a strategy and model it knows."""
    from pipeline.scaling import memory

    rows = []
    for r in mem.to_dict("records"):
        basis = BASES.get(r.get("mem_basis", ""))
        if basis is None or r["strategy"] not in catalog.SPECS or not memory.is_model(r["model"]):
            continue
        if math.isnan(r["peak_mem_mib"]):
            continue
        optimizer = r.get("optimizer") if isinstance(r.get("optimizer"), str) and r.get("optimizer") else "sgd"
        p = memory.predict(
            r["strategy"],
            r["model"],
            int(r["k"]),
            int(r["batch_size"]),
            optimizer,
            basis=basis,
            grad_as_bucket_view=_flag(r.get("grad_as_bucket_view")),
            autocast=_flag(r.get("autocast")) or None,
        )
        rows.append(
            {
                "strategy": r["strategy"],
                "model": r["model"],
                "k": int(r["k"]),
                "batch_size": int(r["batch_size"]),
                "optimizer": optimizer,
                "mem_basis": r["mem_basis"],
                "peak_mem_mib": r["peak_mem_mib"],
                "modelled_mib": p.peak / MIB,
                "error_pct": memory.error_pct(r["peak_mem_mib"] * MIB, p.peak),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def projected_device0(mem: pd.DataFrame) -> list[str]:
    """dp's device-0 excess (GPU figure), modelled, at each (model, k >= 2, batch, optimizer) measured here where dp
    was not (a CPU host runs no dp)."""
    from pipeline.scaling import memory

    measured = set(mem.loc[mem["strategy"].isin(DEVICE0), "model"]) if not mem.empty else set()
    lines = []
    seen = set()
    for r in mem[mem["k"] >= 2].to_dict("records") if not mem.empty else []:
        optimizer = r.get("optimizer") if isinstance(r.get("optimizer"), str) and r.get("optimizer") else "sgd"
        key = (r["model"], int(r["k"]), int(r["batch_size"]), optimizer)
        if r["model"] in measured or key in seen:
            continue
        seen.add(key)
        p = memory.predict(DEVICE0[0], *key[:3], optimizer, basis="gpu")
        rest = sum(p.per_device[1:]) / (len(p.per_device) - 1)
        lines.append(
            f"- {key[0]}, k={key[1]}, batch {key[2]}, {optimizer}: dp's device-0 excess "
            f"{(p.per_device[0] - rest) / MIB:.1f} MiB (*modelled*, GPU figure: device 0 {p.per_device[0] / MIB:.1f}"
            f" MiB, the others {rest / MIB:.1f} MiB above resident)"
        )
    return lines


def section(mem: pd.DataFrame, md_table) -> list[str]:
    """The report's "Memory: measured beside modelled" subsection."""
    s = [
        "\n### Memory: measured beside modelled\n\n",
        "The largest per-device peak of each measured point beside the memory model's for the same figure "
        '(pipeline/scaling/memory.py; docs/metrics.md, "the memory model"): parameters, gradients, optimizer '
        "state per parameter, DDP's buckets, FSDP's shards and gathered unit, and the activations counted once per "
        "model and batch. modelled_mib is *modelled*; error = (modelled − measured) / measured.\n\n",
    ]
    table = compared(mem)
    if table.empty:
        s.append("No measured point of a figure the model predicts.\n")
    else:
        err = table["error_pct"].abs()
        s += [
            md_table(table, COLUMNS),
            f"\nModel error over {len(table)} point(s): mean {err.mean():.2f}%, max {err.max():.2f}% (absolute).\n",
        ]
    projected = projected_device0(mem)
    if projected:
        s += [
            "\ndp cannot run here (CUDA only); its device-0 excess, projected by the same model:\n\n",
            "\n".join(projected) + "\n",
        ]
    return s
