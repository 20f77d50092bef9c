"""The default profile on a host that emulates bf16: ddp_amp's trials are bounded and labelled, never hidden."""

from __future__ import annotations

import pytest
import torch

from pipeline.config import loader
from pipeline.host import capabilities
from pipeline.host.devices import Host
from pipeline.records import labels
from pipeline.records.table import read_table
from pipeline.strategies import STRATEGIES
from pipeline.sweep import space, stage, worker
from pipeline.sweep.stage import load_study

from ..conftest import REPO

AVX2_ONLY = {"fpu", "sse4_2", "avx", "avx2", "fma"}
AMX = AVX2_ONLY | {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
CPU = Host("cpu", 2, "fake CPU", "box", torch.__version__, "")


def caps_with(monkeypatch, flags):
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: set(flags))
    return capabilities.host_capabilities(CPU)


def amp_trial(cfg, strategy="ddp_amp"):
    return space.trial_config(cfg, strategy, space.points(cfg, strategy)[0])


def bound(cfg, strategy, caps):
    t = amp_trial(cfg, strategy)
    return labels.bound(t, STRATEGIES[strategy].autocast_dtype(t.train, "cpu"), caps, cfg.sweep.emulated_max_steps)


def test_cpu_profile_bounds_emulated_bf16_trials_and_labels_them(monkeypatch):
    cfg = loader.load(REPO / "params.yaml", root=REPO)  # the default: profile cpu
    limit = cfg.sweep.emulated_max_steps
    assert limit > cfg.train.warmup_steps  # the profile chooses a bound that leaves steps to time
    t, note = bound(cfg, "ddp_amp", caps_with(monkeypatch, AVX2_ONLY))
    assert t.train.max_steps == limit and t.train.epochs == cfg.train.epochs
    assert labels.is_bounded(note)
    assert f"at most {limit} steps" in note and "bf16 autocast is emulated" in note and "ISA avx2" in note


def test_native_bf16_and_fp32_strategies_are_not_bounded(monkeypatch):
    cfg = loader.load(REPO / "params.yaml", root=REPO)
    t, note = bound(cfg, "ddp_amp", caps_with(monkeypatch, AMX))
    assert note == "" and t.train.max_steps == cfg.train.max_steps
    for strategy in ("single", "ddp", "fsdp"):  # no autocast: nothing emulated
        t, note = bound(cfg, strategy, caps_with(monkeypatch, AVX2_ONLY))
        assert note == "" and t.train.max_steps == cfg.train.max_steps


def test_bound_off_or_already_tighter(monkeypatch):
    cfg = loader.load(REPO / "params.yaml", ["sweep.emulated_max_steps=0"], root=REPO)
    assert bound(cfg, "ddp_amp", caps_with(monkeypatch, AVX2_ONLY))[1] == ""
    cfg = loader.load(REPO / "params.yaml", ["train.max_steps=5", "sweep.emulated_max_steps=40"], root=REPO)
    t, note = bound(cfg, "ddp_amp", caps_with(monkeypatch, AVX2_ONLY))
    assert note == "" and t.train.max_steps == 5


TINY = """
data: {train_limit: 512, test_limit: 128}
train: {epochs: 2, warmup_steps: 1}
sweep:
  emulated_max_steps: 5
  spaces:
    ddp_amp: {devices: [1], batch_size: [64], lr: [0.1]}
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="fakes a CPU host's flags; a GPU host decides by its GPU")
def test_sweep_runs_a_bounded_trial_and_its_row_says_so(make_cfg, tmp_path, monkeypatch):
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "tiny.yaml").write_text(TINY)
    cfg = make_cfg(profile="tiny")
    monkeypatch.setattr(capabilities, "cpu_flags", lambda: set(AVX2_ONLY))
    worker.host_caps.cache_clear()
    try:
        out = tmp_path / "results" / "ddp_amp.jsonl"
        stage.run_sweep(cfg, "ddp_amp", out)
    finally:
        worker.host_caps.cache_clear()
    [row] = read_table(out).to_dict("records")
    assert row["state"] == "complete" and float(row["throughput_img_s"]) > 0
    assert labels.is_bounded(row["reason"]) and "at most 5 steps" in row["reason"]
    study = load_study(cfg, "ddp_amp")
    [trial] = study.trials
    assert trial.user_attrs["metrics"]["steps"] == 5  # 2 epochs of 8 steps unbounded
    assert len(trial.user_attrs["metrics"]["test_acc"]) == 1  # evaluated where it stopped, in epoch 1
