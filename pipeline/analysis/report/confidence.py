"""How sure each claim of the report's reading is: figures quoted with their 95 % interval (tables/stats.py, through
points.scaling_table), a "best" named only when its interval clears the runner-up's ("indistinguishable within the
95% interval" otherwise), efficiency above 1 called implausible only beyond its interval, and a short note per claim
of what is behind it (windows, repeats, interval width, interfered trials left out). Like against like
(tables/comparable.py): a ranking takes the largest group of figures measured under comparable loads, names the
faster ones it leaves out as not comparable, and an efficiency whose two ends are not comparable is labelled, never
ranked.

Pure: table rows in, sentences out. document.py places them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from pipeline.analysis.tables import comparable, stats
from pipeline.analysis.tables.points import EXTRAS, POINT

LEVEL = f"{stats.LEVEL:.0%} interval"
UNKNOWN = "no interval"


def _nan(v) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and math.isnan(v))


def known(lo, hi) -> bool:
    return not (_nan(lo) or _nan(hi))


def fmt(v, lo, hi, digits: int = 2) -> str:
    """'0.85 [0.80–0.90]', or '0.85 (no interval)'; thousands for throughput (digits=0)."""
    f = (lambda x: f"{x:,.0f}") if digits == 0 else (lambda x: f"{x:.{digits}f}")
    return f"{f(v)} [{f(lo)}–{f(hi)}]" if known(lo, hi) else f"{f(v)} ({UNKNOWN})"


def _n(count, what: str) -> str:
    return f"{int(count)} {what}{'' if int(count) == 1 else 's'}"


def _readings(windows, trials) -> str:
    """'36 readings of images/s over 3 trials', '1 reading of images/s over 1 trial': a reading is one measurement
    window's steady-state images/s (its timed steps)."""
    return f"{_n(windows, 'reading')} of images/s over {_n(trials, 'trial')}"


def how_sure(r, value: str = "efficiency") -> str:
    """The note after a claim about one scaling-table row: measurements behind it (trials: repeats and learning
    rates of the point), interval width, trials left out as measured under interference."""
    lo, hi = r.get(f"{value}_lo"), r.get(f"{value}_hi")
    # a trial's measurement windows, in plain words: each gives one images/s reading (meter.py's throughput_windows)
    n = _readings(r["n_windows"], r["n_repeats"])
    if value != "throughput" and not _nan(r.get("base_n_repeats")):
        n += f" at k={r['k']:g}, {_readings(r['base_n_windows'], r['base_n_repeats'])} at k=1"
    width = (
        f"{LEVEL} {hi - lo:,.{0 if value == 'throughput' else 2}f} wide"
        if known(lo, hi)
        else "interval unknown: measured once, so a second measurement could differ by any amount"
    )
    inter = sum(int(r.get(c) or 0) for c in ("n_interfered", "base_n_interfered") if not _nan(r.get(c)))
    excluded = f"; {_n(inter, 'trial')} measured under interference left out" if inter else ""
    if r.get("under_load"):
        excluded = f"; {under_load_text(r)}"
    return f"how sure: {n}; {width}{excluded}"


def under_load_text(r) -> str:
    """The label of a figure whose trials were all flagged as measured under interference (points.timed)."""
    load = r.get("load_cores")
    busy = "" if _nan(load) else f", other processes keeping {load:.2f} cores busy (median)"
    base, at_k = (None if _nan(r.get(c)) else bool(r.get(c)) for c in ("base_under_load", "k_under_load"))
    if base is True and at_k is False:  # a ratio of a loaded k=1 and a quiet k: the efficiency reads high
        return (
            f"**measured under load**: its k=1 reference's trials were all flagged as measured under "
            f"interference{busy} and the k={r['k']:g} trials were not, so the k=1 speed is low and this "
            "efficiency reads high; it is not the strategy's scaling on a quiet host"
        )
    if base is False and at_k is True:  # a quiet k=1 and a loaded k: the efficiency reads low
        return (
            f"**measured under load**: its k={r['k']:g} trials were all flagged as measured under "
            f"interference{busy} and the k=1 reference's were not, so this efficiency reads low; "
            "it is not the strategy's scaling on a quiet host"
        )
    return (
        f"**measured under load**: every trial behind it was flagged as measured under interference{busy}, "
        "so it is what this host gave while busy, not the strategy's speed on a quiet host"
    )


