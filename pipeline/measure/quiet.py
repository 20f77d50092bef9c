"""A bounded wait for a quiet moment before a timed trial, measuring load as interference.py does.

Before each trial the sweep probes, over `probe_s`, how many cores other processes keep busy (interference.Monitor:
the host's busy CPU time less this process tree's); at or below the flagging threshold the trial starts at once,
otherwise the probe repeats until `max_wait_s` have passed, then the trial starts anyway (and interference.py flags
it if the load stays). On a host that stays busy the sweep stops paying for the wait: after `give_up_after` vain
waits in a row each later trial gets one probe only, and a flagged trial is not re-measured
(sweep.remeasure_interfered), until a probe finds the host quiet again. The trials run in
enqueue order (a k=1 reference next to its k>1 points, sweep/stage.py enqueue_order), so a quiet moment found for
one tends to hold for its neighbours. The wait never fails a trial: no /proc/stat means no wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pipeline.measure.interference import Monitor

PROBE_S = 0.5  # one load measurement
GIVE_UP_AFTER = 3  # vain waits in a row after which a trial gets a single probe


def foreign_cores(probe_s: float = PROBE_S, sleep=time.sleep) -> float | None:
    """Cores other processes kept busy, on average, over the next probe_s seconds; None where not measurable."""
    with Monitor(devices_used=0) as m:
        sleep(probe_s)
    return m.result()["foreign_cores"]


@dataclass
class Waited:
    """One wait's outcome: whether the host was quiet when the trial started, the seconds waited, the last load
    measured (cores; None: not measurable) and a sentence that says so."""

    quiet: bool
    waited_s: float
    foreign_cores: float | None
    text: str


class QuietGate:
    """`gate.wait()` before each timed trial. probe: a callable returning foreign cores over one probe (injected in
    tests); clock: monotonic seconds."""

    def __init__(
        self,
        threshold: float,
        max_wait_s: float,
        probe=None,
        clock=time.monotonic,
        probe_s: float = PROBE_S,
        give_up_after: int = GIVE_UP_AFTER,
    ):
        self.threshold, self.max_wait_s, self.probe_s = threshold, max_wait_s, probe_s
        self.probe = probe or (lambda: foreign_cores(probe_s))
        self.clock, self.give_up_after, self.vain = clock, give_up_after, 0

    @property
    def stays_busy(self) -> bool:
        """The last give_up_after waits in a row found the host busy: a re-measure would meet the same load."""
        return self.vain >= self.give_up_after

    def wants(self) -> str:
        """What the gate waits for, in words."""
        return (
            f"other processes to keep at most {self.threshold:.2f} cores busy (train.interference_threshold), "
            f"up to {self.max_wait_s:.0f} s (sweep.quiet_wait_s)"
        )

    def wait(self) -> Waited:
        if self.max_wait_s <= 0:
            return Waited(True, 0.0, None, "")
        budget = self.probe_s if self.vain >= self.give_up_after else self.max_wait_s
        t0 = self.clock()
        load = self.probe()
        while load is not None and load > self.threshold and self.clock() - t0 + self.probe_s <= budget:
            load = self.probe()
        waited = self.clock() - t0
        if load is None:
            return Waited(True, waited, None, "")
        if load <= self.threshold:
            self.vain = 0
            text = (
                f"waited {waited:.0f} s for a quiet moment ({load:.2f} cores busy elsewhere)"
                if waited > self.probe_s * 1.5
                else ""
            )
            return Waited(True, waited, load, text)
        self.vain += 1
        if self.vain > self.give_up_after:
            text = (
                f"host still busy ({load:.2f} cores used by other processes): the trial runs now and is "
                f"flagged if the load stays"
            )
        else:
            text = (
                f"waited {waited:.0f} s for {self.wants()}; still {load:.2f} cores busy elsewhere: the trial "
                f"runs now and is flagged if the load stays"
                + (
                    f"; after {self.give_up_after} vain waits in a row later trials probe once and do not wait"
                    if self.vain == self.give_up_after
                    else ""
                )
            )
        return Waited(False, waited, load, text)
