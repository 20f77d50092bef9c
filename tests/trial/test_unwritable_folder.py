"""A trial whose host cannot write its folder (a full disk, a quota, a read-only or failing file system) fails with
kind `unwritable`, naming the folder, never as the trial's own `error`; and a folder reused from an earlier trial
holds none of that trial's files once the new one starts.

A real full file system needs root (a tmpfs): here the rank's write of final_state.pt raises what the host would
(OSError, or torch's "unexpected pos" of a file cut short by a full disk).

    .venv/bin/python -m pytest tests/trial/test_unwritable_folder.py
"""

from __future__ import annotations

import errno
import os
import pathlib

import pytest
import torch

from pipeline.errors import TrialFailed
from pipeline.trial.launch import run_trial

SMALL = ("train.batch_size=32", "data.train_limit=256", "data.test_limit=64", "train.epochs=1")
CUT_SHORT = "[enforce fail at inline_container.cc:672] . unexpected pos 102656 vs 102552"


def _oserror(code):
    return lambda *a, **kw: (_ for _ in ()).throw(OSError(code, os.strerror(code)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(_oserror(errno.ENOSPC), id="ENOSPC"),
        pytest.param(_oserror(errno.EDQUOT), id="EDQUOT"),
        pytest.param(_oserror(errno.EROFS), id="EROFS"),
        pytest.param(_oserror(errno.EIO), id="EIO"),
        pytest.param(lambda *a, **kw: (_ for _ in ()).throw(RuntimeError(CUT_SHORT)), id="torch-cut-short"),
    ],
)
def test_a_rank_that_cannot_write_its_folder_fails_as_unwritable_naming_it(
    make_cfg, tmp_path, monkeypatch, capfd, fault
):
    """Proves: the rank's write of final_state.pt failing as on a full (or read-only, or failing) disk fails the
    trial with kind `unwritable` and a reason that names the folder, and the launcher prints no traceback."""
    monkeypatch.setattr(torch, "save", fault)  # the ranks are forked: they inherit it
    out = tmp_path / "o"
    with pytest.raises(TrialFailed) as e:
        run_trial(make_cfg("train.strategy=single", *SMALL), out, progress=False)
    assert e.value.kind == "unwritable", (e.value.kind, str(e.value))
    assert str(out) in str(e.value), str(e.value)
    err = capfd.readouterr().err
    assert "Traceback (most recent" not in err, err[-3000:]
    assert not [f.name for f in out.iterdir() if "final_state" in f.name] and not (out / "metrics.json").exists()


def test_a_stale_record_in_a_reused_folder_is_gone_before_the_trial_starts(make_cfg, tmp_path, monkeypatch):
    """Proves: an earlier trial's metrics.json and stacks file in the folder are removed when a trial starts there,
    so a trial that then fails leaves no record that reads as its own."""
    out = tmp_path / "o"
    out.mkdir()
    for name in ("metrics.json", "stacks-rank0.txt", "progress.jsonl", "final_state.pt"):
        (out / name).write_text("stale")
    monkeypatch.setattr(torch, "save", _oserror(errno.ENOSPC))
    with pytest.raises(TrialFailed):
        run_trial(make_cfg("train.strategy=single", *SMALL), out, progress=False)
    assert not [f.name for f in out.iterdir() if f.read_text(errors="replace") == "stale"]


@pytest.mark.timeout(120)
def test_an_answer_the_caller_cannot_write_fails_the_trial_as_unwritable(make_cfg, tmp_path, monkeypatch, capfd):
    """Proves: the caller's answer to an epoch (ack-<epoch>, written beside progress.jsonl) refused by a full disk
    fails the trial with kind `unwritable` naming the folder, once its ranks end, instead of a traceback of the
    thread that reads the epochs."""
    from pipeline.records import files

    real = files.write_text

    def full(path, text):  # the answer is written whole or not at all (files.write_text): here, not at all
        if pathlib.Path(path).name.startswith("ack-"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, text)

    monkeypatch.setattr(files, "write_text", full)
    out = tmp_path / "o"
    with pytest.raises(TrialFailed) as e:
        run_trial(
            make_cfg("train.strategy=single", *SMALL, "train.timeout_s=4"), out, progress=False, on_epoch=lambda r: 0
        )
    assert e.value.kind == "unwritable" and str(out) in str(e.value), (e.value.kind, str(e.value))
    assert "Traceback (most recent" not in capfd.readouterr().err
