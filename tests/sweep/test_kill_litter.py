"""What a SIGKILLed command leaves behind is removed by the next run of it: the scratch folders of the overlap,
collectives and doctor commands in the temp dir, and the half-built data folder of `download`. A folder of a
process that still runs (a second run beside this one) is kept. No training: launches are replaced by stubs."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from pipeline import scratch
from pipeline.config import loader
from pipeline.data import store
from pipeline.doctor import checks
from pipeline.errors import DataError
from pipeline.trial import stage_ranks


def dead_pid() -> str:
    """`<pid>@<host>` of a process of this host that has ended."""
    pid = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
        ).stdout
    )
    return f"{pid}@{scratch.host_tag()}"


@pytest.fixture
def tmpdir_(tmp_path, monkeypatch):
    """A private temp dir (TMPDIR) for this test."""
    t = tmp_path / "tmp"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def test_a_killed_stage_scratch_folder_is_removed_by_the_next_launch(tmpdir_, monkeypatch):
    """A folder `parallax-overlap-<dead pid>@<host>-*` (an overlap run SIGKILLed) is gone once the stage launches
    its ranks again; the folders of a live process and of another host are kept, and the new scratch folder is
    itself removed at the end."""
    import torch.distributed.launcher.api as api

    stale = tmpdir_ / f"parallax-overlap-{dead_pid()}-x1"
    (stale / "attempt_0").mkdir(parents=True)
    live = tmpdir_ / f"parallax-overlap-1@{dead_pid().split('@')[1]}-x2"  # pid 1 always runs
    other_host = tmpdir_ / f"parallax-overlap-{dead_pid().split('@')[0]}@elsewhere-x3"  # a shared temp dir
    live.mkdir()
    other_host.mkdir()
    seen = []
    monkeypatch.setattr(api, "elastic_launch", lambda lc, fn: lambda *a: seen.append(lc.logs_specs) or {0: "ok"})
    assert stage_ranks.launch(2, "overlap", "fork", print) == {0: "ok"}
    assert seen and not stale.exists()
    assert sorted(p.name for p in tmpdir_.iterdir()) == sorted([live.name, other_host.name])


def test_a_killed_doctor_scratch_folder_is_removed_by_the_next_doctor(tmpdir_, monkeypatch, tmp_path):
    """A folder `parallax-doctor-<dead pid>-*` is gone once doctor starts again (here it stops right after)."""
    stale = tmpdir_ / f"parallax-doctor-{dead_pid()}-x1"
    (stale / "data").mkdir(parents=True)

    def stop(base, work):
        raise DataError("stop here")

    monkeypatch.setattr(checks, "_data", stop)
    with pytest.raises(DataError):
        checks.run(loader.Config(), tmp_path / "out", strategies=["single"], say=lambda m: None)
    assert list(tmpdir_.iterdir()) == []


def test_a_killed_download_half_built_folder_is_removed_by_the_next_download(tmp_path):
    """`download` builds the data in a hidden sibling of data.dir; the one a SIGKILLed download left is removed by
    the next download, which also leaves none of its own."""
    root = tmp_path / "fashion-mnist"
    stale = tmp_path / f".fashion-mnist.{dead_pid()}-x1.partial"
    (stale / "FashionMNIST" / "raw").mkdir(parents=True)
    store.prepare(root, "synthetic", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fashion-mnist"]


def test_a_sweep_table_half_written_by_a_killed_sweep_is_removed_by_the_next_write(tmp_path):
    """A sweep SIGKILLed while writing its table leaves `<table>.<pid>...tmp` in results/sweeps, which analyze takes
    whole as its input (a DVC directory dependency): the next table write removes it, keeping a live writer's."""
    from pipeline.records.table import write_rows

    out = tmp_path / "single.jsonl"
    stale = tmp_path / f"single.jsonl.{dead_pid()}-w.tmp"
    stale.write_text('{"study": "half')
    write_rows([], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["single.jsonl"]
