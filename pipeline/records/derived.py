"""The trial record's derived values: numbers computed from its fields (final accuracy, peaks in MiB, the step-time
breakdown's parts), each with its kind and the views it appears in; and the names of those views.
"""

from __future__ import annotations

from dataclasses import dataclass

JSON, PARAM, METRIC, TAG, OPTUNA, TABLE = "json", "param", "metric", "tag", "optuna", "table"
# POINT: a number the analysis carries per measured point (its median over the point's trials: points.point_table)
# and per strategy and k into metrics.json (<name>.S.kK); the field needs TABLE too
POINT = "point"
MIB = 2**20
# The step-time breakdown's parts (breakdown.py PARTS), one table column each: seconds per sampled step
BD_PARTS = ("data", "forward", "backward_compute", "comm_exposed", "optimizer", "idle")


@dataclass(frozen=True)
class Derived:
    """A value computed from the record's fields; `expand`: a dict whose keys are appended to its name."""

    name: str
    kind: str
    fn: object
    views: tuple
    expand: bool


def _mean(xs):
    xs = [x for x in xs or [] if x is not None]
    return sum(xs) / len(xs) if xs else None


def _peaks(r) -> list:
    return [p for p in r.peak_mem_bytes or [] if p is not None]


def _mib_per_device(values) -> dict:
    return {str(i): v / MIB for i, v in enumerate(values or []) if v is not None}


def _bd(r) -> dict:
    """The breakdown where the trial sampled a step, else {}."""
    bd = r.breakdown or {}
    return bd if bd.get("samples") and bd.get("step_s") is not None else {}


def breakdown_metrics(bd: dict) -> dict:
    """<part>_s and <part>_share (of the sampled step), the residual included, step_s and samples."""
    parts = dict(bd.get("parts_s") or {})
    if not bd.get("step_s") or not parts:
        return {}
    parts["residual"] = bd.get("residual_s")
    out = {"step_s": bd["step_s"], "samples": bd["samples"]}
    for name, s in parts.items():
        if isinstance(s, (int, float)):
            out[f"{name}_s"], out[f"{name}_share"] = s, s / bd["step_s"]
    return out


def sampled_breakdown(r) -> dict:
    """The record's breakdown as breakdown_metrics gives it, {} where the trial sampled no step."""
    return breakdown_metrics(_bd(r))


def _bd_cell(key: str):
    return lambda r: (_bd(r).get("parts_s") or {}).get(key[:-2]) if key[:-2] in BD_PARTS else _bd(r).get(key)


def _d(name, kind, fn, *views, expand=False):
    """A derived value, the views it appears in, under its own name in every one (an `expand` dict: the name plus
    each of its keys, peak_mem_mib_dev0); no view renames it."""
    return Derived(name, kind, fn, views, expand)


DERIVED = (
    _d("final_test_acc", "float", lambda r: (r.test_acc or [None])[-1], TABLE, METRIC, OPTUNA),
    _d("final_train_loss", "float", lambda r: (r.train_loss or [None])[-1], TABLE),
    _d("mean_epoch_s", "float", lambda r: _mean(r.epoch_s), TABLE, OPTUNA),
    # the largest device's peak, in MiB: its one name in every view and store (the sweep table, MLflow, Optuna, the
    # analysis' memory table and memory.csv, metrics.json, the report); peak_mem_mib_devN: each device's
    _d("peak_mem_mib", "float", lambda r: max(_peaks(r)) / MIB if _peaks(r) else None, TABLE, OPTUNA, METRIC),
    _d("peak_mem_mean", "float", lambda r: _mean(_peaks(r)), TABLE),
    _d("peak_mem_mib_dev", "dict", lambda r: _mib_per_device(r.peak_mem_bytes), METRIC, expand=True),
    *(
        _d(name, "dict", lambda r, field=field: _mib_per_device(getattr(r, field)), METRIC, expand=True)
        for name, field in (
            ("mem_resident_mib_dev", "mem_resident_bytes"),
            ("mem_workspace_mib_dev", "mem_workspace_bytes"),
            ("mem_reserved_peak_mib_dev", "mem_reserved_peak_bytes"),
            ("mem_nvml_used_mib_dev", "mem_nvml_used_bytes"),
        )
    ),
    _d(
        "mem_device0_excess_mib",
        "float",
        lambda r: r.mem_device0_excess / MIB if r.mem_device0_excess is not None else None,
        METRIC,
    ),
    # of the breakdown, two numbers are metrics; its parts are one table per trial (TrialRecord.breakdown_parts)
    _d("sampled_step_s", "float", lambda r: _bd(r).get("step_s"), METRIC),
    _d("comm_exposed_share", "float", lambda r: breakdown_metrics(_bd(r)).get("comm_exposed_share"), METRIC),
    *(
        _d(f"bd_{key}", "float", _bd_cell(key), TABLE)
        for key in ("step_s", *(f"{p}_s" for p in BD_PARTS), "residual_s", "samples")
    ),
    _d("interfered", "bool", lambda r: (r.interference or {}).get("interfered"), TABLE),
    # the same flag as a number, on the trial's MLflow run (metric `flagged`) and in Optuna (plottable): 1 or 0
    _d(
        "flagged",
        "float",
        lambda r: None if r.interference is None else float(bool(r.interference.get("interfered"))),
        METRIC,
        OPTUNA,
    ),
    _d("foreign_cores", "float", lambda r: (r.interference or {}).get("foreign_cores"), TABLE, OPTUNA),
    _d("loadavg_start", "float", lambda r: (r.interference or {}).get("loadavg_start"), TABLE),
    _d("interference_reason", "str", lambda r: (r.interference or {}).get("interference_reason"), TABLE),
)
BD_COLUMNS = [d.name for d in DERIVED if d.name.startswith("bd_")]
