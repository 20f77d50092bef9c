"""Like against like, end to end: sweep tables of a busy host where one point was measured quietly and the others
beside busy cores, through the analysis stage (`pipeline analyze`'s analyze()): the answer never ranks the quiet
figure against the loaded ones, names it as not comparable with the command to rerun, and an efficiency that divides
a point measured beside 0.56 busy cores by one beside 1.48 is labelled, in report.md, summary.json, metrics.json
and efficiency.csv, never ranked."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pipeline.analysis import stage
from tests.analysis.test_analyze import row, write

QUIET = None


def point(strategy, k, mean, cores=QUIET, seed=0):
    """Three trials of a point around `mean` images/s, twelve windows each; measured beside `cores` busy cores
    (flagged by interference.py), or quietly."""
    rng = np.random.default_rng(seed)
    load = (
        {}
        if cores is QUIET
        else {
            "interfered": True,
            "foreign_cores": cores,
            "interference_reason": f"other processes kept {cores:.2f} cores busy on average",
        }
    )
    out = []
    for _ in range(3):
        w = [float(x) for x in rng.normal(mean, mean * 0.01, 12)]
        out.append(row(strategy, k=k, B=128 * k, thr=float(np.mean(w)), throughput_windows=w, **load))
    return out


def analyze(tmp_path, points):
    d = tmp_path / "sweeps"
    d.mkdir()
    by: dict = {}
    for rows in points:
        by.setdefault(rows[0]["strategy"], []).extend(rows)
    for s, rows in by.items():
        write(rows, d / f"{s}.jsonl")
    out = tmp_path / "analysis"
    summary = stage.analyze(d, out, expected=sorted(by))
    return summary, out


# A busy shared host: scratch k=1 the only point measured quietly (and the fastest), every other beside 1.16-1.31
# busy cores, but fsdp's k=1 reference beside 1.48 and its k=2 point beside 0.56.
MIXED = (
    point("scratch", 1, 4183.0, QUIET, 1),
    point("scratch", 2, 2500.0, 1.20, 2),
    point("single", 1, 2999.0, 1.16, 3),
    point("ddp", 1, 2000.0, 1.20, 4),
    point("ddp", 2, 3000.0, 1.22, 5),
    point("ddp_amp", 1, 3000.0, 1.31, 6),
    point("ddp_amp", 2, 3494.0, 1.25, 7),
    point("fsdp", 1, 1500.0, 1.48, 8),
    point("fsdp", 2, 2940.0, 0.56, 9),
)


def test_a_busy_host_answers_like_against_like_and_labels_an_efficiency_of_unlike_ends(tmp_path):
    summary, out = analyze(tmp_path, MIXED)
    report = (out / "report.md").read_text()
    answer = report[report.index("## Answer") : report.index("## Host and devices")]
    rerun = "dvc exp run -S sweep.repeats=2`"
    # the answer: the fastest of the largest group measured under comparable loads, said so
    assert "**Use ddp_amp at k=2**" in answer and "Use scratch" not in answer
    assert "the fastest of 4 strategies measured beside 1.16-1.31 busy cores, like against like" in answer
    # the quiet figure is named, not ranked: how each side was measured, and the command to rerun
    (left,) = [line for line in answer.splitlines() if line.startswith("- **Not compared:**")]
    assert (
        "faster, but not comparable on this host: scratch at k=1 (4,183 images/s) was measured quietly, ddp_amp "
        "beside 1.25 busy cores; rerun on a quiet host (`"
        in left
        and rerun in left
    )
    (sure,) = [line for line in answer.splitlines() if line.startswith("- **How sure:**")]
    assert "clear of the runner-up's (single " in sure and "scratch" not in sure and "quietly" not in sure
    assert "strategy: ddp_amp" in (out / "best.yaml").read_text()
    # fsdp's 0.98 divides a point beside 0.56 busy cores by one beside 1.48: labelled in every view, never ranked
    (apart,) = [line for line in report.splitlines() if "efficiency not comparable on this host" in line]
    assert (
        "fsdp at k=2 (b=128, 0.98 [" in apart
        and "its k=2 point was measured beside 0.56 busy cores, its k=1 reference beside 1.48 busy cores" in apart
        and rerun in apart
    )
    weak = report[report.index("### Weak scaling") : report.index("### Strong scaling")].splitlines()
    marked = [line.split(" | ")[0] for line in weak if "| no |" in line]
    assert marked == ["| scratch", "| fsdp"] or marked == ["| fsdp", "| scratch"]
    (best,) = [line for line in report.splitlines() if "Best weak-scaling efficiency" in line]
    assert "**fsdp**" not in best and "**ddp**" in best
    fsdp = summary["strategies"]["fsdp"]
    assert fsdp["weak_efficiency"] == pytest.approx(0.98, abs=0.01) and fsdp["weak_efficiency_comparable"] is False
    assert summary["strategies"]["ddp"]["weak_efficiency_comparable"] is True
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["weak_efficiency_comparable.fsdp.k2"] == 0 and "weak_efficiency.fsdp.k2" in metrics
    assert "weak_efficiency_comparable.ddp.k2" not in metrics and "weak_efficiency.ddp.k2" in metrics
    eff = pd.read_csv(out / "efficiency.csv")
    at = eff[(eff["kind"] == "weak") & (eff["k"] == 2)].set_index("strategy")["comparable"]
    assert not at["fsdp"] and not at["scratch"] and at["ddp"] and at["ddp_amp"]


def test_no_two_strategies_measured_alike_give_no_answer_and_say_why(tmp_path):
    """One strategy measured quietly, the other beside busy cores: no like-for-like comparison there is, so no answer,
    with both conditions and the command to rerun."""
    summary, out = analyze(tmp_path, (point("scratch", 1, 4183.0, QUIET, 1), point("ddp", 1, 3000.0, 1.2, 2)))
    report = (out / "report.md").read_text()
    assert "**No answer on this host:** no two strategies were measured under comparable loads" in report
    assert (
        "scratch (4,183 images/s at k=1) was measured quietly, ddp (3,001 images/s at k=1) beside 1.20 busy cores; "
        "rerun on a quiet host (`" in report
    )
    assert "Use " not in report[: report.index("## Host and devices")]
    assert "- Fastest: none named, as no two strategies were measured under comparable loads" in report
    assert (out / "best.yaml").read_text().startswith("# No best configuration on this host: no two strategies")


@pytest.mark.parametrize(
    "a, b, alike",
    [
        ((False, None), (False, None), True),  # both quiet
        ((True, 1.16), (True, 1.31), True),  # loaded, 0.15 cores apart
        ((True, 1.45), (True, 1.70), True),  # at the tolerance
        ((True, 0.56), (True, 1.48), False),  # loaded, 0.92 cores apart
        ((False, None), (True, 0.30), False),  # quiet against loaded, however close
        ((True, None), (True, None), False),  # loads not measured
    ],
)
def test_the_rule(a, b, alike):
    from pipeline.analysis.tables import comparable

    ra, rb = ({"under_load": u, "load_cores": c} for u, c in (a, b))
    assert comparable.comparable(ra, rb) is alike and comparable.comparable(rb, ra) is alike


def test_a_k1_ratio_across_unlike_loads_is_not_printed(tmp_path):
    """The answer's k=1 ratio against single divides ddp_amp's k=1 point (beside 1.31 busy cores) by single's
    (measured quietly): not a number, the two conditions and the command instead."""
    _, out = analyze(
        tmp_path,
        (
            point("single", 1, 2000.0, QUIET, 1),
            point("ddp", 1, 1500.0, 1.30, 2),
            point("ddp", 2, 2500.0, 1.30, 3),
            point("ddp_amp", 1, 3000.0, 1.31, 4),
            point("ddp_amp", 2, 3494.0, 1.25, 5),
        ),
    )
    report = (out / "report.md").read_text()
    (why,) = [line for line in report.splitlines() if line.startswith("- **Why:**")]
    assert "its speed at k=1 against single's is not comparable on this host: ddp_amp (" in why
    assert "images/s) was measured beside 1.31 busy cores, single (" in why and ") quietly; rerun on a quiet" in why
    assert "× single" not in why


def test_the_step_loss_sentence_labels_an_efficiency_of_unlike_ends():
    """ "Why it scales" quotes the measured efficiency beside the step's loss: one whose ends are not comparable says
    so; a comparable one reads as a plain number."""
    from pipeline.analysis.report.why import loss_sentence
    from pipeline.analysis.tables.step_parts import BD_ALL

    r = {"strategy": "fsdp", "k": 2, "per_device_batch": 128, "loss": 0.4, "measured_efficiency": 0.98}
    r.update({f"loss_{p}": 0.0 for p in BD_ALL})
    assert loss_sentence({**r, "measured_comparable": False}).endswith(
        "(measured weak-scaling efficiency from throughput: 0.98, not comparable on this host: its two ends were "
        "measured under loads that are not comparable (docs/metrics.md))."
    )
    assert loss_sentence({**r, "measured_comparable": True}).endswith("from throughput: 0.98).")
