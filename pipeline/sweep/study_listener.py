"""A sweep trial's Optuna trial as a listener of its life (pipeline/trial/lifecycle.py): it records what the trial
learns (why its steps are capped, its SLURM job, its MLflow run) and, once it ran to an end, its record, its numbers
and, when flagged, a note on its dashboard page. It decides nothing: the sweep's worker (worker.py) tells the study
how the trial ended, prunes, requeues and re-measures.
"""

from __future__ import annotations

import contextlib

import optuna

from pipeline.sweep import study_view
from pipeline.trial.outcome import FINISHED, PRUNED


class StudyRecord:
    """Optuna trial `trial`, recorded. A trial the store holds ended already (another worker took it over) takes
    no attribute: the worker sees the take-over and records nothing for it."""

    def __init__(self, trial: optuna.Trial):
        self.trial = trial

    def started(self, t) -> None:
        if t.bounded:
            self._attrs({"reason": t.bounded})  # the sweep table's reason column

    def noted(self, t, attrs: dict) -> None:
        self._attrs(attrs)

    def ended(self, t, outcome) -> None:
        if outcome.kind not in (FINISHED, PRUNED):
            return
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            if outcome.flagged:
                study_view.note_under_load(self.trial, outcome.record)
            self.trial.set_user_attr("metrics", outcome.record.to_json())
            study_view.set_trial_numbers(self.trial, outcome.record)

    def _attrs(self, attrs: dict) -> None:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            for k, v in attrs.items():
                self.trial.set_user_attr(k, v)
