"""Bootstrap confidence intervals for throughput and for ratios of throughputs (speedup, efficiency). Pure numpy.

A point's measurements are `groups`: one list per repeat (a complete trial), each holding that trial's throughput
per measurement window (meter.py's `throughput_windows`; a trial without windows counts as one window of its
overall figure). The statistic is the mean over repeats of each repeat's throughput, a repeat's throughput being
the harmonic mean of its windows (equal-sized windows: images over seconds, as the overall figure). A resample
draws the repeats with replacement, then within each drawn repeat its windows with replacement, so the interval
holds both the spread within a trial and the spread between trials. A ratio resamples its numerator and its
denominator independently (two separate sets of trials). Seeded: the same data give the same interval.

With one repeat of one window nothing says how far a second measurement would be: the interval is NaN (unknown),
never zero-width. With one repeat of several windows the interval holds only the spread within that trial.
"""

from __future__ import annotations

import math

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
SEED = 0
NAN2 = (math.nan, math.nan)


def clean(groups) -> list[np.ndarray]:
    """The groups as arrays of finite, positive values; empty groups dropped."""
    out = []
    for g in groups or ():
        a = np.asarray([v for v in (g if isinstance(g, (list, tuple, np.ndarray)) else [g])], dtype=float)
        a = a[np.isfinite(a) & (a > 0)]
        if a.size:
            out.append(a)
    return out


def counts(groups) -> tuple[int, int]:
    """(windows, repeats) behind a point."""
    g = clean(groups)
    return sum(a.size for a in g), len(g)


def estimate(groups) -> float:
    """The statistic on the data themselves: mean over repeats of each repeat's harmonic-mean window throughput."""
    g = clean(groups)
    return float(np.mean([1.0 / np.mean(1.0 / a) for a in g])) if g else math.nan


def resample(groups, rng: np.random.Generator, resamples: int = RESAMPLES) -> np.ndarray | None:
    """`resamples` bootstrap values of `estimate`, or None when there is a single measurement (or none)."""
    g = [1.0 / a for a in clean(groups)]  # seconds per image: their mean is the harmonic mean's inverse
    if not g or (len(g) == 1 and g[0].size < 2):
        return None
    r = len(g)
    picks = rng.integers(0, r, size=(resamples, r))  # which repeat fills each slot
    total = np.zeros(resamples)
    for slot in range(r):
        # every repeat's windows resampled afresh for this slot; the slot keeps the one its pick names
        per_repeat = np.stack([a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1) for a in g], axis=1)
        total += 1.0 / per_repeat[np.arange(resamples), picks[:, slot]]
    return total / r


def _bounds(values: np.ndarray | None, level: float) -> tuple[float, float]:
    if values is None:
        return NAN2
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return float(lo), float(hi)


def throughput_interval(
    groups, level: float = LEVEL, seed: int = SEED, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """(lo, hi) of the point's throughput at `level`; NaN, NaN with a single measurement."""
    return _bounds(resample(groups, np.random.default_rng(seed), resamples), level)


def ratio_interval(
    numerator, denominator, scale: float = 1.0, level: float = LEVEL, seed: int = SEED, resamples: int = RESAMPLES
) -> tuple[float, float]:
    """(lo, hi) of estimate(numerator) / (scale * estimate(denominator)): speedup T(k)/T(1) with scale 1, weak or
    strong efficiency with scale k. NaN, NaN when either side is a single measurement."""
    rng = np.random.default_rng(seed)
    num, den = resample(numerator, rng, resamples), resample(denominator, rng, resamples)
    if num is None or den is None:
        return NAN2
    return _bounds(num / (scale * den), level)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool | None:
    """Whether two intervals share a value; None if either is unknown (NaN)."""
    if any(math.isnan(v) for v in (*a, *b)):
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def point_intervals(num, den, k: float) -> dict:
    """A scaling-table row's intervals: throughput from `num` (the point's groups); speedup and efficiency against
    `den` (its k=1 reference's groups, None without one); and how many windows and repeats are behind each end.
    k=1 against itself is 1 by definition, not a measurement: no interval."""
    out = dict(zip(("throughput_lo", "throughput_hi"), throughput_interval(num)))
    out.update(zip(("n_windows", "n_repeats"), counts(num)))
    out.update(zip(("base_n_windows", "base_n_repeats"), counts(den or [])))
    unknown = den is None or k == 1
    out.update(zip(("speedup_lo", "speedup_hi"), NAN2 if unknown else ratio_interval(num, den)))
    out.update(zip(("efficiency_lo", "efficiency_hi"), NAN2 if unknown else ratio_interval(num, den, scale=k)))
    return out
