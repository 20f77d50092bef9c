"""The scaling model in the analysis stage: every number here is modelled (pipeline/scaling/model.py), never measured.

For each strategy with a measured k=1 point and a measured k > 1 point at the same per-device batch, the model is
fitted only on the k=1 trial's compute per image (1 / its throughput) and an interconnect's collectives, then
  - checked at every measured k > 1 against the measured weak-scaling efficiency, with the host's own collectives
    (results/collectives.json, written by pipeline/scaling/collectives.py; the analysis never launches processes to
    measure them): no host measurement, no error printed, and the notes say so;
  - projected to k = 4 and 8 on the host's collectives (extrapolated) when measured, and on the nominal
    interconnect profiles (experiments/interconnects/nominal.yaml) always.
Pure: tables and a parsed JSON dict in, a table and notes out (on points.py and scaling/model.py).
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline import catalog
from pipeline.analysis.tables.points import EXTRAS, group_by, is_serial
from pipeline.scaling.model import DEFAULT_TOLERANCE, check, from_collectives, load_profiles, model_layout, predict

PROJECT_KS = (4, 8)
COLUMNS = [
    "strategy",
    "model",
    "per_device_batch",
    *EXTRAS,
    "k",
    "role",
    "basis",
    "interconnect",
    "interconnect_kind",
    "modelled_efficiency",
    "modelled_step_s",
    "modelled_exposed_comm_s",
    "measured_efficiency",
    "rel_error",
    "tolerance",
    "within_tolerance",
    "verdict",
]
COLLECTIVES_HOWTO = "dvc repro -s collectives (or: python -m pipeline collectives)"


def host_interconnect(collectives: dict | None):
    """This host's measured interconnect (collectives timed after compute, as a step issues them), or None."""
    if not collectives:
        return None
    return from_collectives(collectives, mode="after_compute")


def _num(v, default):
    try:
        f = float(v)
        return default if math.isnan(f) else f
    except (TypeError, ValueError):
        return default


def _transport(df, strategy, k):
    """The all-reduce that carried DDP's buckets in the measured trials at k (comm_hook_used), else the default."""
    if "comm_hook_used" not in df:
        return None
    used = set(
        df.loc[(df["strategy"] == strategy) & (df["k"] == k) & (df["state"] == "complete"), "comm_hook_used"].astype(
            str
        )
    ) - {"", "nan"}
    return {"shm": "allreduce_shm", "none": "allreduce"}.get(used.pop()) if len(used) == 1 else None


def model_table(
    df, eff, collectives: dict | None = None, tolerance: float = DEFAULT_TOLERANCE, project_ks=PROJECT_KS
) -> tuple[pd.DataFrame, list[str]]:
    """Modelled checks at measured k and projections (see the module docstring); notes say what was not modelled."""
    host = host_interconnect(collectives)
    profiles = load_profiles()
    notes = (
        []
        if host
        else [
            "No measurement of this host's collectives (results/collectives.json): the model's error at measured k "
            "is not computed, and projections use the nominal interconnect profiles only (modelled, not measured "
            f"anywhere here). Measure them with: `{COLLECTIVES_HOWTO}`."
        ]
    )
    w = eff[(eff["kind"] == "weak") & eff["throughput_img_s"].notna()] if len(eff) else eff
    rows: list = []
    layouts: dict = {}
    for key, g in group_by(w, ("strategy", "model", "per_device_batch", *EXTRAS)):
        ref = dict(zip(("strategy", "model", "per_device_batch", *EXTRAS), key))
        one, many = g[g["k"] == 1], g[(g["k"] > 1) & g["efficiency"].notna()]
        if one.empty or many.empty or catalog.is_one_device_only(ref["strategy"]):
            continue
        s, model, b = ref["strategy"], ref["model"], int(ref["per_device_batch"])
        try:
            layout = layouts.setdefault(model, model_layout(model))
        except KeyError:
            notes.append(f"{s} {model}: the model has no layout for {model!r}; not modelled")
            continue
        kw = dict(
            model=model,
            per_device_batch=b,
            layout=layout,
            bucket_cap_mb=_num(ref["bucket_cap_mb"], 25.0),
            comm_hook=ref["comm_hook"] or "none",
            accum_steps=int(_num(ref["accum_steps"], 1)),
        )
        c1 = 1 / one["throughput_img_s"].iloc[0]

        def add(k, ic, role, measured=math.nan, serial=False, transport=None):
            try:
                p = predict(s, int(k), c1, ic, serial_replicas=serial, transport=transport, **kw)
            except (KeyError, ValueError) as e:
                notes.append(f"{s} at k={k:g} on {ic.name}: not modelled ({str(e).strip(chr(34))})")
                return
            r = {
                **ref,
                "k": k,
                "role": role,
                "basis": "modelled",
                "interconnect": ic.name,
                "interconnect_kind": ic.kind,
                "modelled_efficiency": p["efficiency"],
                "modelled_step_s": p["step_s"],
                "modelled_exposed_comm_s": p["exposed_comm_s"],
                "measured_efficiency": measured,
                "rel_error": math.nan,
                "tolerance": tolerance,
                "within_tolerance": None,
                "verdict": "",
            }
            if not math.isnan(measured):
                c = check(p, measured, tolerance)
                r.update(rel_error=c["rel_error"], within_tolerance=c["within_tolerance"], verdict=c["verdict"])
            rows.append(r)

        last = many.sort_values("k").iloc[-1]
        for r in many.to_dict("records"):
            if host and not r.get("comparable", True):  # tables/comparable.py: no measured figure to check against
                notes.append(
                    f"{s} at k={r['k']:g} (b={b}): the modelled error is not computed: its measured efficiency "
                    f"divides figures measured under loads that are not comparable on this host (docs/metrics.md, "
                    '"Like against like")'
                )
            elif host:
                add(r["k"], host, "check", r["efficiency"], is_serial(r), _transport(df, s, r["k"]))
        for k in (k for k in project_ks if k not in set(many["k"])):
            if host:
                add(k, host, "projection", serial=is_serial(last), transport=_transport(df, s, last["k"]))
            for ic in profiles.values():  # a GPU interconnect: replicas run in parallel there
                add(k, ic, "projection")
    return pd.DataFrame(rows, columns=COLUMNS), notes
