"""How a trial ended, decided once (`decide`): the one value `Trial.run()` returns, which every listener records and
the sweep's worker applies to its queue.

    finished     it ran to its last epoch; `record` holds its figures (`flagged`: why they were measured under
                 interference, "" when quietly; `untimed`: why its throughput could not be timed)
    pruned       it stopped early at an epoch's end (a listener or the sweep's pruner asked); `record` kept
    failed       it failed by itself (a TrialFailed that is not the host's): its point is not run again
    requeued     SLURM ended its job (cancelled, preempted): not the trial's fault, its point runs again
    fault        the host, the cluster or a store failed (`host_faults`, any other error, a store refusing its end):
                 the trial runs again; `stands` is the end the sweep's own stores held before a user's store failed
    cancelled    the sweep's worker cancelled it (another worker took it over): nothing is kept
    interrupted  Ctrl-C or a signal: the trial runs again

`decide` is the one reader of a record's "interfered" and the one place a failure becomes "the host could not write"
(`unwritable` makes that failure's words, wherever it is raised).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import TrialFailed, interruption
from pipeline.records import files
from pipeline.store_faults import root_cause

FINISHED, PRUNED, FAILED, REQUEUED = "finished", "pruned", "failed", "requeued"
FAULT, CANCELLED, INTERRUPTED = "fault", "cancelled", "interrupted"
KINDS = (FINISHED, PRUNED, FAILED, REQUEUED, FAULT, CANCELLED, INTERRUPTED)
UNWRITABLE = "unwritable"  # the failure kind of a trial whose directory the host could not write


class Requeued(TrialFailed):
    """The cluster ended the trial's job (scancel, preemption): not the trial's fault, its point runs again."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    kind: str
    record: object = None  # the TrialRecord (finished, pruned; a fault after a success keeps it)
    reason: str = ""  # why, in words: the failure, the cancel, the fault, the interruption
    error: BaseException | None = None  # what ended it (failed, requeued, fault, interrupted)
    flagged: str = ""  # why it counts as measured under interference, "" when it does not
    untimed: str = ""  # why the record has no throughput (measure.meter.untimed), "" when it has one
    stands: Outcome | None = None  # a fault after the sweep's own stores held this end: that end stands

    @property
    def kept(self) -> bool:
        """Whether the trial ran to an end its point keeps (finished, pruned or failed by itself)."""
        return self.kind in (FINISHED, PRUNED, FAILED)

    def record_or_raise(self):
        """The record of a trial that finished or was pruned; else the error that ended it, raised (an interruption
        as the Interrupted it is)."""
        if self.kind in (FINISHED, PRUNED) or self.error is None:
            return self.record
        raise self.error


def decide(record, error: BaseException | None, cancelled: str, host_faults, out_dir: Path) -> Outcome:
    """The trial's one outcome, from what its run left: its record, the error it raised, why it was cancelled, the
    failure kinds that are the host's or the cluster's (`host_faults`), and its folder (a failure whose folder now
    refuses writes is the host's: `on_a_full_disk`)."""
    if error is not None and (signalled := interruption(error)) is not None:
        e = error if isinstance(error, KeyboardInterrupt) else signalled
        return Outcome(INTERRUPTED, reason=f"interrupted ({str(e) or type(e).__name__})", error=e)
    if isinstance(error, TrialFailed):
        failure = error if error.kind in host_faults else on_a_full_disk(error, out_dir)
        if failure.kind in host_faults:
            return Outcome(FAULT, reason=f"{failure.kind}: {failure}", error=failure)
        if cancelled:
            return Outcome(CANCELLED, reason=cancelled)
        kind = REQUEUED if isinstance(failure, Requeued) else FAILED
        return Outcome(kind, reason=f"{failure.kind}: {failure}", error=failure)
    if error is not None:
        return fault(error)
    if cancelled:
        return Outcome(CANCELLED, reason=cancelled)
    interference = record.get("interference") or {}
    flagged = (
        (interference.get("interference_reason") or "measured under load") if interference.get("interfered") else ""
    )
    if record["stopped"]:
        return Outcome(PRUNED, record, f"pruned after epoch {len(record['test_acc'])}", flagged=flagged)
    from pipeline.measure import meter

    return Outcome(FINISHED, record, flagged=flagged, untimed=meter.untimed(record))


def fault(error: BaseException, stands: Outcome | None = None) -> Outcome:
    """A fault (a store failing, any error that is neither the trial's nor an interruption)."""
    return Outcome(FAULT, stands.record if stands else None, f"error: {root_cause(error)}", error, stands=stands)


def unwritable(out_dir, why) -> TrialFailed:
    """The failure of a trial whose directory the host could not write, in the one form its message takes."""
    return TrialFailed(f"the host could not write the trial directory {out_dir}: {why}", UNWRITABLE)


def on_a_full_disk(failed: TrialFailed, out_dir: Path) -> TrialFailed:
    """A trial failed some other way whose folder now refuses a write: the host's failure after all (in a multi-process
    trial the launcher may report a peer of the rank whose write failed, as worker_died), so its point is kept."""
    if failed.kind == UNWRITABLE:
        return failed
    refused = files.refuses_writes(out_dir)
    if refused is None:
        return failed
    return unwritable(out_dir, f"{refused}; the trial itself ended {failed.kind}: {failed}")