def with_throughput_intervals(pts, eff):
    """point_table rows with the throughput interval and counts of their scaling-table (weak) rows."""
    cols = ["throughput_lo", "throughput_hi", "n_windows", "n_repeats"]
    keys = [c for c in (*POINT, *EXTRAS) if c in pts]
    if len(pts) == 0 or len(eff) == 0:
        return pts.assign(**{c: math.nan for c in cols})
    iv = eff[eff["kind"] == "weak"][[*keys, *cols]].drop_duplicates(keys)
    return pts.drop(columns=[c for c in cols if c in pts]).merge(iv, on=keys, how="left")


def ranking(rows, value: str) -> tuple[str, list, list]:
    """rows: one per strategy, best first. ('best' | 'indistinguishable' | 'unknown' | 'only', the strategies tied
    with the first within their intervals (first included), the rest)."""
    if len(rows) == 1:
        return "only", rows[:1], []
    top = rows[0]
    verdicts = [
        stats.overlap((top[f"{value}_lo"], top[f"{value}_hi"]), (r[f"{value}_lo"], r[f"{value}_hi"])) for r in rows[1:]
    ]
    tied = [top] + [r for r, v in zip(rows[1:], verdicts) if v]
    rest = [r for r, v in zip(rows[1:], verdicts) if not v]
    if len(tied) > 1:
        return "indistinguishable", tied, rest
    return ("unknown" if any(v is None for v in verdicts) else "best"), tied, rest


def _ids(rows) -> set:
    return {id(r) for r in rows}


def outside(rows, group, col: str, q, rerun: str) -> str:
    """The figures of strategies left out of a like-for-like ranking that are above its best (what a reader would
    ask about): " Not ranked with them: ... not comparable on this host: ..." ("" where none is)."""
    if not group:
        return ""
    top = max(r[col] for r in group)
    inside = _ids(group)
    out = [r for r in rows if id(r) not in inside and r[col] > top]
    best: dict = {}
    for r in out:
        if r["strategy"] not in best or r[col] > best[r["strategy"]][col]:
            best[r["strategy"]] = r
    if not best:
        return ""
    named = [(q(r), r) for r in sorted(best.values(), key=lambda r: -r[col])]
    return (
        " Not ranked with them, though higher: "
        + comparable.not_comparable([*named, ("the ranked figures", comparable.load_range(group))], rerun)
        + "."
    )


def per_strategy(rows, col: str) -> list:
    """Each strategy's highest `col` among `rows` (dicts), highest first."""
    best: dict = {}
    for r in rows:
        if r["strategy"] not in best or r[col] > best[r["strategy"]][col]:
            best[r["strategy"]] = r
    return sorted(best.values(), key=lambda r: -r[col])


def unlike(everything, col: str, q, rerun: str) -> str | None:
    """Where no two strategies were measured under comparable loads though several were measured: why none is
    ranked, each strategy's highest figure with how it was measured (None where a ranking stands)."""
    group = comparable.largest_group(everything)
    if len({r["strategy"] for r in group}) >= 2 or len({r["strategy"] for r in everything}) < 2:
        return None
    named = [(q(r), r) for r in per_strategy(everything, col)]
    return "none named, as no two strategies were measured under comparable loads: " + comparable.not_comparable(
        named, rerun
    )


def _ranked_where(group, everything) -> str:
    """Where a ranking on a busy host compares like against like: "" where nothing was left out of it."""
    if len(group) == len(everything):
        return ""
    return f" among the figures measured {comparable.load_range(group)} (like against like: docs/metrics.md)"


