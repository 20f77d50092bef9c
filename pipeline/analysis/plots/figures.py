"""Figures of the analysis stage (matplotlib's object API, Agg, no global pyplot state), drawn from tables/points.py's
tables: efficiency, throughput, memory per device, accuracy, one per varied knob (knob_effects.py), the step-time
breakdown, and measured vs modelled efficiency (the modelled table of projection.py: dashed, hollow, "modelled")."""

from __future__ import annotations

import math

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from pipeline import catalog
from pipeline.analysis.tables.points import EXTRAS, MIB, group_by, is_serial, with_throughput_intervals
from pipeline.records import files
from pipeline.records.derived import BD_PARTS

LINESTYLES = ("-", "--", "-.", (0, (1, 1)))  # one per batch size within a strategy
MARKERS = ("o", "s", "^", "D", "v")


def style(names):
    """One colour per strategy, stable across figures."""
    return {s: colormaps["tab10"](i % 10) for i, s in enumerate(names)}


def source_note(source: str) -> str:
    """The data line every figure carries, so that a copied figure keeps it."""
    if not source:
        return ""
    return (
        "data: SYNTHETIC stand-in, not Fashion-MNIST (accuracy means nothing)"
        if "synthetic" in source
        else f"data: {source}"
    )


def _empty(ax, what):
    text = f"no {what}" if ":" in what else f"no {what} measured"
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([]), ax.set_yticks([])


def load_note(t) -> str:
    """The line a figure of speeds carries when some of what it plots was measured under load (tables/points.py's
    `under_load`: every trial behind the figure flagged as measured under interference), so a copied figure keeps it."""
    if t is None or "under_load" not in t or not len(t):
        return ""
    n = int(t["under_load"].astype(bool).sum())
    return (
        (
            f"measured under load: {n} of the {len(t)} plotted figures come from trials all flagged as measured "
            "under interference (report.md, Reading)"
        )
        if n
        else ""
    )


def _save(fig, path, source="", load=""):
    note = source_note(source)
    if note:
        fig.text(
            0.01, -0.02, note, fontsize=8, ha="left", va="top", color="tab:red" if "SYNTHETIC" in note else "dimgrey"
        )
    if load:
        fig.text(0.01, -0.07 if note else -0.02, load, fontsize=8, ha="left", va="top", color="tab:red")
    with files.replaced(path) as tmp:  # whole or not at all, never through a symlink
        fig.savefig(tmp, dpi=100, bbox_inches="tight")


def _label(r, models, part, varying=()):
    """A line's legend: its strategy, its model where several are drawn, `part`, and each of `varying` (the settings
    that differ between the strategy's lines, e.g. optimizer=adamw), so no two lines share a label."""
    extra = "".join(f" {c}={r[c]}" for c in varying)
    return f"{r['strategy']}{' ' + r['model'] if len(models) > 1 else ''} {part}{extra}"


def _varying(frame, strategy) -> tuple[str, ...]:
    """The EXTRAS columns whose value differs between `strategy`'s rows of `frame`."""
    rows = frame[frame["strategy"] == strategy]
    return tuple(c for c in EXTRAS if c in rows and rows[c].nunique(dropna=False) > 1)


def _bars(ax, x, lo, hi, color):
    """95 % intervals as vertical bars with caps (stats.py), drawn where known: none where unknown (NaN), never a
    zero-width bar standing in for one."""
    x, lo, hi = (np.asarray(v, dtype=float) for v in (x, lo, hi))
    ok = np.isfinite(lo) & np.isfinite(hi)
    if ok.any():
        ax.vlines(x[ok], lo[ok], hi[ok], color=color, lw=1.2)
        ax.plot(np.r_[x[ok], x[ok]], np.r_[lo[ok], hi[ok]], ls="none", marker="_", ms=8, color=color)


