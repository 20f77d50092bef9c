"""What optuna-dashboard shows of a sweep's study: only the dimensions that vary are Optuna parameters (so its
hyperparameter importances list no constant at 0.00), the constant ones are the study's attribute `constants`, and
every reader of a point (the sweep table, the study's metrics) still gets it whole, also from a study whose older
trials have the constants among their params."""

from __future__ import annotations

import json
import warnings

import optuna
from optuna.trial import TrialState

from pipeline.records.table import POINT_KEYS, point_of
from pipeline.sweep.space import Space, constants
from pipeline.sweep.stage import load_study, run_sweep

TWO_LRS = [
    "sweep.strategies=[single]",
    "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1, 0.2]}",
    "train.epochs=1",
    "data.train_limit=256",
    "data.test_limit=128",
]


def _study(cfg):
    return load_study(cfg, "single")


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_only_the_dimensions_that_vary_are_optuna_parameters(make_cfg, tmp_path):
    """lr varies, the rest is constant: each trial's params are {lr}, its whole point (point_of) has every dimension
    of the space, the study's `constants` names each constant with its value, and the importances list lr alone."""
    cfg = make_cfg(*TWO_LRS)
    out = tmp_path / "single.jsonl"
    run_sweep(cfg, "single", out)
    study = _study(cfg)
    space = Space(cfg, "single").choices
    fixed = constants(space)
    assert set(space) - set(fixed) == {"lr"} and {"model", "devices", "batch_size", "optimizer"} <= set(fixed)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 2
    for t in complete:
        assert set(t.params) == {"lr"}, t.params
        point = point_of(t)
        assert set(point) == set(space) and {k: point[k] for k in fixed} == fixed
    assert sorted(point_of(t)["lr"] for t in complete) == [0.1, 0.2]
    shown = study.user_attrs["constants"].split(", ")
    assert shown == [f"{k}={v}" for k, v in fixed.items()] and not any(s.startswith("lr=") for s in shown)
    rows = [r for r in _rows(out) if r["state"] == "complete"]
    assert len(rows) == 2 and all(r[k] is not None for r in rows for k in POINT_KEYS if k in space)
    assert set(optuna.importance.get_param_importances(study)) == {"lr"}


def test_a_study_whose_older_trials_list_the_constants_resumes(make_cfg, tmp_path, monkeypatch):
    """A study made when every dimension was suggested (one trial run so) resumes: the next trial suggests lr alone,
    with no Optuna warning about its enqueued point's other keys, and both rows are whole. (The older trial keeps its
    constant params: Optuna's importances over such a study still list them.)"""
    cfg = make_cfg(*TWO_LRS)
    out = tmp_path / "single.jsonl"
    real = Space.suggest

    def every_dimension(space, trial):  # what the sweep did before
        return {k: trial.suggest_categorical(k, vals) for k, vals in space.choices.items()}

    monkeypatch.setattr(Space, "suggest", every_dimension)
    run_sweep(cfg, "single", out, max_new_trials=1)
    monkeypatch.setattr(Space, "suggest", real)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_sweep(cfg, "single", out)
    said = [str(w.message) for w in caught if "parameter" in str(w.message).lower()]
    assert not said, said
    older, newer = study_trials = _study(cfg).get_trials(states=(TrialState.COMPLETE,))
    assert set(older.params) == set(Space(cfg, "single").choices) and set(newer.params) == {"lr"}
    assert [point_of(t) for t in study_trials] == [
        {**point_of(older), "lr": 0.1},
        {**point_of(older), "lr": 0.2},
    ]
    rows = [r for r in _rows(out) if r["state"] == "complete"]
    assert [(r["lr"], r["batch_size"], r["devices"]) for r in rows] == [(0.1, 64, 1), (0.2, 64, 1)]
