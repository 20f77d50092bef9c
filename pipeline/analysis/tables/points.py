"""The analysis wing's floor: sweep tables in, pure pandas tables out (no files written, no figures).

From the trial rows (rows.py: results/sweeps/*.jsonl read into one typed frame) it derives per-point
throughput, weak/strong scaling efficiency, per-device memory and accuracy.
Only complete, non-oversubscribed trials enter the numbers. Undefined stays NaN, never 0.
Everything above this module (step_parts.py, summary.py, knob_effects.py, projection.py beside it; report/, plots/
and stage.py above tables/) imports from here, never the other way.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.analysis.tables import comparable, stats
from pipeline.analysis.tables.rows import EXPECTED, EXTRAS
from pipeline.records.trial import point_columns

POINT = ("strategy", "model", "k", "batch_size", "per_device_batch")
MIB = 2.0**20
# What a row's peak_mem_bytes holds (its mem_basis, set by pipeline/measure/memory.py's meters), hence what imbalance
# and device-0 excess are computed from. A row without a basis (a table written before the column) has its method's.
# each a phrase with no parentheses of its own: the report puts it in parentheses beside a figure
MEM_BASIS = {
    "steady_step_above_resident": "the steady-state steps' peak above what was resident before the first step, the "
    "libraries' workspaces and the warm-up's autotuning left out, by the CUDA allocator",
    "step_above_resident": "the step's peak above what was resident before the first step, the libraries' workspaces "
    "included, by the CUDA allocator: a table written before the steady-state window",
    "memtracker_step": "one probe step's tensor memory, parameters included, by PyTorch's MemTracker on CPU",
    "peak_with_resident": "the allocator's peak over the whole run, data and evaluation included: a table written "
    "before the step window",
}
MEM_LISTS = {
    "resident": "mem_resident_bytes",
    "workspace": "mem_workspace_bytes",
    "reserved_peaks": "mem_reserved_peak_bytes",
    "nvml_used": "mem_nvml_used_bytes",
}  # memory_table column: the sweep table's per-device column


# ---------------------------------------------------------------- tables


def measured(df):
    return df[(df["state"] == "complete") & ~df["oversubscribed"] & df["k"].notna() & df["batch_size"].notna()]


def all_parallel(values) -> bool | None:
    vals = [v for v in values if v is not None]
    return None if not vals else all(vals)


def is_serial(r) -> bool:
    """The row's k devices ran one after another (parallel_devices is False, as bool or numpy bool)."""
    v = r.get("parallel_devices")
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and not bool(v)


def group_by(df, keys):
    return df.groupby(list(keys), sort=False, dropna=False)


def timed(g):
    """The trials a point's speed comes from: those measured without interference, or, where every timed trial
    of the point was flagged, those flagged trials (the point is then "under load", labelled wherever it shows)."""
    quiet = g[~g["interfered"]]
    if quiet["throughput_img_s"].notna().any() or not g["throughput_img_s"].notna().any():
        return quiet, False
    return g, True


def load_of(g) -> float:
    """The median cores other processes kept busy during a group's trials (interference.py's foreign_cores)."""
    return g["foreign_cores"].median() if "foreign_cores" in g else math.nan


def point_table(df) -> pd.DataFrame:
    """One row per measured point (strategy, model, k, B, knobs): throughput is the median
    over lrs (and repeats) of complete trials measured without interference, or of its flagged trials where all
    were flagged (under_load True, load_cores: their median other-process cores); accuracy comes from the best lr."""
    measures = [c for c in point_columns() if c in df]  # the record's POINT fields: each one's median per point
    cols = [
        *POINT,
        *EXTRAS,
        "nodes",
        "throughput_img_s",
        "n_trials",
        "n_lrs",
        "best_lr",
        "final_test_acc",
        "time_to_acc_s",
        "parallel_devices",
        "n_interfered",
        "under_load",
        "load_cores",
        *measures,
    ]
    rows = []
    for key, g in group_by(measured(df), (*POINT, *EXTRAS)):
        acc = g[g["final_test_acc"].notna()]
        best = acc.sort_values(["final_test_acc", "time_to_acc_s"], ascending=[False, True]).head(1)
        at_best = {c: best[c].iloc[0] if len(best) else math.nan for c in ("lr", "final_test_acc", "time_to_acc_s")}
        used, loaded = timed(g)
        rows.append(
            {
                **dict(zip((*POINT, *EXTRAS), key)),
                "throughput_img_s": used["throughput_img_s"].median(),  # NaN if none timed
                "n_interfered": int(g["interfered"].sum()),
                "under_load": loaded,
                "load_cores": load_of(used) if loaded else math.nan,
                "n_trials": len(g),
                "n_lrs": g["lr"].nunique(),
                "best_lr": at_best["lr"],
                "final_test_acc": at_best["final_test_acc"],
                "time_to_acc_s": at_best["time_to_acc_s"],
                "parallel_devices": all_parallel(g["parallel_devices"]),
                "nodes": nodes(g),
                **{c: g[c].median() for c in measures},
            }
        )
    return sort_points(pd.DataFrame(rows, columns=cols))


