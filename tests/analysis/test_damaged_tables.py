"""A damaged sweep table costs its damaged lines, not its trials: each is skipped, named (file, line number) in the
report's notes and on stderr; `analyze --sweeps` at a directory that is not there stops with the stage to run."""

from __future__ import annotations

import pytest

from pipeline.analysis import stage
from pipeline.cli import main
from pipeline.records.table import read_table
from tests.analysis.test_analyze import row, write


def _damaged(d, lines):
    """ddp.jsonl with two good trials (k=1, k=2) and `lines` (bytes) appended after them."""
    p = d / "ddp.jsonl"
    write([row(k=1, thr=1000), row(k=2, B=256, thr=1800)], p)
    p.write_bytes(p.read_bytes() + lines)
    return p


def test_bad_lines_are_skipped_and_named_the_good_rows_kept(tmp_path, capsys):
    d = tmp_path / "sweeps"
    p = _damaged(d, b'{"study": "s-ddp", "trial": 3, "strat\n\xff\xfe\n[1, 2]\n\n')
    summary = stage.analyze(d, tmp_path / "out", expected=["ddp"])
    assert summary["strategies"]["ddp"]["status"] == "measured"
    assert summary["strategies"]["ddp"]["n_complete"] == 2
    eff = stage.load_sweeps(d, ["ddp"])[0]
    assert sorted(eff["k"]) == [1.0, 2.0] and eff["peak_mem_bytes"].map(type).eq(list).all()  # typed
    err = " ".join(capsys.readouterr().err.split())
    report = (tmp_path / "out" / "report.md").read_text()
    for n in (3, 4, 5):  # the blank line 6 is no row and no damage
        named = f"{p} line {n} skipped: not a sweep-table row"
        assert named in report and f"warning: {named}" in err, (n, err)
    assert "line 6" not in report and "Unterminated string" in report and "not an object" in report


def test_a_table_of_garbage_is_unreadable_and_says_why(tmp_path, capsys):
    d = tmp_path / "sweeps"
    d.mkdir()
    (d / "ddp.jsonl").write_bytes(b"".join(b"garbage %d\n" % i for i in range(25)))
    summary = stage.analyze(d, tmp_path / "out", expected=["ddp"])
    assert summary["strategies"]["ddp"]["status"] == "unreadable"
    assert "none of its 25 lines is a row" in summary["strategies"]["ddp"]["reason"]
    err = capsys.readouterr().err
    assert err.count("warning:") == 11  # ten named one by one, one line for the other fifteen
    assert "15 more damaged lines skipped (lines 11..25)" in " ".join(err.split())


def test_read_table_alone_stops_at_the_first_bad_line_naming_it(tmp_path):
    p = _damaged(tmp_path, b"not json\n")
    with pytest.raises(ValueError, match=r"line 3 is not a sweep-table row"):
        read_table(p)
    bad = []
    assert len(read_table(p, bad)) == 2 and [n for n, _ in bad] == [3]


@pytest.mark.parametrize("where", ["nowhere", "afile"])
def test_analyze_at_a_sweeps_directory_that_is_not_there_stops(tmp_path, monkeypatch, capsys, where):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("profile: ''\n")
    (tmp_path / "afile").write_text("not a directory")
    monkeypatch.setattr(stage, "analyze", lambda *a, **k: pytest.fail("analyzed a sweeps directory that is not there"))
    code = main(["analyze", "--sweeps", str(tmp_path / where), "--out", str(tmp_path / "out")])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2
    assert f"--sweeps {tmp_path / where} {'does not exist' if where == 'nowhere' else 'is not a directory'}" in err
    assert "dvc repro" in err and "python -m pipeline sweep --strategy S" in err
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "out").exists()  # no MLflow run, no report


def test_an_empty_sweeps_directory_still_gives_the_empty_report(tmp_path):
    (tmp_path / "sweeps").mkdir()
    summary = stage.analyze(tmp_path / "sweeps", tmp_path / "out", expected=["ddp"])
    assert summary["strategies"]["ddp"]["status"] == "missing" and (tmp_path / "out" / "report.md").exists()
