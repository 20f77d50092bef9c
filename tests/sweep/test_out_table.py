"""`sweep --out FILE` replaces the file with the strategy's table: it takes a missing or empty file, or a table of the
same strategy (a rerun of its stage), and refuses any other file before any work (exit 2, the file left as it was)."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main

README = "# Parallax\n\nA README, not a sweep table.\n"
OTHER = '{"study": "s", "trial": 0, "state": "complete", "strategy": "ddp"}\n'

# (id, the strategy swept, what --out holds, a phrase the message must contain)
CASES = [
    ("a README, selected strategy", "single", README, "holds text that is not a sweep table"),
    ("a README, unselected strategy", "ddp", README, "holds text that is not a sweep table"),
    ("another strategy's table", "single", OTHER, "holds the sweep table of strategy ddp"),
    ("JSON rows without a strategy", "ddp", '{"a": 1}\n', "holds JSON that is not a sweep table"),
]


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("profile: ''\n")
    return tmp_path


def sweep(strategy, out, *sets):
    argv = ["sweep", "--strategy", strategy, "--out", str(out), "--n-trials", "0"]
    sets = ("data.source=synthetic", "sweep.strategies=[single]", *sets)
    return main(argv + [a for s in sets for a in ("--set", s)])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_an_out_that_holds_something_else_is_refused_before_any_work(project, monkeypatch, capsys, case):
    _, strategy, held, needle = case
    for target in ("pipeline.sweep.stage.run_sweep", "pipeline.sweep.unselected.write_table"):
        monkeypatch.setattr(target, lambda *a, _t=target, **k: pytest.fail(f"{_t} ran over a file it must not replace"))
    out = project / "README.md"
    out.write_text(held)
    code = sweep(strategy, out)
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2, err
    assert f"error: --out {out} {needle}" in err and err.endswith("Nothing was run."), err
    assert out.read_text() == held
    assert not (project / "mlruns").exists()


def test_a_sweep_rewrites_its_own_table_or_an_empty_file_and_refuses_another_strategys(project, capsys):
    out = project / "results" / "sweeps" / "ddp.jsonl"
    assert sweep("ddp", out) == 0  # a new file
    first = out.read_text()
    assert sweep("ddp", out) == 0  # its stage rerun over its own table
    assert out.read_text() == first and all(json.loads(r)["strategy"] == "ddp" for r in first.splitlines())
    empty = project / "empty.jsonl"
    empty.write_text("\n")
    assert sweep("dp", empty) == 0 and all(json.loads(r)["strategy"] == "dp" for r in empty.read_text().splitlines())
    capsys.readouterr()
    assert sweep("dp", out) == 2  # ddp's table is not dp's to replace
    assert out.read_text() == first
    assert "holds the sweep table of strategy ddp" in " ".join(capsys.readouterr().err.split())
