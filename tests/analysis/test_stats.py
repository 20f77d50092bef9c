"""Bootstrap intervals on constructed data with known answers (seeded): coverage, narrowing, ratios, the unknown."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.analysis.tables import stats


def draw(rng, mean, sd, repeats, windows):
    return [list(rng.normal(mean, sd, windows)) for _ in range(repeats)]


def test_interval_covers_the_true_throughput_about_as_often_as_its_level():
    rng, true = np.random.default_rng(1), 1000.0
    hits = [
        lo <= true <= hi
        for lo, hi in (
            stats.throughput_interval(draw(rng, true, 20.0, 3, 12), resamples=400, seed=i) for i in range(150)
        )
    ]
    # a 95 % interval: most, not all, of 150 independent data sets; a broken one is far off either way
    assert 0.85 <= np.mean(hits) < 1.0


def test_interval_narrows_with_more_windows_and_more_repeats():
    rng = np.random.default_rng(2)
    width = {}
    for repeats, windows in ((2, 5), (2, 40), (8, 40)):
        lo, hi = stats.throughput_interval(draw(rng, 500.0, 25.0, repeats, windows))
        width[repeats, windows] = hi - lo
    assert width[2, 40] < width[2, 5] and width[8, 40] < width[2, 40]


def test_spread_between_repeats_widens_the_interval_beyond_the_windows():
    rng = np.random.default_rng(3)
    steady = [list(rng.normal(800, 5, 20)) for _ in range(4)]
    shifted = [list(np.asarray(g) + d) for g, d in zip(steady, (-60, -20, 20, 60))]  # same windows, repeats apart
    lo1, hi1 = stats.throughput_interval(steady)
    lo2, hi2 = stats.throughput_interval(shifted)
    assert hi2 - lo2 > 3 * (hi1 - lo1)


def test_ratio_interval_contains_the_true_ratio_and_scales_with_k():
    rng = np.random.default_rng(4)
    two, one = draw(rng, 1800.0, 30.0, 3, 15), draw(rng, 1000.0, 20.0, 3, 15)
    lo, hi = stats.ratio_interval(two, one)
    assert lo < 1.8 < hi and hi - lo < 0.2
    elo, ehi = stats.ratio_interval(two, one, scale=2)
    assert elo == pytest.approx(lo / 2) and ehi == pytest.approx(hi / 2)  # same seed, same resamples


def test_one_window_of_one_repeat_is_unknown_never_zero_width():
    assert all(math.isnan(v) for v in stats.throughput_interval([[1000.0]]))
    assert all(math.isnan(v) for v in stats.ratio_interval([[1800.0]], [[1000.0, 990.0]], scale=2))
    assert all(math.isnan(v) for v in stats.throughput_interval([]))
    # two repeats of one window each (no windows recorded): an interval from the repeats
    lo, hi = stats.throughput_interval([[1000.0], [1100.0]])
    assert 1000.0 <= lo < hi <= 1100.0


def test_missing_and_bad_values_are_left_out_and_counted():
    groups = [[100.0, float("nan"), -1.0], [], [120.0, 110.0]]
    assert stats.counts(groups) == (3, 2)
    assert stats.estimate(groups) == pytest.approx((100.0 + 2 / (1 / 120 + 1 / 110)) / 2)


def test_seeded():
    rng = np.random.default_rng(5)
    g = draw(rng, 100.0, 5.0, 2, 10)
    assert stats.throughput_interval(g) == stats.throughput_interval(g)


def test_overlap():
    assert stats.overlap((0.8, 0.9), (0.85, 0.95)) is True
    assert stats.overlap((0.8, 0.84), (0.85, 0.95)) is False
    assert stats.overlap((0.8, math.nan), (0.85, 0.95)) is None
