"""analyze, overlap, collectives and doctor check their --out before any work, as train and sweep do: a path that
cannot take their output (for collectives, also a file that holds something else than its result) stops them with
preflight's message and exit 2, and the work itself is never started (its function is replaced by one that fails
the test if called). doctor, overlap and analyze write a directory; collectives writes one file."""

from __future__ import annotations

import pytest

from pipeline.cli import main

# (id, argv after `python -m pipeline`, the functions that do the work, a phrase the message must contain)
CASES = [
    (
        "analyze --out at a file",
        ["analyze", "--sweeps", "{tmp}/sweeps", "--out", "{tmp}/afile"],
        ["pipeline.analysis.stage.analyze"],
        "is an existing file, but it names the directory to write into",
    ),
    (
        "analyze --out under a file",
        ["analyze", "--sweeps", "{tmp}/sweeps", "--out", "{tmp}/afile/out"],
        ["pipeline.analysis.stage.analyze"],
        "cannot be written",
    ),
    (
        "overlap --out at a file",
        ["overlap", "--out", "{tmp}/afile"],
        ["pipeline.scaling.overlap.run"],
        "is an existing file, but it names the directory to write into",
    ),
    (
        "collectives --out at a directory",
        ["collectives", "--out", "{tmp}/adir"],
        ["pipeline.scaling.collectives.measure", "pipeline.host.devices.probe"],
        "is a directory, but it names the file to write",
    ),
    (
        "collectives --out at a file that is not its result",
        ["collectives", "--out", "{tmp}/afile"],
        ["pipeline.scaling.collectives.measure", "pipeline.host.devices.probe"],
        "holds text that is not a collectives result",
    ),
    (
        "collectives --out under a file",
        ["collectives", "--out", "{tmp}/afile/c.json"],
        ["pipeline.scaling.collectives.measure", "pipeline.host.devices.probe"],
        "cannot be written",
    ),
    (
        "doctor --out at a file",
        ["doctor", "--out", "{tmp}/afile"],
        ["pipeline.doctor.checks.run"],
        "is an existing file, but it names the directory to write into",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_bad_out_stops_before_any_work(tmp_path, monkeypatch, capsys, case):
    _, argv, work, needle = case
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("profile: ''\n")
    (tmp_path / "afile").write_text("not a directory")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "adir").mkdir()
    for target in work:
        monkeypatch.setattr(target, lambda *a, **k: pytest.fail(f"{target} ran before --out was checked"))
    code = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert f"error: --out {tmp_path}" in err and needle in err and "Nothing was run" in err, err
    assert "unexpected" not in err
    assert (tmp_path / "afile").read_text() == "not a directory" and not list((tmp_path / "adir").iterdir())
    assert not (tmp_path / "mlruns").exists()  # no MLflow run opened
    assert not (tmp_path / "adir.tmp").exists()  # collectives' temporary file never written
