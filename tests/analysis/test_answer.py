"""The report's first screen (report/answer.py): a clear winner named with its k and a command the project's own
parser and config loader take; a tie said as a tie; no answer said with its cause; a k=1 compute difference from
autocast named in the why. On constructed frames with window lists (three trials of twelve windows per point)."""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path

import pandas as pd

from pipeline.analysis.report import answer, document
from pipeline.analysis.tables.points import memory_table, point_table, scaling_table
from pipeline.analysis.tables.rows import normalize
from pipeline.analysis.tables.summary import strategy_status
from pipeline.cli.parser import build_parser
from pipeline.config import loader
from tests.analysis.test_analyze import frame, row
from tests.analysis.test_intervals import repeats, with_windows
from tests.conftest import REPO

WIDE = (0.9, 1.0, 1.1)  # trials far apart from each other: a wide interval


def build(*points, **kw):
    """points: (strategy, k, mean throughput, seed[, spread]); kw: columns of every row. The answer and the frame."""
    rows, wins = [], []
    for strategy, k, mean, seed, *spread in points:
        r, w = repeats(strategy, k, mean, seed=seed, **kw)
        if spread:
            w = [[x * f for x in g] for g, f in zip(w, spread[0])]
        rows, wins = rows + r, wins + w
    df = with_windows(rows, wins)
    status = {s: {"status": "measured", "reason": ""} for s in set(df["strategy"])}
    return answer.build(df, status, point_table(df), scaling_table(df), memory_table(df)), df


def text(ans) -> str:
    return "\n".join(ans.lines)


