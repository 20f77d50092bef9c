"""Models beyond d2l's in a sweep: a torchvision model (mobilenet_v3_small, the smallest that shows it) swept for
single, ddp, zero1 and fsdp at tiny data limits, its figures in the sweep table, each trial's metrics.json, MLflow and
the report under its name and source; and a user's model from an installed package's entry point in a one-point
sweep, `train` and `fit`."""

from __future__ import annotations

import json

from pipeline.analysis.stage import analyze
from pipeline.sweep.stage import run_sweep
from pipeline.tracking import client

PROFILE = """
data: {{train_limit: 64, test_limit: 32}}
train: {{epochs: 1, warmup_steps: 1, max_steps: 3}}
sweep:
  spaces:
    single: {{model: [{m}], devices: [1], batch_size: [16], lr: [0.01]}}
    ddp: {{model: [{m}], devices: [2], batch_size: [16], lr: [0.01]}}
    zero1: {{model: [{m}], devices: [2], batch_size: [16], lr: [0.01], optimizer: [adamw]}}
    fsdp: {{model: [{m}], devices: [2], batch_size: [16], lr: [0.01]}}
"""


def _sweep(make_cfg, tmp_path, model: str, strategies) -> list[dict]:
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "zoo.yaml").write_text(PROFILE.format(m=model))
    cfg = make_cfg(profile="zoo")
    rows = []
    for s in strategies:
        run_sweep(cfg, s, tmp_path / "results" / "sweeps" / f"{s}.jsonl")
        rows += [json.loads(x) for x in (tmp_path / "results" / "sweeps" / f"{s}.jsonl").read_text().splitlines()]
    return rows, cfg


def test_a_torchvision_model_sweeps_end_to_end_under_its_name(make_cfg, tmp_path):
    model = "mobilenet_v3_small"
    rows, cfg = _sweep(make_cfg, tmp_path, model, ("single", "ddp", "zero1", "fsdp"))
    assert sorted((r["strategy"], r["state"]) for r in rows) == [
        ("ddp", "complete"),
        ("fsdp", "complete"),
        ("single", "complete"),
        ("zero1", "complete"),
    ], [r.get("reason") for r in rows]
    for r in rows:
        assert r["model"] == model and r["model_source"].startswith("torchvision ")
        assert r["throughput_img_s"] > 0 and all(p > 0 for p in r["peak_mem_bytes"])
    trials = [json.loads(p.read_text()) for p in tmp_path.rglob("metrics.json") if "analysis" not in p.parts]
    assert {t["strategy"] for t in trials if t["model"] == model} == {"single", "ddp", "zero1", "fsdp"}
    assert all(t["model_adaptation"] == "gray repeated to 3 channels, 28x28 as is" for t in trials)

    runs = client.Tracker(cfg).find_runs(f"tags.model = '{model}'")
    trial_runs = [r for r in runs if "throughput_img_s" in r.data.metrics]
    assert {r.data.tags["strategy"] for r in trial_runs} == {"single", "ddp", "zero1", "fsdp"}
    assert all(r.data.tags["model_source"].startswith("torchvision ") for r in trial_runs)
    assert all(r.data.params["model_adaptation"].startswith("gray repeated") for r in trial_runs)

    analyze(tmp_path / "results" / "sweeps", tmp_path / "results" / "analysis")
    report = (tmp_path / "results" / "analysis" / "report.md").read_text()
    assert f"`{model}` from torchvision " in report
    assert model in (tmp_path / "results" / "analysis" / "summary.json").read_text()


def test_a_users_model_from_an_entry_point_runs_a_one_point_sweep_train_and_fit(toy_model, make_cfg, tmp_path, capsys):
    from pipeline.cli.commands import main

    rows, _ = _sweep(make_cfg, tmp_path, toy_model, ("ddp",))
    assert [(r["model"], r["state"]) for r in rows] == [(toy_model, "complete")]
    assert rows[0]["model_source"] == "entry point toymodels:build_toynet (toymodels 0.1)"

    (tmp_path / "params.yaml").write_text("profile: zoo\n")
    data = ["--set", f"data.dir={make_cfg().data.dir}", "--set", "data.source=synthetic", "--batch-size", "16"]
    code = main(
        [
            "train",
            "--model",
            toy_model,
            "--strategy",
            "single",
            "--max-steps",
            "2",
            "--no-track",
            "--out",
            str(tmp_path / "run"),
            "--params",
            str(tmp_path / "params.yaml"),
            *data,
        ]
    )
    assert code == 0
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["model"] == toy_model
    capsys.readouterr()
    assert main(["fit", "--model", toy_model, "--batch-size", "64", "--strategies", "ddp,fsdp", "--devices", "2"]) == 0
    said = capsys.readouterr().out
    # the model and its source head the answer; a row per strategy at k=2 with its modelled figure
    assert said.startswith(f"{toy_model} (entry point toymodels:build_toynet (toymodels 0.1)), global batch 64"), said
    rows = [line.split() for line in said.splitlines() if line.split()[:2] in (["ddp", "2"], ["fsdp", "2"])]
    assert [r[:2] for r in rows] == [["ddp", "2"], ["fsdp", "2"]], said
    assert all(float(r[2]) > 0 for r in rows), said  # GiB needed per device, modelled


def test_zero1_and_fsdp_hold_less_per_device_than_ddp_for_resnet50(make_cfg, tmp_path):
    """resnet50 with AdamW at k=2, its measured peaks per device (the CPU MemTracker probe step): ZeRO-1 shards the
    optimizer state, FSDP the parameters, gradients and state, so each holds measurably less than DDP."""
    from pipeline.cli.commands import main

    data = ["profile=", f"data.dir={make_cfg().data.dir}", "data.source=synthetic", "data.train_limit=64"]
    data += ["data.test_limit=16", "train.epochs=1"]
    sets = [x for s in (*data, "train.optimizer=adamw", "train.lr=0.001") for x in ("--set", s)]
    peaks = {}
    for s in ("ddp", "zero1", "fsdp"):
        out = tmp_path / s
        args = ["train", "--model", "resnet50", "--strategy", s, "--devices", "2", "--batch-size", "8"]
        assert main([*args, "--max-steps", "2", "--no-track", "--out", str(out), *sets]) == 0
        peaks[s] = max(json.loads((out / "metrics.json").read_text())["peak_mem_bytes"])
    # AdamW's two buffers of resnet50's 23.5 M parameters are 180 MiB: zero1 saves half of them at k=2
    assert peaks["zero1"] < 0.9 * peaks["ddp"] and peaks["fsdp"] < 0.9 * peaks["ddp"], peaks
