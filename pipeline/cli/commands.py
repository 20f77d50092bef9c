"""What each command of `python -m pipeline` does: one cmd_NAME(args) per subcommand (parser.py builds them)."""

from __future__ import annotations

import os
import sys

from pipeline import paths
from pipeline.cli import stage_progress
from pipeline.cli.parser import build_parser
from pipeline.config import loader


def cmd_download(args) -> int:
    from pipeline.data import store
    from pipeline.preflight import output_dir

    cfg = loader.load(args.params, args.overrides)
    root = output_dir(paths.repo_root() / cfg.data.dir, "data.dir")  # a directory (the IDX files, manifest.json)
    manifest = store.prepare(root, cfg.data.source, cfg.data.mirror, progress=True)
    label = " (SYNTHETIC stand-in, not Fashion-MNIST)" if manifest["source"] == "synthetic" else ""
    print(f"data ready in {root}: source {manifest['source']}{label}, {len(manifest['files'])} files checked")
    return 0


def cmd_train(args) -> int:
    from pipeline.cli.train import run

    return run(args)


def cmd_sweep(args) -> int:
    from pipeline.preflight import output_table
    from pipeline.records import table
    from pipeline.sweep import unselected
    from pipeline.sweep.space import Space

    notes: list[str] = []
    cfg = loader.load(args.params, args.overrides, stage=True, notes=notes)  # its strategy: the stage's
    for note in notes:  # an axis set for a space of several groups: said once
        print(f"[sweep {args.strategy}] {note}", file=sys.stderr)
    loader.check_sweep(cfg)  # every sweep stage, selected or not: a knob a selected strategy cannot take
    default = paths.repo_root() / "results" / "sweeps" / f"{args.strategy}.jsonl"
    # never another file's content (a README, another strategy's table)
    out = output_table(args.out or default, "--out", args.strategy, lambda path: table.foreign(path, args.strategy))
    if not unselected.selected(cfg, args.strategy):  # its table, without loading torch, Optuna and MLflow
        unselected.write_table(Space(cfg, args.strategy), out)
        return 0
    from pipeline.sweep.stage import run_sweep
    from pipeline.tracking import client

    run_sweep(cfg, args.strategy, out, max_new_trials=args.n_trials)
    print(
        f"[sweep {args.strategy}] wrote {out}; its runs in MLflow: make ui, or {client.ui_command(cfg)}",
        file=sys.stderr,
    )
    return 0


def cmd_analyze(args) -> int:
    from pipeline.analysis.stage import analyze
    from pipeline.preflight import input_dir, output_dir
    from pipeline.tracking import client
    from pipeline.tracking.analysis_run import log_analysis_run

    cfg = loader.load(args.params, args.overrides)
    input_dir(
        args.sweeps,
        "--sweeps",
        "the sweep tables (*.jsonl), which the sweep stages write: run them first "
        "(`dvc repro`, or `python -m pipeline sweep --strategy S` per strategy S) or point --sweeps at them",
    )
    output_dir(args.out, "--out")  # a directory (report.md, CSVs, figures)
    summary = analyze(args.sweeps, args.out, target_acc=cfg.analyze.target_acc)
    run_id = log_analysis_run(cfg, summary, args.out)
    print(f"wrote {args.out}/report.md (MLflow run {run_id})")
    print(answer_screen((args.out / "report.md").read_text(), args.out, client.ui_command(cfg)))
    return 0


def answer_screen(report: str, out, ui: str) -> str:
    """What the pipeline's last stage leaves on screen: the report's answer (its section, down to the heading of its
    command, answer.COMMAND_HEADING) and where to look next (`ui`: MLflow's own command for the store,
    client.ui_command's)."""
    from pipeline.analysis.report.answer import COMMAND_HEADING

    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## Answer")), None)
    shown: list[str] = []
    if start is not None:
        for line in lines[start + 1 :]:
            if line.startswith("## ") or line == COMMAND_HEADING:
                break
            shown.append(line)
    body = "\n".join(shown).strip() or "(report.md has no answer section)"
    return (
        f"\n{body}\n\nNext: head -n 40 {out}/report.md (the answer and its command) · "
        f"make ui (every run in MLflow; {ui}) · "
        f".venv/bin/python -m pipeline compare (scaling efficiencies, experiments side by side)"
    )


def cmd_compare(args) -> int:
    from pipeline.cli import compare

    return compare.run(args)


