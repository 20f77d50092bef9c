"""A big search space is set up in work near-linear in its number of points: listing, de-duplicating, the categorical
choices and the study's name compare each point's values a bounded number of times (counted, not timed)."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline import config as configmod
from pipeline import space

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
    grid = configmod.SpaceConfig(batch_size=tuple(range(1, side + 1)), lr=lrs, devices=(1,))
    sweep = dataclasses.replace(configmod.Config().sweep, spaces={"default": (grid,) * repeated})
    return dataclasses.replace(configmod.Config(), sweep=sweep)


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
    ch = space.choices(cfg, "single")
    assert len(ch["lr"]) == SIDE and len(ch["batch_size"]) == SIDE
    assert space.study_name(cfg, "single").startswith("cpu-single-")


def test_a_union_that_repeats_its_products_is_de_duplicated_in_linear_work(counted):
    """The same 200x200 product listed three times (a union of products) gives each point once, in bounded work."""
    Counted.bound = 6 * SIDE * SIDE
    pts = space.points(_grid_cfg(SIDE, repeated=3), "single")
    assert len(pts) == SIDE * SIDE
    assert len({(p["batch_size"], p["lr"]) for p in pts}) == SIDE * SIDE
