"""A busy host: points whose trials were all flagged as measured under interference still give a throughput and an
efficiency, labelled "measured under load" in the Reading, the tables, summary.json, metrics.json and DVC's plots;
and the Reading names the real cause whenever it cannot give an efficiency."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.analysis.report import document
from pipeline.analysis.tables import points, summary
from tests.analysis.test_analyze import frame, one, row
from tests.conftest import REPO


def busy(strategy="ddp", k=1, thr=1000.0, cores=1.6, **kw):
    return row(
        strategy,
        k=k,
        B=128 * k,
        thr=thr,
        interfered=True,
        foreign_cores=cores,
        interference_reason="other processes kept 1.60 cores busy",
        **kw,
    )


def everything(df):
    pts, eff, mem = points.point_table(df), points.scaling_table(df), points.memory_table(df)
    status = summary.strategy_status(df, {}, "x", sorted(set(df["strategy"])))
    summ = summary.summarize(df, status, pts, eff, mem, None)
    return (
        pts,
        eff,
        mem,
        status,
        summ,
        summary.flat_metrics(summ, pts, eff, mem),
        document._reading(pts, eff, mem, status, df),
    )


def test_every_trial_flagged_still_gives_a_labelled_reading():
    """With every trial flagged, throughput and efficiency come from the flagged trials, each labelled with the load
    it ran under; metrics.json keeps the keys tests and `dvc exp show` read, plus the load_cores labels."""
    df = frame([busy("single", 1, 1000.0, 1.5), busy("ddp", 1, 1000.0, 1.5), busy("ddp", 2, 1600.0, 1.7)])
    pts, eff, _, status, summ, metrics, reading = everything(df)
    p = one(pts, strategy="ddp", k=2)
    assert p["throughput_img_s"] == 1600.0 and p["under_load"] and p["load_cores"] == pytest.approx(1.7)
    e = one(eff, strategy="ddp", kind="weak", k=2)
    assert e["efficiency"] == pytest.approx(0.8) and e["under_load"] and e["load_cores"] == pytest.approx(1.7)
    assert metrics["throughput_img_s.single.k1"] == 1000.0 and metrics["weak_efficiency.ddp.k2"] == pytest.approx(0.8)
    assert metrics["load_cores.ddp.k2"] == pytest.approx(1.7) and metrics["under_load"] == 3
    assert metrics["n_flagged"] == 3 and status["ddp"]["n_flagged"] == 2
    assert summ["strategies"]["ddp"]["weak_efficiency_under_load_cores"] == pytest.approx(1.7)
    from pipeline.tracking.client import summary_metrics  # the analysis run's MLflow metrics carry the label

    assert summary_metrics(summ)["strategy/ddp/weak_efficiency_under_load_cores"] == pytest.approx(1.7)
    assert reading[0].startswith(
        "**Measured under load**: every trial (3 complete trials) was measured under interference"
    )
    claim = next(line for line in reading if line.startswith("Best weak-scaling efficiency"))
    assert "**measured under load**" in claim and "1.70 cores busy" in claim
    assert "undefined" not in " ".join(reading)


def test_a_point_with_quiet_trials_leaves_its_flagged_ones_out_unlabelled():
    """A point with trials measured without interference takes its speed from those only and is not labelled; the
    Reading says the flagged ones were left out."""
    df = frame([row("ddp", k=1, B=128, thr=1000.0), busy("ddp", 1, 400.0), row("ddp", k=2, B=256, thr=1800.0)])
    pts, eff, _, _, _, metrics, reading = everything(df)
    p = one(pts, strategy="ddp", k=1)
    assert p["throughput_img_s"] == 1000.0 and not p["under_load"] and math.isnan(p["load_cores"])
    assert not one(eff, strategy="ddp", kind="weak", k=2)["under_load"]
    assert metrics["under_load"] == 0 and not any(k.startswith("load_cores.") for k in metrics)
    assert "1 of the 3 complete trials was measured under interference" in reading[0] and "left out" in reading[0]


def test_a_figures_load_label_tells_quiet_from_unmeasured():
    """summary's label (comparable.load): None quietly or without a figure, the busy cores under load, NaN under a
    load whose cores were not measured (never None, which would read as quiet)."""
    assert summary._load(None) is None and summary._load({"under_load": False, "load_cores": math.nan}) is None
    assert summary._load({"under_load": True, "load_cores": 1.7}) == pytest.approx(1.7)
    assert math.isnan(summary._load({"under_load": True, "load_cores": math.nan}))


def test_summary_json_tells_a_quiet_figure_from_one_under_an_unmeasured_load():
    """summary.json writes an unmeasured load's NaN as null, as it writes a quiet figure's label: each figure's
    `*_condition` beside it says which, in comparable.condition's words."""
    quiet = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])
    unmeasured = frame([busy("ddp", 1, 1000.0, cores=math.nan), busy("ddp", 2, 1800.0, cores=math.nan)])
    measured = frame([busy("ddp", 1, 1000.0, cores=1.7), busy("ddp", 2, 1800.0, cores=1.7)])
    written = {}
    for name, df in (("quiet", quiet), ("unmeasured", unmeasured), ("measured", measured)):
        st = json.loads(json.dumps(summary.jsonable(everything(df)[4])))["strategies"]["ddp"]
        assert st["weak_efficiency"] == pytest.approx(0.9), name
        written[name] = st
    assert written["quiet"]["weak_efficiency_under_load_cores"] is None
    assert written["unmeasured"]["weak_efficiency_under_load_cores"] is None  # null both ways: the condition tells
    assert written["quiet"]["weak_efficiency_condition"] == "quietly"
    assert written["unmeasured"]["weak_efficiency_condition"] == "under load (busy cores not measured)"
    assert written["measured"]["weak_efficiency_condition"] == "beside 1.70 busy cores"
    for name, st in written.items():
        assert st["best_throughput_condition"] == st["weak_efficiency_condition"], name
    assert summary._condition(None) is None  # no figure, no condition


