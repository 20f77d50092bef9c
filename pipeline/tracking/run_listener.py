"""A trial's MLflow run as a listener of its life (pipeline/trial/lifecycle.py): opened when the trial starts, its
epochs and record logged, ended once by the trial's outcome: FINISHED; KILLED when pruned, cancelled, requeued or
interrupted; FAILED.

The same listener serves `python -m pipeline train` and each sweep trial; the sweep adds the run's parent, its tags
(trial, study) and what a stop means for it (`stopped_note`: "trial enqueued again").
"""

from __future__ import annotations

import contextlib

from pipeline.tracking.trial_run import TrialRun

UNDER_LOAD = "[under load] "  # the run-name prefix of a trial measured under interference (a cut name keeps it)


class MlflowListener:
    """`run` (a TrialRun) opened as `name` with the planned record `plan`'s params and base tags, plus `tags`,
    under `parent_id` when given. `samples_here`: this process runs the trial's ranks, so it samples this host's system
    metrics (when on); False where they run elsewhere (a SLURM job, whose nodes sample their own: sweep/slurm.py)."""

    def __init__(self, run: TrialRun, name: str, plan, tags=None, parent_id=None, stopped_note="", samples_here=True):
        self.run, self.name, self.plan, self.tags, self.parent_id = run, name, plan, tags or {}, parent_id
        self.stopped_note, self.samples_here = stopped_note, samples_here
        self.host_metrics = contextlib.ExitStack()

    def started(self, trial) -> None:
        def opened(run_id: str) -> None:  # before anything else is written: the other stores learn the id first
            trial.run_id = run_id
            trial.note({"mlflow_run_id": run_id})

        self.run.start(self.name, self.plan, self.tags, parent_id=self.parent_id, started=opened)
        if trial.bounded:
            self.run.tag({"parallax.bounded": trial.bounded})
        if self.samples_here:  # off unless turned on (system_metrics_on)
            self.host_metrics.enter_context(self.run.system_metrics())

    def noted(self, trial, attrs: dict) -> None:
        tags = {f"parallax.{k}": v for k, v in attrs.items() if k != "mlflow_run_id"}  # its own id is no tag
        if tags and self.run.run_id:
            self.run.tag(tags)

    def epoch(self, trial, record: dict) -> bool:
        return self.run.log_epoch(record)

    def ended(self, trial, outcome) -> None:
        """The run ended once, as the outcome says: FINISHED with its record (a flagged one renamed UNDER_LOAD, the
        reason in tag parallax.flagged); KILLED when pruned (its record kept), requeued, cancelled or interrupted;
        FAILED with the reason. A store refusing a FINISHED or a pruned end raises: no failure passes for a success."""
        self.host_metrics.close()
        kind = outcome.kind
        if kind in ("finished", "pruned"):
            if outcome.flagged:
                self.run.tag({"parallax.flagged": outcome.flagged})
                self.run.rename(UNDER_LOAD + self.name)
            self.run.complete(outcome.record, trial.out_dir, outcome.untimed)
            self.run.end("FINISHED" if kind == "finished" else "KILLED", strict=True)
        elif kind == "cancelled":
            with contextlib.suppress(Exception):  # best effort: the worker that took the trial over records it
                if self.run.run_id and self.run.tracker.status(self.run.run_id) == "RUNNING":
                    self.run.end("KILLED", outcome.reason)
        elif kind in ("fault", "interrupted"):
            note = f"{outcome.reason}; {self.stopped_note}" if self.stopped_note else outcome.reason
            self.run.end("KILLED" if kind == "interrupted" else "FAILED", note)
        else:  # failed by itself, or requeued (SLURM ended its job: it runs again)
            self.run.end("KILLED" if kind == "requeued" else "FAILED", outcome.reason)
