"""Analysis formulas on hand-made sweep tables with known answers; outputs of one full run."""

import math

import pandas as pd
import pytest

from pipeline.analysis import stage


def row(strategy="ddp", k=1, B=128, lr=0.1, thr=1000.0, acc=0.8, state="complete", reason="", peaks=None, **kw):
    """One sweep-table row, as records/table.py writes it (typed: lists are lists, absent is None)."""
    peaks = peaks if peaks is not None else [100 * 2**20] * k
    r = {
        "study": f"s-{strategy}",
        "trial": 0,
        "strategy": strategy,
        "model": "lenet",
        "devices": k,
        "batch_size": B,
        "per_device_batch": B // k,
        "lr": lr,
        "epochs": 2,
        "state": state,
        "reason": reason,
        "data_source": "fashion-mnist",
        "device_kind": "cuda",
        "device_name": "H100",
        "host": "node1",
        "host_devices": 4,
        "parallel_devices": True,
        "oversubscribed": False,
        "throughput_img_s": thr if state == "complete" else None,
        "mean_epoch_s": 1.0,
        "epoch_s": [1.0, 1.0],
        "final_test_acc": acc if state == "complete" else None,
        "test_acc": [acc - 0.1, acc],
        "time_to_acc_s": None,
        "target_acc": 0.85,
        "final_train_loss": 0.5,
        "peak_mem_bytes": peaks,
        "mem_method": "cuda_max_allocated",
        "wall_s": 3.0,
        "mlflow_run_id": "x",
        "bucket_cap_mb": None,
        "grad_as_bucket_view": None,
        "accum_steps": None,
        "comm_hook": None,
    }
    r.update(kw)
    return r


def frame(rows):
    return stage._normalize(pd.DataFrame(rows), "x")


def write(rows, path):
    """Rows into a sweep table file, through the sweep's own writer."""
    from pipeline.records.table import write_rows

    write_rows(rows, path)


def one(df, **where):
    m = df
    for c, v in where.items():
        m = m[m[c] == v]
    assert len(m) == 1, m
    return m.iloc[0]


def test_weak_efficiency_and_speedup():
    df = frame([row(k=1, B=128, thr=1000), row(k=2, B=256, thr=1800), row(k=4, B=512, thr=3200)])
    e = stage.scaling_table(df)
    assert one(e, kind="weak", k=2)["efficiency"] == pytest.approx(0.9)
    assert one(e, kind="weak", k=2)["speedup"] == pytest.approx(1.8)
    assert one(e, kind="weak", k=4)["efficiency"] == pytest.approx(0.8)
    assert one(e, kind="weak", k=1)["efficiency"] == pytest.approx(1.0)
    # B=256 at k=2 has no k=1 point at B=256: strong efficiency undefined, not 0
    assert math.isnan(one(e, kind="strong", k=2)["efficiency"])


def test_strong_efficiency():
    df = frame([row(k=1, B=256, thr=1000), row(k=2, B=256, thr=1500)])
    e = stage.scaling_table(df)
    s = one(e, kind="strong", k=2)
    assert s["efficiency"] == pytest.approx(0.75) and s["speedup"] == pytest.approx(1.5)
    assert s["per_device_batch"] == 128


def test_throughput_is_median_over_lrs_and_accuracy_from_best_lr():
    df = frame(
        [
            row(k=1, lr=0.01, thr=900, acc=0.70),
            row(k=1, lr=0.1, thr=1000, acc=0.90),
            row(k=1, lr=1.0, thr=1300, acc=0.60),
            row(k=1, lr=3.0, state="failed", reason="NaN loss"),
        ]
    )
    p = one(stage.point_table(df), k=1)
    assert p["throughput_img_s"] == pytest.approx(1000)  # median(900, 1000, 1300); failed ignored
    assert p["final_test_acc"] == pytest.approx(0.90) and p["best_lr"] == pytest.approx(0.1)
    assert p["n_trials"] == 3


def test_lr_does_not_split_scaling_points():
    df = frame(
        [
            row(k=1, lr=0.1, thr=1000),
            row(k=1, lr=0.2, thr=1000),
            row(k=2, B=256, lr=0.1, thr=1700),
            row(k=2, B=256, lr=0.2, thr=1900),
        ]
    )
    assert one(stage.scaling_table(df), kind="weak", k=2)["efficiency"] == pytest.approx(0.9)


def test_knob_settings_are_distinct_points():
    df = frame(
        [
            row(k=1, thr=1000, bucket_cap_mb=25),
            row(k=2, B=256, thr=1800, bucket_cap_mb=25),
            row(k=1, thr=1000, bucket_cap_mb=100),
            row(k=2, B=256, thr=1600, bucket_cap_mb=100),
        ]
    )
    w = stage.scaling_table(df)
    w = w[(w["kind"] == "weak") & (w["k"] == 2)]
    assert sorted(w["efficiency"].round(3)) == [0.8, 0.9]
    assert stage._shown(df) == ["bucket_cap_mb"]


