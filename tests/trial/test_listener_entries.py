"""tracking.listeners names a class, never code to run: an entry whose form is not 'package.module:Class', or
whose module is the standard library's or neither installed nor this project's, is refused before its module is
imported (its top-level code never runs); after the import, a non-class or a class without a listener's moment is
refused; a listener class of this project is accepted. Each refusal names the key and the entry."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from pipeline.config import loader
from pipeline.trial.lifecycle import user_listeners

LOUD = "tests.trial.loud_listener"  # writes $PARALLAX_LOUD_FILE when imported


class Recorder:
    """A listener of this project that records each trial's end."""

    def __init__(self, cfg):
        self.ends = []

    def ended(self, trial, outcome):
        self.ends.append(outcome)


class Hears:
    """A class of this project with no listener moment."""

    def __init__(self, cfg):
        pass


@pytest.fixture
def cfg(tmp_path):
    return loader.load(None, ["profile=", "data.source=synthetic"], root=tmp_path)


def with_listeners(cfg, *entries):
    """cfg naming `entries`, set past the loader (as a Config built in code would): the lifecycle checks again."""
    return dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, listeners=entries))


@pytest.fixture
def loud(tmp_path, monkeypatch):
    marker = tmp_path / "loud-imported"
    monkeypatch.setenv("PARALLAX_LOUD_FILE", str(marker))
    monkeypatch.delitem(sys.modules, LOUD, raising=False)
    yield marker
    sys.modules.pop(LOUD, None)


@pytest.mark.parametrize("entry", ["code:interact", "builtins:print", "os:system"])
def test_a_function_of_the_standard_library_is_refused_when_the_configuration_loads(tmp_path, entry):
    """`code:interact` opened a console reading stdin, `builtins:print` printed the whole Config each trial: now
    each is a ConfigError naming the key and the entry, before the sweep (or `train`) starts."""
    with pytest.raises(loader.ConfigError, match=rf"`tracking\.listeners\[0\]`: '{entry}' is not a listener class"):
        loader.load(None, ["profile=", "data.source=synthetic", f"tracking.listeners=[{entry}]"], root=tmp_path)


@pytest.mark.parametrize("entry", ["code:interact", "builtins:print", "os:system"])
def test_a_function_is_refused_by_the_lifecycle_too(cfg, entry):
    with pytest.raises(loader.ConfigError, match=rf"tracking\.listeners: '{entry}' is not a listener class"):
        user_listeners(with_listeners(cfg, entry))


def test_a_wrong_entry_is_refused_before_its_module_runs(cfg, loud, tmp_path, monkeypatch):
    """A project module with a side effect at import: named with a function (wrong form) it is never imported; the
    standard library's `this` (it prints the Zen of Python on import) is refused by name; a module outside the
    project and every installed package is refused by where it lies, without running it."""
    with pytest.raises(loader.ConfigError, match=rf"'{LOUD}:store' is not a listener class"):
        user_listeners(with_listeners(cfg, f"{LOUD}:store"))
    assert not loud.exists() and LOUD not in sys.modules
    with pytest.raises(loader.ConfigError, match="'this:Zen' names the standard library's module 'this'"):
        user_listeners(with_listeners(cfg, "this:Zen"))
    assert "this" not in sys.modules
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "stray_store.py").write_text(f"open({str(tmp_path / 'stray-imported')!r}, 'w')\nclass Store: pass\n")
    monkeypatch.syspath_prepend(str(outside))
    with pytest.raises(loader.ConfigError, match="neither an installed package nor part of this project"):
        user_listeners(with_listeners(cfg, "stray_store:Store"))
    assert not (tmp_path / "stray-imported").exists() and "stray_store" not in sys.modules


def test_the_standard_library_s_classes_are_refused(cfg):
    """`threading:Thread` was "unexpected AssertionError ... report it"; a class re-exported by a project module
    (pathlib.Path from this test module's imports of tests.sweep) is the standard library's too."""
    with pytest.raises(loader.ConfigError, match="'threading:Thread' names the standard library's module"):
        user_listeners(with_listeners(cfg, "threading:Thread"))
    with pytest.raises(loader.ConfigError, match="is the standard library's class pathlib.Path"):
        user_listeners(with_listeners(cfg, "tests.sweep.test_listener_store:Path"))


def test_a_project_listener_class_is_accepted_and_a_class_with_no_moment_is_refused(cfg):
    (built,) = user_listeners(with_listeners(cfg, f"{__name__}:Recorder"))
    assert isinstance(built, Recorder)
    with pytest.raises(loader.ConfigError, match=rf"'{__name__}:Hears' has none of a listener's moments"):
        user_listeners(with_listeners(cfg, f"{__name__}:Hears"))
