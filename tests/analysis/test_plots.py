"""Figures say what they show: the data source on every figure, one style per line, no invented zero bars."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from pipeline.analysis.plots import figures
from pipeline.analysis.stage import analyze

from .test_analyze import row, write


def test_source_note_names_synthetic_data_loudly():
    assert "SYNTHETIC" in figures.source_note("synthetic") and "not Fashion-MNIST" in figures.source_note("synthetic")
    assert figures.source_note("fashion-mnist") == "data: fashion-mnist"
    assert figures.source_note("") == ""


def _texts(monkeypatch):
    """Every Figure.savefig call's figure texts and its lines' styles, captured."""
    seen = []
    real = Figure.savefig

    def spy(fig, path, *a, **k):
        lines = [
            [
                (ln.get_color(), ln.get_linestyle(), ln.get_marker())
                for ln in ax.get_lines()
                if not ln.get_label().startswith("_") and ln.get_label() != "ideal"
            ]
            for ax in fig.axes
        ]
        seen.append((Path(path).name, [t.get_text() for t in fig.texts], lines))
        return real(fig, path, *a, **k)

    monkeypatch.setattr(Figure, "savefig", spy)
    return seen


def test_every_figure_is_labelled_and_lines_are_distinguishable(tmp_path, monkeypatch):
    rows = [row("ddp", k=k, B=B * k, thr=900.0 * k, data_source="synthetic") for k in (1, 2) for B in (64, 128)]
    rows += [
        row("ddp", k=2, B=256, thr=1500.0, data_source="synthetic"),
        row("single", k=1, B=128, thr=1000.0, data_source="synthetic"),
        row("scratch", k=2, B=256, thr=800.0, peaks=[100 * 2**20], data_source="synthetic"),
    ]
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    for s in ("ddp", "single", "scratch"):
        write([r for r in rows if r["strategy"] == s], sweeps / f"{s}.jsonl")
    seen = _texts(monkeypatch)
    analyze(sweeps, tmp_path / "out", expected=("ddp", "single", "scratch"))
    assert {name for name, _, _ in seen} >= {"efficiency.png", "throughput.png", "memory.png", "accuracy.png"}
    for name, texts, panels in seen:
        assert any("SYNTHETIC" in t for t in texts), name
        for lines in panels:  # within one panel
            assert len(set(lines)) == len(lines), f"{name}: two lines share colour, style and marker: {lines}"


def test_a_panel_with_only_k1_points_says_why_it_is_empty(tmp_path):
    """One global batch at k=1 and k=2 (the tiny profile's sweep): the weak-scaling panel has no line and says what
    is missing instead of showing an empty frame."""
    from pipeline.analysis.tables.points import scaling_table
    from pipeline.analysis.tables.rows import load_sweeps

    write([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=128, thr=1500.0)], tmp_path / "ddp.jsonl")
    df, _ = load_sweeps(tmp_path, expected=("ddp",))
    texts = []
    real = Figure.savefig

    def grab(fig, *a, **kw):
        texts.extend(t.get_text() for ax in fig.axes for t in ax.texts)
        return real(fig, *a, **kw)

    Figure.savefig = grab
    try:
        figures.plot_efficiency(scaling_table(df), tmp_path / "e.png", figures.style(["ddp"]))
    finally:
        Figure.savefig = real
    assert any("no weak-scaling efficiency" in t and "per-device batch" in t for t in texts), texts


def test_lines_that_differ_in_a_setting_say_it_in_their_legend(tmp_path, monkeypatch):
    """AdamW and SGD lines of one strategy at one batch are two lines with two legends (optimizer=...), never one
    label twice; a setting that does not vary is left out of the label."""
    rows = [
        row("ddp", k=k, B=128 * k, thr=900.0 * k * f, optimizer=opt)
        for k in (1, 2)
        for opt, f in (("sgd", 1.0), ("adamw", 0.8))
    ]
    write(rows, tmp_path / "ddp.jsonl")
    labels = []
    real = Figure.savefig

    def grab(fig, path, *a, **kw):
        if Path(path).name.startswith("efficiency"):
            labels.extend(ln.get_label() for ax in fig.axes[:1] for ln in ax.get_lines() if ln.get_label() != "ideal")
        return real(fig, path, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", grab)
    analyze(tmp_path, tmp_path / "out", expected=("ddp",))
    drawn = [label for label in labels if not label.startswith("_")]
    assert sorted(drawn) == ["ddp b=128 optimizer=adamw", "ddp b=128 optimizer=sgd"], labels
