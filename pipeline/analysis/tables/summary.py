"""summary.json of the analysis stage: per strategy its status, trial counts and headline numbers; and metrics.json,
the DVC metric: the same results as one flat mapping of numbers (`dvc metrics show`, `dvc exp show` columns).

Pure: tables in, plain JSON types out (NaN and inf become null in summary.json, absent in metrics.json). Built on
points.py, rows.py and comparable.py only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.analysis.tables import comparable
from pipeline.analysis.tables.points import POINT as POINT_KEYS
from pipeline.analysis.tables.points import all_parallel, best_row, is_unavailable, joined, measured
from pipeline.analysis.tables.rows import EXTRAS
from pipeline.records.table import n_flagged
from pipeline.records.trial import PROVENANCE, point_columns


def strategy_status(df, files, sweeps_dir, expected):
    """Per strategy: status, reason and trial counts."""
    names = list(dict.fromkeys([*expected, *sorted(set(df["strategy"]) | set(files))]))
    out = {}
    for s in names:
        g = df[df["strategy"] == s]
        counts = {f"n_{st}": int((g["state"] == st).sum()) for st in ("complete", "failed", "pruned", "skipped")}
        counts["n_oversubscribed"] = int(g["oversubscribed"].sum())
        counts["n_flagged"] = n_flagged(g.to_dict("records"))  # the one rule (records/table.is_flagged)
        reasons = sorted(set(g.loc[g["state"] == "skipped", "reason"]) - {""})
        if g.empty:
            status = "missing" if s not in files else files[s].split(":")[0]
            reason = (
                f"no sweep table ({Path(sweeps_dir) / (s + '.jsonl')})"
                if s not in files
                else f"{s}.jsonl is {files[s]}"
            )
        elif (g["state"] == "skipped").all():
            status = "unavailable" if any(map(is_unavailable, reasons)) else "all skipped"
            reason = "; ".join(reasons) or "skipped (no reason recorded)"
        elif len(measured(g)):
            status, reason = "measured", ""
        elif counts["n_complete"]:
            status = "oversubscribed only"
            reason = "complete trials were all oversubscribed (functional tests)"
        else:
            status, reason = "no complete trials", "; ".join(sorted(set(g["reason"]) - {""}))
        out[s] = {"status": status, "reason": reason, "n_trials": len(g), **counts}
    return out


def _at(r, cols):
    return None if r is None else {c: r[c] for c in cols}


def _at_largest_k(eff, kind):
    """Best efficiency of `kind` at the largest k >= 2 where it is defined: of those whose two ends are comparable
    (comparable.py) where there is one, else the best of the rest (labelled `<kind>_efficiency_comparable` False)."""
    e = eff[(eff["kind"] == kind) & eff["efficiency"].notna() & (eff["k"] >= 2)]
    if e.empty:
        return None
    at = e[e["k"] == e["k"].max()]
    like = at[at["comparable"].astype(bool)] if "comparable" in at else at
    return best_row(like if len(like) else at, "efficiency")


def _comparable(r):
    """Whether an efficiency's two ends may be divided (comparable.py's rule); None where there is no efficiency."""
    return None if r is None else bool(r.get("comparable", True))


def _interval(r):
    """The efficiency's 95 % interval ([null, null] where unknown) and the measurements behind its two ends."""
    return (
        None
        if r is None
        else {
            "lo": r["efficiency_lo"],
            "hi": r["efficiency_hi"],
            "level": 0.95,
            "n_windows": r["n_windows"],
            "n_repeats": r["n_repeats"],
            "base_n_windows": r["base_n_windows"],
            "base_n_repeats": r["base_n_repeats"],
        }
    )


def _load(r) -> float | None:
    """The median cores other processes kept busy during the trials behind a figure (comparable.load): None where
    it was measured quietly (or there is no figure), NaN under load with the cores not measured (never None, which
    would read as quiet; jsonable writes it as null, summary.json carrying no NaN, so `_condition` beside it tells
    the two apart)."""
    return None if r is None else comparable.load(r)


def _condition(r) -> str | None:
    """How a figure was measured, in comparable.condition's words ("quietly", "beside 1.70 busy cores", "under load
    (busy cores not measured)"); None where there is no figure. summary.json's `*_under_load_cores` is null both
    quietly and where the busy cores were not measured: this says which."""
    return None if r is None else comparable.condition(r)


