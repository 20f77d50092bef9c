"""Where a sampled step goes, per point, and what a step at k lost against k=1, part by part: the tables behind the
report's "Why it scales as it does" and the first screen's why."""

from __future__ import annotations

import math

import pandas as pd

from pipeline.analysis.tables.points import group_by, measured, sort_points
from pipeline.analysis.tables.rows import EXTRAS
from pipeline.records.derived import BD_PARTS

BD_ALL = (*BD_PARTS, "residual")


BD_KEY = ("strategy", "model", "k", "per_device_batch")


def breakdown_table(df) -> pd.DataFrame:
    """Where a sampled step goes, per (strategy, model, k, per-device batch, extras): the median over complete trials
    of the step and of each part (seconds), and each part's share of that median step. The residual is the median
    step less the parts' medians: the measured residual (the loop's own work between phases) exactly when the point
    has one trial, plus what medians of separate parts leave over when it has several; so the shares and the
    residual's share sum to 1 by construction."""
    m = measured(df)
    m = m[m["bd_step_s"].notna() & (m["bd_step_s"] > 0)]
    rows = []
    for key, g in group_by(m, (*BD_KEY, *EXTRAS)):
        r = {
            **dict(zip((*BD_KEY, *EXTRAS), key)),
            "batch_size": g["batch_size"].iloc[0],
            "n_trials": len(g),
            "samples": g["bd_samples"].sum(),
            "step_s": g["bd_step_s"].median(),
        }
        for p in BD_PARTS:
            r[f"{p}_s"] = g[f"bd_{p}_s"].median()
        r["residual_s"] = r["step_s"] - sum(r[f"{p}_s"] for p in BD_PARTS)
        for p in BD_ALL:
            r[f"{p}_share"] = r[f"{p}_s"] / r["step_s"]
        rows.append(r)
    cols = [
        *BD_KEY,
        *EXTRAS,
        "batch_size",
        "n_trials",
        "samples",
        "step_s",
        *(f"{p}_s" for p in BD_ALL),
        *(f"{p}_share" for p in BD_ALL),
    ]
    return sort_points(pd.DataFrame(rows, columns=cols))


def breakdown_losses(bd, eff) -> pd.DataFrame:
    """Per strategy at each k > 1 with a k=1 breakdown at the same per-device batch (and extras): what the step lost
    against k=1, part by part. loss_<part> = (part(k) - part(1)) / step(k), so the parts' losses sum to the step's
    loss 1 - step(1)/step(k) exactly (a negative loss is a part that got faster); measured_efficiency is the weak
    scaling efficiency from throughput (unsampled steps) beside it, measured_comparable whether its two ends were
    measured under comparable loads (tables/comparable.py)."""
    weak = eff[eff["kind"] == "weak"] if len(eff) else eff
    rows = []
    for key, g in group_by(bd, ("strategy", "model", "per_device_batch", *EXTRAS)):
        base = g[g["k"] == 1]
        if base.empty:
            continue
        one = base.iloc[0]
        for r in g[g["k"] > 1].to_dict("records"):
            e = weak
            for c, v in zip(("strategy", "model", "per_device_batch", *EXTRAS), key):
                e = e[e[c] == v] if len(e) else e
            e = e[e["k"] == r["k"]] if len(e) else e
            out = {c: r[c] for c in (*BD_KEY, *EXTRAS)}
            out.update(
                step_s=r["step_s"],
                step_k1_s=one["step_s"],
                loss=1 - one["step_s"] / r["step_s"],
                measured_efficiency=e["efficiency"].iloc[0] if len(e) else math.nan,
                # False: that efficiency's two ends were measured under loads that are not comparable (comparable.py)
                measured_comparable=bool(e["comparable"].iloc[0]) if len(e) and "comparable" in e else True,
            )
            for p in BD_ALL:
                out[f"loss_{p}"] = (r[f"{p}_s"] - one[f"{p}_s"]) / r["step_s"]
            rows.append(out)
    cols = [
        *BD_KEY,
        *EXTRAS,
        "step_s",
        "step_k1_s",
        "loss",
        "measured_efficiency",
        "measured_comparable",
        *(f"loss_{p}" for p in BD_ALL),
    ]
    return sort_points(pd.DataFrame(rows, columns=cols))
