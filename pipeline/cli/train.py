"""`python -m pipeline train`: one training trial from the command line, logged as one MLflow run.

The flags (--model, --strategy, ...) become `train.*` overrides on top of params.yaml, the profile and --set.
"""
from __future__ import annotations

import contextlib
import sys

from pipeline.config import loader as configmod
from pipeline import paths


def _train_cfg(args):
    sets = list(args.overrides)
    for flag, key in [("model", "model"), ("strategy", "strategy"), ("devices", "devices"),
                      ("batch_size", "batch_size"), ("lr", "lr"), ("epochs", "epochs"),
                      ("max_steps", "max_steps"), ("seed", "seed")]:
        v = getattr(args, flag)
        if v is not None:
            sets.append(f"train.{key}={v}")
    return configmod.load(args.params, sets)


def run(args) -> int:
    """`python -m pipeline train`: one trial, its MLflow run (unless --no-track), metrics.json and the final state."""
    from pipeline.host.devices import probe
    from pipeline.measure import meter
    from pipeline.trial.launch import check_batch_fits, check_feasible, run_trial
    from pipeline.preflight import output_dir
    cfg = _train_cfg(args)
    host = probe()
    check_feasible(cfg, host)  # before any work, before touching the stores
    from pipeline.data import store as data
    ds = data.load(paths.repo_root() / cfg.data.dir, cfg.data.source, cfg.data.train_limit, 1, verify=True)
    check_batch_fits(cfg, len(ds.train_y))
    output_dir(args.out, "--out")
    tracker = run_id = on_epoch = None
    if not args.no_track:
        from pipeline.tracking import client as tracking
        from pipeline.trial.launch import host_fields
        from pipeline.records.trial import planned
        tracker = tracking.Tracker(cfg)
        t, plan = cfg.train, planned(cfg, host, host_fields(host, cfg.train.devices))
        run_id = tracker.start_run(f"{t.strategy} k={t.devices} B={t.batch_size} lr={t.lr}",
                                   tracking.base_tags(plan, cfg, stage="train"))
        tracker.log_params(run_id, plan.params())
        tracker.log_dataset(run_id, cfg)

        def on_epoch(record):
            tracker.log_metrics(run_id, tracking.epoch_metrics(record), step=record["epoch"])
            print(f"epoch {record['epoch']}/{record['epochs']}: loss {record['train_loss']:.4f}, "
                  f"test acc {record['test_acc']:.4f}, {record['epoch_s']:.2f} s", file=sys.stderr)
            return False
    status, reason = "FAILED", ""
    try:
        with tracking.system_metrics(cfg, run_id) if tracker else contextlib.nullcontext():
            metrics = run_trial(cfg, args.out, on_epoch=on_epoch, progress=not args.quiet)
        untimed = meter.untimed(metrics)
        if tracker:
            tracking.log_completed_run(tracker, run_id, metrics, args.out)
            if untimed:
                tracker.set_tags(run_id, {"parallax.untimed": untimed})
        status = "FINISHED"
    except KeyboardInterrupt as e:
        status, reason = "KILLED", str(e) or "interrupted"
        raise
    except Exception as e:
        reason = f"{getattr(e, 'kind', type(e).__name__)}: {e}"
        raise
    finally:
        if tracker:
            tracker.close_run(run_id, status, reason)  # never left RUNNING, also when the store fails
    syn = "  [SYNTHETIC DATA]" if metrics["synthetic"] else ""
    print(f"{metrics['strategy']} k={metrics['devices']} {metrics['model']}: "
          f"{meter.speed_text(metrics)}, test acc {metrics['test_acc'][-1]:.4f}, "
          f"peak mem/device {[round(p / 2**20, 1) for p in metrics['peak_mem_bytes']]} MiB{syn}")
    print(f"wrote {args.out / 'metrics.json'} and {args.out / 'final_state.pt'}"
          + (f"; MLflow run {run_id}" if run_id else ""))
    return 0
