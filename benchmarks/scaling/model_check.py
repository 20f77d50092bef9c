"""Does the scaling model (pipeline/scaling/model.py) predict what this host measures? One command: measure, model,
compare, project.

    .venv/bin/python -m benchmarks.scaling.model_check [--rounds 3] [--steps 60] [--per-device-batch 256] [--json
    out.json]

1. Measures ddp, fsdp and scratch on LeNet at k = 1 and every k up to the host's N (run_trial, steady-state images/s,
   per-device batch b; the k values alternate within each round, so all see the same machine state).
2. Measures the collectives those strategies issue (pipeline/scaling/collectives.py) at k = 2..N.
3. Predicts every measured k > 1 from the k=1 compute time and the measured collectives only (nothing is fitted to
   the k > 1 trials), prints measured vs modelled weak-scaling efficiency and the error, and says MISS where the
   error exceeds the tolerance. The collectives as timed after a compute phase (how a step issues them) are the
   model's input; the back-to-back timings are shown beside them for sensitivity.
4. Projects k = 4 and 8 on this host (collectives extrapolated from the largest measured k) and on the nominal
   profiles of experiments/interconnects/nominal.yaml, with this host's k=1 compute. Every modelled number says so.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import base_cfg, ensure_data, host_line, med, parser, probe, resolve_source, trial
from pipeline.cli.types import count, positive
from pipeline.scaling import collectives, model
from pipeline.strategies import STRATEGIES

STRATEGY_NAMES = ("ddp", "fsdp", "scratch")
PRIMARY, OTHER = "after_compute", "back_to_back"


def _med(xs, what: str) -> float:
    """The median of `what`'s images/s; where no trial timed a step there is none, and nothing to check the model on."""
    m = med(xs)
    if m is None:
        sys.exit(f"{what}: no trial timed a step (every step inside the warm-up): no figure to check the model on")
    return m


def measure_trials(args, source, ks) -> dict:
    """strategy -> k -> {"img_s": [per round], "comm_hook_used", "parallel_devices"}."""
    b, out = args.per_device_batch, {}
    for r in range(args.rounds):
        for s in args.strategies:
            with tempfile.TemporaryDirectory() as tmp:
                for k in ks if r % 2 == 0 else ks[::-1]:  # alternate the order between rounds
                    cfg = base_cfg(
                        args.data,
                        source,
                        f"data.train_limit={k * b * (args.steps + 5)}",
                        "data.test_limit=500",
                        "train.warmup_steps=5",
                    )
                    m = trial(cfg, Path(tmp) / f"{k}", model="lenet", strategy=s, devices=k, batch_size=k * b)
                    e = out.setdefault(s, {}).setdefault(k, {"img_s": []})
                    e["img_s"].append(m["throughput_img_s"])
                    e.update(
                        comm_hook_used=m["comm_hook_used"],
                        parallel_devices=m["parallel_devices"],
                        bucket_cap_mb=m["bucket_cap_mb"],
                    )
            print(
                f"  round {r + 1}: {s} " + ", ".join(f"k={k} {out[s][k]['img_s'][-1]:,.0f} img/s" for k in ks),
                flush=True,
            )
    return out


