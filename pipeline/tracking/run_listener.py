"""A trial's MLflow run as a listener of its life (pipeline/trial/lifecycle.py): opened when the trial starts, its
epochs and record logged, ended once: FINISHED; KILLED when pruned, cancelled, requeued or interrupted; FAILED.

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

    def ran(self, trial) -> None:
        self.host_metrics.close()

    def flagged(self, trial, reason: str) -> None:
        """A trial measured under interference, flagged where a viewer looks: its run name begins UNDER_LOAD and the
        tag parallax.flagged holds the reason (the metric `flagged` comes with its record)."""
        self.run.tag({"parallax.flagged": reason})
        self.run.rename(UNDER_LOAD + self.name)

    def finished(self, trial, record) -> None:
        if record["stopped"]:  # pruned: its record kept, the run KILLED; a store refusing the end raises
            self.run.complete(record, trial.out_dir)
            self.run.end("KILLED", strict=True)
            return
        self.run.complete(record, trial.out_dir, trial.untimed)
        self.run.end("FINISHED")

    def failed(self, trial, error) -> None:
        requeued = getattr(error, "requeue", False)  # SLURM cancelled or preempted its job: it runs again
        self.run.end("KILLED" if requeued else "FAILED", f"{error.kind}: {error}")

    def cancelled(self, trial, why: str) -> None:
        with contextlib.suppress(Exception):  # best effort: the worker that took the trial over records it
            if self.run.run_id and self.run.tracker.status(self.run.run_id) == "RUNNING":
                self.run.end("KILLED", why)

    def stopped(self, trial, error, why: str, interrupted: bool) -> None:
        self.host_metrics.close()
        note = f"{why}; {self.stopped_note}" if self.stopped_note else why
        self.run.end("KILLED" if interrupted else "FAILED", note)

    def closed(self, trial) -> None:
        self.host_metrics.close()
