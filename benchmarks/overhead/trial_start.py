"""What a trial costs beside its training: per start method, a trial's wall time split into its phases, against a
bare `python -c "import torch"` timed in the same run.

    .venv/bin/python -m benchmarks.overhead.trial_start [--methods fork,spawn,forkserver] [--trials 4] [--rounds 3]

Two shapes, per start method (train.start_method), alternating with the bare import in every round:
- in one command: one process runs --trials trials in a row, as a sweep or doctor does; the trials after the first
  are the sweep's steady cost (the first pays what a command pays once: a forkserver's start, the fork caller's
  imports);
- one-off: `python -m pipeline train ... --no-track --quiet` as a subprocess, its whole wall time.
A trial's fixed cost is its wall time less its steps and its evaluation (timeline.json, written by every trial:
pipeline/trial/launch.py). Phases, from the trial's timeline: parent (before the ranks are launched, and after they
return), start (launch to the rank's entry: the process start, with spawn its imports), imports (the rank's imports
still missing), data, model (the strategy's set-up, the model, data to the device), steps, evaluation (each epoch's
end: loss, test accuracy), state (saving the final state), exit (the rank's return to the launcher's).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, ensure_data, host_line, med, parser
from pipeline.cli.types import count

PHASES = ("parent", "start", "imports", "data", "model", "steps", "evaluation", "state", "exit")


def phases(tl: dict) -> dict:
    """Seconds per phase of one trial's timeline.json."""
    r = tl["rank0"]
    loop = r["trained"] - r["built"]
    return {
        "parent": (tl["launched"] - tl["entered"]) + (tl["written"] - tl["returned"]),
        "start": r["entered"] - tl["launched"],
        "imports": r["imported"] - r["entered"],
        "data": r["data"] - r["imported"],
        "model": r["built"] - r["data"],
        "steps": r["steps_s"] + (loop - r["steps_s"] - r["eval_s"]),  # with the epoch's hand-offs
        "evaluation": r["eval_s"],
        "state": r["returned"] - r["trained"],
        "exit": tl["returned"] - r["returned"],
    }


def fixed(p: dict, wall: float) -> float:
    return wall - p["steps"] - p["evaluation"]


def _sets(data: Path, method: str, steps: int) -> list[str]:
    return [
        f"data.dir={data}",
        "data.source=synthetic",
        f"train.start_method={method}",
        f"train.max_steps={steps}",
        "train.epochs=1",
        "train.strategy=single",
        "data.test_limit=2000",
    ]


def in_command(method: str, n: int, data: Path, steps: int, out: Path) -> list[dict]:
    """Run n trials in one fresh process (this module's --inner); each trial's wall time and phases."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.overhead.trial_start",
        "--inner",
        str(n),
        "--out",
        str(out),
        *[a for s in _sets(data, method, steps) for a in ("--set", s)],
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{method}: in-command trials failed:\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def one_off(method: str, data: Path, steps: int, out: Path) -> dict:
    """`python -m pipeline train` as a user types it; its wall time and phases."""
    sets = [a for s in _sets(data, method, steps) for a in ("--set", s)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline", "train", *sets, "--no-track", "--quiet", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"{method}: one-off train failed:\n{proc.stderr[-3000:]}")
    return {"wall": wall, "phases": phases(json.loads((out / "timeline.json").read_text()))}


def bare_import() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def inner(n: int, out: Path, sets: list[str]) -> None:
    """--inner: n trials in this process, one JSON line each."""
    from pipeline.config import loader
    from pipeline.trial.launch import run_trial

    cfg = loader.load(None, ["profile=", *sets], root=REPO)
    for i in range(n):
        t0 = time.perf_counter()
        run_trial(cfg, out / f"t{i}", progress=False)
        wall = time.perf_counter() - t0
        tl = json.loads((out / f"t{i}" / "timeline.json").read_text())
        print(json.dumps({"wall": wall, "phases": phases(tl)}), flush=True)


def main() -> None:
    p = parser(__doc__, data=False)
    p.add_argument("--methods", default="fork,spawn,forkserver", help="start methods, comma-separated")
    p.add_argument("--trials", type=count("trials"), default=4, help="trials per command (the first is reported apart)")
    p.add_argument(
        "--rounds", type=count("rounds"), default=3, help="rounds, each alternating every method and the bare import"
    )
    p.add_argument("--steps", type=count("steps"), default=5, help="training steps per trial")
    p.add_argument("--inner", type=int, default=0, help=argparse_hidden())
    p.add_argument("--out", type=Path, default=None, help=argparse_hidden())
    p.add_argument("--set", action="append", default=[], help=argparse_hidden())
    args = p.parse_args()
    if args.inner:
        return inner(args.inner, args.out, args.set)
    methods = args.methods.split(",")
    data = ensure_data(REPO / "data" / "bench-synthetic", "synthetic")
    print(host_line(), f"| LeNet single, {args.steps} steps a trial, SYNTHETIC data", flush=True)
    bare, later, first, once = [], {m: [] for m in methods}, {m: [] for m in methods}, {m: [] for m in methods}
    with tempfile.TemporaryDirectory(prefix="parallax-trial-start-") as tmp:
        for r in range(args.rounds):
            bare.append(bare_import())
            for m in methods:
                runs = in_command(m, args.trials, data, args.steps, Path(tmp) / f"{m}-{r}")
                first[m].append(runs[0])
                later[m] += runs[1:]
                once[m].append(one_off(m, data, args.steps, Path(tmp) / f"{m}-{r}-once"))
            bare.append(bare_import())
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    b = med(bare)
    print(
        f'\nbare `python -c "import torch"`: median {b:.2f} s (min {min(bare):.2f}, max {max(bare):.2f}, n={len(bare)})'
    )
    print("\nmedian seconds per phase; fixed = wall - steps - evaluation; ratio = fixed / bare import\n")
    head = "".join(f"{ph:>11}" for ph in PHASES)
    print(f"{'start method, trial':<34}{head}{'wall':>8}{'fixed':>8}{'ratio':>8}")
    for m in methods:
        for label, rows in (
            (f"{m}, trials 2..{args.trials} of a command", later[m]),
            (f"{m}, first trial of a command", first[m]),
            (f"{m}, one-off `pipeline train`", once[m]),
        ):
            if not rows:  # --trials 1: no trial 2 of a command
                print(f"{label:<34}none (--trials {args.trials})")
                continue
            ph = {k: med([x["phases"][k] for x in rows]) for k in PHASES}
            wall = med([x["wall"] for x in rows])
            fx = med([fixed(x["phases"], x["wall"]) for x in rows])
            cells = "".join(f"{ph[k]:>11.3f}" for k in PHASES)
            print(f"{label:<34}{cells}{wall:>8.2f}{fx:>8.2f}{fx / b:>7.2f}x")
    print("\none-off: `parent` is inside the command; its interpreter start and imports are the wall time's rest")


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