def nodes(g) -> int:
    """The nodes a point's trials ran on (the sweep table's nnodes: ceil(k / devices per node) under SLURM; 1 in
    tables without the column)."""
    n = pd.to_numeric(g["nnodes"], errors="coerce").max() if "nnodes" in g else math.nan
    return 1 if math.isnan(n) else int(n)


def _window_groups(df) -> dict:
    """Per point (POINT + EXTRAS, as text): one list of window throughputs per complete trial its speed comes from
    (timed(): measured without interference, or all flagged), from its `throughput_windows`, or its overall
    figure as one window where it has none, for stats.py."""
    m = measured(df)
    m = pd.concat([timed(g)[0] for _, g in group_by(m, (*POINT, *EXTRAS))]) if len(m) else m
    cells = m["throughput_windows"] if "throughput_windows" in m else pd.Series([None] * len(m), index=m.index)
    out: dict = {}
    for r, w in zip(m.to_dict("records"), cells):
        windows = [float(x) for x in w] if isinstance(w, (list, tuple)) else []
        thr = r["throughput_img_s"]
        out.setdefault(_point_key(r), []).append(windows or ([] if math.isnan(thr) else [thr]))
    return out


def _point_key(r) -> tuple:
    return tuple(str(r[c]) for c in (*POINT, *EXTRAS))


def _intervals(r, base, windows) -> dict:
    out = stats.point_intervals(
        windows.get(_point_key(r), []), None if base is None else windows.get(_point_key(base), []), r["k"]
    )
    loads = [x["load_cores"] for x in (r, base) if x is not None and x["under_load"]]
    return {
        **out,
        "base_n_interfered": base["n_interfered"] if base is not None else math.nan,
        # either end measured under load: the ratio is too, at the larger of the two loads
        "under_load": bool(loads),
        "load_cores": max(loads) if loads else math.nan,
        "base_under_load": bool(base is not None and base["under_load"]),
        "k_under_load": bool(r["under_load"]),
        # each end's own load (NaN where quiet), and whether the two may be divided (comparable.py's rule)
        "base_load_cores": base["load_cores"] if base is not None else math.nan,
        "k_load_cores": r["load_cores"],
        "comparable": base is None or comparable.comparable(r, base),
    }


def scaling_table(df) -> pd.DataFrame:
    """Weak (fixed b) and strong (fixed B) efficiency T(k)/(k*T(1)) and speedup T(k)/T(1)
    for every measured k; NaN where the same strategy has no k=1 point at that b/B. Each with its 95 % bootstrap
    interval (stats.py; *_lo/*_hi: NaN where a single measurement leaves it unknown), the windows and repeats
    behind the point (n_windows, n_repeats) and behind its k=1 reference (base_n_*), each end's load (k_/base_
    under_load, *_load_cores) and `comparable`: False where the two ends were measured under loads that
    comparable.py's rule keeps apart (the efficiency is then labelled, never ranked)."""
    pts = point_table(df)
    pts = pts[pts["throughput_img_s"].notna()]
    windows = _window_groups(df)
    rows = []
    for kind, ref in (("weak", "per_device_batch"), ("strong", "batch_size")):
        for _, g in group_by(pts, ("strategy", "model", ref, *EXTRAS)):
            base = g[g["k"] == 1]
            base = base.iloc[0] if len(base) else None
            t1 = base["throughput_img_s"] if base is not None else math.nan
            for r in g.to_dict("records"):
                speedup = r["throughput_img_s"] / t1
                rows.append(
                    {
                        **r,
                        "kind": kind,
                        "base_throughput_img_s": t1,
                        "speedup": speedup,
                        "efficiency": speedup / r["k"],
                        **_intervals(r, base, windows),
                    }
                )
    cols = [
        *POINT,
        *EXTRAS,
        "nodes",
        "kind",
        "efficiency",
        "efficiency_lo",
        "efficiency_hi",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "throughput_img_s",
        "throughput_lo",
        "throughput_hi",
        "base_throughput_img_s",
        "parallel_devices",
        "n_windows",
        "n_repeats",
        "base_n_windows",
        "base_n_repeats",
        "n_interfered",
        "base_n_interfered",
        "under_load",
        "load_cores",
        "base_under_load",
        "k_under_load",
        "base_load_cores",
        "k_load_cores",
        "comparable",
    ]
    return sort_points(pd.DataFrame(rows, columns=cols), ("kind",))


