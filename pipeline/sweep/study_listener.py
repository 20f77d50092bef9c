"""A sweep trial's Optuna trial as a listener of its life (pipeline/trial/lifecycle.py): a take-over its heartbeat
noticed cancels the trial here (queue.claimed holds the heartbeat, from the claim to the release), pruning at each
epoch, and its end told once: COMPLETE with its final test accuracy, PRUNED, or FAIL with the reason; a SLURM job
the cluster ended is enqueued again, a trial measured under interference re-measured, and one stopped by a fault or
Ctrl-C failed and enqueued again.
One outcome per trial: once the store holds the trial's end (`ended`), a later fault (a store of the user's that
raises in `finished`, say) is reported and the end stands: never failed after it completed, nor enqueued again.
`outcome` is what the sweep prints after the trial; `told` and `again` what the store took of a stop.
"""

from __future__ import annotations

import contextlib

import optuna
from optuna.trial import TrialState

from pipeline.measure import meter
from pipeline.sweep import console, slurm, study_view
from pipeline.sweep import queue as claims

TAKEN_OVER = "taken over: another worker failed this trial as stale (late heartbeat) and runs it again"


class StudyListener:
    """Optuna trial `trial` of `study`, running point `p` (its whole point, for a copy enqueued again)."""

    def __init__(self, cfg, study: optuna.Study, trial: optuna.Trial, p: dict):
        self.cfg, self.study, self.trial, self.p = cfg, study, trial, p
        self.beat = claims.heartbeat(trial)  # beating since the claim; its owner, queue.claimed, stops it
        self.outcome = ""
        self.ended = ""  # the end the store holds, once told (COMPLETE, PRUNED, FAIL ...): it stands
        self.told = self.again = False

    # ------------------------------------------------------------------ while it runs

    def started(self, t) -> None:
        if t.bounded:
            self._attrs(t, {"reason": t.bounded})  # the sweep table's reason column

    def noted(self, t, attrs: dict) -> None:
        self._attrs(t, attrs)

    def epoch(self, t, record: dict) -> bool:
        if self.beat.lost.is_set():
            t.cancel(TAKEN_OVER)
            return True  # stop at this epoch's end
        if not self.cfg.sweep.pruning:
            return False
        try:
            self.trial.report(record["test_acc"], record["epoch"])
            return self.trial.should_prune()
        except optuna.exceptions.UpdateFinishedTrialError:
            t.cancel(TAKEN_OVER)
            return True

    def ran(self, t) -> None:
        if self.beat.lost.is_set():
            t.cancel(TAKEN_OVER)

    # ------------------------------------------------------------------ its end

    def flagged(self, t, reason: str) -> None:
        study_view.note_under_load(self.trial, t.record)

    def finished(self, t, record) -> None:
        try:
            self.trial.set_user_attr("metrics", record.to_json())
            study_view.set_trial_numbers(self.trial, record)
            if record["stopped"]:
                self.trial.set_user_attr("reason", f"pruned after epoch {len(record['test_acc'])}")
                self.study.tell(self.trial, state=TrialState.PRUNED)
                self.ended, self.outcome = "PRUNED", "pruned"
                return
            if t.untimed:  # complete, its accuracy valid; the table's reason and the run's tag say why img/s is missing
                reason = "; ".join(filter(None, (self.trial.user_attrs.get("reason"), t.untimed)))
                self.trial.set_user_attr("reason", reason)
            self.study.tell(self.trial, record["test_acc"][-1])
            self.ended = "COMPLETE"
            self.outcome = (
                f"{meter.speed_text(record)}{console.under_load(record)}, acc {record['test_acc'][-1]:.3f}"
                + remeasure(self.cfg, self.study, self.trial, self.p, record)
            )
        except optuna.exceptions.UpdateFinishedTrialError:
            self.ended, self.outcome = TAKEN_OVER, f"{TAKEN_OVER}; nothing recorded here"

    def failed(self, t, error) -> None:
        reason = f"{error.kind}: {error}"
        try:
            self.trial.set_user_attr("reason", reason)
            if getattr(error, "requeue", False):  # SLURM cancelled or preempted its job (slurm.Requeued)
                self.outcome = requeue(self.study, self.trial, self.p, reason)
                self.ended = "FAIL, its point enqueued again"
                return
            self.trial.set_user_attr("failure_kind", error.kind)
            self.study.tell(self.trial, state=TrialState.FAIL)
            self.ended, self.outcome = "FAIL", f"failed ({reason})"
        except optuna.exceptions.UpdateFinishedTrialError:
            self.ended, self.outcome = TAKEN_OVER, f"{TAKEN_OVER}; nothing recorded here"

    def cancelled(self, t, why: str) -> None:
        self.ended, self.outcome = why, f"{why}; nothing recorded here"

    def stopped(self, t, error, why: str, interrupted: bool) -> None:
        """Failed with the reason and its point enqueued again, each step tried once (read back in told, again);
        a trial whose end the store holds already keeps it (`ended`): one outcome per trial."""
        if self.ended:
            return
        with contextlib.suppress(Exception):
            self.trial.set_user_attr("reason", f"{why}; enqueued again")
        with contextlib.suppress(Exception):
            self.study.tell(self.trial, state=TrialState.FAIL)
            self.told = True
        with contextlib.suppress(Exception):
            self.study.enqueue_trial(self.p, user_attrs=copied(self.trial))
            self.again = True

    # ------------------------------------------------------------------

    def _attrs(self, t, attrs: dict) -> None:
        try:
            for k, v in attrs.items():
                self.trial.set_user_attr(k, v)
        except optuna.exceptions.UpdateFinishedTrialError:
            t.cancel(TAKEN_OVER)


def remeasure(cfg, study, trial, p, metrics) -> str:
    """A trial flagged as measured under interference is enqueued again (its own row stays, flagged), up to
    sweep.remeasure_interfered times; the copy runs after the trials already waiting. Not on a host that stays busy
    (the quiet wait failed that many times in a row before this trial, stage.py): the copy would meet the same load."""
    done = trial.user_attrs.get("remeasure", 0)
    if not (metrics.get("interference") or {}).get("interfered") or done >= cfg.sweep.remeasure_interfered:
        return ""
    busy = trial.user_attrs.get("host_stays_busy")
    if busy:
        return f"; not re-measured: the host stayed busy through {busy} quiet wait{'s' * (busy != 1)} in a row"
    study.enqueue_trial(
        p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "remeasure": done + 1, "remeasure_of": trial.number}
    )
    return f"; measured under interference: enqueued again ({done + 1}/{cfg.sweep.remeasure_interfered})"


def requeue(study, trial, p, reason) -> str:
    """A trial whose SLURM job was cancelled or preempted: failed with SLURM's reason and its point enqueued again
    (up to slurm.MAX_REQUEUES times, then failed for good), never left RUNNING."""
    n = trial.user_attrs.get("requeued", 0)
    if n >= slurm.MAX_REQUEUES:
        trial.set_user_attr("failure_kind", "slurm_requeues")
        study.tell(trial, state=TrialState.FAIL)
        return f"failed ({reason}; already enqueued again {n} times)"
    study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(p, user_attrs={"repeat": trial.user_attrs.get("repeat", 0), "requeued": n + 1})
    return f"{reason} ({n + 1}/{slurm.MAX_REQUEUES})"


def copied(trial) -> dict:
    """What a trial enqueued again after a fault keeps of its own: which repeat or re-measure of its point it is (as
    a copy enqueued for a dead worker keeps them)."""
    return {k: trial.user_attrs[k] for k in ("repeat", "remeasure", "remeasure_of") if k in trial.user_attrs}