def _predict(s, k, trials, ic, b, layout):
    one, at_k = trials[s][1], trials[s][k]
    transport = {"shm": "allreduce_shm", "none": "allreduce"}.get(at_k.get("comm_hook_used"))
    return model.predict(
        s,
        k,
        1 / _med(one["img_s"], f"{s} k=1"),
        ic,
        model="lenet",
        per_device_batch=b,
        layout=layout,
        bucket_cap_mb=at_k["bucket_cap_mb"],
        transport=transport,
        serial_replicas=not at_k["parallel_devices"],
    )


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def _ms(x):
    return f"{x * 1e3:7.2f} ms"


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=count("rounds"), default=3)
    p.add_argument("--steps", type=count("steps"), default=60, help="steady-state steps per trial")
    p.add_argument("--per-device-batch", type=count("per-device batch"), default=256)
    p.add_argument("--strategies", nargs="*", default=list(STRATEGY_NAMES))
    p.add_argument("--tolerance", type=positive("tolerance"), default=model.DEFAULT_TOLERANCE)
    p.add_argument("--json", type=Path, default=None, help="write every measured and modelled figure here")
    args = p.parse_args()
    host = probe()
    ks = list(range(1, host.n + 1))
    args.strategies = [s for s in args.strategies if STRATEGIES[s].unavailable_reason(host) is None]
    source = resolve_source(args)
    ensure_data(args.data, source)
    b = args.per_device_batch
    print(host_line(), f"| data: {source} | LeNet, per-device batch {b}, {args.rounds} rounds x {args.steps} steps")
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    print(
        f"load average before starting: {_load()} ({host.n} {host.kind} devices; above ~0.5 others are using them "
        f"and every timing below is disturbed)"
    )
    if host.n < 2:
        raise SystemExit("this host has one device: no k > 1 to check the model against")

    print("1. trials (measured, steady-state img/s):")
    trials = measure_trials(args, source, ks)
    print(f"2. collectives (measured, k = 2..{host.n}):")
    coll = collectives.measure(ks=ks[1:], model="lenet")
    for name, c in coll["collectives"].items():
        if not c["available"]:
            print(f"   {name:18s} unavailable: {c['reason']}")
            continue
        for k, by_mode in c["by_k"].items():
            for mode in (PRIMARY, OTHER):
                f = by_mode[mode]["fit"]
                trial_pts = [q for q in by_mode[mode]["points"] if q["in_trial"]]
                beta = f"{f['beta_Bps'] / 1e9:6.2f} GB/s" if f["beta_Bps"] else "  (flat)   "
                print(
                    f"   {name:18s} k={k} {mode:13s} alpha {f['alpha_s'] * 1e6:8.1f} us  beta {beta}  "
                    f"fit rel. rms {f['rel_rms']:.0%}  | at trial sizes: "
                    + ", ".join(
                        f"{q['bytes']:,} B median {q['median_s'] * 1e3:.2f} ms "
                        f"[{q['min_s'] * 1e3:.2f}-{q['max_s'] * 1e3:.2f}]"
                        for q in trial_pts[:3]
                    )
                    + (" ..." if len(trial_pts) > 3 else "")
                )
    print(f"   ({coll['wall_s']:.1f} s; {coll['settings']['reps']} repeats per size; {coll['settings']['timed']})")

    layout = model.model_layout("lenet")
    hosts = {m: model.from_collectives(coll, mode=m) for m in (PRIMARY, OTHER)}
    print(
        f"3. measured vs modelled weak-scaling efficiency (model fitted on k=1 compute + the measured collectives "
        f"only; tolerance {args.tolerance:.0%}):"
    )
    checks = []
    for s in args.strategies:
        one = trials[s][1]["img_s"]
        for k in ks[1:]:
            many = trials[s][k]["img_s"]
            measured = _med(many, f"{s} k={k}") / (k * _med(one, f"{s} k=1"))
            per_round = [m / (k * o) for o, m in zip(one, many)]
            pred = _predict(s, k, trials, hosts[PRIMARY], b, layout)
            alt = _predict(s, k, trials, hosts[OTHER], b, layout)
            c = model.check(pred, measured, args.tolerance)
            checks.append(
                {
                    "check": c,
                    "prediction": pred,
                    "back_to_back_prediction": alt,
                    "measured_img_s": {"k1": one, f"k{k}": many},
                }
            )
            transport = trials[s][k]["comm_hook_used"]
            print(
                f"   {s} k={k}{f' [{transport}]' if transport else ''}: measured {measured:6.1%} "
                f"(rounds {min(per_round):.1%}-{max(per_round):.1%}) | modelled {pred['efficiency']:6.1%} modelled"
                f" (step {_ms(pred['step_s'])} = compute {_ms(pred['compute_s'])} + exposed comm "
                f"{_ms(pred['exposed_comm_s'])}, all modelled) | error {c['rel_error']:+.1%} -> {c['verdict']}"
            )
            print(
                f"      with back-to-back collectives instead: {alt['efficiency']:6.1%} modelled "
                f"(exposed comm {_ms(alt['exposed_comm_s'])} modelled), error "
                f"{model.check(alt, measured, args.tolerance)['rel_error']:+.1%}"
            )

    print("4. projections (all modelled; this host's k=1 compute per image with each interconnect):")
    ics = {f"host ({PRIMARY}, extrapolated past k={host.n})": hosts[PRIMARY], **model.load_profiles()}
    projections = []
    for s in args.strategies:
        for label, ic in ics.items():
            row = []
            for k in (4, 8):
                # a profile is a GPU interconnect: there, scratch's replicas run in parallel
                serial = ic.kind == "measured" and not trials[s][ks[-1]]["parallel_devices"]
                transport = (
                    "allreduce_shm" if ic.kind == "measured" and trials[s][ks[-1]]["comm_hook_used"] == "shm" else None
                )
                pred = model.predict(
                    s,
                    k,
                    1 / _med(trials[s][1]["img_s"], f"{s} k=1"),
                    ic,
                    model="lenet",
                    per_device_batch=b,
                    layout=layout,
                    transport=transport,
                    serial_replicas=serial,
                )
                projections.append(pred)
                row.append(
                    f"k={k} E_w {pred['efficiency']:6.1%} modelled ({pred['throughput_img_s']:>9,.0f} img/s modelled)"
                )
            print(f"   {s:8s} {label:44s} " + " | ".join(row))
    print(f"load average at the end (1, 5, 15 min): {_load()} (this script's own ranks included)")
    misses = [c["check"] for c in checks if not c["check"]["within_tolerance"]]
    print(
        f"summary: {len(checks) - len(misses)} of {len(checks)} measured points within {args.tolerance:.0%} "
        f"(modelled vs measured)"
        + (
            "; MISSES: " + ", ".join(f"{c['strategy']} k={c['k']} {c['rel_error']:+.1%}" for c in misses)
            if misses
            else ""
        )
    )
    if host.kind == "cpu" and load0 >= 0.5:
        print(
            f"DISTURBED: other processes were using this host's cores (load average {load0:.2f} before starting, "
            f"{host.n} cores): the measured points, the collectives and so the errors above are not this host's "
            f"own figures; rerun on an idle machine before reading an error as the model's"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "trials": {s: {str(k): v for k, v in t.items()} for s, t in trials.items()},
                    "collectives": coll,
                    "checks": checks,
                    "projections": projections,
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
