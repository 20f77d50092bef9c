"""The report's printed command (`train ... --answer-img-s N --out runs/best`) labels its own result: measured under
load or quietly, and against the answer's figure it reproduces; a second run keeps the first's folder."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.cli.train import fresh_out, verdict
from pipeline.trial.outcome import Outcome


def _record(thr, cores=None):
    seen = {"interfered": cores is not None, "foreign_cores": cores}
    return {"throughput_img_s": thr, "interference": seen}


def test_a_quiet_run_is_compared_with_the_answer():
    assert verdict(_record(1513.0), 1540.0, None) == (
        "1,513 img/s vs the answer's 1,540 (-1.8%), both measured quietly"
    )


def test_a_run_under_load_says_so_and_is_not_compared():
    """In the report's words (comparable.condition, comparable.not_comparable): one phrasing, two decimals."""
    assert verdict(_record(1513.0, 1.31), 4183.0, None) == (
        "1,513 img/s, not comparable on this host: this run was measured beside 1.31 busy cores, the answer's 4,183 "
        "quietly; rerun on a quiet host"
    )
    # the answer's own figure under load: not comparable either, whatever this run's conditions
    assert "this run was measured quietly, the answer's 4,183 beside 1.48 busy cores; rerun" in verdict(
        _record(1513.0), 4183.0, 1.48
    )
    assert verdict(_record(1513.0, 0.9), None, None) == (
        "1,513 img/s, measured beside 0.90 busy cores (not this host's quiet speed)"
    )


def test_a_run_with_no_figure_says_it_compares_nothing_with_the_answer():
    """An untimed run given the answer's figure says there is nothing to compare, never drops the comparison."""
    untimed = {**_record(None), "steps": 2, "warmup_steps": 3, "max_steps": 2}
    assert verdict(untimed, 1000.0, None).endswith("; no figure to compare with the answer's 1,000 img/s")
    assert "answer" not in verdict(untimed, None, None)


def test_an_earlier_result_is_kept(tmp_path):
    out = tmp_path / "best"
    assert fresh_out(out) == out
    out.mkdir()
    assert fresh_out(out) == out  # an empty folder holds no result
    (out / "metrics.json").write_text("{}")
    assert fresh_out(out) == tmp_path / "best-2"
    (tmp_path / "best-2").mkdir()
    (tmp_path / "best-2" / "metrics.json").write_text("{}")
    assert fresh_out(out) == tmp_path / "best-3"


@pytest.fixture
def fake_trial(monkeypatch):
    """Trial.run writes and returns a record measured beside 1.31 busy cores, without training."""
    from pipeline.trial import lifecycle

    def run(self):
        rec = {
            **_record(1513.0, 1.31),
            "strategy": "scratch",
            "devices": 1,
            "model": "lenet",
            "test_acc": [0.789],
            "peak_mem_bytes": [22200904],
            "synthetic": True,
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "metrics.json").write_text(json.dumps(rec))
        return Outcome("finished", rec)

    monkeypatch.setattr(lifecycle.Trial, "run", run)


def test_the_printed_command_twice_labels_its_result_and_keeps_the_first(
    make_cfg, tmp_path, synthetic_root, monkeypatch, capsys, fake_trial
):
    make_cfg()
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, train_limit: 1024, test_limit: 256}}\n"
    )
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--no-track", "--quiet", "--answer-img-s", "4183", "--out", str(tmp_path / "runs" / "best")]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert "[under load]" in first.out.splitlines()[0]
    assert first.out.splitlines()[-1] == (
        "result: 1,513 img/s, not comparable on this host: this run was measured beside 1.31 busy cores, the "
        "answer's 4,183 quietly; rerun on a quiet host"
    )
    (tmp_path / "runs" / "best" / "metrics.json").write_text('{"kept": true}')
    assert main(argv) == 0
    second = capsys.readouterr()
    assert json.loads((tmp_path / "runs" / "best" / "metrics.json").read_text()) == {"kept": True}
    assert (tmp_path / "runs" / "best-2" / "metrics.json").exists()
    assert f"{tmp_path / 'runs' / 'best'} holds an earlier result, kept: this run writes " in second.err
    assert f"wrote {tmp_path / 'runs' / 'best-2' / 'metrics.json'}" in second.out


def test_runs_under_comparable_loads_are_compared_by_the_reports_rule():
    """This run and the answer beside equal busy cores (or within the report's LOAD_TOLERANCE of 0.25): compared,
    both sides' loads said; beyond it: not comparable."""
    assert verdict(_record(2400.0, 1.2), 2470.0, 1.2) == (
        "2,400 img/s vs the answer's 2,470 (-2.8%), this run measured beside 1.20 busy cores, the answer beside 1.20 "
        "busy cores: comparable loads"
    )
    assert "(+" in verdict(_record(2500.0, 1.1), 2470.0, 1.3) and "comparable loads" in verdict(
        _record(2500.0, 1.1), 2470.0, 1.3
    )
    assert "not comparable on this host: this run" in verdict(_record(2400.0, 1.2), 2470.0, 1.6)
    assert verdict(_record(2400.0, float("nan")), 2470.0, 1.2) == (  # this run's busy cores not measured
        "2,400 img/s, not comparable on this host: this run was measured under load (busy cores not measured), the "
        "answer's 2,470 beside 1.20 busy cores; rerun on a quiet host"
    )
    assert verdict(_record(2400.0, None), 2470.0, float("nan")) == (  # the answer's busy cores not measured
        "2,400 img/s, not comparable on this host: this run was measured quietly, the answer's 2,470 under load (busy "
        "cores not measured); rerun on a quiet host"
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--answer-img-s", "0"],
        ["--answer-img-s", "-5"],
        ["--answer-img-s", "nan"],
        ["--answer-img-s", "inf"],
        ["--answer-img-s", "3000", "--answer-load-cores", "-1"],
        ["--answer-img-s", "3000", "--answer-load-cores", "inf"],
        ["--answer-load-cores", "1"],
    ],
)
def test_an_answer_figure_no_run_can_be_compared_with_is_refused_before_training(flags, capsys, monkeypatch, tmp_path):
    """A figure of 0 (a division by zero after the whole run), a negative, nan or infinite one, a negative load, or
    a load without its figure: refused with exit 2 before anything trains."""
    from pipeline.trial import lifecycle

    monkeypatch.setattr(lifecycle.Trial, "run", lambda self: pytest.fail("a trial ran"))
    with pytest.raises(SystemExit) as e:
        code = main(["train", "--no-track", "--quiet", *flags, "--out", str(tmp_path / "best")])
        raise SystemExit(code)
    assert e.value.code == 2, capsys.readouterr()
    assert "Nothing was run." in capsys.readouterr().err


def test_an_answer_measured_under_an_unmeasured_load_parses_as_nan():
    from pipeline.cli.parser import build_parser

    argv = ["train", "--answer-img-s", "3000", "--answer-load-cores", "nan", "--out", "runs/best"]
    args = build_parser().parse_args(argv)
    assert args.answer_img_s == 3000.0 and args.answer_load_cores != args.answer_load_cores
