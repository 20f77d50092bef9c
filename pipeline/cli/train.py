"""`python -m pipeline train`: one training trial from the command line, logged as one MLflow run.

The flags (--model, --strategy, ...) are the last layer on top of params.yaml, the profile and --set, as typed
values: the trial's Config is built and validated once, here, and passed on as it is.
"""

from __future__ import annotations

import sys

from pipeline import paths
from pipeline.config import loader as configmod

FLAGS = ("model", "strategy", "devices", "batch_size", "lr", "epochs", "max_steps", "seed")  # each sets train.<name>


def _train_cfg(args):
    flags = {k: v for k in FLAGS if (v := getattr(args, k)) is not None}
    return configmod.load(args.params, args.overrides, flags={"train": flags}, sweeps=False)  # one run: no spaces


class EpochLines:
    """The trial's console listener (pipeline/trial/lifecycle.py): a line per epoch."""

    def epoch(self, trial, record) -> bool:
        print(
            f"epoch {record['epoch']}/{record['epochs']}: loss {record['train_loss']:.4f}, "
            f"test acc {record['test_acc']:.4f}, {record['epoch_s']:.2f} s",
            file=sys.stderr,
        )
        return False


def run(args) -> int:
    """`python -m pipeline train`: one trial, its MLflow run (unless --no-track), metrics.json and the final state."""
    from pipeline.trial import start

    cfg = _train_cfg(args)
    start.start_early(cfg.train.start_method)  # a forkserver's imports run beside this process's own

    from pipeline.host.devices import probe
    from pipeline.measure import meter
    from pipeline.preflight import output_dir
    from pipeline.trial.launch import check_batch_fits, check_feasible
    from pipeline.trial.lifecycle import Trial

    host = probe()
    check_feasible(cfg, host)  # before any work, before touching the stores
    from pipeline.data import store as data

    ds = data.load(paths.repo_root() / cfg.data.dir, cfg.data.source, cfg.data.train_limit, 1, verify=True)
    check_batch_fits(cfg, len(ds.train_y))
    output_dir(args.out, "--out")
    listeners, run = [], None
    if not args.no_track:
        from pipeline.records.trial import planned
        from pipeline.tracking import client as tracking
        from pipeline.tracking.run_listener import MlflowListener
        from pipeline.tracking.trial_run import TrialRun
        from pipeline.trial.launch import host_fields

        t = cfg.train
        run = TrialRun(tracking.Tracker(cfg), cfg, stage="train")
        plan = planned(cfg, host, host_fields(host, t.devices))
        listeners = [MlflowListener(run, f"{t.strategy} k={t.devices} B={t.batch_size} lr={t.lr}", plan), EpochLines()]
    # its run ended FINISHED, KILLED (Ctrl-C) or FAILED: never left RUNNING
    metrics = Trial(cfg, args.out, listeners, progress=not args.quiet).run()
    syn = "  [SYNTHETIC DATA]" if metrics["synthetic"] else ""
    print(
        f"{metrics['strategy']} k={metrics['devices']} {metrics['model']}: "
        f"{meter.speed_text(metrics)}, test acc {metrics['test_acc'][-1]:.4f}, "
        f"peak mem/device {[round(p / 2**20, 1) for p in metrics['peak_mem_bytes']]} MiB{syn}"
    )
    print(
        f"wrote {args.out / 'metrics.json'} and {args.out / 'final_state.pt'}"
        + (f"; MLflow run {run.run_id}" if run else "")
    )
    return 0