def plot_efficiency(eff, path, colors, source=""):
    """Weak and strong efficiency per k, with 95 % interval bars where known."""
    fig = Figure(figsize=(11, 4.2))
    for ax, kind, ref, sym in zip(
        fig.subplots(1, 2), ("weak", "strong"), ("per_device_batch", "batch_size"), ("b", "B")
    ):
        e = eff[(eff["kind"] == kind) & eff["efficiency"].notna()]
        ax.set_title(f"{kind} scaling (fixed {sym})")
        if e.empty:
            _empty(ax, f"{kind}-scaling efficiency")
            continue
        models = e["model"].unique()
        seen: dict = {}  # strategy -> how many of its lines are drawn: each gets its own style and marker
        for _, g in group_by(e, ("strategy", "model", ref, *EXTRAS)):
            r = g.iloc[0]
            if len(g) < 2:
                continue  # a lone k=1 point is 1.0 by definition
            i = seen[r["strategy"]] = seen.get(r["strategy"], -1) + 1
            ax.plot(
                g["k"],
                g["efficiency"],
                marker=MARKERS[i % len(MARKERS)],
                color=colors[r["strategy"]],
                ls=":" if is_serial(r) else LINESTYLES[i % len(LINESTYLES)],
                label=_label(r, models, f"{sym}={r[ref]:g}", _varying(e, r["strategy"]))
                + (" (serial)" if is_serial(r) else ""),
            )
            _bars(ax, g["k"], g["efficiency_lo"], g["efficiency_hi"], colors[r["strategy"]])
        if not seen:  # only lone k=1 points: no line to draw, and an empty frame reads as "zero"
            what = "per-device batch b" if kind == "weak" else "global batch B"
            _empty(ax, f"{kind}-scaling efficiency:\nno k=1 and k>=2 at one {what}")
            continue
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="ideal")
        ax.set_xticks(sorted(e["k"].unique()))
        ax.set(xlabel="devices k", ylabel="efficiency T(k)/(k·T(1)) (bars: 95% interval)", ylim=(0, None))
        ax.legend(fontsize=7)
    _save(fig, path, source, load_note(eff[eff["efficiency"].notna()] if len(eff) else eff))


def _model_panels(p, what):
    """One panel per model; a model with nothing measured gets a panel that says so."""
    models = sorted(p["model"].unique()) or [""]
    fig = Figure(figsize=(5.5 * len(models), 4.2))
    panels = []
    for ax, model in zip(np.atleast_1d(fig.subplots(1, len(models))), models):
        g = p[p["model"] == model]
        if g.empty:
            _empty(ax, what)
        else:
            panels.append((ax, model, g))
    return fig, panels


def plot_throughput(pts, path, colors, source="", eff=None):
    """Best throughput over batch sizes per strategy and k; with `eff` (scaling_table), its 95 % interval bars."""
    pts = with_throughput_intervals(pts[pts["throughput_img_s"].notna()], eff)
    fig, panels = _model_panels(pts, "throughput")
    for ax, model, g in panels:
        best = g.loc[g.groupby(["strategy", "k"], sort=False)["throughput_img_s"].idxmax()]
        ks = sorted(g["k"].unique())
        for s, b in group_by(best, ("strategy",)):
            if catalog.is_one_device_only(s[0]) and len(b) == 1 and len(ks) > 1:
                # one device only: a reference line across k (a lone point at k=1 hides under the others)
                ax.axhline(
                    b["throughput_img_s"].iloc[0],
                    color=colors[s[0]],
                    ls="--",
                    lw=2,
                    zorder=5,
                    label=f"{s[0]} (1 device), for reference",
                )
                if np.isfinite(b[["throughput_lo", "throughput_hi"]].to_numpy(dtype=float)).all():
                    ax.axhspan(b["throughput_lo"].iloc[0], b["throughput_hi"].iloc[0], color=colors[s[0]], alpha=0.15)
                continue
            ax.plot(b["k"], b["throughput_img_s"], marker="o", color=colors[s[0]], label=s[0])
            _bars(ax, b["k"], b["throughput_lo"], b["throughput_hi"], colors[s[0]])
        ax.set_xticks(ks)
        ax.set(
            title=f"{model}: best throughput over batch sizes",
            xlabel="devices k",
            ylabel="images / s (bars: 95% interval)",
        )
        ax.legend(fontsize=7)
    _save(fig, path, source, load_note(pts))


