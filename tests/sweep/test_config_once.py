"""A trial's Config is built and validated once, by the command that runs it: `python -m pipeline train` builds it
from params.yaml, --set and its flags; the sweep builds each point's once and its trial, ranks included, use it as
it is. The count is read from every process (the forked ranks too), through a file."""

from __future__ import annotations

import pytest

from pipeline.cli import main
from pipeline.config import loader
from pipeline.config.schema import Config
from pipeline.sweep.stage import run_sweep


@pytest.fixture
def validations(tmp_path, monkeypatch):
    """A callable returning how many whole Configs the validator built since the fixture started, in any process."""
    log = tmp_path / "validations.log"
    log.write_text("")
    real = loader._build

    def counting(cls, mapping, prefix):
        if cls is Config:
            with open(log, "a") as f:
                f.write("built\n")
        return real(cls, mapping, prefix)

    monkeypatch.setattr(loader, "_build", counting)
    return lambda: len(log.read_text().splitlines())


def test_a_sweep_trial_validates_its_config_once(make_cfg, tmp_path, validations):
    """One point, one trial: the point's Config is built once for the feasibility checks and the trial (its MLflow
    run, its ranks); the load of params.yaml happens before the count starts."""
    cfg = make_cfg(
        "sweep.strategies=[single]",
        "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}",
        "data.train_limit=256",
        "data.test_limit=128",
        "train.epochs=1",
    )
    before = validations()
    out = run_sweep(cfg, "single", tmp_path / "results" / "single.jsonl")
    assert out.exists() and "complete" in out.read_text()
    assert validations() - before == 1


def test_train_validates_its_config_once(make_cfg, tmp_path, synthetic_root, monkeypatch, validations):
    """`python -m pipeline train` with typed flags and --set: params.yaml, the flags and --set are validated
    together, once, and the trial's ranks use that Config."""
    make_cfg()
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, train_limit: 256, test_limit: 128}}\n"
    )
    monkeypatch.chdir(tmp_path)
    before = validations()  # make_cfg's
    code = main(
        [
            "train",
            "--batch-size",
            "64",
            "--lr",
            "0.1",
            "--epochs",
            "1",
            "--set",
            "train.warmup_steps=1",
            "--quiet",
            "--no-track",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0 and (tmp_path / "run" / "metrics.json").exists()
    assert validations() - before == 1
