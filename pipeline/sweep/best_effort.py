"""`best_effort(*steps)`: each step (a callable of no arguments) tried once, in order, an Exception from one kept from
the caller and the next tried all the same; returns which steps succeeded. For the writes of a sweep that is stopping
(a fault, an interruption): a store that is failing is already being reported."""

from __future__ import annotations

from typing import Callable


def best_effort(*steps: Callable[[], object]) -> list[bool]:
    done = []
    for step in steps:
        try:
            step()
            done.append(True)
        except Exception:
            done.append(False)
    return done
