"""The sweep's table: results/sweeps/<strategy>.csv, one row per trial (complete, failed, pruned, running) and per
point skipped on this host, rewritten atomically from the study after every trial."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from optuna.trial import TrialState

from .catalog import KNOBS
from .devices import probe

# The step-time breakdown (breakdown.py, metrics["breakdown"]) flat, one column per part: seconds per sampled step
BD_PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")
BD_COLUMNS = ["bd_step_s", *(f"bd_{p}_s" for p in BD_PARTS), "bd_residual_s", "bd_samples"]
CSV_COLUMNS = [
    "study", "trial", "strategy", "model", "devices", "batch_size", "per_device_batch", "lr", "epochs", "state",
    "reason", "data_source", "device_kind", "device_name", "host", "host_devices", "parallel_devices",
    "oversubscribed", "throughput_img_s", "epoch_s", "epoch_s_list", "test_acc", "test_acc_list",
    "time_to_acc_s", "target_acc", "train_loss", "peak_mem_bytes", "peak_mem_max", "peak_mem_mean",
    "mem_imbalance", "mem_method", "duration_s", "mlflow_run_id", *KNOBS, "comm_hook_used",
    "interfered", "foreign_cores", "loadavg_start", "interference_reason", *BD_COLUMNS]


def breakdown_cells(m: dict) -> dict:
    """metrics["breakdown"] as the bd_* cells; all empty where the trial sampled no step (or predates it)."""
    bd = m.get("breakdown") or {}
    parts = bd.get("parts_s") or {}
    if not bd.get("samples") or bd.get("step_s") is None:
        return dict.fromkeys(BD_COLUMNS, "")
    return {"bd_step_s": bd["step_s"], **{f"bd_{p}_s": parts.get(p, "") for p in BD_PARTS},
            "bd_residual_s": bd.get("residual_s", ""), "bd_samples": bd["samples"]}


def trial_row(study, strategy, t=None, point=None, reason="", state="skipped") -> dict:
    m = (t.user_attrs.get("metrics") if t else None) or {}
    p = dict(t.params) if t else dict(point)
    state = {TrialState.COMPLETE: "complete", TrialState.FAIL: "failed", TrialState.PRUNED: "pruned",
             TrialState.RUNNING: "running", TrialState.WAITING: "waiting"}[t.state] if t else state
    peaks = m.get("peak_mem_bytes") or []
    row = {"study": study.study_name, "trial": t.number if t else "", "strategy": strategy,
           "model": p.get("model"), "devices": p.get("devices"), "batch_size": p.get("batch_size"),
           "per_device_batch": p["batch_size"] // p["devices"] if p.get("devices") else "", "lr": p.get("lr"),
           "epochs": m.get("epochs", ""), "state": state,
           "reason": reason or (t.user_attrs.get("reason", "") if t else "") or (
               "worker_died: its sweep process stopped (heartbeat stale); the point was enqueued again"
               if t and t.state == TrialState.FAIL else ""),
           "peak_mem_bytes": json.dumps(peaks), "peak_mem_max": max(peaks) if peaks else "",
           "peak_mem_mean": sum(peaks) / len(peaks) if peaks else "", "mem_imbalance": m.get("mem_imbalance"),
           "epoch_s": sum(m["epoch_s"]) / len(m["epoch_s"]) if m.get("epoch_s") else "",
           "epoch_s_list": json.dumps(m.get("epoch_s", [])), "test_acc": (m.get("test_acc") or [""])[-1],
           "test_acc_list": json.dumps(m.get("test_acc", [])), "train_loss": (m.get("train_loss") or [""])[-1],
           "duration_s": m.get("wall_s", ""),
           "mlflow_run_id": t.user_attrs.get("mlflow_run_id", "") if t else ""}
    for k in ("data_source", "device_kind", "device_name", "host", "host_devices", "parallel_devices",
              "oversubscribed", "throughput_img_s", "time_to_acc_s", "target_acc", "mem_method"):
        row[k] = m.get(k, "")
    for k in KNOBS:
        row[k] = p.get(k, m.get(k, ""))
    inter = m.get("interference") or {}  # what else used the host during the trial (interference.py)
    row.update(interfered=inter.get("interfered", ""), foreign_cores=inter.get("foreign_cores"),
               loadavg_start=inter.get("loadavg_start"), interference_reason=inter.get("interference_reason", ""))
    row["comm_hook_used"] = m.get("comm_hook_used") or ""  # the transport used (not a group key)
    row.update(breakdown_cells(m))
    return {k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS}


def write_csv(study, strategy: str, skipped, out_csv: Path) -> None:
    host = probe()
    rows = [trial_row(study, strategy, t=t) for t in study.get_trials(deepcopy=False)
            if t.state != TrialState.WAITING]
    in_study = [t.system_attrs.get("fixed_params") or t.params for t in study.get_trials(deepcopy=False)]
    for p, why in skipped:
        if p in in_study:  # infeasible here, but queued by a larger host: its row is the trial's
            continue
        r = trial_row(study, strategy, point=p, reason=why)
        r.update(host=host.hostname, device_kind=host.kind, device_name=host.name, host_devices=host.n)
        rows.append(r)
    write_rows(rows, out_csv)


def write_rows(rows: list[dict], out_csv: Path) -> None:
    out_csv = Path(out_csv)
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_csv.with_suffix(f".csv.{os.getpid()}.tmp")  # per process: workers of one study share the CSV
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out_csv)  # atomic: a crash never leaves half a CSV
