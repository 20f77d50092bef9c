"""`python -m pipeline train`: one training trial from the command line, logged as one MLflow run.

The flags (--model, --strategy, ...) are the last layer on top of params.yaml, the profile and --set, as typed
values: the trial's Config is built and validated once, here, and passed on as it is. A run never replaces an
earlier one's result: an --out that holds one is kept, and the run writes the next free OUT-2, OUT-3, ... (`fresh_out`).
The report's printed command passes its answer's figure (--answer-img-s, --answer-load-cores): the run's last line
says how its own figure compares, and whether either was measured under load (`verdict`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline import paths
from pipeline.config import loader

FLAGS = ("model", "strategy", "devices", "batch_size", "lr", "epochs", "max_steps", "seed")  # each sets train.<name>


def _train_cfg(args):
    flags = {k: v for k in FLAGS if (v := getattr(args, k)) is not None}
    return loader.load(args.params, args.overrides, flags={"train": flags}, sweeps=False)  # one run: no spaces


class EpochLines:
    """The trial's console listener (pipeline/trial/lifecycle.py): a line per epoch."""

    def epoch(self, trial, record) -> bool:
        print(
            f"epoch {record['epoch']}/{record['epochs']}: loss {record['train_loss']:.4f}, "
            f"test acc {record['test_acc']:.4f}, {record['epoch_s']:.2f} s",
            file=sys.stderr,
        )
        return False


def fresh_out(out: Path) -> Path:
    """The folder this run writes: `out` unless it holds an earlier run's metrics.json, else the first of OUT-2,
    OUT-3, ... that holds none (the earlier result is kept)."""
    n, path = 1, out
    while (path / "metrics.json").exists():
        n += 1
        path = out.with_name(f"{out.name}-{n}")
    return path


def _row(record) -> dict:
    """This run's figure as a row of the report's rule (tables/comparable.py): under load where interference.py
    flagged it, its busy cores NaN where they were not measured."""
    seen = record.get("interference") or {}
    cores = seen.get("foreign_cores")
    return {
        "under_load": bool(seen.get("interfered")),
        "load_cores": float(cores) if isinstance(cores, (int, float)) else float("nan"),
    }


def _answer(load_cores: float | None) -> dict:
    """The answer's figure as a row of the rule: --answer-load-cores absent (None) is quiet, nan under load with its
    busy cores not measured."""
    return {"under_load": load_cores is not None, "load_cores": load_cores}


def verdict(record, answer_img_s: float | None, answer_load_cores: float | None) -> str:
    """This run's images/s, labelled: under load when it was flagged, and against the answer's figure it reproduces
    when given ("1,540 img/s vs the answer's 1,513 (+1.8%)"), like against like by the report's own rule and in its
    words (tables/comparable.py): both quiet, or both under load with busy cores close enough, is compared, each
    side's condition said; otherwise comparable.not_comparable's sentence."""
    from pipeline.analysis.tables import comparable
    from pipeline.measure import meter

    thr, mine = record.get("throughput_img_s"), _row(record)
    if thr is None:  # nothing to compare: said, never a comparison dropped in silence
        answer = f"; no figure to compare with the answer's {answer_img_s:,.0f} img/s" if answer_img_s else ""
        return meter.speed_text(record) + answer
    own = f"{thr:,.0f} img/s"
    if answer_img_s is None:
        if not mine["under_load"]:
            return own
        return f"{own}, measured {comparable.condition(mine)} (not this host's quiet speed)"
    theirs, answer = f"the answer's {answer_img_s:,.0f}", _answer(answer_load_cores)
    if not comparable.comparable(mine, answer):
        return f"{own}, " + comparable.not_comparable([("this run", mine), (theirs, answer)])
    both = "both measured quietly"
    if mine["under_load"]:
        both = f"this run measured {comparable.condition(mine)}, the answer {comparable.condition(answer)}"
        both += ": comparable loads"
    return f"{own} vs {theirs} ({(thr / answer_img_s - 1) * 100:+.1f}%), {both}"


def run(args) -> int:
    """`python -m pipeline train`: one trial, its MLflow run (unless --no-track), metrics.json and the final state."""
    from pipeline.trial import start

    if args.answer_load_cores is not None and args.answer_img_s is None:  # a load of no figure compares nothing
        raise loader.ConfigError(
            "--answer-load-cores is the load of the answer's figure, --answer-img-s, which is not given: give both "
            "(the report's printed command does), or neither. Nothing was run."
        )
    cfg = _train_cfg(args)
    start.start_early(cfg.train.start_method)  # a forkserver's imports run beside this process's own

    from pipeline.host.devices import probe
    from pipeline.measure import meter
    from pipeline.preflight import output_dir
    from pipeline.trial.launch import check_batch_fits, check_feasible
    from pipeline.trial.lifecycle import How, Trial

    host = probe()
    check_feasible(cfg, host)  # before any work, before touching the stores
    from pipeline.data import store

    ds = store.load(paths.repo_root() / cfg.data.dir, cfg.data.source, cfg.data.train_limit, 1, verify=True)
    check_batch_fits(cfg, len(ds.train_y))
    out = fresh_out(args.out)
    if out != args.out:
        print(f"{args.out} holds an earlier result, kept: this run writes {out}", file=sys.stderr)
    output_dir(out, "--out")
    listeners, run = [], None
    if not args.no_track:
        from pipeline.records.trial import planned
        from pipeline.tracking import client
        from pipeline.tracking.run_listener import MlflowListener
        from pipeline.tracking.trial_run import TrialRun
        from pipeline.trial.launch import host_fields

        t = cfg.train
        run = TrialRun(client.Tracker(cfg), cfg, stage="train")
        plan = planned(cfg, host, host_fields(host, t.devices))
        listeners = [MlflowListener(run, f"{t.strategy} k={t.devices} B={t.batch_size} lr={t.lr}", plan), EpochLines()]
    # its run ended FINISHED, KILLED (Ctrl-C) or FAILED: never left RUNNING
    metrics = Trial(cfg, out, listeners, How(progress=not args.quiet)).run().record_or_raise()
    syn = "  [SYNTHETIC DATA]" if metrics["synthetic"] else ""
    speed = verdict(metrics, args.answer_img_s, args.answer_load_cores)
    print(
        f"{metrics['strategy']} k={metrics['devices']} {metrics['model']}: "
        f"{meter.speed_text(metrics)}{' [under load]' if _row(metrics)['under_load'] else ''}, "
        f"test acc {metrics['test_acc'][-1]:.4f}, "
        f"peak mem/device {[round(p / 2**20, 1) for p in metrics['peak_mem_bytes']]} MiB{syn}"
    )
    print(
        f"wrote {out / 'metrics.json'} and {out / 'final_state.pt'}"
        + (f"; MLflow run {run.run_id} (make ui, or {client.ui_command(cfg)})" if run else "")
    )
    print(f"result: {speed}")
    return 0
