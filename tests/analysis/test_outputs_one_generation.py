"""The analysis stage's outputs are one generation, marked: every analyze writes all its outputs into a new folder
beside --out and swaps it in whole, so a kill or an error at any point leaves the earlier generation whole (every
file as its generation.json lists it), and a complete run leaves the new one whole.

The kill is real and needs no timing: the second analysis runs in a process of its own whose model figure writer
sends that process SIGKILL, after its CSVs and first figures are written.

    .venv/bin/python -m pytest tests/analysis/test_outputs_one_generation.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.analysis.plots import figures
from pipeline.analysis.stage import analyze
from pipeline.records import files

from .test_analyze import row, write

REPO = Path(__file__).resolve().parents[2]


def _sweeps(folder: Path, thr2: float) -> Path:
    folder.mkdir(parents=True)
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=2, B=256, thr=thr2)], folder / "ddp.jsonl")
    return folder


def _files(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.is_file()}


def _one_generation(out: Path) -> dict:
    """`out`'s marker, after checking that it lists exactly the folder's files, each as written."""
    assert files.check_generation(out) == []
    mark = json.loads((out / files.MARKER).read_text())
    assert set(mark["files"]) == set(_files(out)) - {files.MARKER}
    return mark


def _first(tmp_path) -> tuple[Path, dict, Path]:
    out, second = tmp_path / "analysis", _sweeps(tmp_path / "second", 17000)
    analyze(_sweeps(tmp_path / "first", 1800), out)
    return out, _files(out), second


def test_a_kill_mid_write_leaves_the_earlier_generation_whole(tmp_path):
    """Proves: analyze killed (SIGKILL) after it wrote part of a new analysis leaves --out exactly as the earlier
    analysis wrote it, every file the one its generation.json lists; the next analyze removes the killed one's
    folder and leaves its own generation whole, its marker naming the new input table's sha256."""
    out, before, second = _first(tmp_path)
    kill = (
        "import os, signal, sys; from pipeline.analysis import stage; from pipeline.analysis.plots import figures; "
        "figures.plot_model = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL); "
        "stage.analyze(sys.argv[1], sys.argv[2])"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", kill, str(second), str(out)], env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == -9
    assert _files(out) == before
    mark = _one_generation(out)
    assert [d.name for d in tmp_path.iterdir() if files.STAGING in d.name]  # the killed writer's folder
    analyze(second, out)
    new = _one_generation(out)
    assert new["files"]["metrics.json"] != mark["files"]["metrics.json"]
    assert new["inputs"] == {str(second / "ddp.jsonl"): files.sha256(second / "ddp.jsonl")}
    assert not [d.name for d in tmp_path.iterdir() if files.STAGING in d.name]


@pytest.mark.parametrize("exchange", ["atomic", "one by one"])
def test_an_error_mid_write_leaves_the_earlier_generation_whole(tmp_path, monkeypatch, exchange):
    """Proves: a writer failing half way through a second analysis (with the folders exchanged in one rename, and
    where the file system cannot, with the files replaced one by one) leaves --out as the first analysis wrote it;
    a complete second run then leaves its own generation, the first one's files it no longer writes removed and a
    file analyze does not write (a user's notes) kept."""
    if exchange == "one by one":
        monkeypatch.setattr(files, "_exchange", lambda a, b: (_ for _ in ()).throw(files._NoExchange()))
    out, before, second = _first(tmp_path)
    out.chmod(0o751)
    (out / "notes.txt").write_text("mine")
    (out / "knob_old.png").write_bytes(b"an earlier generation's figure")

    def fail(*a, **k):
        raise RuntimeError("a writer fails")

    with monkeypatch.context() as m:
        m.setattr(figures, "plot_model", fail)
        with pytest.raises(RuntimeError, match="a writer fails"):
            analyze(second, out)
    assert _files(out) == {**before, "notes.txt": b"mine", "knob_old.png": b"an earlier generation's figure"}
    assert files.check_generation(out) == []
    mark = json.loads((out / files.MARKER).read_text())
    assert mark["files"] == {n: files.sha256(out / n) for n in before if n != files.MARKER}
    assert not [d.name for d in tmp_path.iterdir() if files.STAGING in d.name]
    analyze(second, out)
    assert files.check_generation(out) == []
    now = _files(out)
    assert now["notes.txt"] == b"mine" and "knob_old.png" not in now
    assert out.stat().st_mode & 0o777 == 0o751
    new = json.loads((out / files.MARKER).read_text())
    assert set(new["files"]) == set(now) - {files.MARKER, "notes.txt"}
    assert new["files"]["metrics.json"] != mark["files"]["metrics.json"]