def test_missing_k1_gives_undefined_efficiency():
    df = frame([row(strategy="fsdp", k=2, B=256, thr=1800), row(strategy="fsdp", k=4, B=512, thr=3000)])
    e = stage.scaling_table(df)
    assert len(e) == 4 and e["efficiency"].isna().all() and e["speedup"].isna().all()
    m = stage._strategy_metrics("fsdp", stage.point_table(df), e, stage.memory_table(df))
    assert m["weak_efficiency"] is None and m["strong_efficiency"] is None
    assert m["best_throughput_img_s"] == 3000


def test_memory_imbalance_and_device0_excess():
    mib = 2**20
    df = frame(
        [
            row(strategy="dp", k=4, B=512, peaks=[400 * mib, 100 * mib, 100 * mib, 100 * mib]),
            row(strategy="dp", k=1, B=128, peaks=[250 * mib]),
        ]
    )
    m = stage.memory_table(df)
    r = one(m, k=4)
    assert r["mem_imbalance"] == pytest.approx(400 / 175)
    assert r["dev0_excess_bytes"] == pytest.approx(300 * mib)
    r1 = one(m, k=1)
    assert math.isnan(r1["dev0_excess_bytes"]) and r1["mem_imbalance"] == pytest.approx(1.0)
    long = stage.memory_devices(m)
    assert list(one(long, k=4, device=0)[["peak_mem_bytes", "peak_mem_mib_dev", "peak_mem_mib"]]) == [
        400 * mib,
        400.0,
        400.0,
    ]
    assert one(long, k=4, device=1)["peak_mem_mib_dev"] < one(long, k=4, device=1)["peak_mem_mib"] == 400.0


def test_memory_peaks_median_over_trials():
    df = frame([row(k=2, B=256, lr=lr, peaks=p) for lr, p in ((0.1, [10, 6]), (0.2, [12, 8]), (0.3, [30, 7]))])
    r = one(stage.memory_table(df), k=2)
    assert r["peak_mem_bytes"] == [12, 7] and r["dev0_excess_bytes"] == 5


def test_failed_and_oversubscribed_rows_are_excluded():
    df = frame(
        [
            row(k=1, thr=1000),
            row(k=2, B=256, thr=1800),
            row(k=2, B=256, lr=0.5, state="failed", reason="CUDA out of memory"),
            row(k=4, B=512, thr=9999, peaks=[1, 1, 1, 1], oversubscribed=True),
            row(k=8, B=1024, thr=9999, oversubscribed=True),
        ]
    )
    for t in (stage.point_table(df), stage.scaling_table(df), stage.memory_table(df), stage.accuracy_table(df)):
        assert set(t["k"]) == {1, 2}
    assert one(stage.scaling_table(df), kind="weak", k=2)["efficiency"] == pytest.approx(0.9)


def test_accuracy_table_and_time_to_target():
    df = frame(
        [
            row(k=1, lr=0.1, acc=0.9, epoch_s=[2.0, 3.0], test_acc=[0.86, 0.9], time_to_acc_s=2.0),
            row(k=1, lr=0.5, acc=0.7, epoch_s=[2.0, 3.0], test_acc=[0.5, 0.7]),
        ]
    )
    a = stage.accuracy_table(df)
    assert one(a, lr=0.1)["time_to_acc_s"] == 2.0 and math.isnan(one(a, lr=0.5)["time_to_acc_s"])
    a = stage.accuracy_table(df, target_acc=0.88)  # recomputed from the per-epoch lists
    assert one(a, lr=0.1)["time_to_acc_s"] == 5.0 and math.isnan(one(a, lr=0.5)["time_to_acc_s"])
    assert one(a, lr=0.5)["final_test_acc"] == pytest.approx(0.7)


def test_tolerant_reading(tmp_path):
    # a table with few columns (an older writer's), one row without the flag; an empty one; a CSV of old
    (tmp_path / "old.jsonl").write_text(
        '{"strategy": "old", "devices": 1, "batch_size": 64, "state": "complete", "throughput_img_s": 500,'
        ' "oversubscribed": false}\n{"strategy": "old", "devices": 2, "batch_size": 128, "state": "complete",'
        ' "throughput_img_s": 900}\n'
    )
    (tmp_path / "dp.jsonl").write_text("")
    (tmp_path / "fsdp.csv").write_text("study,trial,strategy\n")
    df, notes = stage.load_sweeps(tmp_path, expected=("dp", "fsdp", "ddp"))
    assert len(df) == 2 and not df["oversubscribed"].any()
    assert df["peak_mem_bytes"].map(lambda p: p == []).all() and (df["host"] == "").all()
    assert one(stage.scaling_table(df), kind="weak", k=2)["efficiency"] == pytest.approx(0.9)
    text = " ".join(notes)
    assert "dp.jsonl is empty" in text and "fsdp.csv is a sweep table of an older Parallax" in text
    assert "'ddp'" in text and "'fsdp'" in text
    assert "'dp'" not in text  # empty, not missing
