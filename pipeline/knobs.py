"""The DDP communication knobs' effect, for the analysis stage: one table and one plot per knob that varied.

For each knob (bucket_cap_mb, grad_as_bucket_view, accum_steps, comm_hook) that took more than one value among a
strategy's complete trials, every point (strategy, model, k, B, other knobs fixed) is shown per knob value with its
throughput, weak-scaling efficiency and best test accuracy side by side: a faster but worse setting is visible.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

KNOBS = ("bucket_cap_mb", "grad_as_bucket_view", "accum_steps", "comm_hook")


def varied(pts: pd.DataFrame) -> list[str]:
    return [k for k in KNOBS if k in pts and pts[k].dropna().astype(str).nunique() > 1]


def knob_table(pts: pd.DataFrame, eff: pd.DataFrame) -> pd.DataFrame:
    weak = eff[eff["kind"] == "weak"] if len(eff) else eff
    cols = ["knob", "value", "strategy", "model", "k", "batch_size", "throughput_img_s", "weak_efficiency",
            "test_acc"]
    rows = []
    for knob in varied(pts):
        for r in pts.to_dict("records"):
            if pd.isna(r.get(knob)) or r.get(knob) == "":
                continue
            match = weak
            for c in ("strategy", "model", "k", "batch_size", *KNOBS):
                if c in weak and c in r:
                    match = match[match[c].astype(str) == str(r[c])]
            rows.append({"knob": knob, "value": r[knob], "strategy": r["strategy"], "model": r["model"],
                         "k": r["k"], "batch_size": r["batch_size"], "throughput_img_s": r["throughput_img_s"],
                         "weak_efficiency": match["efficiency"].iloc[0] if len(match) else float("nan"),
                         "test_acc": r["test_acc"]})
    return pd.DataFrame(rows, columns=cols)


def plot_knob(table: pd.DataFrame, knob: str, path) -> None:
    t = table[table["knob"] == knob]
    fig = Figure(figsize=(7, 3.6))
    ax, ax2 = fig.subplots(1, 2)
    for (strategy, k), g in t.groupby(["strategy", "k"]):
        g = g.groupby(g["value"].astype(str)).agg({"throughput_img_s": "median", "test_acc": "max"})
        ax.plot(g.index, g["throughput_img_s"], marker="o", label=f"{strategy} k={k}")
        ax2.plot(g.index, g["test_acc"], marker="s", label=f"{strategy} k={k}")
    ax.set(title=f"throughput by {knob}", xlabel=knob, ylabel="images/s")
    ax2.set(title=f"best test accuracy by {knob}", xlabel=knob, ylabel="test accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def section(table: pd.DataFrame, md_table) -> list[str]:
    if table.empty:
        return ["\n## DDP communication knobs\n\nNo knob was varied in these sweeps (turn them on with the "
                "`cpu-comm` profile or `sweep.spaces.ddp.<knob>: [...]`).\n"]
    out = ["\n## DDP communication knobs\n\nEach row is one measured point; accuracy beside throughput shows a "
           "faster but worse setting.\n"]
    for knob in table["knob"].unique():
        t = table[table["knob"] == knob].sort_values(["strategy", "k", "batch_size", "value"])
        out += [f"\n### {knob}\n\n", md_table(t, ["value", "strategy", "model", "k", "batch_size",
                                                  "throughput_img_s", "weak_efficiency", "test_acc"]),
                f"\n![{knob}](knob_{knob}.png)\n"]
    return out
