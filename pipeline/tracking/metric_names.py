"""The names and rounding of a trial's MLflow metrics: what its page, the runs table and the compare table show.

A measurement keeps its name on MLflow: the learning curves are the epoch record's own keys (CURVES), the trial's
numbers its record's own field and derived names (records/trial.py; `throughput_img_s`, the same in the sweep table,
Optuna, metrics.json and the report), a study's numbers the names summary.json and metrics.json give them. MLflow's
compare table and chart sections sort keys alphabetically; the runs table's columns are chosen, not sorted
(ui_view.COLUMNS).
The step-time breakdown is one table artifact per trial (BREAKDOWN_FILE) plus two summary metrics, not one
single-point series per part. Values are rounded to ROUND_DIGITS significant digits: the timings behind them
vary by more than that between repeats. Pure: a record (or an epoch's dict) in, a dict of metrics out.
"""

from __future__ import annotations

import math
import re

ROUND_DIGITS = 4
BREAKDOWN_FILE = "breakdown.json"  # MLflow's log_table artifact: one row per part of a sampled step
TRACE_DIR = "trace"  # each rank's first sampled step as a Chrome trace (measure/chrome_trace.py), artifact folder too
TRACES = f"{TRACE_DIR}/rank*.pt.trace.json"  # in the trial directory (trial/ranks.py writes them)

# learning curves: one point per epoch (step = epoch), under the epoch record's keys (trial/loop.py), which are the
# record's per-epoch lists too
EPOCH_THROUGHPUT = "epoch_throughput_img_s"
CURVES = ("train_loss", "test_acc", "epoch_s", EPOCH_THROUGHPUT)
# once per trial, at the last epoch's step: the record's METRIC view (records/trial.py), each under the record's own
# name; named here because tracking does not import records (tests/tracking/test_metric_names.py holds them equal)
FINAL_ACC = "final_test_acc"
THROUGHPUT = "throughput_img_s"
STEP_S = "sampled_step_s"
COMM_SHARE = "comm_exposed_share"
PEAK_MIB = "peak_mem_mib"
MEM_IMBALANCE = "mem_imbalance"


def rounded(v: float, digits: int = ROUND_DIGITS) -> float:
    """`v` to `digits` significant digits (1234.567 -> 1235.0, 0.0123456 -> 0.01235)."""
    if not v or not math.isfinite(v):
        return v
    return round(v, digits - 1 - math.floor(math.log10(abs(v))))


def _metric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _clean(metrics: dict) -> dict:
    """Finite numbers only, rounded, keys sorted as MLflow shows them."""
    return {k: rounded(float(metrics[k])) for k in sorted(metrics) if _metric(metrics[k])}


def epoch_metrics(record: dict) -> dict:
    """One epoch's learning-curve points (the loop's per-epoch record), under its own keys."""
    return _clean({k: record.get(k) for k in CURVES})


def trial_metrics(record) -> dict:
    """A finished trial's metrics: its record's METRIC view under the names the record declares, rounded (of the
    breakdown the step time and the exposed communication's share; its parts are breakdown_table)."""
    return _clean(record.metrics())


def breakdown_table(record) -> dict | None:
    """The sampled step's breakdown as columns (part, seconds, share of the step), for MLflow's log_table; None
    where the trial sampled no step."""
    m = record.breakdown_parts()
    parts = [k[: -len("_share")] for k in m if k.endswith("_share")]
    if not parts:
        return None
    return {
        "part": parts,
        "seconds": [rounded(m[f"{p}_s"]) for p in parts],
        "share": [rounded(m[f"{p}_share"]) for p in parts],
        "samples": [m.get("samples")] * len(parts),
        "step_s": [rounded(m["step_s"])] * len(parts),
    }


# The analysis run's numbers (summary.json's): the counts and each strategy's headline numbers only. MLflow's run
# page makes one chart section per name prefix (up to the last slash), in name order: the figures that compare
# strategies (FIGURES, analysis_run.CHARTS) come first, then strategy/<s> (the numbers the runs and compare tables
# show), then summary; never a screen of single-bar charts before the comparisons.
FIGURES = "figures"
# the *_under_load_cores names are labels (the cores other processes kept busy): absent on a quiet host
ANALYSIS_HEADLINE = (
    "best_throughput_img_s",
    "weak_efficiency",
    "best_test_acc",
    "worst_mem_imbalance",
    "weak_efficiency_under_load_cores",
    "best_throughput_under_load_cores",
)
ANALYSIS_COUNTS = ("n_trials", "n_complete", "n_measured", "n_flagged")
# a study (parent) run's numbers from summary.json, under its names: the strategy's headline and the largest k
STUDY_HEADLINE = ("best_throughput_img_s", "weak_efficiency", "largest_k", "best_test_acc", "worst_mem_imbalance")
# the trials' columns a study row carries, the same quantity at the study's best point (the k of its best throughput,
# metrics.json's point there): one configuration's peak is a trial's peak, so the column keeps its name
STUDY_POINT = (PEAK_MIB,)


def analysis_metrics(summary: dict) -> dict:
    """summary.json's counts as summary/<name> and each strategy's headline numbers as strategy/<s>/<name>,
    rounded; a strategy that measured nothing has none."""
    out = {f"summary/{k}": summary.get(k) for k in ANALYSIS_COUNTS}
    for name, s in (summary.get("strategies") or {}).items():
        out.update({f"strategy/{name}/{k}": s.get(k) for k in ANALYSIS_HEADLINE})
    return _clean(out)


def study_row_metrics(strategy: str, summary: dict, flat: dict) -> dict:
    """A study parent run's metrics from the analyze stage's outputs, the numbers the report shows, each under the
    name its file gives it: from summary.json the strategy's STUDY_HEADLINE numbers (best_throughput_img_s,
    weak_efficiency at the largest k where it is defined, largest_k measured, best_test_acc, worst_mem_imbalance),
    rounded here as every metric is; from metrics.json (`flat`, already rounded) every per-k figure of the strategy
    (weak_efficiency.<strategy>.kK, throughput_img_s.<strategy>.kK, ...: keys that end in .kK; best_test_acc comes
    from summary.json). The study's figures come from here alone (the sweep writes its trial counts only): the
    report's rule, one source for the row and the report. Last, the STUDY_POINT columns (peak_mem_mib) at the study's
    best point: metrics.json's figure at the k (and model) of summary.json's best_throughput_at, so the collapsed
    study row shows the answer's memory beside its throughput."""
    s = (summary.get("strategies") or {}).get(strategy) or {}
    out = _clean({k: s.get(k) for k in STUDY_HEADLINE})
    for key, v in flat.items():
        name, _, rest = key.partition(f".{strategy}.")
        if name and re.fullmatch(r"k\d+", rest.split(".")[-1]) and _metric(v):
            out[key] = v
    at = s.get("best_throughput_at") or {}
    if _metric(at.get("k")):
        k = f"k{int(at['k'])}"
        for name in STUDY_POINT:  # the key names the model only where the sweeps hold several
            v = flat.get(f"{name}.{strategy}.{at.get('model')}.{k}", flat.get(f"{name}.{strategy}.{k}"))
            if _metric(v):
                out[name] = v
    return out