def efficiency_claim(w, tag: str, rerun: str = "") -> str:
    """The weak-scaling comparison at the largest k with a k=1 reference; w: plausible weak rows (k >= 2, at least
    one) whose two ends are comparable, ranked within the largest group measured under comparable loads."""
    K = w["k"].max()
    everything = w[w["k"] == K].to_dict("records")
    group = comparable.largest_group(everything)
    at = pd.DataFrame(group)
    rows = per_strategy(group, "efficiency")
    verdict, tied, rest = ranking(rows, "efficiency")
    where = f"Best weak-scaling efficiency at the largest k with a k=1 reference (k={K:g}){tag}"

    def q(r):
        return f"{r['strategy']} {fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}"

    none = unlike(everything, "efficiency", q, rerun)
    if none:
        return f"{where}: {none}."
    where += _ranked_where(group, everything)

    left = outside(everything, group, "efficiency", q, rerun)
    then = f" (then {', '.join(map(q, rest))})" if rest else ""
    if verdict == "indistinguishable":
        return (
            f"Weak-scaling efficiency at the largest k with a k=1 reference (k={K:g}){tag}"
            f"{_ranked_where(group, everything)}: "
            + " and ".join(f"**{q(r)}**" for r in tied)
            + f" are indistinguishable within the {LEVEL}: no best "
            f"named{then}. {how_sure(tied[0]).capitalize()}.{left}"
        )
    top = rows[0]
    head = f"{where}: **{top['strategy']}** {fmt(top['efficiency'], top['efficiency_lo'], top['efficiency_hi'])}"
    tail = {
        "only": " (the only one defined there)",
        "best": f", its interval clear of the runner-up's{then}",
        "unknown": f"{then}; not shown to be ahead beyond noise (an interval is unknown)",
    }[verdict]
    return f"{head}{tail}. {how_sure(top).capitalize()}.{speed_caveat(top, at)}{left}"


def k_end(r) -> dict:
    """An efficiency row's k point as a figure of its own: its load (for comparable.py)."""
    return {"under_load": r.get("k_under_load"), "load_cores": r.get("k_load_cores")}


def base_end(r) -> dict:
    """An efficiency row's k=1 reference as a figure of its own: its load (for comparable.py)."""
    return {"under_load": r.get("base_under_load"), "load_cores": r.get("base_load_cores")}


def ends_apart(r, rerun: str) -> str:
    """Why an efficiency whose two ends are not comparable is no figure to read: which end was measured how."""
    return comparable.not_comparable([(f"its k={r['k']:g} point", k_end(r)), ("its k=1 reference", base_end(r))], rerun)


def incomparable(w_all, tag: str, rerun: str = "") -> str | None:
    """The Reading's line for the efficiencies whose two ends are not comparable (comparable.py): each named with
    its value and both ends' loads, none ranked; None where there is none."""
    bad = w_all[~w_all["comparable"].astype(bool)] if "comparable" in w_all and len(w_all) else w_all.iloc[0:0]
    if bad.empty:
        return None
    said = [
        f"{r['strategy']} at k={r['k']:g} (b={r['per_device_batch']:g}, "
        f"{fmt(r['efficiency'], r['efficiency_lo'], r['efficiency_hi'])}): its k={r['k']:g} point was measured "
        f"{comparable.condition(k_end(r))}, its k=1 reference {comparable.condition(base_end(r))}"
        for r in bad.to_dict("records")
    ]
    return (
        f"Weak-scaling efficiency not comparable on this host{tag}, so not ranked: "
        + "; ".join(said)
        + f". The load difference between the two ends moves such a ratio as much as the scaling does (the rule: "
        f'docs/metrics.md, "Like against like"); rerun on a quiet host (`{rerun}`).'
    )


def speed_caveat(top, at) -> str:
    """A best efficiency is not a best speed: efficiency compares a strategy with its own k=1. Where another strategy
    moves more images/s at the same k and per-device batch, measured under a comparable load, say so with both k=1
    references (the references compared only where comparable too; "" where none does)."""
    same = at["strategy"] != top["strategy"]
    for c in (c for c in ("per_device_batch", "model", *EXTRAS) if c in at):
        same &= at[c].isna() if _nan(top[c]) else at[c] == top[c]
    same = at[same]
    faster = same[same["throughput_img_s"] > top["throughput_img_s"]]
    if len(faster):
        faster = faster[np.array([comparable.comparable(k_end(top), k_end(r)) for r in faster.to_dict("records")])]
    if faster.empty:
        return ""
    f = faster.loc[faster["throughput_img_s"].idxmax()]
    s, o = top["strategy"], f["strategy"]
    text = (
        f" Efficiency measures scaling against a strategy's own k=1, not speed: at k={top['k']:g}, "
        f"b={top['per_device_batch']:g} **{o}** moves {f['throughput_img_s']:,.0f} images/s to {s}'s "
        f"{top['throughput_img_s']:,.0f}"
    )
    if top["base_throughput_img_s"] < f["base_throughput_img_s"] and comparable.comparable(base_end(top), base_end(f)):
        text += (
            f"; {s}'s k=1 reference is the slower one ({top['base_throughput_img_s']:,.0f} against "
            f"{f['base_throughput_img_s']:,.0f} images/s), and a longer step leaves any communication a smaller "
            "share of it"
        )
    return text + "."


