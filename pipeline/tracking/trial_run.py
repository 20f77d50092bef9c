"""A trial's MLflow run, opened and ended in one place for `python -m pipeline train` and for each sweep trial, by
the trial's MLflow listener (run_listener.py), which ends it as the trial's outcome says:

    run.start(name, plan)                   # base tags, params, dataset
    run.log_epoch(record)                   # each epoch's metrics
    run.complete(record, out_dir, untimed)  # metrics, tags, metrics.json, the untimed tag
    run.end("FINISHED")                     # or KILLED, FAILED with the reason

A run is ended once. When the store refuses the write, a run that did not finish is left as it is (the fault is
being reported); a refused FINISHED raises, so that no failure passes for a success (the trial's outcome is then a
fault, and its run ended FAILED).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.redact import redact
from pipeline.tracking import client


class TrialRun:
    """One trial's MLflow run in experiment `tracker`: `cfg` is the trial's Config, `stage` the tag dvc_stage
    ("train", "sweep@ddp")."""

    def __init__(self, tracker: client.Tracker, cfg, stage: str):
        self.tracker, self.cfg, self.stage = tracker, cfg, stage
        self.run_id: str | None = None
        self.ended: str | None = None  # the status the run was ended with (or given up on, the store refusing it)

    def start(self, name: str, plan, tags: dict | None = None, parent_id: str | None = None, started=None) -> str:
        """Open the run with the base tags of `plan` (the planned record, records.trial.planned) and `tags`, then
        log the plan's params and the dataset. `started(run_id)` is called as soon as the run exists, before
        anything else is written (the sweep records the id in Optuna)."""
        self.run_id = self.tracker.start_run(
            name, {**client.base_tags(plan, self.cfg, stage=self.stage), **(tags or {})}, parent_id=parent_id
        )
        if started:
            started(self.run_id)
        self.tracker.log_params(self.run_id, plan.params())
        self.tracker.log_dataset(self.run_id, self.cfg)
        return self.run_id

    def tag(self, tags: dict) -> None:
        self.tracker.set_tags(self.run_id, tags)

    def rename(self, name: str) -> None:
        self.tracker.rename(self.run_id, name)

    def log_epoch(self, record: dict) -> bool:
        """An epoch record's metrics at step epoch; False: the trial goes on (run_trial's on_epoch contract)."""
        self.tracker.log_metrics(self.run_id, client.epoch_metrics(record), step=record["epoch"])
        return False

    def system_metrics(self):
        """MLflow's metrics of this host into this run while the block runs, labelled with its name (off unless
        tracking.system_metrics or MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING turns them on: tracking.system_metrics_on)."""
        return client.sampling(self.system_metrics_target())

    def system_metrics_target(self) -> client.SystemMetrics | None:
        """Where this run's system metrics go, for the nodes that run the trial elsewhere (a SLURM job's, each
        sampling its own host: tracking.sampling); None when they are off or the run is not open."""
        return client.system_metrics_target(self.cfg, self.run_id)

    def complete(self, record, out_dir: Path, untimed: str = "") -> None:
        """A finished trial's record (metrics, tags, metrics.json) and, when its throughput could not be timed
        (`untimed`: why, measure.meter.untimed), the tag parallax.untimed. The run stays open: `end` ends it."""
        client.log_completed_run(self.tracker, self.run_id, record, Path(out_dir))
        if untimed:
            self.tag({"parallax.untimed": untimed})

    def end(self, status: str, reason: str = "", strict: bool | None = None) -> None:
        """End the run `status` (FINISHED, KILLED, FAILED), a reason as tag `failure`; once: a second call does
        nothing. strict (default: status is FINISHED): a store that refuses the write raises, and the run counts as
        not ended; otherwise the refusal is swallowed and the run left as the store holds it."""
        if self.run_id is None or self.ended is not None:
            return
        strict = status == "FINISHED" if strict is None else strict
        try:
            if reason:
                self.tracker.set_tags(self.run_id, {"failure": redact(reason)[:5000]})
            self.tracker.end_run(self.run_id, status)
        except Exception:
            if strict:
                raise
        self.ended = status
