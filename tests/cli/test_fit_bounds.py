"""`python -m pipeline fit` refuses every input it cannot model, before counting anything: exit 2, one message that
names the flag and its valid range, no traceback and no "unexpected ... report it"."""

from __future__ import annotations

import pytest

from pipeline.cli.commands import main
from pipeline.config.schema import DEVICES_MAX

BASE = ["fit", "--model", "lenet", "--batch-size", "128", "--device-memory", "8GiB"]


def run(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's refusal
        return e.code


@pytest.mark.parametrize(
    "flags, named, says",
    [
        (["--devices", "0,3"], "--devices", f"from 1 to {DEVICES_MAX}"),
        (["--devices", "99999999"], "--devices", f"from 1 to {DEVICES_MAX}"),
        (["--devices", "-2"], "--devices", f"from 1 to {DEVICES_MAX}"),
        (["--devices", ","], "--devices", "no device count"),
        (["--devices", "two"], "--devices", "not a whole number"),
        (["--strategies", "bogus,single"], "--strategies", "unknown strategy 'bogus'; valid: single"),
        (["--strategies", ","], "--strategies", "no strategy given"),
        (["--batch-size", "0"], "--batch-size", "1 or more"),
        (["--batch-size=-5"], "--batch-size", "1 or more"),
        (["--device-memory", "0"], "--device-memory", "from 1MiB"),
        (["--device-memory", "0.0000001KiB"], "--device-memory", "from 1MiB"),
        (["--device-memory", "99999TiB"], "--device-memory", "to 16TiB"),
        (["--devices", "1000"], "--devices", "k=1000 left out: a strategy splits the global batch 128 evenly"),
        (["--devices", "2", "--strategies", "single"], "--devices", "k=2 left out: single runs on one device only"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_fit_refuses_a_bad_input_by_its_flag(flags, named, says, fit_root, capsys):
    assert run([*BASE, *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert named in err and says in err and "Nothing was run" in err, err
    assert "Traceback" not in err and "unexpected" not in err, err


def test_fit_takes_the_largest_device_count(fit_root, capsys):
    assert run([*BASE, "--batch-size", "1024", "--strategies", "ddp", "--devices", str(DEVICES_MAX)]) == 0
    assert f"ddp          {DEVICES_MAX}" in capsys.readouterr().out
