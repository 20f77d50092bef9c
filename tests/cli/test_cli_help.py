"""`python -m pipeline COMMAND --help` describes every flag: what it does and its default (or that it is required),
and the flags that override a configuration key say where an unset value comes from."""

from __future__ import annotations

import argparse
import re

import pytest

from pipeline.cli import build_parser, main
from pipeline.config import loader

COMMANDS = ("download", "train", "sweep", "overlap", "collectives", "analyze", "ui", "profiles", "doctor", "fit")


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in ap._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _flags(p: argparse.ArgumentParser):
    return [a for a in p._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def test_every_command_is_there():
    assert set(COMMANDS) <= set(_subparsers(build_parser()))


@pytest.mark.parametrize("name", sorted(_subparsers(build_parser())))
def test_every_flag_has_help_and_its_default(name):
    p = _subparsers(build_parser())[name]
    assert p.description, f"`{name}` has no description"
    for a in _flags(p):
        flag = "/".join(a.option_strings)
        assert a.help and a.help.strip(), f"{name} {flag}: no help text"
        assert a.required or re.search(r"\bdefault\b", a.help), f"{name} {flag}: help does not give the default"


def test_config_flags_say_where_unset_values_come_from():
    p = _subparsers(build_parser())["train"]
    built_in = loader.TrainConfig()
    for a in _flags(p):
        # unset: the configuration decides (the answer's figure is no configuration: the printed command's own)
        if a.default is None and not a.required and a.dest not in ("params", "answer_img_s", "answer_load_cores"):
            assert "params.yaml" in a.help and "profile" in a.help, a.option_strings
            assert f"built in: {getattr(built_in, a.dest)}" in a.help, a.option_strings


@pytest.mark.parametrize("name", COMMANDS)
def test_help_prints(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: python -m pipeline " + name)
    for a in _flags(_subparsers(build_parser())[name]):
        assert a.option_strings[-1] in text


def test_doctor_help_names_its_real_warm_up_and_every_strategy(capsys, monkeypatch):
    """The numbers in `doctor --help` are read from the code: the warm-up doctor times after, the catalog's
    strategies."""
    from pipeline.doctor import checks

    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width, and breaks "warm-up" at its hyphen
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help: one line of words
    assert f"timed steps after {checks.WARMUP_STEPS} warm-up steps" in text
    assert f"all {len(loader.STRATEGY_NAMES)}, {', '.join(loader.STRATEGY_NAMES)}" in text


def _examples(text: str) -> list[list[str]]:
    """The `python -m pipeline ...` commands of a help text's examples, as argv after `python -m pipeline`."""
    import shlex

    lines = [line.split("  #")[0].strip() for line in text.splitlines()]
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m pipeline ")]


@pytest.mark.parametrize("name", sorted(_subparsers(build_parser())))
def test_every_command_teaches_by_example_and_its_examples_parse(name):
    """Each subcommand's --help ends with examples of its own command, and each example is a command line the
    parser takes as written (a renamed flag breaks it here, not in a user's terminal)."""
    ap = build_parser()
    text = _subparsers(ap)[name].format_help()
    assert "\nexamples:\n" in text, f"`{name} --help` has no examples"
    own = [argv for argv in _examples(text.split("\nexamples:\n")[-1]) if argv[:1] == [name]]
    assert own, f"`{name} --help`'s examples run no `python -m pipeline {name}`"
    for argv in _examples(text) + _examples(ap.format_help()):
        assert ap.parse_args(argv).command == argv[0], argv
