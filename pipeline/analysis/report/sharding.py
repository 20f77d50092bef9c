"""What sharding saved: per measured point, a sharding strategy's largest per-device memory peak against its
unsharded baseline's (catalog.sharding_baselines: fsdp -> ddp) at the same model, k, batch, optimizer and memory
figure. The optimizer decides what there is to shard: plain SGD keeps no state, so ZeRO-1 saves nothing there;
sgd_momentum keeps one buffer per parameter, adamw two."""

from __future__ import annotations

import math

import pandas as pd

from pipeline import catalog
from pipeline.analysis.tables.points import MEM_BASIS

COLUMNS = [
    "strategy",
    "shards",
    "baseline",
    "model",
    "k",
    "batch_size",
    "optimizer",
    "mem_basis",
    "peak_mem_mib",
    "baseline_mib",
    "saved_mib",
    "saved_pct",
]
# a pair is measured alike: same point, same optimizer (its state is what there is to shard), same memory figure
MATCH = ("model", "k", "batch_size", "optimizer", "mem_basis")


def savings(mem: pd.DataFrame) -> pd.DataFrame:
    """One row per sharding strategy's memory point that its baseline has too: peaks in MiB (peak_mem_mib, the
    largest per-device peak of the analysis' memory table; the baseline's: baseline_mib), what sharding saved
    (baseline - sharded; negative: it cost), and that as a % of the baseline. Several baseline points alike (its
    knobs swept): the smallest peak, so the saving shown is the smallest."""
    rows = []
    for sharded, base in catalog.sharding_baselines().items():
        a, b = mem[mem["strategy"] == sharded], mem[mem["strategy"] == base]
        for r in a.to_dict("records"):
            alike = b[(b[list(MATCH)] == pd.Series({c: r[c] for c in MATCH})).all(axis=1)]["peak_mem_mib"].dropna()
            if alike.empty or math.isnan(r["peak_mem_mib"]):
                continue
            peak, ref = r["peak_mem_mib"], alike.min()
            rows.append(
                {
                    "strategy": sharded,
                    "shards": ", ".join(catalog.spec(sharded).shards),
                    "baseline": base,
                    **{c: r[c] for c in MATCH},
                    "peak_mem_mib": peak,
                    "baseline_mib": ref,
                    "saved_mib": ref - peak,
                    "saved_pct": 100 * (ref - peak) / ref if ref > 0 else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


def section(mem: pd.DataFrame, md_table) -> list[str]:
    """The report's "What sharding saved" subsection (`md_table` renders a DataFrame as Markdown)."""
    pairs = ", ".join(f"{a} against {b}" for a, b in catalog.sharding_baselines().items())
    s = [
        "\n### What sharding saved\n\n",
        f"Each sharding strategy's largest per-device peak against its unsharded baseline's ({pairs}) at the same "
        "model, k, batch, optimizer and memory figure (mem_basis: "
        + "; ".join(f"{k} = {v}" for k, v in MEM_BASIS.items() if k != "peak_with_resident")
        + "). saved = baseline − sharded, in MiB and % of the baseline; negative: sharding cost memory. "
        "Counted (bytes), not timed. The optimizer sets what there is to shard: sgd keeps no state (ZeRO-1 saves "
        "nothing there), sgd_momentum one buffer per parameter, adamw two. ZeRO-1 splits it by whole tensors, so the "
        "rank that keeps the largest share sets the largest peak (LeNet at k=2: its first linear layer's weight is "
        "four fifths of the model).\n\n",
    ]
    table = savings(mem)
    if table.empty:
        return s + ["No sharding strategy was measured at a point its baseline was measured at.\n"]
    return s + [md_table(table, COLUMNS)]