def memory_table(df) -> pd.DataFrame:
    """Per point: per-device figures (median over trials, bytes; device 0 first): `peak_mem_bytes` (of kind
    mem_basis, the figure imbalance max/mean and device-0 excess peak[0] - mean(peak[1:]) (k >= 2 only) are computed
    from), `resident`, `reserved_peaks` and `nvml_used` ([] where not measured: CPU, older tables, no NVML); the
    largest device's peak `peak_mem_mib` (MiB) and the devices' mean `peak_mem_mean` (bytes), the record's names."""
    rows = []
    for key, g in group_by(measured(df), (*POINT, *EXTRAS)):
        peaks = _device_medians(g["peak_mem_bytes"])
        if not peaks:
            continue
        n = len(peaks)
        mean = float(np.nanmean(peaks))
        r = dict(zip((*POINT, *EXTRAS), key))
        excess = peaks[0] - float(np.nanmean(peaks[1:])) if r["k"] >= 2 and n >= 2 else math.nan
        top = float(np.nanmax(peaks))
        rows.append(
            {
                **r,
                "peak_mem_bytes": peaks,
                **{c: _device_medians(g[src]) for c, src in MEM_LISTS.items()},
                "peak_mem_mib": top / MIB,
                "peak_mem_mean": mean,
                "mem_imbalance": top / mean if mean > 0 else math.nan,
                "dev0_excess_bytes": excess,
                "mem_method": ", ".join(sorted(set(g["mem_method"]) - {""})),
                "mem_basis": ", ".join(
                    sorted({basis_of(m, b) for m, b in zip(g["mem_method"], g["mem_basis"])} - {""})
                ),
            }
        )
    cols = [
        *POINT,
        *EXTRAS,
        "peak_mem_bytes",
        *MEM_LISTS,
        "peak_mem_mib",
        "peak_mem_mean",
        "mem_imbalance",
        "dev0_excess_bytes",
        "mem_method",
        "mem_basis",
    ]
    return sort_points(pd.DataFrame(rows, columns=cols))


def basis_of(method: str, basis: str) -> str:
    """A row's mem_basis; an older row's (none recorded) from its method."""
    if basis or not method:
        return basis
    return "memtracker_step" if method == "memtracker" else "peak_with_resident"


def _device_medians(lists) -> list[float]:
    """Per device, the median over trials of a per-device column ([] where no trial has a value)."""
    lists = [[math.nan if v is None else float(v) for v in p] for p in lists if any(v is not None for v in p)]
    if not lists:
        return []
    return [float(np.nanmedian([p[i] if i < len(p) else math.nan for p in lists])) for i in range(max(map(len, lists)))]


