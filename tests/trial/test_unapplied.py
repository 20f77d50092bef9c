"""A setting that applies only with a knob or a row's design (catalog.APPLIES_WITH), set away from its default for a
trial that does not run with it, is refused before the trial starts: it would be recorded and never run."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.cli import main
from pipeline.host.devices import probe
from pipeline.trial.launch import Infeasible, check_feasible

CPU = dataclasses.replace(probe(), kind="cpu")


@pytest.mark.parametrize(
    "strategy,sets,said,fix",
    [
        (
            "single",
            ["train.amp_dtype=fp16"],
            "train.amp_dtype=fp16 is autocast's type and applies with",
            ["train.autocast=true"],
        ),
        (
            "ddp",
            ["train.amp_dtype=fp16"],
            "train.amp_dtype=fp16 is autocast's type and applies with",
            ["train.strategy=ddp_amp"],
        ),
        (
            "ddp",
            ["train.output_device=1"],
            "train.output_device=1 is the device nn.DataParallel gathers outputs on",
            [],
        ),
        (
            "ddp",
            ["train.amp_init_scale=1024"],
            "train.amp_init_scale=1024.0 is the fp16 GradScaler's first scale",
            ["train.strategy=ddp_amp"],
        ),
        ("single", ["train.compile_mode=reduce-overhead"], "applies with train.compile=true", ["train.compile=true"]),
    ],
)
def test_a_setting_the_trial_would_not_run_with_is_refused(make_cfg, strategy, sets, said, fix):
    """Refused with what it applies with; with that on (dp's rows need CUDA: not here), the same setting runs."""
    cfg = make_cfg(f"train.strategy={strategy}", *sets)
    with pytest.raises(Infeasible) as refused:
        check_feasible(cfg, CPU)
    why = str(refused.value)
    assert said in why and f"this `{strategy}` run" in why and why.endswith("Nothing was run."), why
    if fix:
        check_feasible(make_cfg(f"train.strategy={strategy}", *sets, *fix), CPU)


@pytest.mark.parametrize(
    "flags",
    [
        ["--set", "train.amp_dtype=fp16"],
        ["--strategy", "ddp", "--set", "train.amp_dtype=fp16"],
        ["--strategy", "ddp", "--set", "train.output_device=1"],
        ["--strategy", "ddp", "--set", "train.amp_init_scale=1024"],
    ],
)
def test_train_refuses_it_before_loading_data(flags, capsys, monkeypatch, tmp_path):
    """`python -m pipeline train` exits 2 with the reason, before its data loads or a trial runs."""
    from pipeline.data import store
    from pipeline.trial import lifecycle

    monkeypatch.setattr(store, "load", lambda *a, **k: pytest.fail("the data loaded"))
    monkeypatch.setattr(lifecycle.Trial, "run", lambda self: pytest.fail("a trial ran"))
    argv = ["train", "--no-track", "--quiet", "--max-steps", "2", "--set", "data.source=synthetic", *flags]
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main([*argv, "--out", str(tmp_path / "o2")]))
    err = " ".join(capsys.readouterr().err.split())  # one paragraph, wrapped to the terminal
    assert e.value.code == 2, err
    assert "record it and never run it" in err and err.endswith("Nothing was run."), err
    assert not (tmp_path / "o2").exists()