def cmd_collectives(args) -> int:
    import json

    from pipeline.host.devices import probe
    from pipeline.preflight import output_result
    from pipeline.scaling.collectives import fit_bytes, measure

    settings = loader.load(args.params, args.overrides).collectives
    # a file (collectives.json), checked before the benchmark's seconds; never another file's content: a README
    output_result(args.out, "--out", "collectives", "measured", "a collectives result", "results/collectives.json")
    host = probe()
    if host.n < 2:
        result = {"measured": False, "reason": f"this host offers one {host.kind} device: no collective to time"}
    else:
        result = measure(
            reps=settings.reps,
            warmup=settings.warmup,
            gap_s=settings.gap_s,
            fit_bytes=fit_bytes(settings.fit_sizes),
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(args.out)
    print(f"wrote {args.out}" + ("" if result.get("measured", True) else f" ({result['reason']})"))
    return 0


def cmd_overlap(args) -> int:
    from pipeline.errors import interruption
    from pipeline.host.devices import probe
    from pipeline.measure.interference import Monitor
    from pipeline.preflight import check_store, output_dir
    from pipeline.scaling import overlap
    from pipeline.store_faults import root_cause
    from pipeline.tracking import client

    cfg = loader.load(args.params, args.overrides)
    output_dir(args.out, "--out")  # a directory (overlap.json, overlap.md)
    check_store(client.tracking_uri(cfg), "tracking.uri")  # before the experiments, not after them
    res = overlap.run(cfg, args.out, watch=Monitor)  # what else used the host meanwhile: labelled under load
    tracker = client.Tracker(cfg)
    host = probe()
    run_id = tracker.start_run(
        "overlap",
        {
            "stage": "overlap",
            "device_kind": host.kind,
            "host": host.hostname,
            "dvc_stage": "overlap",
            "under_load": res.get("under_load"),  # the measurements beside busy processes (overlap.md says so)
        },
    )
    c, m = res["concurrent"], res["communication"]
    try:
        tracker.log_params(run_id, res["settings"])
        tracker.log_metrics(
            run_id,
            {
                "overlap/A_s": c["A"]["median_s"],
                "overlap/B_s": c["B"]["median_s"],
                "overlap/both_s": c["both"]["median_s"],
                "overlap/ratio_both_to_sum": res["ratio_both_to_sum"],
                "overlap/comm_sequential_s": m["sequential"]["median_s"],
                "overlap/comm_overlapped_s": m["overlapped"]["median_s"],
                "overlap/comm_saving": res["comm_saving"],
            },
        )
        tracker.log_artifacts(run_id, args.out)
    except BaseException as e:  # Ctrl-C, SIGTERM (or DVC gone) or a store fault while logging: never left RUNNING
        signalled = interruption(e)
        tracker.close_run(run_id, "KILLED" if signalled else "FAILED", str(signalled or root_cause(e)))
        raise
    tracker.end_run(run_id)
    print((args.out / "overlap.md").read_text())
    return 0


def cmd_ui(args) -> int:
    from pipeline.cli import ui

    return ui.run(args)


def cmd_doctor(args) -> int:
    from pipeline.doctor import checks
    from pipeline.preflight import output_dir

    names = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in names if s not in loader.STRATEGY_NAMES]
    if bad or not names:
        raise loader.ConfigError(
            f"Unknown strategy `{bad[0] if bad else ''}` in --strategies. Valid: "
            f"{', '.join(loader.STRATEGY_NAMES)} (comma-separated)."
        )
    if twice := sorted({s for s in names if names.count(s) > 1}):
        raise loader.ConfigError(
            f"--strategies names `{twice[0]}` twice: each strategy is checked once. Name it once. Nothing was run."
        )
    if args.max_devices < 1 or args.steps < 1 or args.batch_per_device < 1:
        raise loader.ConfigError("--max-devices, --steps and --batch-per-device must be at least 1.")
    # the doctor checks the host, not a study: no profile's search spaces, only params.yaml and --set
    base = loader.load(args.params, ["profile=", "train.timeout_s=120", *args.overrides], sweeps=False)
    if why := checks.refusal(base, args.overrides, names):  # a setting no run takes: never dropped unsaid
        raise loader.ConfigError(why)
    if args.dump_events is not None:
        output_dir(args.dump_events, "--dump-events")  # a directory of event files, like --out
    output_dir(args.out, "--out")  # a directory (doctor.json, doctor.md): checked before every check is run
    report = checks.run(
        base,
        args.out,
        names,
        args.max_devices,
        args.steps,
        args.batch_per_device,
        args.model,
        dump_events=args.dump_events,
        sets=checks.took_effect(base, args.overrides),
    )
    print(f"wrote {args.out / 'doctor.md'} and {args.out / 'doctor.json'}")
    from pipeline.scaling import device

    if kept := device.keep_from_doctor(report):  # on CUDA: the device's fixed cost, read by `fit`
        print(f"kept {kept}'s fixed cost (context, workspaces) in {device.store_file()}")
    return 1 if report["counts"]["failed"] else 0