@pytest.mark.parametrize("loaded_end", ["k=1", "k=2"])
def test_an_efficiency_with_one_end_under_load_is_labelled_not_comparable(loaded_end):
    """A loaded k=1 against a quiet k=2 (or the reverse) divides a figure measured beside busy cores by one measured
    quietly: the efficiency is labelled not comparable (table, Reading, summary.json, metrics.json), naming how each
    end was measured and the command to rerun, and is never ranked."""
    k1 = busy("ddp", 1, 500.0) if loaded_end == "k=1" else row("ddp", k=1, B=128, thr=1000.0)
    k2 = busy("ddp", 2, 900.0) if loaded_end == "k=2" else row("ddp", k=2, B=256, thr=1800.0)
    _, eff, _, _, summ, metrics, reading = everything(frame([k1, k2]))
    e = one(eff, strategy="ddp", kind="weak", k=2)
    assert (
        e["under_load"] and e["base_under_load"] == (loaded_end == "k=1") and e["k_under_load"] == (loaded_end == "k=2")
    )
    assert not e["comparable"] and summ["strategies"]["ddp"]["weak_efficiency_comparable"] is False
    assert metrics["weak_efficiency_comparable.ddp.k2"] == 0 and "weak_efficiency.ddp.k2" in metrics
    line = next(line for line in reading if "eak-scaling efficiency" in line)
    k2_how, k1_how = (
        ("beside 1.60 busy cores", "quietly") if loaded_end == "k=2" else ("quietly", "beside 1.60 busy cores")
    )
    assert line.startswith("Weak-scaling efficiency not comparable on this host, so not ranked: ddp at k=2")
    assert f"its k=2 point was measured {k2_how}, its k=1 reference {k1_how}" in line
    assert "rerun on a quiet host (`" in line and "sweep.repeats=2" in line
    assert not any(x.startswith("Best weak-scaling efficiency") for x in reading)


def test_the_reading_and_metrics_json_say_what_their_under_load_counts_count():
    """The Reading counts points (a strategy, k and batch each) with only flagged trials; metrics.json's `under_load`
    counts strategy-k pairs (its one point per pair, the fastest). With two loaded points at one strategy-k pair
    the two counts differ, and the Reading gives both, each named, the second as metrics.json's number."""
    df = frame(
        [
            busy("ddp", 1, 1000.0, 1.5),
            busy("ddp", 2, 1600.0, 1.7),
            row("ddp", k=2, B=512, thr=1500.0, interfered=True, foreign_cores=1.7, interference_reason="busy"),
        ]
    )
    *_, metrics, reading = everything(df)
    line = next(line for line in reading if line.startswith("**Measured under load**"))
    assert metrics["under_load"] == 2
    assert "3 points (a strategy, k and batch each) had only flagged trials" in line
    assert "counts 2 strategy-k pairs measured under load (its `under_load`: 2," in line


def test_a_quiet_host_has_no_load_line():
    """No flagged trial: no under-load line, and metrics.json says 0 under load."""
    df = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])
    *_, metrics, reading = everything(df)
    assert metrics["under_load"] == 0 and metrics["n_flagged"] == 0
    assert not any("under load" in line.lower() for line in reading)


