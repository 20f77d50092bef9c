"""The DDP communication knobs' effect, for the analysis stage: one row per measured point and knob value.

For each knob (bucket_cap_mb, grad_as_bucket_view, accum_steps, comm_hook) that took more than one value among a
strategy's complete trials, every point (strategy, model, k, B, other knobs fixed) is listed per knob value with its
throughput, weak-scaling efficiency and best test accuracy side by side: a faster but worse setting is visible.
Pure pandas on points.py's point and scaling tables; plots/figures.py's plot_knob and report/document.py's
knob_section draw and write it.
"""

from __future__ import annotations

import pandas as pd

from pipeline.catalog import KNOBS

# a knob table's columns after `knob`, as the report shows them
COLUMNS = ["value", "strategy", "model", "k", "batch_size", "throughput_img_s", "weak_efficiency", "final_test_acc"]


def varied(pts: pd.DataFrame) -> list[str]:
    return [k for k in KNOBS if k in pts and pts[k].dropna().astype(str).nunique() > 1]


def knob_table(pts: pd.DataFrame, eff: pd.DataFrame) -> pd.DataFrame:
    weak = eff[eff["kind"] == "weak"] if len(eff) else eff
    rows = []
    for knob in varied(pts):
        for r in pts.to_dict("records"):
            if pd.isna(r.get(knob)) or r.get(knob) == "":
                continue
            match = weak
            for c in ("strategy", "model", "k", "batch_size", *KNOBS):
                if c in weak and c in r:
                    match = match[match[c].astype(str) == str(r[c])]
            rows.append(
                {
                    "knob": knob,
                    "value": r[knob],
                    "strategy": r["strategy"],
                    "model": r["model"],
                    "k": r["k"],
                    "batch_size": r["batch_size"],
                    "throughput_img_s": r["throughput_img_s"],
                    "weak_efficiency": match["efficiency"].iloc[0] if len(match) else float("nan"),
                    "final_test_acc": r["final_test_acc"],
                }
            )
    return pd.DataFrame(rows, columns=["knob", *COLUMNS])