def _common_batch(m):
    """The global batch measured by the most strategies (ties: the largest)."""
    n = m.groupby("batch_size")["strategy"].nunique()
    return max(n.index, key=lambda b: (n[b], b))


def plot_memory(mem, path, source=""):
    panels = sorted({(r["model"], r["k"]) for r in mem.to_dict("records")}, key=lambda t: (t[0], t[1]))
    fig = Figure(figsize=(max(5.5, 4.5 * len(panels)), 4.2))
    axes = np.atleast_1d(fig.subplots(1, max(1, len(panels)), squeeze=False)[0])
    if not panels:
        _empty(axes[0], "memory")
    for ax, (model, k) in zip(axes, panels):
        m = mem[(mem["model"] == model) & (mem["k"] == k)]
        m = m[m["batch_size"] == _common_batch(m)]
        # one bar group per configuration: a setting that varies (AdamW beside SGD) names its groups, never hidden
        vary = [c for c in EXTRAS if c in m and c not in ("host", "data_source") and m[c].nunique() > 1]
        m = m.drop_duplicates(["strategy", *vary])
        n = max(len(p) for p in m["peak_mem_bytes"])
        w = 0.8 / n
        for d in range(n):
            x = np.arange(len(m)) + (d - (n - 1) / 2) * w
            have = [(xi, p[d] / MIB) for xi, p in zip(x, m["peak_mem_bytes"]) if d < len(p)]
            ax.bar([h[0] for h in have], [h[1] for h in have], w, color=f"C{d}", label=f"device {d}")
            for xi in sorted(set(x) - {h[0] for h in have}):  # not measured (scratch: one process): never 0 MiB
                ax.text(xi, 0, "not measured", ha="center", va="bottom", fontsize=7, rotation=90, color="dimgrey")
        ticks = [" ".join([r["strategy"], *(str(r[c]) for c in vary)]) for r in m.to_dict("records")]
        ax.set_xticks(np.arange(len(m)), ticks, rotation=30, ha="right" if vary else "center", fontsize=8)
        ax.set(title=f"{model}, k={k:g}, B={m['batch_size'].iloc[0]:g}", ylabel="peak memory (MiB)")
        ax.legend(fontsize=7)
    _save(fig, path, source)


def plot_accuracy(pts, path, colors, source=""):
    fig, panels = _model_panels(pts[pts["final_test_acc"].notna()], "accuracy")
    for ax, model, g in panels:
        best = g.groupby(["strategy", "k", "batch_size"], sort=False)["final_test_acc"].max().reset_index()
        for (s, k), b in group_by(best, ("strategy", "k")):
            ax.plot(
                b["batch_size"],
                b["final_test_acc"],
                marker="o",
                color=colors[s],
                ls=["-", "--", ":", "-."][int(math.log2(k)) % 4 if k >= 1 else 0],
                label=f"{s} k={k:g}",
            )
        ax.set_xscale("log", base=2)
        ticks = sorted(best["batch_size"].unique())
        ax.set_xticks(ticks, [f"{b:g}" for b in ticks])
        ax.set(title=f"{model}: final test accuracy (best lr)", xlabel="global batch B", ylabel="test accuracy")
        ax.legend(fontsize=7)
    _save(fig, path, source)