def cmd_fit(args) -> int:
    import time

    from pipeline.scaling import device, memory

    if args.count_ahead is not None and args.answering:  # counting answers nothing: no flag of the answer is dropped
        given = list(dict.fromkeys(args.answering))
        # the models the user named (after --count-ahead, then --model), else an example
        named = [*args.count_ahead, *([args.model] if "--model" in given else [])]
        name = " ".join(dict.fromkeys(named)) or "resnet50"
        raise loader.ConfigError(
            f"fit --count-ahead only counts models and answers nothing, so it takes no {', '.join(given)}. Name the "
            f"model to count after it (`python -m pipeline fit --count-ahead {name}`), or drop --count-ahead to "
            "answer. Nothing was run."
        )
    if args.count_ahead is not None:
        t0 = time.monotonic()
        models, kept = memory.count_ahead(args.count_ahead)  # none named: d2l's two (memory.known_models)
        counted = (
            f"counted {', '.join(models)} for fit in {time.monotonic() - t0:.1f} s" if models else "nothing to count"
        )
        print(f"{counted}{'; kept already: ' + ', '.join(kept) if kept else ''} (runs/memory_model.json)")
        return 0
    from pipeline.data.files import TRAIN_IMAGES

    if args.batch_size > TRAIN_IMAGES:  # as train refuses it (trial.launch.check_batch_fits), before counting
        raise loader.ConfigError(
            f"fit --batch-size {args.batch_size:,} is larger than the training set ({TRAIN_IMAGES:,} images): not "
            f"one full step fits. Give a global batch of at most {TRAIN_IMAGES:,}. Nothing was run."
        )
    ks, strategies = args.devices, args.strategies
    shown, dropped = memory.applicable(strategies, ks, args.batch_size)
    left = _left_out(dropped)
    if not shown:  # every k left out, each for its reason, before anything is counted
        fixes = " or ".join(dict.fromkeys(out.fix for out in dropped))
        raise loader.ConfigError(
            f"fit has no row to show for --strategies {','.join(strategies)} and --devices {','.join(map(str, ks))}: "
            f"{'; '.join(left)}. Give {fixes}. Nothing was run."
        )
    if not memory.is_counted(args.model, strategies=sorted({s for s, _ in shown})):
        print(
            f"[fit] counting {args.model}'s activations on this host, once (fake tensors: no training, no GPU; "
            "seconds, kept in runs/memory_model.json; `make setup` counts ahead)",
            file=sys.stderr,
            flush=True,
        )
    here = device.cuda_device() if args.device_memory is None or args.device_name is None else None
    cap = device.capacity(args.device_memory, here)
    fixed = device.fixed_cost(args.device_name or (here[0] if here else None))
    rows, _ = memory.fit_table(
        args.model, args.batch_size, cap.bytes, args.optimizer, ks, strategies, fixed=fixed.bytes
    )
    from pipeline import zoo

    gib, mib = memory.GIB, memory.MIB
    print(
        f"{args.model} ({zoo.source(args.model)}), global batch {args.batch_size}, {args.optimizer}: what one GPU "
        "needs (tensors modelled; "
        "the rest as sourced)"
    )
    size = f"{cap.bytes / gib:.2f} GiB" if cap.bytes >= gib else f"{cap.bytes / mib:,.0f} MiB"  # as the table reads
    print(_wrapped(f"device memory {size}: {cap.label}", ""))
    source = f"{fixed.note}: " if fixed.note else ""  # a name with no kept figure: said, with the names kept
    print(
        _wrapped(
            f"fixed cost {fixed.bytes / mib:.0f} MiB per device ({fixed.device or 'no CUDA device here or named'}): "
            f"{source}context {fixed.context.kind}, workspaces {fixed.workspaces.kind}",
            "  ",
        )
    )
    largest = [_largest(r["largest_batch"]) for r in rows]
    width = max(24, *map(len, largest))
    print(f"{'strategy':<13}{'k':>3}  {'needed GiB':>10}  {'fits':>4}  {'largest batch that fits':>{width}}")
    for r, most in zip(rows, largest):
        print(
            f"{r['strategy']:<13}{r['k']:>3}  {r['device_bytes'] / gib:>10.2f}  {'yes' if r['fits'] else 'no':>4}  "
            f"{most:>{width}}"
        )
    if len(rows) == 1:
        p = rows[0]["prediction"]
        print(f"\n{p.strategy} at k={p.k}, device {p.rank}: each term, its figure and its source")
        print(f"  {'':<11}{'term':<25}{'MiB':>8}  source")
        part = None
        for section, term, value, source in memory.need_terms(p, fixed):
            head, part = (section if section != part else ""), section
            print(_wrapped(f"  {head:<11}{term:<25}{value / mib:>8.1f}  {source}", " " * 48))
        print("  not modelled: NCCL's own buffers at k >= 2 (outside the allocator), a CUDA graph's pool")
    elif rows:
        print("(each term with its source: name one strategy and one k)")
    for line in left:
        print(f"({line})")
    return 0


