"""report.md and metrics.json say which code, data and torch each strategy's figures come from (the rows'
code_digest, data_digest, torch_version), and report.md warns where a strategy's rows mix several.

    .venv/bin/python -m pytest tests/analysis/test_measured_with.py
"""

from __future__ import annotations

import json

from pipeline.analysis.stage import analyze

from .test_analyze import row, write

ONE = {"code_digest": "c0de000001", "data_digest": "da7a000001", "torch_version": "2.5.1"}


def _analyze(tmp_path, ddp_second: dict):
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write([row("single", k=1, B=128, thr=1000, **ONE)], sweeps / "single.jsonl")
    write(
        [row("ddp", k=1, B=128, thr=1000, **ONE), row("ddp", k=2, B=256, thr=1800, **ddp_second)],
        sweeps / "ddp.jsonl",
    )
    out = tmp_path / "analysis"
    analyze(sweeps, out, expected=("single", "ddp"))
    return (out / "report.md").read_text(), json.loads((out / "metrics.json").read_text())


def test_report_and_metrics_name_the_rows_code_data_and_torch(tmp_path):
    """Proves: with every row of one code, data and torch, report.md's "Measured with" table lists them per
    strategy and metrics.json holds them under code_digest.S, data_digest.S, torch_version.S; no warning."""
    report, metrics = _analyze(tmp_path, ONE)
    assert "## Measured with" in report
    section = report.split("## Measured with", 1)[1].split("\n## ", 1)[0]
    for s in ("single", "ddp"):
        assert f"| {s} | c0de000001 | da7a000001 | 2.5.1 | no |" in section, section
        assert metrics[f"code_digest.{s}"] == "c0de000001"
        assert metrics[f"data_digest.{s}"] == "da7a000001"
        assert metrics[f"torch_version.{s}"] == "2.5.1"
    assert "MIXED" not in report
    assert metrics["data_source"] == "fashion-mnist"  # the data the figures are of, which compare shows


def test_metrics_name_the_synthetic_data_their_figures_are_of(tmp_path):
    """Rows on the stand-in: metrics.json's data_source names synthetic, whatever params.yaml says after
    `make pipeline-offline` puts it back (compare labels the experiment's figures with it)."""
    _, metrics = _analyze(tmp_path, {**ONE, "data_source": "synthetic"})
    assert metrics["data_source"] == "fashion-mnist, synthetic"


def test_rows_of_different_code_give_a_warning(tmp_path):
    """Proves: a strategy whose rows come from two code digests gets report.md's warning on top, naming it and both
    digests; the table and metrics.json show both values, the other strategy's stay single."""
    report, metrics = _analyze(tmp_path, {**ONE, "code_digest": "c0de000002"})
    head = report.split("## Answer", 1)[0]
    assert "WARNING: FIGURES FROM DIFFERENT CODE OR DATA MIXED" in head, head
    assert "ddp: code_digest c0de000001, c0de000002" in head, head
    assert "| ddp | c0de000001, c0de000002 | da7a000001 | 2.5.1 | code_digest |" in report
    assert metrics["code_digest.ddp"] == "c0de000001, c0de000002" and metrics["code_digest.single"] == "c0de000001"