def strategy_metrics(s, pts, eff, mem):
    p, e, m = (t[t["strategy"] == s] for t in (pts, eff, mem))
    thr, acc = best_row(p, "throughput_img_s"), best_row(p, "final_test_acc")
    weak, strong = _at_largest_k(e, "weak"), _at_largest_k(e, "strong")
    m2 = m[m["k"] >= 2]
    imb, exc = best_row(m2, "mem_imbalance"), best_row(m2, "dev0_excess_bytes")
    par = all_parallel(p.loc[p["k"] >= 2, "parallel_devices"])
    return {
        "largest_k": None if p.empty else int(p["k"].max()),
        "parallel_devices": par,
        "best_throughput_img_s": None if thr is None else thr["throughput_img_s"],
        "best_throughput_at": _at(thr, ("model", "k", "batch_size")),
        "weak_efficiency": None if weak is None else weak["efficiency"],
        "weak_efficiency_at": _at(weak, ("model", "k", "per_device_batch")),
        "weak_efficiency_interval": _interval(weak),
        "strong_efficiency": None if strong is None else strong["efficiency"],
        "strong_efficiency_at": _at(strong, ("model", "k", "batch_size")),
        "strong_efficiency_interval": _interval(strong),
        "worst_mem_imbalance": None if imb is None else imb["mem_imbalance"],
        "worst_mem_imbalance_at": _at(imb, ("model", "k", "batch_size")),
        "max_dev0_excess_bytes": None if exc is None else exc["dev0_excess_bytes"],
        # what those two are computed from (points.MEM_BASIS): on GPUs the step's peak above resident
        "mem_basis": None if imb is None else imb["mem_basis"] or None,
        # measured under load (points.timed): every trial behind the figure was flagged by interference.py; the
        # figure is kept, labelled with the cores other processes kept busy meanwhile (numbers, so the analysis
        # run's MLflow metrics carry the label: strategy/<s>/weak_efficiency_under_load_cores)
        "best_throughput_under_load_cores": _load(thr),
        "weak_efficiency_under_load_cores": _load(weak),
        "strong_efficiency_under_load_cores": _load(strong),
        "best_throughput_condition": _condition(thr),
        "weak_efficiency_condition": _condition(weak),
        "strong_efficiency_condition": _condition(strong),
        # False: its k=1 reference and its k point were measured under loads comparable.py keeps apart, so the
        # ratio is the load difference as much as the strategy's scaling (report.md says which end was which)
        "weak_efficiency_comparable": _comparable(weak),
        "strong_efficiency_comparable": _comparable(strong),
        "best_test_acc": None if acc is None else acc["final_test_acc"],
        "best_test_acc_at": _at(acc, ("model", "k", "batch_size", "best_lr")),
    }


