"""`python -m pipeline compare`: DVC's experiment rows turned round, one row per figure, so that every strategy's
weak-scaling efficiency fits 120 columns (DVC's own table gives each a column as wide as its key)."""

from __future__ import annotations

import re

import pytest

from pipeline.analysis.tables.summary import WEAK_EFFICIENCY
from pipeline.cli import compare
from pipeline.cli.parser import build_parser

STRATEGIES = ("scratch", "ddp", "ddp_amp", "zero1", "fsdp", "dp", "dp_criterion")


def _row(name, rev, value):
    figures = {f"{WEAK_EFFICIENCY}.{s}.k{k}": value for s in STRATEGIES for k in (2, 4, 8)}
    return {"Experiment": name, "rev": rev, "typ": "exp", "Created": "11:15 PM", **figures, "n_flagged": 53.0}


def test_every_efficiency_of_every_experiment_fits_120_columns():
    rows = [{"Experiment": None, "rev": "main", "typ": "baseline", f"{WEAK_EFFICIENCY}.ddp.k2": "!"}]
    rows += [_row(f"exp-number-{i}", f"{i:07x}", 0.5 + i / 100) for i in range(12)]
    lines = compare.table(rows, compare.default_keep())
    text = "\n".join(lines)
    assert max(map(len, lines)) <= compare.WIDTH, max(lines, key=len)
    for s in STRATEGIES:
        for k in (2, 4, 8):
            assert text.count(f"{WEAK_EFFICIENCY}.{s}.k{k} ") >= 2  # a row per figure, in each block of columns
    for i in range(12):
        assert f"exp-number-{i}" in text and f"{0.5 + i / 100:g}" in text
    assert "n_flagged" not in text  # only the figures asked for
    assert "(no such figure in main:" in lines[-1]  # a baseline without results is named, not a column of `-`


def test_a_pattern_picks_other_figures_and_a_bad_one_is_refused():
    rows = [_row("one", "abc1234", 0.9)]
    assert compare.table(rows, "^n_flagged$") == ["figure       one", "n_flagged     53"]
    assert compare.table(rows, "^nothing$") == []
    args = build_parser().parse_args(["compare", "--keep", "(["])
    from pipeline.config.loader import ConfigError

    with pytest.raises(ConfigError, match=re.escape("--keep '([' is not a regular expression")):
        compare.run(args)


def test_by_default_the_labels_of_a_figure_show_beside_it():
    """A synthetic run, a point measured under load and an efficiency whose ends are not comparable are labelled in
    the default table, not shown as bare numbers."""
    row = {
        "Experiment": "one",
        "rev": "abc1234",
        f"{WEAK_EFFICIENCY}.ddp.k2": 1.12,
        f"{WEAK_EFFICIENCY}_comparable.ddp.k2": 0.0,
        "load_cores.ddp.k2": 1.25,
        "data_source": "synthetic",
        "data.source": "fashion-mnist",  # params.yaml put back after a synthetic run (make pipeline-offline)
        "n_flagged": 3.0,
    }
    text = "\n".join(compare.table([row], compare.default_keep()))
    for key in (f"{WEAK_EFFICIENCY}_comparable.ddp.k2", "load_cores.ddp.k2", "data_source"):
        assert key in text, text
    assert "synthetic" in text and "fashion-mnist" not in text and "n_flagged" not in text


def test_a_pattern_that_matches_nothing_names_the_figures_there(monkeypatch, tmp_path):
    import dvc.api

    from pipeline.config.loader import ConfigError

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(dvc.api, "exp_show", lambda repo: [_row("one", "abc1234", 0.9)])
    with pytest.raises(ConfigError, match="No figure matches --keep 'nomatch'; the experiments in .* hold 22, e.g. "):
        compare.run(build_parser().parse_args(["compare", "--keep", "nomatch"]))
    monkeypatch.setattr(dvc.api, "exp_show", lambda repo: [{"Experiment": None, "rev": "main", "typ": "baseline"}])
    with pytest.raises(ConfigError, match="has a figure yet: run the pipeline first"):
        compare.run(build_parser().parse_args(["compare", "--keep", "nomatch"]))


