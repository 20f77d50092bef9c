"""What a sweep trial says on stderr while it runs, as a listener of its life (pipeline/trial/lifecycle.py): why its
steps are capped, and each epoch's accuracy, loss and the trial's ETA. The trial's one-line outcome is the sweep's
(stage.py), from the study's listener; `under_load` is its mark for a trial measured under load."""

from __future__ import annotations

import sys
import time


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def under_load(record) -> str:
    """ " [under load: 1.3 cores busy]" after a flagged trial's img/s: the cores other processes kept busy while it
    was measured, or the flag's reason where something else flagged it (steal, a throttled GPU:
    measure/interference.py); "" for a trial measured quietly."""
    seen = record.get("interference") or {}
    if not seen.get("interfered"):
        return ""
    cores, why = seen.get("foreign_cores"), seen.get("interference_reason") or "the host was busy"
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
