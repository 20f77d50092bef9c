"""Repeats in alternating rounds: the order trials are enqueued and claimed, the study name, and re-measuring a
trial measured under interference. No training: prepare_study and claim on a throw-away SQLite store."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from pipeline.host.devices import probe
from pipeline.records.table import point_of
from pipeline.sweep import stage, worker
from pipeline.sweep.claims import claim, storage_url
from pipeline.sweep.space import Space

SPACE = ["sweep.spaces.ddp.devices=[1, 2]", "sweep.spaces.ddp.batch_size=[64, 128]", "sweep.spaces.ddp.lr=[0.1, 0.2]"]


class FakeTracker:
    def start_run(self, *a, **k):
        return "parent"

    def log_params(self, *a, **k):
        pass


def claimed_order(study):
    out = []
    while (t := claim(study)) is not None:
        out.append((point_of(study._storage.get_trial(t._trial_id)), t.user_attrs["repeat"]))
    return out


def _prepared(cfg, host):
    return stage.prepare_study(Space(cfg, "ddp"), host, FakeTracker(), stage.open_storage(storage_url(cfg)))


@pytest.fixture
def host():
    h = probe()
    if h.n < 2:
        pytest.skip("needs 2 devices for the k=2 points")
    return h


def test_rounds_run_every_point_once_each_with_k1_beside_its_k2(make_cfg, host):
    cfg = make_cfg(*SPACE, "sweep.repeats=3")
    study, feasible, skipped = _prepared(cfg, host)
    assert not skipped and len(feasible) == 8 and study.user_attrs["enqueued"] == 24
    order = claimed_order(study)  # the order workers take them in
    assert [(p, r) for p, r in order] == stage.enqueue_order(feasible, 3)
    for r in range(3):  # round r: trials r*8 .. r*8+7, every point once
        rnd = order[8 * r : 8 * (r + 1)]
        assert {rep for _, rep in rnd} == {r}
        assert sorted(map(str, (p for p, _ in rnd))) == sorted(map(str, feasible))
        lrs = [p["lr"] for p, _ in rnd]  # a group (one lr) runs together: its k=1 references next to its k=2 points
        assert lrs == sorted(lrs, key=lrs.index) and len(set(lrs[:4])) == 1
        assert {(p["devices"], p["batch_size"]) for p, _ in rnd[:4]} == {(1, 64), (1, 128), (2, 64), (2, 128)}


def test_one_repeat_enqueues_each_point_once_in_space_order(make_cfg, host):
    cfg = make_cfg(*SPACE)
    study, feasible, _ = _prepared(cfg, host)
    order = claimed_order(study)
    assert len(order) == len(feasible) and {r for _, r in order} == {0}
    assert sorted(map(str, (p for p, _ in order))) == sorted(map(str, feasible))


def test_repeats_name_a_new_study_and_one_repeat_keeps_the_old_name(make_cfg):
    one, default, two = (make_cfg(*SPACE, *s) for s in (["sweep.repeats=1"], [], ["sweep.repeats=2"]))
    assert Space(one, "ddp").name == Space(default, "ddp").name
    assert Space(two, "ddp").name != Space(one, "ddp").name


@pytest.mark.parametrize("bad", ["sweep.repeats=0", "sweep.remeasure_interfered=-1"])
def test_repeats_and_remeasure_are_validated(make_cfg, bad):
    from pipeline.config.loader import ConfigError

    with pytest.raises(ConfigError, match=bad.split("=")[0]):
        make_cfg(bad)


def test_an_interfered_trial_is_enqueued_again_up_to_the_limit(make_cfg):
    cfg = make_cfg("sweep.remeasure_interfered=1")
    study = optuna.create_study(storage=stage.open_storage(storage_url(cfg)), study_name="remeasure")
    p = {"devices": 1, "batch_size": 64, "lr": 0.1}
    study.enqueue_trial(p, user_attrs={"repeat": 1})
    interfered, quiet = "2 cores busy", ""  # the outcome's flag: why it counts as measured under load
    first = claim(study)
    assert worker.remeasure(cfg, study, first, p, quiet) == ""  # a quiet trial: nothing enqueued
    assert "enqueued again (1/1)" in worker.remeasure(cfg, study, first, p, interfered)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs == {"repeat": 1, "remeasure": 1, "remeasure_of": first.number}
    again = claim(study)
    assert worker.remeasure(cfg, study, again, p, interfered) == ""  # the limit reached: kept, not re-run
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_no_remeasure_on_a_host_that_stays_busy(make_cfg):
    """A flagged trial that ran after the quiet wait failed N times in a row (the worker marks it) is not enqueued
    again: the copy would meet the same load."""
    cfg = make_cfg("sweep.remeasure_interfered=1")
    study = optuna.create_study(storage=stage.open_storage(storage_url(cfg)), study_name="busy")
    p = {"devices": 1, "batch_size": 64, "lr": 0.1}
    study.enqueue_trial(p, user_attrs={"repeat": 1})
    first = claim(study)
    first.set_user_attr("host_stays_busy", 3)
    said = worker.remeasure(cfg, study, first, p, "2 cores busy")
    assert said == "; not re-measured: the host stayed busy through 3 quiet waits in a row"
    assert not study.get_trials(states=(TrialState.WAITING,))


def test_the_sweep_waits_for_a_quiet_moment_only_where_it_can_see_the_load(make_cfg, capsys):
    """Before each trial the sweep waits (bounded by sweep.quiet_wait_s) and says for what, once; off at 0, and off
    when SLURM runs the trials on other machines."""
    gate = stage._quiet_gate(make_cfg("sweep.quiet_wait_s=7", "train.interference_threshold=0.5"), "ddp")
    assert gate.max_wait_s == 7 and gate.threshold == 0.5
    assert "waiting for other processes to keep at most 0.50 cores busy" in capsys.readouterr().err
    assert stage._quiet_gate(make_cfg("sweep.quiet_wait_s=0"), "ddp") is None
    assert stage._quiet_gate(make_cfg("slurm.partition=gpu"), "ddp") is None


@pytest.mark.parametrize(
    "done, total, remeasures, shown",
    [
        (0, 8, 0, "1/8"),
        (8, 8, 1, "9/9 (8 planned + 1 re-measure)"),
        (9, 8, 2, "10/10 (8 planned + 2 re-measures)"),
        (3, 8, 2, "4/10 (8 planned + 2 re-measures)"),
        (15, 8, 0, "16/16"),
        (15, 8, 2, "16/16"),
    ],
)
def test_the_counter_counts_remeasures_and_never_passes_its_total(done, total, remeasures, shown):
    """The console's "trial n/total": re-measures extend the total and say so (never "14/8+6", which reads as an
    overflow); a count past even that reads n/n, never 16/8. The sweep ETA beside it times the N - n + 1 trials from
    this one on at the worker's pace, re-measures enqueued included (never "ETA 0 s" while one still waits)."""
    from pipeline.sweep.progress import counter, time_left

    assert counter(done, total, remeasures) == shown
    n, of = map(int, shown.split(" ")[0].split("/"))
    assert time_left(30.0, done, total, remeasures) == 30.0 * (of - n + 1)
    assert time_left(None, done, total, remeasures) is None  # no trial ran here yet: no pace
