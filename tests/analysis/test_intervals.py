"""Intervals in the scaling table, from frames whose `throughput_windows` cells are Python lists (or absent)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis.tables import points
from tests.analysis.test_analyze import frame, one, row


def with_windows(rows, windows):
    df = frame(rows)
    df["throughput_windows"] = pd.Series(windows, index=df.index, dtype=object)
    return df


def repeats(strategy, k, mean, n=3, w=12, seed=0, **kw):
    """n repeats of a point, each with w windows around `mean`; the rows and their window lists."""
    rng = np.random.default_rng(seed)
    wins = [list(rng.normal(mean, mean * 0.02, w)) for _ in range(n)]
    return [row(strategy, k=k, B=128 * k, thr=float(np.mean(x)), **kw) for x in wins], wins


def test_efficiency_interval_brackets_the_efficiency_and_counts_what_is_behind_it():
    r1, w1 = repeats("ddp", 1, 1000.0, seed=1)
    r2, w2 = repeats("ddp", 2, 1800.0, seed=2)
    e = one(points.scaling_table(with_windows(r1 + r2, w1 + w2)), kind="weak", k=2)
    assert e["efficiency_lo"] < e["efficiency"] < e["efficiency_hi"]
    assert e["efficiency_lo"] < 0.9 < e["efficiency_hi"] and e["efficiency_hi"] - e["efficiency_lo"] < 0.1
    assert e["speedup_lo"] == pytest.approx(2 * e["efficiency_lo"])
    assert e["throughput_lo"] < e["throughput_img_s"] < e["throughput_hi"]
    assert (e["n_windows"], e["n_repeats"], e["base_n_windows"], e["base_n_repeats"]) == (36, 3, 36, 3)
    k1 = one(points.scaling_table(with_windows(r1 + r2, w1 + w2)), kind="weak", k=1)
    assert math.isnan(k1["efficiency_lo"]) and k1["throughput_lo"] < k1["throughput_hi"]  # 1 by definition


def test_one_measurement_each_leaves_the_interval_unknown():
    df = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])  # no windows column
    e = one(points.scaling_table(df), kind="weak", k=2)
    assert e["efficiency"] == pytest.approx(0.9)
    assert all(math.isnan(e[c]) for c in ("efficiency_lo", "efficiency_hi", "speedup_lo", "throughput_hi"))
    assert (e["n_windows"], e["n_repeats"]) == (1, 1)


def test_repeats_without_windows_still_give_an_interval_and_nan_cells_count_as_none():
    rows = [row("ddp", k=1, B=128, thr=t) for t in (1000.0, 1040.0)] + [
        row("ddp", k=2, B=256, thr=t) for t in (1800.0, 1850.0)
    ]
    e = one(points.scaling_table(with_windows(rows, [math.nan, None, [], math.nan])), kind="weak", k=2)
    assert e["efficiency_lo"] < e["efficiency_hi"] and (e["n_windows"], e["n_repeats"]) == (2, 2)


def test_an_interfered_repeat_stays_out_of_the_interval():
    r1, w1 = repeats("ddp", 1, 1000.0, n=2, seed=3)
    r2, w2 = repeats("ddp", 2, 1800.0, n=2, seed=4)
    r1.append(row("ddp", k=1, B=128, thr=500.0, interfered=True))
    e = one(points.scaling_table(with_windows(r1 + r2, w1 + [[500.0] * 12] + w2)), kind="weak", k=2)
    assert (e["base_n_repeats"], e["base_n_interfered"]) == (2, 1) and e["efficiency_hi"] < 1.0


def bars_drawn(monkeypatch, tmp_path, df):
    """The vertical interval bars of plot_efficiency's weak panel and plot_throughput's panel: (x, lo, hi)."""
    from matplotlib.figure import Figure

    from pipeline.analysis.plots import figures

    figs = []

    def savefig(fig, path, *a, **k):  # the figure kept for its bars; an empty file where the figure goes
        figs.append(fig)
        Path(path).write_bytes(b"")

    monkeypatch.setattr(Figure, "savefig", savefig)
    eff, pts = points.scaling_table(df), points.point_table(df)
    colors = figures.style(["ddp"])
    figures.plot_efficiency(eff, tmp_path / "e.png", colors)
    figures.plot_throughput(pts, tmp_path / "t.png", colors, eff=eff)
    return [
        sorted(
            (float(s[0][0]), float(s[0][1]), float(s[1][1])) for c in fig.axes[0].collections for s in c.get_segments()
        )
        for fig in figs
    ]


def test_figures_draw_the_intervals_where_known_and_nothing_where_unknown(monkeypatch, tmp_path):
    r1, w1 = repeats("ddp", 1, 1000.0, seed=1)
    r2, w2 = repeats("ddp", 2, 1800.0, seed=2)
    df = with_windows(r1 + r2, w1 + w2)
    eff_bars, thr_bars = bars_drawn(monkeypatch, tmp_path, df)
    e = one(points.scaling_table(df), kind="weak", k=2)
    assert eff_bars == [(2.0, pytest.approx(e["efficiency_lo"]), pytest.approx(e["efficiency_hi"]))]
    assert [x for x, _, _ in thr_bars] == [1.0, 2.0] and thr_bars[1][1:] == (
        pytest.approx(e["throughput_lo"]),
        pytest.approx(e["throughput_hi"]),
    )
    single = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])
    assert bars_drawn(monkeypatch, tmp_path, single) == [[], []]


def test_summary_carries_the_efficiency_interval():
    from pipeline.analysis.tables import summary

    r1, w1 = repeats("ddp", 1, 1000.0, seed=1)
    r2, w2 = repeats("ddp", 2, 1800.0, seed=2)
    df = with_windows(r1 + r2, w1 + w2)
    m = summary.jsonable(
        summary.strategy_metrics("ddp", points.point_table(df), points.scaling_table(df), points.memory_table(df))
    )
    iv = m["weak_efficiency_interval"]
    assert iv["lo"] < m["weak_efficiency"] < iv["hi"] and (iv["n_repeats"], iv["base_n_repeats"]) == (3, 3)
    one_each = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])
    m = summary.jsonable(
        summary.strategy_metrics(
            "ddp", points.point_table(one_each), points.scaling_table(one_each), points.memory_table(one_each)
        )
    )
    assert m["weak_efficiency_interval"]["lo"] is None and m["weak_efficiency"] is not None