def jsonable(v):
    """Plain JSON types; NaN/inf -> None (summary.json must never carry NaN)."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if not math.isfinite(f) else int(f) if f.is_integer() and abs(f) < 2**53 else f
    return None if v is None or v is pd.NA else v


def trial_counts(df) -> dict:
    """Complete trials on devices of their own, split into those measured on a quiet host (n_measured) and those
    flagged as measured under interference (n_flagged: records/table.n_flagged, the study row's count too; left out
    of a point that has quiet trials, labelled *measured under load* where a point has no other)."""
    flags = ["state", "oversubscribed", "interfered"]
    rows = df[[c for c in flags if c in df]].to_dict("records")
    m = measured(df)
    return {
        "n_measured": len(m) - n_flagged(m[[c for c in flags if c in m]].to_dict("records")),
        "n_flagged": n_flagged(rows),
    }


def summarize(df, status, pts, eff, mem, target_acc):
    strategies = {s: {**st, **provenance(df, s), **strategy_metrics(s, pts, eff, mem)} for s, st in status.items()}
    targets = sorted(set(df["target_acc"].dropna()))
    return jsonable(
        {
            "host": joined(df["host"]),
            "device_kind": joined(df["device_kind"]),
            "device_name": joined(df["device_name"]),
            "host_devices": None if df["host_devices"].dropna().empty else df["host_devices"].max(),
            "data_source": joined(df["data_source"]),
            "synthetic_data": bool((df["data_source"] == "synthetic").any()),
            "target_acc": target_acc if target_acc is not None else (targets[0] if len(targets) == 1 else None),
            "n_trials": len(df),
            "n_complete": int((df["state"] == "complete").sum()),
            **trial_counts(df),
            "strategies": strategies,
        }
    )


def provenance(df, strategy: str) -> dict:
    """The code, data and torch a strategy's rows were measured with (records.trial.PROVENANCE), each value that
    occurs; None for a table written before they were recorded."""
    rows = df[df["strategy"] == strategy] if "strategy" in df else df.iloc[:0]
    return {k: joined(rows[k].dropna().astype(str)) if k in rows else None for k in PROVENANCE}


def _key(*parts) -> str:
    return ".".join(str(p) for p in parts if p is not None and p != "")


def _finite(v) -> bool:
    return (
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, (bool, np.bool_))
        and math.isfinite(float(v))
    )


# significant digits per metrics.json group, keyed by the measurement's name (every key starts with it: a figure is
# named as the column or the summary.json entry it holds, never renamed): enough to tell two experiments apart;
# accuracy to 4 decimals of a 0.xxxx value, as the report prints it
THROUGHPUT = "throughput_img_s"  # the record's field, the sweep table's column, the report's and MLflow's name
PEAK_MIB = "peak_mem_mib"  # the record's name for the largest device's peak in MiB (the memory table's column)
WEAK_EFFICIENCY = "weak_efficiency"  # summary.json's name, and metrics.json's keys `weak_efficiency.S.kK`
STRONG_EFFICIENCY = "strong_efficiency"  # the same for strong scaling: `strong_efficiency.S.kK`
DIGITS = {
    THROUGHPUT: 4,
    WEAK_EFFICIENCY: 3,
    STRONG_EFFICIENCY: 3,
    PEAK_MIB: 4,
    "final_test_acc": 4,
    "best_test_acc": 4,
    "load_cores": 3,
}
KEYS = ("strategy", "model", "k")  # what a metrics.json figure is per (the model only when the sweeps hold several)


def _rounded(v: float, digits: int) -> float:
    v = float(v)
    return v if v == 0 else round(v, digits - 1 - math.floor(math.log10(abs(v))))


def fastest(pts) -> pd.DataFrame:
    """Per strategy, model and k, the point metrics.json's figures are of: the fastest measured (the configuration
    the report's answer runs at that k, with its best lr), else the first listed. Like against like
    (comparable.py): the fastest of the largest group of that k's points measured under comparable loads, so a
    quiet point is never passed over for a loaded one that was timed faster."""
    if pts.empty:
        return pts
    speed = pts["throughput_img_s"] if "throughput_img_s" in pts else pd.Series(math.nan, index=pts.index)
    order = pts.assign(_speed=speed.fillna(-math.inf)).sort_values("_speed", ascending=False, kind="stable")
    if "under_load" in order:
        timed = order[order["throughput_img_s"].notna()] if "throughput_img_s" in order else order.iloc[0:0]
        apart = []
        for _, g in timed.groupby(list(KEYS), sort=False):
            rows = g.to_dict("index")
            like = comparable.largest_group([{**r, "_i": i} for i, r in rows.items()])
            apart += [i for i in rows if i not in {r["_i"] for r in like}]
        order = order.drop(index=apart)
    return order.groupby(list(KEYS), sort=True).head(1).drop(columns="_speed")


def _at_point(table, points, on) -> pd.DataFrame:
    """table's rows at those points (matched on `on`, the columns both have), one per point."""
    if table.empty or points.empty:
        return table.iloc[0:0]
    on = [c for c in on if c in table and c in points]
    return table.merge(points[on].drop_duplicates(), on=on, how="inner")


def _per_k(out: dict, table, col: str, models: bool) -> None:
    """out[col.strategy[.model].kK] = `col` of the table's row for that strategy, model and k (one per key): the
    key is the column's own name (a figure under another name is a column of that name in the view handed here)."""
    if table.empty or col not in table:
        return
    for (s, m, k), g in table.groupby(list(KEYS), sort=True):
        vals = [float(v) for v in g[col] if _finite(v)]
        if vals:
            out[_key(col, s, m if models else None, f"k{int(k)}")] = _rounded(vals[0], DIGITS.get(col, 4))


