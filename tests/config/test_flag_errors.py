"""An invalid value a command's option gave (`train --epochs 0`) is refused naming the option the user typed, not
params.yaml, which does not hold it; a value from params.yaml or --set keeps the files' wording."""

from __future__ import annotations

import pytest

from pipeline.cli import main


@pytest.mark.parametrize(
    "flag,value,said",
    [
        ("--epochs", "0", "--epochs 0: must be >= 1, got 0."),
        ("--devices", "0", "--devices 0: must be >= 1, got 0."),
        ("--batch-size", "0", "--batch-size 0: must be >= 1, got 0."),
        ("--lr", "nan", "--lr nan: expected a finite number, got nan."),
        ("--lr", "-1", "--lr -1.0: must be > 0, got -1.0."),
        ("--max-steps", "-1", "--max-steps -1: must be >= 0, got -1."),
        ("--seed", "-1", "--seed -1: must be >= 0, got -1."),
    ],
)
def test_an_invalid_option_is_named_as_typed(flag, value, said, capsys, monkeypatch, tmp_path):
    from pipeline.trial import lifecycle

    monkeypatch.setattr(lifecycle.Trial, "run", lambda self: pytest.fail("a trial ran"))
    assert main(["train", "--no-track", "--out", str(tmp_path / "x"), flag, value]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"error: {said}") and "params.yaml" not in err, err
    assert err.endswith("Nothing was run."), err
    key = f"train.{flag[2:].replace('-', '_')}"  # the same value from --set: the files' wording
    assert main(["train", "--no-track", "--out", str(tmp_path / "x"), "--set", f"{key}={value}"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"Invalid configuration value for `{key}`: " in err and "Fix it in params.yaml" in err, err
