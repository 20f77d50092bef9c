"""The report's reading says how sure each claim is: best vs indistinguishable, implausible vs within noise of 1,
unknown intervals said as such; on constructed frames with window lists."""

from __future__ import annotations

import re

from pipeline.analysis.report import confidence, document
from pipeline.analysis.tables.points import memory_table, point_table, scaling_table
from tests.analysis.test_intervals import repeats, with_windows


def reading(*points):
    """points: (strategy, k, mean throughput, seed[, spread]); three trials of twelve windows each."""
    rows, wins = [], []
    for strategy, k, mean, seed, *spread in points:
        r, w = repeats(strategy, k, mean, seed=seed)
        if spread:  # trials far apart from each other: a wide interval
            w = [[x * f for x in g] for g, f in zip(w, spread[0])]
        rows, wins = rows + r, wins + w
    df = with_windows(rows, wins)
    return document._reading(point_table(df), scaling_table(df), memory_table(df), {}, df)


def line(lines, start):
    found = [s for s in lines if s.startswith(start)]
    assert len(found) == 1, lines
    return found[0]


def test_a_clear_winner_is_named_best_with_its_interval():
    out = reading(("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), ("fsdp", 1, 1000.0, 3), ("fsdp", 2, 1400.0, 4))
    best = line(out, "Best weak-scaling efficiency")
    assert "**ddp** 0.9" in best and "[0.8" in best and "clear of the runner-up" in best and "then fsdp 0.7" in best
    assert (
        "how sure: 36 readings of images/s over 3 trials at k=2, 36 readings of images/s over 3 trials at k=1"
        in best.lower()
    )
    assert "95% interval" in best and "indistinguishable" not in " ".join(out)


def test_overlapping_intervals_name_no_best():
    wide = (0.9, 1.0, 1.1)
    out = reading(
        ("ddp", 1, 1000.0, 1, wide),
        ("ddp", 2, 1800.0, 2, wide),
        ("fsdp", 1, 1000.0, 3, wide),
        ("fsdp", 2, 1760.0, 4, wide),
    )
    text = " ".join(out)
    assert "Best weak-scaling efficiency" not in text
    claim = line(out, "Weak-scaling efficiency at the largest k")
    assert "indistinguishable within the 95% interval" in claim and "no best named" in claim
    assert "**ddp 0.9" in claim and "**fsdp 0.88" in claim
    assert line(out, "Highest throughput").count("indistinguishable") == 1  # the fastest point too


def test_superlinear_beyond_its_interval_is_implausible_and_left_out():
    out = reading(("ddp", 1, 1000.0, 1), ("ddp", 2, 2300.0, 2), ("fsdp", 1, 1000.0, 3), ("fsdp", 2, 1600.0, 4))
    odd = line(out, "Implausible")
    assert "ddp at k=2" in odd and "1.15 [" in odd and "beyond its 95% interval" in odd
    assert "**fsdp** 0.8" in line(out, "Best weak-scaling efficiency")  # the only plausible one


def test_superlinear_within_noise_of_one_is_said_so_and_compared():
    wide = (0.85, 1.0, 1.15)
    out = reading(("ddp", 1, 1000.0, 1, wide), ("ddp", 2, 2040.0, 2, wide))
    assert not [s for s in out if s.startswith("Implausible")]
    noise = line(out, "Within noise of 1")
    assert "ddp at k=2" in noise and "includes 1" in noise
    assert "**ddp** 1.02" in line(out, "Best weak-scaling efficiency")


def test_a_single_measurement_says_its_interval_is_unknown():
    from tests.analysis.test_analyze import frame, row

    df = frame(
        [
            row("ddp", k=1, B=128, thr=1000.0),
            row("ddp", k=2, B=256, thr=2300.0),
            row("fsdp", k=1, B=128, thr=1000.0),
            row("fsdp", k=2, B=256, thr=1600.0),
        ]
    )
    out = document._reading(point_table(df), scaling_table(df), memory_table(df), {}, df)
    assert "no interval to say by how much" in line(out, "Implausible")  # unknown: still not a finding
    best = line(out, "Best weak-scaling efficiency")
    assert "0.80 (no interval)" in best and "interval unknown" in best


def test_a_best_efficiency_that_is_not_the_fastest_says_so_with_both_references():
    """ddp_amp on a CPU whose bf16 step is slower: the higher efficiency comes from a slower k=1 step, not speed."""
    out = reading(("ddp", 1, 1000.0, 1), ("ddp", 2, 1700.0, 2), ("ddp_amp", 1, 600.0, 3), ("ddp_amp", 2, 1140.0, 4))
    best = line(out, "Best weak-scaling efficiency")
    assert "**ddp_amp** 0.95" in best and "then ddp 0.85" in best
    assert re.search(r"not speed: at k=2, b=128 \*\*ddp\*\* moves 1,(69|70)\d images/s to ddp_amp's 1,1[34]\d", best)
    assert re.search(r"ddp_amp's k=1 reference is the slower one \((59|60)\d against (99\d|1,00\d) images/s\)", best)


def test_a_best_efficiency_that_is_also_the_fastest_has_no_caveat():
    out = reading(("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), ("fsdp", 1, 1000.0, 3), ("fsdp", 2, 1400.0, 4))
    assert "not speed" not in line(out, "Best weak-scaling efficiency")


def test_one_reading_is_counted_in_the_singular():
    row = {"k": 2, "n_windows": 1, "n_repeats": 1, "base_n_windows": 12, "base_n_repeats": 1}
    assert confidence.how_sure(row).startswith(
        "how sure: 1 reading of images/s over 1 trial at k=2, 12 readings of images/s over 1 trial at k=1; "
    )


def test_a_memory_basis_reads_inside_parentheses_without_nesting():
    """The report puts a basis's phrase in parentheses beside a figure: the phrase holds none of its own."""
    from pipeline.analysis.tables.points import MEM_BASIS

    assert not any("(" in text or ")" in text for text in MEM_BASIS.values()), MEM_BASIS
