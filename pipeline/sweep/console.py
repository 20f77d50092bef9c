"""What a sweep trial says on stderr while it runs, as a listener of its life (pipeline/trial/lifecycle.py): why its
steps are capped, and each epoch's accuracy, loss and the trial's ETA. The trial's one-line outcome is the sweep's
(stage.py), from the sweep's worker; `under_load` is its mark for a trial measured under load."""

from __future__ import annotations

import sys
import time


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def under_load(outcome) -> str:
    """ " [under load: 1.3 cores busy]" after a flagged trial's img/s (its outcome's `flagged`, trial/outcome.py): the
    cores other processes kept busy while it was measured, or the flag's reason where something else flagged it
    (steal, a throttled GPU: measure/interference.py); "" for a trial measured quietly."""
    if not outcome.flagged:
        return ""
    cores, why = (outcome.record.get("interference") or {}).get("foreign_cores"), outcome.flagged
    return (
        f" [under load: {cores:.1f} cores busy]"
        if "cores busy" in why and cores is not None
        else f" [under load: {why}]"
    )


class SweepConsole:
    def __init__(self, label: str):
        self.label, self.t0 = label, time.monotonic()

    def started(self, trial) -> None:
        if trial.bounded:
            say(f"  {self.label} {trial.bounded}")

    def epoch(self, trial, record: dict) -> bool:
        eta = (time.monotonic() - self.t0) / record["epoch"] * (record["epochs"] - record["epoch"])
        say(
            f"  {self.label} epoch {record['epoch']}/{record['epochs']}: acc {record['test_acc']:.3f}, "
            f"loss {record['train_loss']:.3f}, trial ETA {eta:.0f} s"
        )
        return False
