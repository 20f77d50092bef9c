"""A study's queue set up so that an interruption loses nothing: the worker setting it up records itself and the
number of trials first, enqueues, and marks the set-up complete last; a worker that finds the set-up incomplete waits
while its creator is at work and completes it once the creator is gone, enqueuing only the trials still missing
(each known by its point and repeat), so every trial of the queue is in the study exactly once.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid

from pipeline.records.table import point_of
from pipeline.sweep import claims
from pipeline.sweep.progress import progress

SETUP_BY = "setup_by"  # the worker setting the queue up (claims.me())
EXPECTED = "setup_expected"  # how many trials the queue holds
DONE = "enqueued"  # written last: the set-up is complete (its value: the trials of the queue)
UID = "uid"  # this study's own id: its trial folders carry it, so a same-named study in another store has others


def key(point: dict, repeat: int) -> str:
    """A queued trial's identity: its point and its repeat."""
    return json.dumps([point, repeat], sort_keys=True)


def present(study) -> set[str]:
    """The keys of the trials in the study, in any state (a trial that ran, or was failed and enqueued again,
    counts as present)."""
    return {key(point_of(t), t.user_attrs.get("repeat", 0)) for t in study.get_trials(deepcopy=False)}


def uid(study) -> str:
    return study.user_attrs.get(UID, "")


def trial_folder(study, trials_dir, number: int):
    """A trial's own folder: the study's name, the study's uid (two stores may hold a study of one name) and the
    trial's number."""
    return trials_dir / "-".join(x for x in (study.study_name, uid(study), f"{number:04d}") if x)


def begin(study, queue: list[tuple[dict, int]]) -> None:
    """Record who sets the queue up and how many trials it holds, before the first is enqueued."""
    if UID not in study.user_attrs:
        study.set_user_attr(UID, uuid.uuid4().hex[:8])
    study.set_user_attr(SETUP_BY, claims.me())
    study.set_user_attr(EXPECTED, len(queue))


def missing(study, queue: list[tuple[dict, int]]) -> list[tuple[dict, int]]:
    have = present(study)
    return [(p, r) for p, r in queue if key(p, r) not in have]


def complete(study, queue: list[tuple[dict, int]], what: str = "enqueueing trials") -> int:
    """Enqueue, in order, the trials of `queue` not in the study yet (a long queue says how far it is, as `what`:
    ~40 ms a trial on SQLite), then mark the set-up complete; returns how many were enqueued here."""
    todo = missing(study, queue)
    for p, repeat in progress(todo, what):
        study.enqueue_trial(p, user_attrs={"repeat": repeat})
    study.set_user_attr(DONE, len(queue))
    return len(todo)


def ready(study, reload, poll_s: float = 0.5, say=lambda msg: print(msg, file=sys.stderr, flush=True)):
    """The study once no other worker is setting it up: complete, or left incomplete by a creator that is gone
    (the caller completes it). A creator alive on this host is waited for; one on another host (or unknown) while
    its queue keeps growing, until it stalls for claims.GRACE_S. `reload()` reads the study again."""
    seen, since, told = -1, time.monotonic(), False
    while DONE not in study.user_attrs:
        by = study.user_attrs.get(SETUP_BY)
        if by == claims.me():
            break  # this process's own set-up, interrupted earlier
        n = len(study.get_trials(deepcopy=False))
        if n != seen:
            seen, since = n, time.monotonic()
        here = bool(by) and by.get("host") == socket.gethostname()
        if not claims.is_alive_here(by) and (here or time.monotonic() - since >= claims.GRACE_S):
            break  # its creator is gone: the caller completes the set-up
        if not told:
            told = True
            say(f"study {study.study_name}: waiting for the worker setting it up ({by or 'unknown'})")
        time.sleep(poll_s)
        study = reload()
    return study