def test_a_long_value_is_cut_to_fit_and_each_row_shows_once():
    """`--keep .` on a fresh clone: a sweep space's value runs to hundreds of characters; it ends in … so that the
    workspace and its baseline share one block of 120 columns, each row once, and a line says where it shows whole."""
    space = str([{"model": ["lenet"], "devices": [d], "batch_size": [128, 256], "lr": [0.1, 0.3]} for d in (1, 2, 4)])
    figures = {"experiments/cpu.yaml:sweep.remeasure_interfered": 1, "sweep.spaces.ddp": space, "train.seed": "None"}
    rows = [{"Experiment": None, "rev": rev, "typ": "baseline", **figures} for rev in ("workspace", "main")]
    lines = compare.table(rows, ".")
    assert max(map(len, lines)) <= compare.WIDTH, max(lines, key=len)
    labels = [line.split()[0] for line in lines if line and not line.startswith("(")]
    assert len(labels) == len(set(labels)), labels  # one block: no row twice
    assert lines[0].split() == ["figure", "workspace", "main"]
    assert lines[2].startswith("sweep.spaces.ddp ") and lines[2].count(space[:32] + "…") == 2
    assert lines[-1] == "(… ends a value cut to 33 characters; `dvc exp show --json` prints each whole)"


def test_the_help_says_what_a_row_is_and_which_show_by_default(capsys):
    """`--keep .` shows params and the stages' dependencies beside metrics.json's figures, as `dvc exp show` does; the
    help says so, and names the default rows default_keep() picks."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in ("metrics.json's keys", "params (train.lr", "dependency paths", "params.yaml:train.epochs"):
        assert words in text, text
    row = {"Experiment": "one", "rev": "abc1234"}
    for key in ("weak_efficiency.S.kK", "strong_efficiency.S.kK", "weak_efficiency_comparable.S.kK", "data_source"):
        assert key in text.split("default: ")[-1], text
        assert compare.table([{**row, key: 1.0}], compare.default_keep()), key  # the default keeps what it names


def test_by_default_a_label_alone_shows_no_experiment_and_none_with_figures_says_how_to_make_them(monkeypatch, capsys):
    """A fresh clone: every experiment has data.source (a param) and no efficiency yet. The default table is no lone
    data.source row but one line naming the command that makes the figures, exit 2; --keep data.source shows it."""
    import dvc.api

    from pipeline.user_errors import say

    fresh = [{"Experiment": None, "rev": rev, "typ": "baseline", "data.source": "fashion-mnist"} for rev in "ab"]
    assert compare.table(fresh, compare.default_keep(), needs=compare.default_figures()) == []
    assert compare.table(fresh, "data.source")[0].split() == ["figure", "a", "b"]
    monkeypatch.setattr(dvc.api, "exp_show", lambda repo: fresh)
    with pytest.raises(compare.ConfigError) as e:
        compare.run(build_parser().parse_args(["compare"]))
    say(f"error: {e.value}")
    assert capsys.readouterr().err == (
        "error: No experiment has weak_efficiency figures: run `make pipeline` or `make pipeline-offline`.\n"
    )
    one = {"Experiment": "one", "rev": "abc1234", f"{WEAK_EFFICIENCY}.ddp.k2": 0.9, "data.source": "synthetic"}
    lines = compare.table([*fresh, one], compare.default_keep(), needs=compare.default_figures())
    assert lines[0].split() == ["figure", "one"] and lines[-1].startswith("(no such figure in a, b:")


def test_an_empty_pattern_keeps_every_row_as_dot_does(monkeypatch, capsys, tmp_path):
    """--keep '' is a Python regex that re.search matches in every key: every row shows, as with --keep '.', not the
    default rows; the help says so."""
    import dvc.api

    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setattr(dvc.api, "exp_show", lambda repo: [{**_row("one", "abc1234", 0.9), "train.lr": 0.1}])
    shown = {}
    for keep in ("", "."):
        assert compare.run(build_parser().parse_args(["compare", "--keep", keep])) == 0
        shown[keep] = capsys.readouterr().out
    assert shown[""] == shown["."] and "n_flagged" in shown[""] and "train.lr" in shown[""], shown[""]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["compare", "--help"])
    assert "or '' (re.search matches it everywhere too)" in " ".join(capsys.readouterr().out.split())