def test_a_clear_winner_names_strategy_and_k_and_its_command_and_yaml_run(tmp_path):
    """The fastest strategy beyond noise is named with its k; the command parses with the CLI's own parser into
    those values (the knob as --set), and best.yaml loads with the config loader as that train section."""
    ans, _ = build(
        ("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), ("fsdp", 1, 1000.0, 3), ("fsdp", 2, 1400.0, 4), bucket_cap_mb=50.0
    )
    t = text(ans)
    assert "**Use ddp at k=2**" in t and "clear of the runner-up's (fsdp 1,3" in t and "tie" not in t.lower()
    assert "weak-scaling efficiency of 0.9" in t and ans.command in t.replace(" \\\n    ", " ")
    words = shlex.split(ans.command)
    assert words[0] in ("python", ".venv/bin/python") and words[1:4] == ["-m", "pipeline", "train"]
    args = build_parser().parse_args(words[3:])
    assert (args.strategy, args.devices, args.batch_size, args.lr, args.epochs) == ("ddp", 2, 256, 0.1, 2)
    cfg = loader.load(overrides=args.overrides, root=REPO)
    assert cfg.train.bucket_cap_mb == 50.0 and str(args.out) == answer.RUN_DIR
    # the answer's figure (the point's mean, as the answer shows it) rides with the command: the run's last line
    # compares its own with it
    assert abs(args.answer_img_s - 1800) < 20 and f"{args.answer_img_s:,.0f} [" in t
    assert args.answer_load_cores is None
    path = tmp_path / "best.yaml"
    path.write_text(answer.best_yaml(ans))
    train = loader.load(params=path, root=REPO).train
    assert (train.strategy, train.devices, train.batch_size, train.lr, train.bucket_cap_mb) == (
        "ddp",
        2,
        256,
        0.1,
        50.0,
    )


def test_a_tie_is_said_as_a_tie():
    """Overlapping throughput intervals: the headline and the how-sure line say tie, no strategy is "used"."""
    ans, _ = build(
        ("ddp", 1, 1000.0, 1, WIDE),
        ("ddp", 2, 1800.0, 2, WIDE),
        ("ddp_amp", 1, 1000.0, 3, WIDE),
        ("ddp_amp", 2, 1760.0, 4, WIDE),
    )
    t = text(ans)
    assert "**Tie: ddp and ddp_amp within noise**" in t and "tie: ddp and ddp_amp within noise" in t
    assert "**Use " not in t and "clear of the runner-up" not in t
    assert ans.train["strategy"] == "ddp"  # the command runs the higher median, and says so
    assert "the higher median" in t


def test_no_answer_says_why():
    """Every trial under interference: an answer labelled measured under load on its first line; trials that never
    completed: no answer, and the summary's per-strategy reason."""
    ans, df = build(("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), interfered=True)
    assert ans.train["strategy"] == "ddp"
    assert "*measured under load (busy cores not measured)*" in text(ans).split("\n")[2]  # comparable.condition
    loaded = answer.why_no_answer(df, {})  # where no under-load figure can be made either
    assert "measured under interference" in loaded and "helps only where the host has quiet moments" in loaded
    failed = frame([row("ddp", k=1, state="failed", reason="CUDA out of memory")])
    status = strategy_status(failed, {"ddp": "ok"}, "results/sweeps", ["ddp"])
    cause = answer.why_no_answer(failed, status)
    assert cause.startswith("no complete, non-oversubscribed trial") and "CUDA out of memory" in cause
    empty = normalize(pd.DataFrame(), "")
    assert "no sweep table holds a trial" in answer.why_no_answer(empty, {})


def test_autocast_compute_at_k1_is_the_why():
    """ddp_amp already faster than single at k=1: the why names the k=1 ratio and autocast compute."""
    ans, _ = build(
        ("single", 1, 1000.0, 1),
        ("ddp", 1, 1000.0, 2),
        ("ddp", 2, 1800.0, 3),
        ("ddp_amp", 1, 1700.0, 4),
        ("ddp_amp", 2, 3100.0, 5),
        host_bf16="native",
    )
    why = [s for s in ans.lines if s.startswith("- **Why:**")][0]
    assert "**Use ddp_amp at k=2**" in text(ans)
    assert "at k=1 ddp_amp already runs 1.70× single" in why and "autocast (bf16 native on this host)" in why
    # B (global) and b (per device) each say which batch they are where the answer first uses them
    assert "**Use ddp_amp at k=2** (global batch B=" in text(ans) and "images/s at per-device batch b=" in why


def test_even_memory_is_no_finding_and_equal_accuracy_is_a_tie():
    """Equal per-device peaks: "no imbalance beyond noise", never a worst strategy; equal accuracies: a tie."""
    df = frame([row("ddp", k=1), row("ddp", k=2, B=256), row("fsdp", k=1), row("fsdp", k=2, B=256)])
    out = " ".join(document._reading(point_table(df), scaling_table(df), memory_table(df), {}, df))
    assert "no imbalance beyond noise" in out and "Worst memory imbalance" not in out
    assert "Best final test accuracy: **tie: ddp, fsdp** within 0.005" in out


def test_the_command_runs_as_printed_with_its_exact_lr_data_source_and_interpreter():
    """A learning rate in full (not 6 digits), the synthetic source the sweep measured on (so it runs offline, where
    params.yaml names Fashion-MNIST), and the interpreter that has the project's packages."""
    cmd = answer.command({"strategy": "ddp", "devices": 2, "lr": 0.123456789}, "synthetic")
    words = shlex.split(cmd)
    args = build_parser().parse_args(words[3:])
    assert args.lr == 0.123456789
    assert loader.load(overrides=args.overrides, root=REPO).data.source == "synthetic"
    venv = sys.prefix != sys.base_prefix and Path(sys.prefix).name == ".venv"
    assert words[0] == (".venv/bin/python" if venv else "python")
    assert "data.source" not in answer.command({"strategy": "ddp"}, "fashion-mnist")


def test_the_command_passes_the_load_only_of_an_answer_measured_under_load():
    """A figure measured quietly (load None) passes its images/s alone; one measured under load passes the load too,
    "nan" where its busy cores were not measured (never dropped, which would read as quiet), and the printed command
    parses."""
    cmd = answer.command({"strategy": "ddp"}, "synthetic", (1234.4, None))
    assert "--answer-img-s 1234" in cmd and "--answer-load-cores" not in cmd, cmd
    cmd = answer.command({"strategy": "ddp"}, "synthetic", (1234.4, 0.5))
    args = build_parser().parse_args(shlex.split(cmd)[3:])
    assert (args.answer_img_s, args.answer_load_cores) == (1234.0, 0.5)
    cmd = answer.command({"strategy": "ddp"}, "synthetic", (1234.4, float("nan")))
    args = build_parser().parse_args(shlex.split(cmd)[3:])
    assert args.answer_img_s == 1234.0 and math.isnan(args.answer_load_cores), cmd


def test_a_point_without_a_weak_reference_says_its_strong_scaling_never_not_measured():
    """k=2 at B=256 (b=128) with a k=1 run only at B=256: weak scaling has no reference, strong scaling has one; the
    why gives the strong efficiency (which the table below shows) and says which reference is missing."""
    rows, wins = [], []
    for k, mean, seed in ((1, 1000.0, 1), (2, 1800.0, 2)):
        r, w = repeats("ddp", k, mean, seed=seed)
        rows += [{**x, "batch_size": 256, "per_device_batch": 256 // k} for x in r]
        wins += w
    df = with_windows(rows, wins)
    status = {"ddp": {"status": "measured", "reason": ""}}
    ans = answer.build(df, status, point_table(df), scaling_table(df), memory_table(df))
    t = text(ans)
    assert "**Use ddp at k=2**" in t, t
    assert "strong-scaling efficiency of 0.9" in t and "weak scaling is not measured" in t, t
    assert "its scaling is not measured" not in t


def test_the_answer_runs_the_optimizer_it_measured(tmp_path):
    """A point measured with AdamW: the headline says so, the command sets train.optimizer, and best.yaml loads
    with it (the lr is AdamW's, meaningless with another optimizer)."""
    ans, _ = build(("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), lr=0.001, optimizer="adamw")
    assert "lr=0.001, adamw)" in text(ans) and ans.train["optimizer"] == "adamw"
    args = build_parser().parse_args(shlex.split(ans.command)[3:])
    assert loader.load(overrides=args.overrides, root=REPO).train.optimizer == "adamw"
    path = tmp_path / "best.yaml"
    path.write_text(answer.best_yaml(ans))
    train = loader.load(params=path, root=REPO).train
    assert (train.optimizer, train.lr) == ("adamw", 0.001)


def test_every_comparison_states_both_sides_conditions():
    """Every trial measured under comparable loads (1.20-1.30 cores busy): the k=1 ratio, the efficiency and the
    runner-up each say how both of their sides were measured; an all-quiet comparison says nothing of load."""

    def load(cores):
        return {"interfered": True, "foreign_cores": cores, "interference_reason": "other processes kept cores busy"}

    rows, wins = [], []
    for strategy, k, mean, seed, kw in (
        ("single", 1, 1000.0, 1, load(1.2)),
        ("ddp", 1, 1000.0, 2, load(1.3)),
        ("ddp", 2, 1800.0, 3, load(1.3)),
        ("ddp_amp", 1, 1700.0, 4, load(1.25)),
        ("ddp_amp", 2, 3100.0, 5, load(1.25)),
    ):
        r, w = repeats(strategy, k, mean, seed=seed, host_bf16="native", **kw)
        rows, wins = rows + r, wins + w
    df = with_windows(rows, wins)
    status = {s: {"status": "measured", "reason": ""} for s in set(df["strategy"])}
    ans = answer.build(df, status, point_table(df), scaling_table(df), memory_table(df))
    why = [s for s in ans.lines if s.startswith("- **Why:**")][0]
    sure = [s for s in ans.lines if s.startswith("- **How sure:**")][0]
    assert "ddp_amp measured beside 1.25 busy cores, single measured beside 1.20 busy cores" in why
    assert "(k=2 measured under load, its k=1 reference under load)" in why
    assert "ddp_amp measured beside 1.25 busy cores, ddp measured beside 1.30 busy cores" in sure
    assert "Not compared" not in text(ans) and "the fastest measured on this host" in text(ans)
    assert "; *measured beside 1.25 busy cores*)" in ans.lines[2]  # the headline: comparable.condition's words
    quiet, _ = build(("ddp", 1, 1000.0, 1), ("ddp", 2, 1800.0, 2), ("fsdp", 1, 1000.0, 3), ("fsdp", 2, 1400.0, 4))
    assert "measured quietly" not in text(quiet) and "under load" not in text(quiet)


def test_the_why_quotes_the_answers_own_optimizer_not_another_at_the_same_k_and_batch():
    """Two optimizers at the same strategy, k and batch: the Why's weak-scaling efficiency and k=1 speed are the
    recommended optimizer's (adamw: 1,800 at k=2 from 800 at k=1), never sgd's row beside it (1,100 from 1,500)."""
    rows, wins = [], []
    for strategy, k, mean, seed, opt in (
        ("single", 1, 1000.0, 1, "sgd"),
        ("single", 1, 1000.0, 2, "adamw"),
        ("ddp", 1, 1500.0, 3, "sgd"),
        ("ddp", 2, 1100.0, 4, "sgd"),
        ("ddp", 1, 800.0, 5, "adamw"),
        ("ddp", 2, 1800.0, 6, "adamw"),
    ):
        r, w = repeats(strategy, k, mean, seed=seed, optimizer=opt, lr=0.001 if opt == "adamw" else 0.1)
        rows, wins = rows + r, wins + w
    df = with_windows(rows, wins)
    status = {s: {"status": "measured", "reason": ""} for s in set(df["strategy"])}
    pts, eff = point_table(df), scaling_table(df)
    ans = answer.build(df, status, pts, eff, memory_table(df))
    why = [s for s in ans.lines if s.startswith("- **Why:**")][0]
    assert "**Use ddp at k=2** (global batch B=256, lr=0.001, adamw)" in text(ans)
    weak = eff[(eff["kind"] == "weak") & (eff["strategy"] == "ddp") & (eff["k"] == 2)].set_index("optimizer")
    assert weak.loc["sgd", "efficiency"] < 0.4 < 1.0 < weak.loc["adamw", "efficiency"]
    assert f"weak-scaling efficiency of {weak.loc['adamw', 'efficiency']:.2f}" in why and "0.3" not in why, why
    at1 = pts[pts["k"] == 1].set_index(["strategy", "optimizer"])["throughput_img_s"]
    assert f"ddp already runs {at1['ddp', 'adamw'] / at1['single', 'adamw']:.2f}× single" in why, why
    assert f"({at1['ddp', 'adamw']:,.0f} against {at1['single', 'adamw']:,.0f} images/s" in why, why
    assert f"{at1['ddp', 'sgd']:,.0f}" not in why, why


def test_a_table_holding_one_point_twice_is_an_error_not_a_pick():
    """Two rows at one point (every KEY column equal): the lookup raises, naming the point, instead of taking the
    first."""
    df = frame([row("ddp", k=2, B=256)])
    pts = point_table(df)
    twice = pd.concat([pts, pts.assign(throughput_img_s=1.0)])
    top = pts.iloc[0].to_dict()
    assert answer._at(pts, top)["throughput_img_s"] == 1000.0
    try:
        answer._at(twice, top)
    except ValueError as e:
        assert "2 rows at one point (strategy=ddp" in str(e) and "optimizer=sgd" in str(e)
    else:
        raise AssertionError("two rows at one point: no error")


def test_the_command_and_best_yaml_rerun_on_the_images_the_sweep_measured_on(tmp_path):
    """Trials on 1,024 training and 256 test images (the profile's limits are 18,000 and 2,000), at a step limit and
    a seed: the command and best.yaml carry each, so the rerun trains on those images, not the profile's."""
    kw = {"data_source": "synthetic", "train_limit": 1024, "test_limit": 256, "max_steps": 7}
    rows, wins = [], []
    for k, mean, seed in ((1, 1000.0, 1), (2, 1800.0, 2)):
        r, w = repeats("ddp", k, mean, seed=seed, **kw)
        rows, wins = rows + [{**x, "seed": 3} for x in r], wins + w  # repeats' seed is its noise's, not the trial's
    df = with_windows(rows, wins)
    status = {"ddp": {"status": "measured", "reason": ""}}
    ans = answer.build(df, status, point_table(df), scaling_table(df), memory_table(df))
    assert "--set data.train_limit=1024 --set data.test_limit=256" in ans.command, ans.command
    args = build_parser().parse_args(shlex.split(ans.command)[3:])
    assert (args.max_steps, args.seed) == (7, 3)
    data = loader.load(overrides=args.overrides, root=REPO).data
    assert (data.source, data.train_limit, data.test_limit) == ("synthetic", 1024, 256)
    path = tmp_path / "best.yaml"
    path.write_text(answer.best_yaml(ans))
    cfg = loader.load(params=path, root=REPO)
    assert (cfg.data.source, cfg.data.train_limit, cfg.data.test_limit) == ("synthetic", 1024, 256)
    assert (cfg.train.max_steps, cfg.train.seed) == (7, 3)


def test_the_answer_runs_on_its_own_points_data_when_another_strategys_table_is_synthetic():
    """ddp's table from Fashion-MNIST, fsdp's (rerun offline alone) from the synthetic stand-in: the answer, ddp,
    reruns on Fashion-MNIST with no synthetic caveat, and its accuracy is weighed against the same data's only."""
    rows, wins = [], []
    for strategy, k, mean, seed, source, acc in (
        ("ddp", 1, 1000.0, 1, "fashion-mnist", 0.80),
        ("ddp", 2, 1800.0, 2, "fashion-mnist", 0.80),
        ("fsdp", 1, 900.0, 3, "synthetic", 0.99),
        ("fsdp", 2, 1200.0, 4, "synthetic", 0.99),
    ):
        r, w = repeats(strategy, k, mean, seed=seed, data_source=source, acc=acc)
        rows, wins = rows + r, wins + w
    df = with_windows(rows, wins)
    status = {s: {"status": "measured", "reason": ""} for s in ("ddp", "fsdp")}
    ans = answer.build(df, status, point_table(df), scaling_table(df), memory_table(df))
    t = text(ans)
    assert "**Use ddp at k=2**" in t, t
    assert "data.source" not in ans.command and "synthetic data" not in t, t
    assert "test accuracy 0.8000, the best measured" in t, t
    assert "source" not in answer.best_yaml(ans)