def plot_knob(table, knob, path, source=""):
    """Throughput and best test accuracy per value of one knob (its rows of
    pipeline.analysis.tables.knob_effects.knob_table)."""
    t = table[table["knob"] == knob]
    fig = Figure(figsize=(7, 3.6))
    ax, ax2 = fig.subplots(1, 2)
    for (strategy, k), g in t.groupby(["strategy", "k"]):
        g = g.groupby(g["value"].astype(str)).agg({"throughput_img_s": "median", "final_test_acc": "max"})
        ax.plot(g.index, g["throughput_img_s"], marker="o", label=f"{strategy} k={k}")
        ax2.plot(g.index, g["final_test_acc"], marker="s", label=f"{strategy} k={k}")
    ax.set(title=f"throughput by {knob}", xlabel=knob, ylabel="images/s")
    ax2.set(title=f"best test accuracy by {knob}", xlabel=knob, ylabel="test accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, path, source)


BD_COLORS = {
    "data": "tab:gray",
    "forward": "tab:blue",
    "backward_compute": "tab:orange",
    "comm_exposed": "tab:red",
    "optimizer": "tab:green",
    "idle": "tab:purple",
}


def plot_breakdown(bd, path, source=""):
    """One bar per strategy x k (x per-device batch where several): each part's share of the sampled step, stacked;
    the residual (step - parts) its own hatched segment, below the top where it is negative."""
    fig = Figure(figsize=(max(6.0, 0.8 * len(bd) + 2.5), 4.5))
    ax = fig.subplots()
    if bd.empty:
        _empty(ax, "step-time breakdown")
        _save(fig, path, source)
        return
    several = bd.groupby("strategy")["per_device_batch"].nunique().max() > 1 or bd["model"].nunique() > 1
    labels = [
        f"{r['strategy']}\nk={r['k']:g}" + (f"\n{r['model']} b={r['per_device_batch']:g}" if several else "")
        for r in bd.to_dict("records")
    ]
    x = np.arange(len(bd))
    bottom = np.zeros(len(bd))
    for p in BD_PARTS:
        h = bd[f"{p}_share"].fillna(0).to_numpy()
        ax.bar(x, h, 0.7, bottom=bottom, color=BD_COLORS[p], label=p.replace("_", " "))
        bottom += h
    ax.bar(
        x,
        bd["residual_share"].fillna(0).to_numpy(),
        0.7,
        bottom=bottom,
        color="white",
        edgecolor="black",
        hatch="//",
        label="residual (unattributed)",
    )
    ax.set_xticks(x, labels, fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(title="where a sampled step goes (measured; share of the step)", ylabel="share of step time")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    _save(fig, path, source)


def plot_model(eff, model, path, source=""):
    """Per strategy with modelled points: measured weak-scaling efficiency (solid, filled) and the model's
    (dashed, hollow, labelled "modelled"), one dashed line per interconnect."""
    strategies = list(dict.fromkeys(model["strategy"])) if len(model) else []
    n = max(1, len(strategies))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(5.2 * cols, 4.0 * rows))
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False).ravel())
    if not strategies:
        _empty(axes[0], "modelled efficiency (no strategy with k=1 and k>1 at one per-device batch)")
    ics = list(dict.fromkeys(model["interconnect"])) if len(model) else []
    weak = eff[(eff["kind"] == "weak") & eff["efficiency"].notna()] if len(eff) else eff
    keys = ("model", "per_device_batch", *EXTRAS)
    for ax, s in zip(axes, strategies):
        mine = model[model["strategy"] == s]
        for i, (key, g) in enumerate(group_by(mine, keys)):
            ref = dict(zip(keys, key))
            m = weak[weak["strategy"] == s]
            for c, v in ref.items():
                m = m[m[c] == v]
            b = f"b={ref['per_device_batch']:g}"
            if len(m) >= 2:
                ax.plot(
                    m["k"],
                    m["efficiency"],
                    color="black",
                    ls="-",
                    marker=MARKERS[i % len(MARKERS)],
                    label=f"{b} measured",
                )
            for j, ic in enumerate(ics):
                q = g[g["interconnect"] == ic].sort_values("k")
                if len(q):
                    ax.plot(
                        q["k"],
                        q["modelled_efficiency"],
                        color=colormaps["tab10"]((j + 1) % 10),
                        ls="--",
                        marker=MARKERS[i % len(MARKERS)],
                        markerfacecolor="none",
                        label=f"{b} modelled: {ic}",
                    )
        ax.axhline(1.0, color="grey", ls=":", lw=1, label="ideal")
        ax.set(
            title=f"{s}: weak scaling, measured vs modelled",
            xlabel="devices k",
            ylabel="efficiency (modelled where dashed)",
            ylim=(0, None),
        )
        ax.set_xscale("log", base=2)
        ks = sorted(set(mine["k"]) | {1})
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.legend(fontsize=6)
    for ax in axes[len(strategies) :] if strategies else axes[1:]:
        ax.set_visible(False)
    fig.text(0.01, 1.0, "dashed, hollow: modelled (pipeline/scaling/model.py), not measured", fontsize=8)
    _save(fig, path, source)
