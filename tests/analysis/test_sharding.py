"""The report's "What sharding saved": each sharding strategy's peak against its unsharded baseline's, measured
alike (same model, k, batch, memory figure), from hand-made sweep tables with known answers."""

import pytest

from pipeline import catalog
from pipeline.analysis import stage
from pipeline.analysis.report import sharding
from pipeline.analysis.report.markdown import md_table

from .test_analyze import frame, row

MIB = 2**20
SHARDED, BASE = next(iter(catalog.sharding_baselines().items()))  # fsdp -> ddp


def mem(rows):
    return stage.memory_table(frame(rows))


def test_saving_is_the_baseline_peak_minus_the_sharded_peak_in_mib_and_percent():
    m = mem(
        [
            row(BASE, k=2, B=256, peaks=[200 * MIB, 200 * MIB]),
            row(SHARDED, k=2, B=256, peaks=[150 * MIB, 140 * MIB]),
            row(SHARDED, k=1, B=128, peaks=[300 * MIB]),
        ]
    )  # no baseline at k=1: no row
    t = sharding.savings(m)
    assert len(t) == 1
    r = t.iloc[0]
    assert (r["strategy"], r["baseline"], r["k"]) == (SHARDED, BASE, 2)
    assert r["peak_mem_mib"] == pytest.approx(150) and r["baseline_mib"] == pytest.approx(200)
    assert r["saved_mib"] == pytest.approx(50) and r["saved_pct"] == pytest.approx(25)


def test_a_sharding_that_costs_memory_shows_a_negative_saving():
    t = sharding.savings(
        mem([row(BASE, k=2, B=256, peaks=[100 * MIB] * 2), row(SHARDED, k=2, B=256, peaks=[110 * MIB] * 2)])
    )
    assert t.iloc[0]["saved_mib"] == pytest.approx(-10)


def test_points_measured_differently_are_not_compared():
    t = sharding.savings(mem([row(BASE, k=2, B=256, mem_method="memtracker"), row(SHARDED, k=2, B=512)]))
    assert t.empty
    text = "".join(sharding.section(mem([row(BASE, k=2, B=256)]), md_table))
    assert "### What sharding saved" in text and "No sharding strategy was measured" in text
    assert f"{SHARDED} against {BASE}" in text


def test_section_renders_the_table():
    """The subsection names each pair and holds one Markdown row per compared point."""
    text = "".join(
        sharding.section(
            mem([row(BASE, k=2, B=256, peaks=[200 * MIB] * 2), row(SHARDED, k=2, B=256, peaks=[100 * MIB] * 2)]),
            md_table,
        )
    )
    shards = ", ".join(catalog.spec(SHARDED).shards)
    assert f"| {SHARDED} | {shards} | {BASE} | lenet | 2 | 256 |" in text
    assert text.rstrip().endswith("| 100 | 200 | 100 | 50 |")


def test_each_optimizer_is_compared_with_its_own_baseline():
    """AdamW's state is memory plain SGD does not hold: a sharded AdamW point is compared with the baseline's AdamW
    point, never with its smaller SGD one, and the table says which optimizer each row is."""
    m = mem(
        [
            row(BASE, k=2, B=256, peaks=[20 * MIB] * 2, optimizer="sgd"),
            row(BASE, k=2, B=256, peaks=[21 * MIB] * 2, optimizer="adamw"),
            row(SHARDED, k=2, B=256, peaks=[20 * MIB] * 2, optimizer="sgd"),
            row(SHARDED, k=2, B=256, peaks=[20.5 * MIB] * 2, optimizer="adamw"),
        ]
    )
    t = sharding.savings(m).set_index("optimizer")
    assert t.loc["sgd", "saved_mib"] == pytest.approx(0) and t.loc["sgd", "baseline_mib"] == pytest.approx(20)
    assert t.loc["adamw", "saved_mib"] == pytest.approx(0.5) and t.loc["adamw", "baseline_mib"] == pytest.approx(21)
    assert "| lenet | 2 | 256 | adamw |" in "".join(sharding.section(m, md_table))


def test_rows_of_tables_from_before_the_optimizer_setting_read_as_plain_sgd():
    """An older table has no optimizer column: its trials trained with plain SGD, the only optimizer then."""
    t = sharding.savings(mem([row(BASE, k=2, B=256), row(SHARDED, k=2, B=256, optimizer="sgd")]))
    assert list(t["optimizer"]) == ["sgd"]