def memory_devices(mem) -> pd.DataFrame:
    """memory_table exploded to one row per device (tidy, for memory.csv): the device's peak `peak_mem_bytes` and
    `peak_mem_mib_dev` (MiB, as MLflow's peak_mem_mib_devN) beside its point's figures (`peak_mem_mib`: the largest
    device's); resident_bytes, reserved_peak_bytes and nvml_used_bytes NaN where not measured."""
    lists = ("peak_mem_bytes", *MEM_LISTS)
    extra = {
        "resident": "resident_bytes",
        "workspace": "workspace_bytes",
        "reserved_peaks": "reserved_peak_bytes",
        "nvml_used": "nvml_used_bytes",
    }
    rows = [
        {
            **{c: r[c] for c in mem.columns if c not in lists},
            "device": i,
            "peak_mem_bytes": int(round(p)),
            "peak_mem_mib_dev": p / MIB,
            **{name: r[c][i] if i < len(r[c]) else math.nan for c, name in extra.items()},
        }
        for r in mem.to_dict("records")
        for i, p in enumerate(r["peak_mem_bytes"])
        if not math.isnan(p)
    ]
    return pd.DataFrame(
        rows,
        columns=[
            *(c for c in mem.columns if c not in lists),
            "device",
            "peak_mem_bytes",
            "peak_mem_mib_dev",
            *extra.values(),
        ],
    )


def _time_to_acc(r, target):
    accs, secs = r["test_acc"], r["epoch_s"]
    if accs and len(secs) >= len(accs):
        for a, t in zip(accs, np.cumsum(secs)):
            if a >= target:
                return float(t)
        return math.nan
    return r["time_to_acc_s"] if r["target_acc"] == target else math.nan


def accuracy_table(df, target_acc: float | None = None) -> pd.DataFrame:
    """Final test accuracy and time to target per (strategy, model, k, B, lr); with target_acc,
    time is recomputed as cumulative training-epoch seconds until the first epoch >= target."""
    m = measured(df).copy()
    if target_acc is not None:
        m["time_to_acc_s"] = [_time_to_acc(r, target_acc) for r in m.to_dict("records")]
        m["target_acc"] = float(target_acc)
    keys = (*POINT, "lr", "epochs", *EXTRAS)
    rows = [
        {
            **dict(zip(keys, key)),
            "final_test_acc": g["final_test_acc"].median(),
            # a repeat that never reached the target makes the point "not reached"
            "time_to_acc_s": g["time_to_acc_s"].median(skipna=False),
            "target_acc": g["target_acc"].max(),
            "n_trials": len(g),
        }
        for key, g in group_by(m, keys)
    ]
    cols = [*keys, "final_test_acc", "time_to_acc_s", "target_acc", "n_trials"]
    return sort_points(pd.DataFrame(rows, columns=cols), ("lr",))


def with_throughput_intervals(pts, eff) -> pd.DataFrame:
    """`pts` (point_table) with each point's throughput 95% interval, `throughput_lo` and `throughput_hi`, from the
    scaling table's weak rows (where the bootstrap computes it); NaN where it has none."""
    if eff is None or not len(eff) or not len(pts):
        return pts.assign(throughput_lo=np.nan, throughput_hi=np.nan)
    keys = [c for c in (*POINT, *EXTRAS) if c in pts]
    iv = eff[eff["kind"] == "weak"][[*keys, "throughput_lo", "throughput_hi"]].drop_duplicates(keys)
    return pts.merge(iv, on=keys, how="left")


def sort_points(df, extra=()):
    """Strategies in EXPECTED's order (others after them), then model, k, b, B and `extra`."""
    rank = {s: i for i, s in enumerate(EXPECTED)}
    by = [c for c in ("strategy", "model", "k", "per_device_batch", "batch_size", *extra) if c in df]

    def key(col):
        return col.map(lambda s: f"{rank.get(s, 99):02d}{s}") if col.name == "strategy" else col

    return df.sort_values(by, key=key, kind="stable").reset_index(drop=True) if len(df) else df


# ---------------------------------------------------------------- helpers for the summary and the report


def shown_extras(df, cols=EXTRAS):
    """Extras worth a column: they vary within a strategy (host/data_source: anywhere)."""
    if df.empty:
        return []
    return [
        c
        for c in cols
        if c in df
        and (df.groupby("strategy")[c].nunique().max() > 1 or (c in ("host", "data_source") and df[c].nunique() > 1))
    ]


def is_unavailable(reason) -> bool:
    return "unavailable" in str(reason).lower()


def best_row(df, col, ascending=False):
    """The row with the largest (ascending: smallest) defined `col`, or None."""
    d = df[df[col].notna()]
    return None if d.empty else d.sort_values(col, ascending=ascending, kind="stable").iloc[0]


def joined(series):
    """Distinct non-empty values, sorted and comma-joined; None if there are none."""
    vals = sorted(set(series) - {""})
    return ", ".join(vals) if vals else None
