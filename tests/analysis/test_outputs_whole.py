"""The analysis stage's outputs are written whole or not at all: a write that fails (the disk full, a file-size
limit) leaves each earlier output as it was, never truncated or missing, and the user reads one paragraph naming the
output folder and its free space. A symlink placed where an output goes is replaced by the output, never written
through.

The failing write is real: the analysis runs in a process whose file-size limit (RLIMIT_FSIZE) is below its figures'
size, so its writes fail as they would on a full disk (EFBIG there, ENOSPC on a full disk), without root.

    .venv/bin/python -m pytest tests/analysis/test_outputs_whole.py
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from pipeline.analysis.stage import analyze

from .test_analyze import row, write

REPO = Path(__file__).resolve().parents[2]
LIMIT = 8 * 1024  # bytes: below every figure's size, above the small CSVs'


def _sweeps(folder: Path, thr2: float) -> Path:
    folder.mkdir(parents=True)
    write([row("ddp", k=1, B=128, thr=1000), row("ddp", k=2, B=256, thr=thr2)], folder / "ddp.jsonl")
    return folder


def _files(out: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(out.iterdir()) if f.is_file()}


def _limited():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _analyze(tmp_path, sweeps: Path, out: Path, limited: bool = False) -> subprocess.CompletedProcess:
    """`python -m pipeline analyze` in a process of its own (with the file-size limit when `limited`)."""
    (tmp_path / "params.yaml").write_text("profile: ''\n")
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "PYTHONPATH": str(REPO)}
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "analyze",
        "--params",
        str(tmp_path / "params.yaml"),
        "--sweeps",
        str(sweeps),
        "--out",
        str(out),
    ]
    return subprocess.run(
        cmd,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited if limited else None,
    )


def test_a_failing_write_leaves_every_earlier_output_whole_and_says_where(tmp_path):
    """Proves: analyze rewriting its outputs in a process that cannot write files larger than LIMIT (as on a nearly
    full disk) exits 1 with one paragraph naming --out and its free space, no traceback; every output of the earlier
    run is still there, each either as it was or as the new run wrote it whole; no temporary file is left."""
    out, ref = tmp_path / "analysis", tmp_path / "reference"
    new = _sweeps(tmp_path / "new", 1500)
    for sweeps, folder in ((_sweeps(tmp_path / "old", 1800), out), (new, ref)):
        assert _analyze(tmp_path, sweeps, folder).returncode == 0
    before, after_ok = _files(out), _files(ref)
    assert before.keys() == after_ok.keys() and before["metrics.json"] != after_ok["metrics.json"]
    p = _analyze(tmp_path, new, out, limited=True)
    err = " ".join(p.stderr.split())
    assert p.returncode == 1, err
    assert "Traceback (most recent" not in err and "unexpected" not in err, err
    assert str(out) in err and "free" in err, err
    now = _files(out)
    assert now.keys() == before.keys(), sorted(set(now) ^ set(before))
    for name, data in now.items():
        assert data in (before[name], after_ok[name]), f"{name}: {len(data)} bytes, neither the old nor the new file"
    assert any(now[name] == before[name] != after_ok[name] for name in now)  # the limit did stop some writes


def test_an_output_that_is_a_symlink_is_replaced_never_written_through(tmp_path):
    """Proves: with report.md, best.yaml, metrics.json, summary.json, a CSV and a figure each a symlink to a file
    outside the output folder, analyze leaves those files untouched and writes regular files in the folder."""
    out = tmp_path / "analysis"
    out.mkdir()
    names = ("report.md", "best.yaml", "metrics.json", "summary.json", "throughput.csv", "efficiency.png")
    for name in names:
        victim = tmp_path / f"victim-{name}"
        victim.write_text("keep me")
        (out / name).symlink_to(victim)
    analyze(_sweeps(tmp_path / "sweeps", 1800), out)
    for name in names:
        assert (tmp_path / f"victim-{name}").read_text() == "keep me", name
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0, name