def fastest_claim(p, tag: str, rerun: str = "") -> str | None:
    """The fastest point per strategy compared, within the largest group measured under comparable loads; p:
    point_table rows with_throughput_intervals."""
    p = p[p["throughput_img_s"].notna()]
    if p.empty:
        return None
    everything = p.to_dict("records")
    group = comparable.largest_group(everything)
    rows = per_strategy(group, "throughput_img_s")
    verdict, tied, rest = ranking(rows, "throughput")

    def q(r):
        return (
            f"**{r['strategy']}**, {fmt(r['throughput_img_s'], r['throughput_lo'], r['throughput_hi'], 0)} "
            f"images/s at k={r['k']:g}, B={r['batch_size']:g}"
        )

    none = unlike(everything, "throughput_img_s", q, rerun)
    if none:
        return f"Fastest{tag}: {none}."
    left = outside(everything, group, "throughput_img_s", q, rerun)
    where = _ranked_where(group, everything)
    top = rows[0]
    if verdict == "indistinguishable":
        return (
            f"Highest throughput{tag}{where}: "
            + " and ".join(map(q, tied))
            + f" are indistinguishable within the {LEVEL}: no fastest named. "
            f"{how_sure(top, 'throughput').capitalize()}.{left}"
        )
    note = {
        "only": "",
        "best": " (its interval clear of the runner-up's)",
        "unknown": " (not shown to be ahead beyond noise: an interval is unknown)",
    }[verdict]
    return f"Fastest{tag}{where}: {q(top)}{note}. {how_sure(top, 'throughput').capitalize()}.{left}"


def implausible(r, tag: str) -> str | None:
    """Efficiency above 1 (superlinear): implausible beyond its interval (or with none), else within noise of 1;
    None for efficiency <= 1."""
    e, lo, hi = r["efficiency"], r["efficiency_lo"], r["efficiency_hi"]
    if not e > 1.0:
        return None
    head = f"{r['strategy']} at k={r['k']:g} has a weak-scaling efficiency of {fmt(e, lo, hi)}"
    if known(lo, hi) and lo <= 1.0:
        return (
            f"Within noise of 1{tag}: {head}: above 1, but its {LEVEL} includes 1, so not superlinear beyond "
            f"the noise ({how_sure(r)})."
        )
    why = f"above 1 beyond its {LEVEL}" if known(lo, hi) else "above 1, with no interval to say by how much"
    return (
        f"Implausible{tag}: {head} ({why}, superlinear): most likely its k=1 reference ran slower than usual "
        f"(interference or noise), so it is left out of the comparison below ({how_sure(r)})."
    )


def plausible(w):
    """Weak rows that enter the comparison: efficiency <= 1, or above 1 but within noise of 1."""
    return w[(w["efficiency"] <= 1.0) | (w["efficiency_lo"] <= 1.0)]


def interval_columns(e):
    """Scaling-table rows with efficiency_95 ('[lo–hi]', NaN where unknown) and n_measured ('w/t at k; w/t at 1')."""
    if e.empty:
        return e.assign(efficiency_95=[], n_measured=[])
    return e.assign(
        efficiency_95=[
            f"[{lo:.2f}–{hi:.2f}]" if known(lo, hi) else math.nan
            for lo, hi in zip(e["efficiency_lo"], e["efficiency_hi"])
        ],
        n_measured=[
            f"{w:g}/{t:g}; {bw:g}/{bt:g}"
            for w, t, bw, bt in zip(e["n_windows"], e["n_repeats"], e["base_n_windows"], e["base_n_repeats"])
        ],
    )
