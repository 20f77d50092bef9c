"""The Reading's honesty lines: what load the figures were measured under, and why a figure the Reading cannot give
is missing, named from the trial rows (never a generic "undefined").

Pure: tables in, sentences out; document.py places them.
"""

from __future__ import annotations

import math

from pipeline.analysis.tables.points import measured
from pipeline.analysis.tables.summary import fastest


def _n(count: int, what: str) -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def load_line(df, pts) -> str | None:
    """How many complete trials were measured under interference and what that did to the figures; None when none
    was flagged."""
    done = df[(df["state"] == "complete") & ~df["oversubscribed"]]
    flagged = done[done["interfered"]]
    if flagged.empty:
        return None
    load = flagged["foreign_cores"].median() if "foreign_cores" in flagged else math.nan
    busy = "" if math.isnan(load) else f" (other processes kept a median {load:.2f} cores busy while they ran)"
    loaded = int(pts["under_load"].astype(bool).sum()) if len(pts) else 0
    top = fastest(pts)  # metrics.json's one point per strategy-k pair (summary.flat_metrics counts these)
    pairs = int(top["under_load"].astype(bool).sum()) if len(top) and "under_load" in top else 0
    who = (
        f"every trial ({_n(len(done), 'complete trial')})"
        if len(flagged) == len(done)
        else f"{len(flagged)} of the {_n(len(done), 'complete trial')}"
    )
    verb = "was" if len(flagged) in (1, len(done)) else "were"
    head = (
        f"**Measured under load**: {who} {verb} measured under interference (flagged by "
        f"pipeline/measure/interference.py){busy}."
    )
    if not loaded:
        return head + (
            " Each such point also has trials measured without interference: its figures come from "
            "those, the flagged ones are left out."
        )
    return head + (
        f" {_n(loaded, 'point')} (a strategy, k and batch each) had only flagged trials: their throughput and "
        "efficiency come from those trials and are labelled *measured under load* (here, in the tables and "
        "summary.json). metrics.json holds one point per strategy-k pair, the fastest, and counts "
        f"{_n(pairs, 'strategy-k pair')} measured under load (its `under_load`: {pairs}, each labelled in "
        "`load_cores.S.kK`). What this host gave while busy is not the strategy's speed on a quiet one; for "
        "that, rerun the sweep when the host is quiet (before each trial it waits up to `sweep.quiet_wait_s` "
        "for a quiet moment)."
    )


def _reasons(rows) -> str:
    reasons = sorted(set(rows["reason"]) - {""}) if "reason" in rows else []
    states = ", ".join(f"{n} {st}" for st, n in rows["state"].value_counts().items())
    return f"{states}" + (f": {'; '.join(reasons[:2])}" if reasons else "")


def no_efficiency_cause(df, p, w_all) -> str:
    """Why no weak-scaling efficiency can be given for one model: df its trial rows, p its point table, w_all its
    weak rows at k >= 2 with an efficiency (before implausible ones are dropped)."""
    timed = p[p["throughput_img_s"].notna()]
    if len(w_all):
        return (
            "every k≥2 efficiency is above 1 beyond its interval (its k=1 reference most likely ran slow), so "
            "none is compared"
        )
    if timed.empty:
        m = measured(df)
        why = "; ".join(sorted(set(m["reason"]) - {""})[:2]) if len(m) and "reason" in m else ""
        return "no complete trial has a throughput" + (f" ({why})" if why else "")
    ks = set(timed["k"])
    for side, missing in (("k=1", 1 not in ks), ("k≥2", not any(k >= 2 for k in ks))):
        if missing:
            rows = df[(df["k"] == 1) if side == "k=1" else (df["k"] >= 2)]
            return f"no {side} point was timed" + (
                f" (its trials: {_reasons(rows)})" if len(rows) else f" (the sweep space has no {side} point)"
            )
    return "no strategy has both k=1 and k≥2 timed at the same per-device batch"