@pytest.mark.parametrize(
    "rows, cause",
    [
        (
            [busy("ddp", 2, 1600.0), row("ddp", k=1, B=128, state="failed", reason="OOM at step 3")],
            "no k=1 point was timed (its trials: 1 failed: OOM at step 3)",
        ),
        ([row("ddp", k=1, B=128, thr=1000.0)], "no k≥2 point was timed (the sweep space has no k≥2 point)"),
        (
            [row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=512, thr=1800.0)],
            "no strategy has both k=1 and k≥2 timed at the same per-device batch",
        ),
        (
            [
                row("ddp", k=1, B=128, thr=None, reason="untimed: too few steps"),
                row("ddp", k=2, B=256, thr=None, reason="untimed: too few steps"),
            ],
            "no complete trial has a throughput (untimed: too few steps)",
        ),
    ],
)
def test_the_reading_names_the_real_cause_of_a_missing_efficiency(rows, cause):
    """Each way the weak-scaling efficiency can be missing is named as itself, never the generic "no k=1 and k≥2"
    (and a flagged trial is never the cause: its figure is kept, labelled)."""
    *_, reading = everything(frame(rows))
    line = next(line for line in reading if line.startswith("Weak-scaling efficiency"))
    assert line == f"Weak-scaling efficiency: undefined ({cause})."


def test_the_report_tables_label_points_measured_under_load(tmp_path):
    """report.md's throughput and scaling tables carry an under_load column with the load; its interference section
    says the flagged trials of an all-flagged point are kept."""
    df = frame([busy("ddp", 1, 1000.0, 1.5), busy("ddp", 2, 1600.0, 1.7)])
    pts, eff, mem, status, *_ = everything(df)
    path = tmp_path / "report.md"
    document.write_report(path, df, [], status, pts, eff, mem, points.accuracy_table(df))
    text = path.read_text()
    assert "| under_load |" in text and "1.70 cores" in text and "1.50 cores" in text
    assert "were all flagged keeps them, labelled under load" in text


def test_the_speed_figures_carry_the_under_load_line(tmp_path):
    """efficiency.png and throughput.png say how many of their figures were measured under load; none on a quiet
    host."""
    from pipeline.analysis.plots import figures

    df = frame([busy("single", 1, 1000.0, 1.5), busy("ddp", 1, 1000.0, 1.5), row("ddp", k=2, B=256, thr=1800.0)])
    pts, eff, *_ = everything(df)
    assert figures.load_note(pts).startswith("measured under load: 2 of the 3 plotted figures")
    assert figures.load_note(eff[eff["efficiency"].notna()]).startswith("measured under load:")
    quiet = frame([row("ddp", k=1, B=128, thr=1000.0), row("ddp", k=2, B=256, thr=1800.0)])
    assert figures.load_note(points.point_table(quiet)) == ""
    colors = figures.style(sorted(set(df["strategy"])))
    figures.plot_efficiency(eff, tmp_path / "efficiency.png", colors, "synthetic")
    figures.plot_throughput(pts, tmp_path / "throughput.png", colors, "synthetic", eff)
    assert (tmp_path / "efficiency.png").stat().st_size > 0 and (tmp_path / "throughput.png").stat().st_size > 0


def test_the_dvc_plots_csvs_label_the_point_measured_under_load(tmp_path):
    """efficiency.csv and throughput.csv (DVC's plots: a ring and a legend entry, a tooltip line) carry `measured`:
    "under load" on the row of the point from flagged trials and on the efficiency it enters, "quiet" elsewhere; the
    numbers are unchanged."""
    import pandas as pd

    from pipeline.analysis import stage
    from tests.analysis.test_analyze import write

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write([row("ddp", k=1, B=128, thr=1000.0), busy("ddp", 2, 1600.0, 1.7)], sweeps / "ddp.jsonl")
    stage.analyze(sweeps, tmp_path / "out", expected=("ddp",))
    thr = pd.read_csv(tmp_path / "out" / "throughput.csv")
    assert thr[["k", "throughput_img_s", "measured"]].values.tolist() == [
        [1, 1000.0, "quiet"],
        [2, 1600.0, "under load"],
    ]
    eff = pd.read_csv(tmp_path / "out" / "efficiency.csv")
    weak = eff[eff["kind"] == "weak"].set_index("k")
    assert weak.loc[2, "measured"] == "under load" and weak.loc[2, "efficiency"] == pytest.approx(0.8)
    assert weak.loc[1, "measured"] == "quiet"
    # DVC's templates draw it: a ring around the point, in a legend of its own (the line keeps its strategy's colour)
    for name in ("efficiency_by_strategy", "throughput_by_strategy"):
        spec = json.loads((REPO / ".dvc" / "plots" / f"{name}.json").read_text())
        layers = spec["spec"]["layer"] if "spec" in spec else spec["layer"]
        (ring,) = [x for x in layers if x.get("transform") == [{"filter": "datum.measured == 'under load'"}]]
        assert ring["encoding"]["stroke"]["field"] == "measured", name


