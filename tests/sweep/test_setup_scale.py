"""A big search space is set up in work near-linear in its number of points: listing, de-duplicating, the categorical
choices and the study's name compare each point's values a bounded number of times (counted, not timed); and a
long set-up says how far it is."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import loader
from pipeline.sweep import progress, space
from pipeline.sweep.space import Space
from pipeline.sweep.stage import run_sweep
from tests.sweep.test_sweep import TINY

SIDE = 200  # a 200 x 200 grid: 40,000 points


class Counted(float):
    """A float that counts the equality tests made on it, and stops the test once they exceed the bound."""

    calls = 0
    bound = 0

    def __eq__(self, other):
        Counted.calls += 1
        if Counted.calls > Counted.bound:
            raise AssertionError(f"more than {Counted.bound} value comparisons for {SIDE * SIDE} points")
        return float.__eq__(self, other)

    __hash__ = float.__hash__


def _grid_cfg(side: int, repeated: int = 1):
    lrs = tuple(Counted(0.001 * (i + 1)) for i in range(side))
    grid = loader.SpaceConfig(batch_size=tuple(range(1, side + 1)), lr=lrs, devices=(1,))
    sweep = dataclasses.replace(loader.Config().sweep, spaces={"default": (grid,) * repeated})
    return dataclasses.replace(loader.Config(), sweep=sweep)


@pytest.fixture
def counted():
    Counted.calls, Counted.bound = 0, 2 * SIDE * SIDE
    yield Counted
    Counted.calls, Counted.bound = 0, 0


def test_a_200x200_grid_is_listed_named_and_chosen_from_in_linear_work(counted):
    """points, choices and study_name on a 40,000-point grid make at most two value comparisons per point in all."""
    cfg = _grid_cfg(SIDE)
    pts = space.points(cfg, "single")
    assert len(pts) == SIDE * SIDE
    assert pts[0]["batch_size"] == 1 and pts[1]["batch_size"] == 1 and pts[SIDE]["batch_size"] == 2  # stable order
    ch = Space(cfg, "single").choices
    assert len(ch["lr"]) == SIDE and len(ch["batch_size"]) == SIDE
    assert Space(cfg, "single").name.startswith("cpu-single-")


def test_a_union_that_repeats_its_products_is_de_duplicated_in_linear_work(counted):
    """The same 200x200 product listed three times (a union of products) gives each point once, in bounded work."""
    Counted.bound = 6 * SIDE * SIDE
    pts = space.points(_grid_cfg(SIDE, repeated=3), "single")
    assert len(pts) == SIDE * SIDE
    assert len({(p["batch_size"], p["lr"]) for p in pts}) == SIDE * SIDE


@pytest.fixture
def tiny_cfg(make_cfg, tmp_path):
    (tmp_path / "experiments").mkdir(exist_ok=True)
    (tmp_path / "experiments" / "tiny.yaml").write_text(TINY.format(bad_lr=100.0))
    return make_cfg(profile="tiny")


def test_a_long_set_up_says_how_far_it_is(tiny_cfg, tmp_path, capsys, monkeypatch):
    """Study set-up reports its progress while it checks the points and enqueues the trials (here on every item,
    the interval set to 0); each line names the stage and counts done/total."""
    monkeypatch.setattr("pipeline.sweep.progress.EVERY_S", 0.0)
    run_sweep(tiny_cfg, "single", tmp_path / "single.jsonl", max_new_trials=0)
    err = capsys.readouterr().err
    assert "[sweep single] checking which points run here: 1/4" in err, err
    assert "[sweep single] enqueueing trials: 1/2" in err and "enqueueing trials: 2/2 done in" in err, err


def test_progress_speaks_at_most_once_per_interval_and_not_at_all_for_a_short_loop(capsys):
    """With a clock that advances 1 s per item and a 5 s interval, 20 items give a line at 5, 10 and 15 and a
    `done` line; a loop done within the interval prints nothing."""
    ticks = iter(range(1000))
    items = list(progress.progress(range(20), "work", every_s=5, clock=lambda: float(next(ticks))))
    assert items == list(range(20))
    lines = capsys.readouterr().err.strip().splitlines()
    assert [ln.split(":")[1].split()[0] for ln in lines] == ["5/20", "10/20", "15/20", "20/20"], lines
    assert lines[-1].startswith("work: 20/20 done in")
    list(progress.progress(range(3), "quick", every_s=5))
    assert capsys.readouterr().err == ""
