"""Progress lines for a long loop that would otherwise run in silence: at most one every EVERY_S seconds, on stderr.

    for p in progress(queue, "[sweep ddp] enqueueing trials"): ...

A loop that ends within EVERY_S prints nothing; one that spoke ends with a `done in N s` line. `counter` is the
sweep's "trial 9/9 (8 planned + 1 re-measure)" count, and `time_left` the sweep ETA beside it, over the same trials.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Iterator, TypeVar

EVERY_S = 5.0
T = TypeVar("T")


def progress(
    items: Iterable[T], what: str, every_s: float | None = None, clock: Callable[[], float] | None = None
) -> Iterator[T]:
    """Yield each item; after an item's work, print `what: done/total (pct%), N s` if every_s has passed since the
    last line (or the start)."""
    items = list(items)
    every_s = EVERY_S if every_s is None else every_s
    clock = clock or time.monotonic
    start = clock()
    next_at, spoke = start + every_s, False
    for n, item in enumerate(items, 1):
        yield item
        now = clock()
        if now >= next_at and n < len(items):  # the last item's line is the `done` line
            next_at, spoke = now + every_s, True
            print(
                f"{what}: {n}/{len(items)} ({100 * n // len(items)}%), {now - start:.0f} s", file=sys.stderr, flush=True
            )
    if spoke:
        print(f"{what}: {len(items)}/{len(items)} done in {clock() - start:.0f} s", file=sys.stderr, flush=True)


def counter(done: int, total: int, remeasures: int = 0) -> str:
    """`trial n/total` for the trial about to run, `done` trials finished before it: re-measures extend the total and
    say so ("9/9 (8 planned + 1 re-measure)"), and a count past even that (trials failed and run again) reads n/n,
    never 16/8."""
    n = done + 1
    if remeasures and n <= total + remeasures:
        return f"{n}/{total + remeasures} ({total} planned + {remeasures} re-measure{'s' if remeasures > 1 else ''})"
    return f"{n}/{max(total, n)}"


def time_left(pace_s: float | None, done: int, total: int, remeasures: int = 0) -> float | None:
    """The seconds the trials `counter` counts still need at `pace_s` per trial (None: no pace yet): the one about to
    run and those after it, re-measures enqueued included (at least the one about to run)."""
    return None if pace_s is None else pace_s * max(total + remeasures - done, 1)
