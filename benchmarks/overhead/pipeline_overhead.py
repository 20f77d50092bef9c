"""Pipeline overhead of the CPU profile: wall time of `dvc repro` vs the time spent inside training steps.

    .venv/bin/python -m benchmarks.overhead.pipeline_overhead [--profile cpu]

Runs the whole pipeline in a fresh temporary copy of the repository on synthetic data (so it needs no network),
then sums every trial's training-epoch seconds from the sweep CSVs. Overhead = 1 - training / wall: process and
interpreter start-up, DVC, data generation, evaluation, MLflow/Optuna bookkeeping, analysis.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import REPO, host_line, parser


def main():
    p = parser(__doc__, data=False)
    p.add_argument("--profile", default="cpu")
    p.add_argument("--keep", action="store_true", help="keep the temporary copy and print its path")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="parallax-bench-"))
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, tmp / f)
    params = (tmp / "params.yaml").read_text().replace("profile: cpu", f"profile: {args.profile}")
    (tmp / "params.yaml").write_text(params.replace("source: fashion-mnist", "source: synthetic"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("DVC_ROOT", None)
    for cmd in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "bench"],
    ):
        subprocess.run(cmd, cwd=tmp, check=True, env=env)
    print(host_line(), f"| profile {args.profile}, synthetic data, copy in {tmp}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(["dvc", "repro"], cwd=tmp, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"dvc repro failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    train_s, trial_s, trials, lines = 0.0, 0.0, 0, []
    for f in sorted((tmp / "results" / "sweeps").glob("*.jsonl")):
        rows = [r for r in map(json.loads, open(f)) if r["state"] in ("complete", "pruned")]
        steps = sum(sum(r["epoch_s"] or []) for r in rows)
        walls = sum(r["wall_s"] for r in rows)
        train_s, trial_s, trials = train_s + steps, trial_s + walls, trials + len(rows)
        if rows:
            lines.append(
                f"  {f.stem}: {len(rows)} trials, {walls - steps:.1f} s in trials outside training steps "
                f"({(walls - steps) / len(rows):.2f} s a trial: start-up, evaluation, hand-offs)"
            )
    print(
        f"dvc repro wall time: {wall:.1f} s; time inside training steps (sum of epoch seconds over "
        f"{trials} trials): {train_s:.1f} s"
    )
    print(f"pipeline overhead: {wall - train_s:.1f} s = {(wall - train_s) / wall:.1%} of wall time")
    print(
        f"of which {trial_s - train_s:.1f} s inside trials, {wall - trial_s:.1f} s outside them (stage processes' "
        f"start-up, the stores, study plots, data, overlap, analysis, DVC):"
    )
    print("\n".join(lines))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
