"""The sweep's wait for a quiet moment (measure/quiet.py): bounded, says what it waits for, stops paying on a host
that stays busy, and measures load as interference.py does. Fake clock and probe: no real waiting."""

from __future__ import annotations

import pytest

from pipeline.measure import quiet
from pipeline.measure.quiet import QuietGate


class Fake:
    """A clock that advances one probe per probe, and a probe that returns the given loads (the last repeats)."""

    def __init__(self, loads, probe_s=1.0):
        self.t, self.loads, self.probes, self.probe_s = 0.0, list(loads), 0, probe_s

    def clock(self):
        return self.t

    def probe(self):
        self.t += self.probe_s
        self.probes += 1
        return self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]


def gate(fake, max_wait_s=10.0, **kw):
    return QuietGate(0.25, max_wait_s, probe=fake.probe, clock=fake.clock, probe_s=fake.probe_s, **kw)


def test_a_busy_host_is_waited_for_at_most_the_bound_and_the_wait_says_what_for():
    """A host that never quiets: the wait ends within sweep.quiet_wait_s, the trial is not held back, and the
    message names the threshold, both settings and the load it saw."""
    f = Fake([1.9])
    w = gate(f).wait()
    assert not w.quiet and w.waited_s <= 10.0 and f.probes == 10
    assert w.foreign_cores == 1.9
    for part in (
        "at most 0.25 cores busy",
        "train.interference_threshold",
        "up to 10 s",
        "sweep.quiet_wait_s",
        "still 1.90 cores busy elsewhere",
        "the trial runs now",
    ):
        assert part in w.text, part


def test_a_quiet_moment_ends_the_wait():
    """The wait ends at the first probe at or below the threshold; a host quiet at once costs one probe and says
    nothing."""
    f = Fake([1.5, 1.2, 0.1])
    w = gate(f).wait()
    assert w.quiet and f.probes == 3 and w.foreign_cores == 0.1 and "waited 3 s" in w.text
    f = Fake([0.0])
    w = gate(f).wait()
    assert w.quiet and f.probes == 1 and w.text == ""


def test_after_vain_waits_in_a_row_each_trial_probes_once_until_the_host_quiets():
    """On a host that stays busy the sweep stops paying the full wait after give_up_after vain waits (and says so
    on the last full one), and waits in full again once a probe finds it quiet."""
    f = Fake([2.0])
    g = gate(f, max_wait_s=5.0, give_up_after=2)
    assert not g.stays_busy and g.wait().waited_s == 5.0 and not g.stays_busy  # one vain wait of two
    assert g.wait().waited_s == 5.0 and g.stays_busy
    assert f.probes == 10
    w = g.wait()
    assert w.waited_s == 1.0 and f.probes == 11 and "host still busy" in w.text and g.stays_busy
    f.loads = [0.0]
    assert g.wait().quiet and g.vain == 0 and not g.stays_busy
    f.loads = [2.0]
    assert g.wait().waited_s == 5.0


@pytest.mark.parametrize("max_wait_s, load", [(0.0, 2.0), (10.0, None)])
def test_no_wait_when_off_or_not_measurable(max_wait_s, load):
    """quiet_wait_s 0 probes nothing; a host whose load cannot be measured (no /proc/stat) is not waited for."""
    f = Fake([load])
    w = gate(f, max_wait_s=max_wait_s).wait()
    assert w.quiet and w.text == "" and f.probes == (0 if max_wait_s == 0 else 1)


def test_the_probe_measures_other_processes_as_interference_does(monkeypatch):
    """foreign_cores is interference.Monitor's figure over the probe: the host's busy CPU time less this process
    tree's, per second of the window (here 3 s busy, 1 s of it ours, over 2 s: 1 core)."""
    from pipeline.measure import interference

    ticks = iter([(100.0, 0.0), (103.0, 0.0)])
    own = iter([10.0, 11.0])
    clock = iter([50.0] + [52.0] * 100)  # the window: 2 s
    monkeypatch.setattr(interference, "_proc_stat", lambda: next(ticks))
    monkeypatch.setattr(interference, "_own_cpu", lambda helpers=(): next(own))
    monkeypatch.setattr(interference.time, "monotonic", lambda: next(clock))
    assert quiet.foreign_cores(2.0, sleep=lambda s: None) == pytest.approx(1.0)
