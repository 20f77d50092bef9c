"""A trial's end as the worker tells it (worker.Told): the count of the study's trials that ran to an end and the end
that stands after a fault follow what the Optuna store took, whatever words the console prints; a fault with no end
that stands fails the trial and enqueues it again, each step tried once. No training: an in-memory study, each
trial's outcome given.

    .venv/bin/python -m pytest tests/sweep/test_told.py
"""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest

from pipeline.errors import Stopped, TrialFailed
from pipeline.sweep import worker
from pipeline.trial.outcome import CANCELLED, FAILED, Outcome, fault

POINT = {"devices": 1, "batch_size": 64, "lr": 0.1}
OTHER_WORDS = {"TAKEN_OVER": "handed on: another worker runs this trial", "NOTHING_HERE": "its record is elsewhere"}
QUOTED = "nothing recorded here"  # the console's usual words, quoted by a trial's own failure


@pytest.fixture
def reworded(monkeypatch):
    """The console's words for a trial another worker records, changed."""
    for name, words in OTHER_WORDS.items():
        monkeypatch.setattr(worker, name, words, raising=False)


def _worker(tmp_path) -> tuple[worker.Worker, optuna.Trial]:
    study = optuna.create_study()
    study.enqueue_trial(POINT)
    sweep = SimpleNamespace(
        space=SimpleNamespace(strategy="single"),
        cfg=None,
        strategy="single",
        host=SimpleNamespace(kind="cpu", n=1),
        tracker=None,
        study=study,
        skipped=[],
        out_csv=tmp_path / "single.jsonl",
        stores=worker.Stores("sqlite:///optuna.db", "sqlite:///mlflow.db"),
        gate=None,
        total=1,
    )
    return worker.Worker(sweep), study.ask()


def _failed(why: str) -> Outcome:
    return Outcome(FAILED, reason=f"crashed: {why}", error=TrialFailed(why, "crashed"))


@pytest.mark.parametrize(
    "outcome, counted",
    [
        (lambda: Outcome(CANCELLED, reason=worker.TAKEN_OVER), 0),
        (lambda: _failed(f"a listener said: {worker.TAKEN_OVER}; {QUOTED}"), 1),
    ],
    ids=["taken over", "failed, quoting the words"],
)
def test_the_count_of_trials_that_ran_to_an_end_reads_what_the_store_took(
    tmp_path, monkeypatch, capsys, reworded, outcome, counted
):
    """A trial another worker took over is not counted here; one that failed by itself is, whatever its words."""
    w, trial = _worker(tmp_path)
    ended = outcome()
    monkeypatch.setattr(worker, "write_table", lambda *a, **k: None)
    monkeypatch.setattr(worker.Worker, "run_one", lambda self, t, label: self.apply(t, POINT, None, ended))
    w.run(trial, 3, None)
    said = capsys.readouterr().err
    assert w.done == 3 + counted, said
    assert (OTHER_WORDS["NOTHING_HERE"] in said) is (not counted), said


@pytest.mark.parametrize(
    "stands, held",
    [
        (lambda: Outcome(CANCELLED, reason=worker.TAKEN_OVER), OTHER_WORDS["TAKEN_OVER"]),
        (lambda: _failed(f"a listener said: {worker.TAKEN_OVER}; {QUOTED}"), "FAIL"),
    ],
    ids=["taken over", "failed, quoting the words"],
)
def test_the_end_that_stands_after_a_fault_reads_what_the_store_took(tmp_path, reworded, stands, held):
    """A user's store failing after the sweep's own stores held a trial's end: the stop names the end that stands as
    the Optuna store holds it (taken over: the words that say so), whatever the trial's own words quote."""
    w, trial = _worker(tmp_path)
    one = SimpleNamespace(run_id=None, out_dir=tmp_path)
    with pytest.raises(Stopped) as stopped:
        w.apply(trial, POINT, one, fault(RuntimeError("my store is down"), stands=stands()))
    said = " ".join(str(stopped.value).split())
    assert f"before the fault ({held}): that end stands" in said, said


@pytest.mark.parametrize(
    "refused, said, copies",
    [
        ("tell", "The Optuna store did not record the trial's failure", 1),
        ("enqueue_trial", "recorded as failed, but enqueueing it again failed", 0),
        (None, "recorded as failed with this reason and enqueued again", 1),
    ],
)
def test_a_fault_fails_the_trial_and_enqueues_it_each_step_tried_once(tmp_path, monkeypatch, refused, said, copies):
    """A fault with no end that stands: the trial is failed and its point enqueued again, each step tried once
    (best_effort), a step the store refuses kept from the next; the stop says what the store took."""
    w, trial = _worker(tmp_path)

    def refuse(*a, **k):
        raise RuntimeError("the store refuses")

    if refused:
        monkeypatch.setattr(w.study, refused, refuse)
    one = SimpleNamespace(run_id=None, out_dir=tmp_path)
    with pytest.raises(Stopped) as stopped:
        w.apply(trial, POINT, one, fault(RuntimeError("my store is down")))
    assert said in " ".join(str(stopped.value).split()), stopped.value
    waiting = w.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    assert len(waiting) == copies, waiting
