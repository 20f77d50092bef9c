"""The trial record owns its schema: every field reaches every view it declares (metrics.json, MLflow params, metrics
and tags, Optuna's numeric attributes, the sweep table and the table read back), so a new field cannot be
half-wired; every view uses the field's (or derived value's) own name, never another; and summarize builds it from
the ranks' results."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from pipeline.records import derived, table, trial

VALUE = {"int": 3, "float": 1.5, "str": "x", "bool": True, "list": [2.0, 1.0]}
DICTS = {
    "breakdown": {"step_s": 0.1, "parts_s": dict.fromkeys(trial.BD_PARTS, 0.01), "residual_s": 0.04, "samples": 3},
    "interference": {
        "interfered": True,
        "foreign_cores": 0.5,
        "loadavg_start": 1.25,
        "interference_reason": "other processes",
    },
}


def _full() -> trial.TrialRecord:
    """A record with every field set, of its declared kind."""
    values = {
        f.name: DICTS[f.name] if f.name in DICTS else VALUE[trial._kind(f.type)]
        for f in dataclasses.fields(trial.TrialRecord)
    }
    return trial.TrialRecord(**values)


def _views(r: trial.TrialRecord) -> dict:
    return {
        trial.PARAM: r.params(),
        trial.METRIC: r.metrics(),
        trial.TAG: r.tags(),
        trial.OPTUNA: r.optuna_attrs(),
        trial.TABLE: r.table_row(),
    }


def _declared():
    """(name, view, key, expands) for every field and derived value, as declared: its key is its name."""
    for f in dataclasses.fields(trial.TrialRecord):
        for v in f.metadata["views"]:
            yield f.name, v, f.name, False
    for d in trial.DERIVED:
        for v in d.views:
            yield d.name, v, d.name, d.expand


def test_every_field_is_in_every_view_it_declares(tmp_path):
    r = _full()
    views = _views(r)
    table.write_rows([{**r.table_row(), "study": "s", "trial": 0, "state": "complete"}], tmp_path / "t.jsonl")
    back = table.typed(table.read_table(tmp_path / "t.jsonl")).iloc[0]
    checked = set()
    for name, view, key, expands in _declared():
        if view == trial.POINT:  # the analysis' view: it reads the field's sweep-table column
            assert any(
                f.name == name and trial.TABLE in f.metadata["views"] for f in dataclasses.fields(trial.TrialRecord)
            ) and len(trial.point_columns()) == len(set(trial.point_columns())), f"{name}: POINT needs the TABLE view"
            checked.add((name, view))
            continue
        got = views[view]
        keys = [k for k in got if k.startswith(key)] if expands else [key] if key in got else []
        assert keys, f"{name} declares view {view} as {key!r}, which its {view} view lacks"
        if view == trial.TABLE:
            assert key in trial.COLUMNS and key in back.index, f"{name}: column {key} not written or not read back"
            assert back[key] == pytest.approx(got[key]), f"{name}: column {key} changed on the way through the file"
        checked.add((name, view))
    assert {(f.name, v) for f in dataclasses.fields(trial.TrialRecord) for v in f.metadata["views"]} <= checked
    # metrics.json carries every field, and reads back as the same record
    assert set(r.to_json()) == {f.name for f in dataclasses.fields(trial.TrialRecord)}
    assert trial.TrialRecord.from_dict(json.loads(json.dumps(r.to_json()))) == r


def _own_name(key: str, r: trial.TrialRecord) -> bool:
    """`key` is a field's name, a derived value's, or an expanding derived value's name plus one of its dict's keys."""
    fields = {f.name for f in dataclasses.fields(trial.TrialRecord)}
    declared = {d.name: d for d in trial.DERIVED}
    if key in fields or (key in declared and not declared[key].expand):
        return True
    return any(d.expand and key.startswith(d.name) and key[len(d.name) :] in d.fn(r) for d in trial.DERIVED)


def test_every_view_uses_the_measurements_own_name():
    """No view renames a measurement: every key of every view of a fully filled record is a field's name or a
    derived value's (peak_mem_mib_dev0: peak_mem_mib_dev's device 0), so MLflow, Optuna and the sweep table agree."""
    r = _full()
    views = _views(r)
    assert all(views.values()), {v: len(got) for v, got in views.items()}
    for view, got in views.items():
        wrong = sorted(k for k in got if not _own_name(k, r))
        assert not wrong, f"the {view} view renames: {wrong}"
    # the sweep table's columns: the record's names and the Optuna trial's (ROW_COLUMNS), nothing else
    assert not [c for c in trial.COLUMNS if c not in trial.ROW_COLUMNS and not _own_name(c, r)]
    assert len({d.name for d in trial.DERIVED} | {f.name for f in dataclasses.fields(trial.TrialRecord)}) == len(
        trial.DERIVED
    ) + len(dataclasses.fields(trial.TrialRecord)), "a derived value shares a field's name"


def test_no_declaration_names_another_key():
    """`_f` and `_d` take no per-view key (metric="perf/wall_s", table="duration_s"): a declaration that tries
    one is refused, and none carries one."""
    for view in (trial.PARAM, trial.METRIC, trial.TAG, trial.OPTUNA, trial.TABLE, trial.POINT):
        with pytest.raises(TypeError):
            trial._f(trial.METRIC, **{view: "other_name"})
        with pytest.raises(TypeError):
            derived._d("x", "float", lambda r: None, trial.METRIC, **{view: "other_name"})
    assert all(set(f.metadata) == {"views", "rank"} for f in dataclasses.fields(trial.TrialRecord))
    assert {f.name for f in dataclasses.fields(derived.Derived)} == {"name", "kind", "fn", "views", "expand"}


def test_table_kinds_survive_the_file(tmp_path):
    r = _full()
    table.write_rows([r.table_row()], tmp_path / "t.jsonl")
    back = table.typed(table.read_table(tmp_path / "t.jsonl")).iloc[0]
    for col, kind in trial.table_kinds().items():
        if col in r.table_row():
            want = {"int": float, "float": float, "str": str, "bool": bool, "list": list}[kind]
            assert isinstance(back[col], want), (col, kind, type(back[col]))


def test_a_record_that_measured_nothing_leaves_views_empty_not_wrong(tmp_path):
    r = trial.TrialRecord(model="lenet", devices=2)
    assert r.metrics() == {} and r.optuna_attrs() == {}
    assert r.tags() == {"model": "lenet", "devices": "2"} and r.params()["devices"] == 2
    row = r.table_row()
    assert all(row[c] is None for c in trial.BD_COLUMNS) and row["peak_mem_mib"] is None
    table.write_rows([row], tmp_path / "t.jsonl")
    back = table.typed(table.read_table(tmp_path / "t.jsonl")).iloc[0]
    assert back["peak_mem_bytes"] == [] and back["host"] == "" and back["parallel_devices"] is None


def _rank(thr, windows=None, peaks=(100,), rank=0):
    out = {
        "throughput_img_s": thr,
        "peak_mem_bytes": list(peaks),
        "device_names": ["cpu"] * len(peaks),
        "rank": rank,
        "steps": 10,
        "stopped": False,
        "timed_steps": 8,
        "epoch_s": [1.0],
        "test_acc": [0.5],
        "train_loss": [1.0],
        "epoch_throughput_img_s": [100.0],
        "time_to_acc_s": None,
        "mem_method": "m",
        "amp_dtype": None,
    }
    if windows is not None:
        out["throughput_windows"] = windows
    return out


def test_summarize_takes_the_slowest_rank_window_by_window(make_cfg):
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.batch_size=64")
    host = SimpleNamespace(kind="cpu", n=2, name="cpu", hostname="h", torch="t", cuda="")
    ddp = SimpleNamespace(multiprocess=True, parallel_on_cpu=True)
    ranks = [_rank(90.0, [100.0, 80.0, 95.0], rank=0), _rank(85.0, [90.0, 85.0, 99.0], rank=1)]
    r = trial.summarize(cfg, host, ddp, ranks, 2.0, {"host_cpu_isa": "avx2"})
    assert r.throughput_windows == [90.0, 80.0, 95.0] and r.throughput_img_s == 85.0
    assert r.peak_mem_bytes == [100, 100] and r.mem_imbalance == 1.0 and r.host_cpu_isa == "avx2"
    assert r.table_row()["throughput_windows"] == [90.0, 80.0, 95.0]
    # ranks that report no windows: none to take; an older train() reports none at all
    assert trial.summarize(cfg, host, ddp, [_rank(90.0), _rank(85.0, [1.0, 2.0], rank=1)], 2.0).throughput_windows == [
        1.0,
        2.0,
    ]
    assert trial.summarize(cfg, host, ddp, [_rank(90.0), _rank(85.0, rank=1)], 2.0).throughput_windows == []


def test_capability_fields_keep_their_names_as_tags():
    caps = {
        "bf16": "native",
        "fp16": "emulated",
        "nccl": "2.21.5",
        "torch": "2.5",
        "cuda": "12.4",
        "cpu": {"isa": ["avx2", "avx512f"], "torch_cpu_capability": "AVX512", "bf16": "emulated", "fp16": "emulated"},
        "gpus": [{"name": "H100", "compute_capability": "9.0"}, {"name": "H100", "compute_capability": "9.0"}],
    }
    r = trial.TrialRecord(**trial.capability_fields(caps))
    tags, row = r.tags(), r.table_row()
    assert tags["host_cpu_isa"] == row["host_cpu_isa"] == "avx2,avx512f"
    assert tags["host_gpu_cc"] == row["host_gpu_cc"] == "9.0"
    assert tags["host_gpu_name"] == "H100" and tags["host_bf16"] == "native" and row["host_nccl"] == "2.21.5"
    assert "host_interconnect" not in tags and row["host_interconnect"] is None