def _largest(batch: int) -> str:
    """The largest batch that fits, as said: none, the batch, or beyond the training set (which no batch exceeds)."""
    from pipeline.data.files import TRAIN_IMAGES

    if batch > TRAIN_IMAGES:
        return f"more than the {TRAIN_IMAGES:,} training images"
    return str(batch) if batch else "none"


def _left_out(dropped) -> list[str]:
    """What fit_table left out, one phrase per reason it gives, its ks in order: `k=2, 4 left out: <why>`."""
    by_why: dict[str, list[int]] = {}
    for out in dropped:
        ks = by_why.setdefault(out.why, [])
        if out.k not in ks:
            ks.append(out.k)
    return [f"k={', '.join(map(str, sorted(ks)))} left out: {why}" for why, ks in by_why.items()]


def _wrapped(line: str, indent: str, width: int = 100) -> str:
    """One printed line, folded at `width` columns, its continuation lines indented."""
    import textwrap

    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))


def cmd_models(args) -> int:
    from pipeline import zoo
    from pipeline.scaling import memory

    print(f"{'model':<22}{'parameters':>14}  {'FSDP units':>10}  source")
    for name in list(dict.fromkeys(args.names)) or zoo.names():  # each named model once
        lay = memory.layout(name)
        print(f"{name:<22}{sum(lay.numel):>14,}  {len(lay.units):>10}  {zoo.source(name)}", flush=True)
    return 0


def cmd_profiles(args) -> int:
    found = loader.describe_profiles()
    for name, desc in found:
        print(f"{name}:\n  " + "\n  ".join(desc.splitlines()) + "\n")
    if not found:
        raise loader.ConfigError(
            f"No profiles: no experiments/*.yaml under {paths.repo_root()}, taken as the "
            f"repository root. Run from the Parallax checkout (where dvc.yaml is), or set "
            f"DVC_ROOT."
        )
    return 1 if any(d.startswith("UNREADABLE: ") for _, d in found) else 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from pipeline.lifeline import lifeline
    from pipeline.user_errors import user_errors

    stage = stage_progress.begin(args.command)  # a DVC stage: its place in the pipeline and the rest's ETA
    # lifeline: a stage command run by DVC stops (as on SIGTERM, which user_errors turns into an exit 143) once the
    # process that ran it is gone; a `kill` of DVC leaves no sweep, overlap or analyze writing on without it
    with user_errors() as status, lifeline():
        status.code = globals()[f"cmd_{args.command}"](args)
    stage.end(status.code)  # its wall time, kept for the next run's ETA when it succeeded
    return status.code


def exit_now(code: int) -> None:
    """End the process without the interpreter's teardown, which spends over a second freeing the objects and
    modules of torch, MLflow and Optuna in every stage process. Everything a command writes is committed and closed
    by the time it returns (the stores write synchronously; files are replaced atomically), so only streams need
    flushing."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed pipe: nothing more can be said anyway
            pass
    os._exit(code)