def flat_metrics(summary: dict, pts, eff, mem) -> dict:
    """metrics.json: numbers and, last, the strings of what they come from; flat dotted keys, stable across experiments
    of one profile, in the order `dvc exp show` shows them: first the counts that explain an empty cell (`n_trials`,
    `n_complete`, `n_measured`: on a quiet host, `n_flagged`: measured under interference), then per strategy and k the
    figures of ONE point, the fastest at that k (`fastest`: the configuration the report's answer runs there), so that
    each value is the report's. Every key starts with the name of the measurement it holds (the column of the table it
    is read from, or summary.json's name for it): `throughput_img_s.S.kK` (its images/s), `weak_efficiency.S.kK` (its
    weak-scaling efficiency, k >= 2), `strong_efficiency.S.kK`, `peak_mem_mib.S.kK` (its largest per-device peak, MiB,
    as the trial record names it), `final_test_acc.S.kK` (its test accuracy, best lr), `<name>.S.kK` for each field the
    trial record declares with the POINT view; then per strategy `best_test_acc.S`, a different quantity: the best test
    accuracy of any of the strategy's points (the report's "against the best"). Rounded to DIGITS significant digits.
    The model joins the key (`weak_efficiency.ddp.resnet18.k2`) only when the sweeps hold more than one. Undefined
    values are left out, never 0; memory imbalance and per-strategy counts are in summary.json and report.md. Measured
    under load (points.timed: every trial behind the point flagged by interference.py): the figures keep their keys and
    `load_cores.S.kK` labels them with the cores other processes kept busy at that point (an efficiency whose k=1 end
    alone was loaded is labelled in report.md and efficiency.csv); `under_load` counts the labelled strategy-k pairs (0
    on a quiet host). An efficiency whose k=1 reference and k point were measured under loads that are not comparable
    (comparable.py's rule, docs/metrics.md) keeps its key and gets `weak_efficiency_comparable.S.kK` (or `strong_…`)
    0 beside it (absent where its ends are comparable, as on a quiet host). Last, per strategy, `code_digest.S`,
    `data_digest.S` and `torch_version.S` (records.trial.PROVENANCE, as summary.json's `provenance` joins them:
    comma-separated where its rows mix several), strings that `dvc exp show` shows as columns and `dvc metrics diff`
    lists without a difference; absent for a table without them; and `data_source`, the data the figures are of
    (summary.json's: "synthetic" for the stand-in), which params.yaml's data.source need not be (`make
    pipeline-offline` puts params.yaml back after its synthetic run)."""
    models = len(set(pts["model"]) | set(mem["model"])) > 1 if len(pts) or len(mem) else False
    out: dict = {
        k: summary[k] for k in ("n_trials", "n_complete", "n_measured", "n_flagged") if _finite(summary.get(k))
    }
    top = fastest(pts)
    on = [*POINT_KEYS, *(c for c in top.columns if c in EXTRAS)]
    _per_k(out, top, THROUGHPUT, models)
    for kind in ("weak", "strong"):  # summary.json's weak_efficiency and strong_efficiency, per point
        e = eff[(eff["kind"] == kind) & (eff["k"] >= 2)] if len(eff) else eff
        at = _at_point(e, top, on)
        if "efficiency" in at:  # the efficiency table's column, computed under summary.json's name for this kind
            _per_k(out, at.assign(**{f"{kind}_efficiency": at["efficiency"]}), f"{kind}_efficiency", models)
    if len(mem):
        at = _at_point(mem, top, on)
        _per_k(out, at, PEAK_MIB, models)
    _per_k(out, top, "final_test_acc", models)
    strategies = summary.get("strategies") or {}
    out.update(
        {
            _key("best_test_acc", s): _rounded(st["best_test_acc"], DIGITS["best_test_acc"])
            for s, st in strategies.items()
            if _finite(st.get("best_test_acc"))
        }
    )
    for col in point_columns():  # the record's POINT fields, at the same point
        if col in top:
            _per_k(out, top, col, models)
    loaded = top[top["under_load"].astype(bool)] if len(top) and "under_load" in top else top.iloc[0:0]
    _per_k(out, loaded, "load_cores", models)  # the label: cores busy elsewhere (absent: unmeasured)
    out["under_load"] = len(loaded)
    for kind in ("weak", "strong"):  # the label of an efficiency whose two ends are not comparable: 0
        e = eff[(eff["kind"] == kind) & (eff["k"] >= 2) & eff["efficiency"].notna()] if len(eff) else eff
        at = _at_point(e, top, on)
        if "comparable" in at and len(at):
            name = f"{kind}_efficiency_comparable"
            _per_k(out, at[~at["comparable"].astype(bool)].assign(**{name: 0.0}), name, models)
    for name in PROVENANCE:  # what the figures come from, as strings `dvc exp show` shows in their own columns
        out.update({_key(name, s): st[name] for s, st in strategies.items() if isinstance(st.get(name), str)})
    if isinstance(summary.get("data_source"), str) and summary["data_source"]:  # the data the figures are of
        out["data_source"] = summary["data_source"]
    return jsonable(out)
