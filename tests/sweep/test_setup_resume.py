"""A sweep's study set-up interrupted part-way (Ctrl-C, SIGKILL) is completed by the next run: every point of the
queue ends up in the study exactly once, the rerun does not wait for a creator that is gone, and its banner counts
the whole queue. No training: the sweep is run with --n-trials 0 (set-up only) on a throw-away SQLite store."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import optuna
import pytest

from pipeline.records.table import point_of
from pipeline.sweep import claims, stage
from pipeline.sweep.claims import storage_url
from pipeline.sweep.space import Space, points
from pipeline.sweep.stage import load_study, open_storage, run_sweep

SPACE = [
    "sweep.strategies=[single]",
    "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1, 0.2, 0.3]}",
    "sweep.repeats=2",
]  # 3 points x 2 repeats: 6 trials


def keys(study) -> list[str]:
    return sorted(
        json.dumps([point_of(t), t.user_attrs.get("repeat")], sort_keys=True) for t in study.get_trials(deepcopy=False)
    )


def interrupt_after(monkeypatch, n: int) -> None:
    """The n+1-th trial written to the store raises KeyboardInterrupt (Ctrl-C in the middle of the enqueueing)."""
    real, calls = optuna.storages.RDBStorage._create_new_trial, []

    def create_new_trial(self, *a, **k):
        calls.append(1)
        if len(calls) > n:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(optuna.storages.RDBStorage, "_create_new_trial", create_new_trial)


def test_a_rerun_completes_an_interrupted_set_up_with_every_point_once(make_cfg, tmp_path, monkeypatch, capsys):
    """Interrupted after 2 of 6 enqueues, the rerun (same store) adds the 4 missing trials, none twice, without
    waiting for the interrupted creator, marks the set-up complete, and its banner says 6 trials."""
    cfg = make_cfg(*SPACE)
    out = tmp_path / "single.jsonl"
    with monkeypatch.context() as m:
        interrupt_after(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(cfg, "single", out, max_new_trials=0)
    study = load_study(cfg, "single")
    assert len(study.trials) == 2 and "enqueued" not in study.user_attrs  # the truncated queue
    capsys.readouterr()

    def no_wait(s):
        raise AssertionError(f"the rerun waited {s} s for a set-up whose creator is gone")

    with monkeypatch.context() as m:
        m.setattr(time, "sleep", no_wait)
        run_sweep(cfg, "single", out, max_new_trials=0)
    err = capsys.readouterr().err
    study = load_study(cfg, "single")
    expected = sorted(json.dumps([p, r], sort_keys=True) for p, r in stage.enqueue_order(points(cfg, "single"), 2))
    assert keys(study) == expected  # every (point, repeat) once
    assert study.user_attrs["enqueued"] == 6 and study.user_attrs.get("mlflow_parent_run_id")
    assert "6 trial(s) to run" in err

    run_sweep(cfg, "single", out, max_new_trials=0)  # a third run: nothing more is added
    assert keys(load_study(cfg, "single")) == expected


@pytest.mark.timeout(120)
def test_a_set_up_whose_creator_is_alive_is_waited_for_then_completed_when_it_dies(make_cfg, monkeypatch):
    """A worker that finds the set-up incomplete while its creator (a live process on this host) is at work waits
    for it; once the creator is gone it completes the set-up itself."""
    from pipeline.sweep import study_setup

    cfg = make_cfg(*SPACE)
    storage = open_storage(storage_url(cfg))
    name = Space(cfg, "single").name
    study = optuna.create_study(study_name=name, storage=storage, direction="maximize")
    creator = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        study.set_user_attr(
            study_setup.SETUP_BY, {**claims.me(), "pid": creator.pid, "start": claims.start_time(creator.pid)}
        )
        killed = threading.Event()

        def kill_later():
            time.sleep(1.5)
            killed.set()
            creator.kill()

        threading.Thread(target=kill_later, daemon=True).start()
        study = study_setup.ready(study, lambda: optuna.load_study(study_name=name, storage=storage))
        assert killed.is_set()  # it waited while the creator lived
        assert "enqueued" not in study.user_attrs  # and hands back a study whose set-up is left to complete
        queue = stage.enqueue_order(points(cfg, "single"), 2)
        study_setup.complete(study, queue)
        assert keys(study) == sorted(json.dumps([p, r], sort_keys=True) for p, r in queue)
    finally:
        creator.kill()
        creator.wait()


def test_a_budget_that_grows_enqueues_the_new_part_and_says_so(make_cfg, tmp_path, capsys):
    """sweep.n_trials is the budget, not part of the study's identity: raised from 1 to 3 over the same study, the
    rerun enqueues the 2 new points' trials (the first kept, none twice) and says so; the study keeps its name."""
    out = tmp_path / "single.jsonl"
    small = make_cfg(*SPACE[:2], "sweep.n_trials=1")
    run_sweep(small, "single", out, max_new_trials=0)
    study = load_study(small, "single")
    assert len(study.trials) == 1 and study.user_attrs["enqueued"] == 1
    capsys.readouterr()

    grown = make_cfg(*SPACE[:2], "sweep.n_trials=3")
    assert Space(grown, "single").name == Space(small, "single").name
    run_sweep(grown, "single", out, max_new_trials=0)
    err = capsys.readouterr().err
    study = load_study(grown, "single")
    assert keys(study) == sorted(json.dumps([p, 0], sort_keys=True) for p in points(grown, "single"))
    assert study.user_attrs["enqueued"] == 3
    assert "its queue grew from 1 to 3 trial(s)" in err and "3 trial(s) to run" in err