def test_metrics_json_figures_at_a_k_are_those_of_one_point_the_answer_runs():
    """At ddp k=2 the fastest point (B=256, flagged, 0.36 cores) and a slower one (B=512, bigger memory, better
    accuracy) measured under a comparable load (0.40 cores), the k=1 reference too (0.30): every `.ddp.k2` figure of
    metrics.json is the B=256 point's, as in the report's answer (its load, its peak memory, its accuracy), never
    mixed with the other point's; `best_test_acc.ddp` is the best of any point."""
    mib = 2**20
    df = frame(
        [
            busy("ddp", k=1, thr=1000.0, cores=0.3, acc=0.79, peaks=[90 * mib]),
            row("ddp", k=2, B=512, thr=1500.0, acc=0.81, peaks=[200 * mib] * 2, interfered=True, foreign_cores=0.4),
            busy("ddp", k=2, thr=1800.0, cores=0.36, acc=0.80, peaks=[100 * mib] * 2),  # B=256
        ]
    )
    pts, eff, mem, status, summ, metrics, _ = everything(df)
    assert metrics["throughput_img_s.ddp.k2"] == 1800.0 and metrics["peak_mem_mib.ddp.k2"] == 100.0
    assert metrics["final_test_acc.ddp.k2"] == 0.8 and metrics["best_test_acc.ddp"] == 0.81
    assert metrics["load_cores.ddp.k2"] == pytest.approx(0.36) and metrics["under_load"] == 2
    assert metrics["weak_efficiency.ddp.k2"] == pytest.approx(0.9)  # B=256 is b=128 per device: k=1's b
    from pipeline.analysis.report import answer

    ans = answer.build(df, status, pts, eff, mem)
    t = "\n".join(ans.lines)
    assert ans.train["batch_size"] == 256 and "0.36" in t
    assert "peak memory 100.0 / 100.0 MiB" in t and "test accuracy 0.8000" in t, t


def test_dvc_plots_draw_the_95_percent_intervals_the_csvs_carry(tmp_path):
    """throughput.csv carries each point's 95% interval (throughput_lo/hi) beside efficiency.csv's efficiency_lo/hi,
    and DVC's two templates draw each as an error bar over those columns; each template, filled as DVC fills it,
    compiles to a chart with a bar for each row that has an interval and none for the others (vl-convert's Vega-Lite,
    where installed)."""
    import pandas as pd

    from pipeline.analysis import stage
    from tests.analysis.test_analyze import write

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    windows = {1: [990.0, 1010.0, 1000.0, 995.0, 1005.0, 998.0], 2: [1580.0, 1620.0, 1600.0, 1590.0, 1610.0, 1605.0]}
    write(
        [row("ddp", k=k, B=128 * k, thr=sum(w) / len(w), throughput_windows=w) for k, w in windows.items()],
        sweeps / "ddp.jsonl",
    )
    stage.analyze(sweeps, tmp_path / "out", expected=("ddp",))
    filled, bars = {}, {}
    for csv, (y, lo, hi), name in (
        ("throughput.csv", ("throughput_img_s", "throughput_lo", "throughput_hi"), "throughput_by_strategy"),
        ("efficiency.csv", ("efficiency", "efficiency_lo", "efficiency_hi"), "efficiency_by_strategy"),
    ):
        data = pd.read_csv(tmp_path / "out" / csv)
        iv = data[data[lo].notna()]  # efficiency's k=1 rows are 1 by definition: no interval
        assert len(iv) == (len(data) if csv == "throughput.csv" else 1), csv  # the weak efficiency at k=2
        assert (iv[lo] <= iv[y]).all() and (iv[y] <= iv[hi]).all() and (iv[lo] < iv[hi]).all(), csv
        text = (REPO / ".dvc" / "plots" / f"{name}.json").read_text()
        spec = json.loads(text)
        layers = spec["spec"]["layer"] if "spec" in spec else spec["layer"]
        (bar,) = [x for x in layers if x["mark"]["type"] == "errorbar"]
        assert (bar["encoding"]["y"]["field"], bar["encoding"]["y2"]["field"]) == (lo, hi), name
        # as DVC hands a CSV's rows to the template: every value a string, "" where the cell is empty
        records = data.assign(rev="workspace").fillna("").astype(str).to_dict("records")
        bars[name] = len(iv)
        filled[name] = text.replace('"<DVC_METRIC_DATA>"', json.dumps(records, default=str))
        for anchor, value in (("X", "k"), ("Y", y), ("X_LABEL", "k"), ("Y_LABEL", y), ("TITLE", name)):
            filled[name] = filled[name].replace(f"<DVC_METRIC_{anchor}>", value)
    # each filled template renders, where a Vega-Lite renderer is installed (none is a dependency: DVC renders them)
    vl_convert = pytest.importorskip("vl_convert")
    for name, spec in filled.items():
        svg = vl_convert.vegalite_to_svg(json.loads(spec))
        # a bar per row with an interval; none at 0 for the empty ones (an empty string passes isValid)
        assert svg.count('aria-roledescription="errorbar"') == bars[name], name
