"""Which stages a `dvc repro` (or `dvc exp run`) is about to run, asked of DVC before it starts, so that each stage's
`[pipeline] stage i/n` line and ETA count only those (pipeline/cli/stage_progress.py).

    python -m pipeline.cli.repro_plan [-S [FILE:]KEY=VALUE ...] [-s] [TARGET ...]   # DVC's arguments: its plan

A stage's own command cannot ask DVC (`dvc repro` holds the repository's lock while its stages run), so the Makefile's
entry points (`make pipeline`, `make pipeline-offline`, `make stage-offline`) ask first, with the arguments they give
DVC, and hand the answer to every stage in $PARALLAX_STAGE_PLAN. The plan is, in DVC's order, every stage DVC's status
(what `dvc status --json` prints) lists as changed, and every stage downstream of one of them: DVC looks at that one
again when its turn comes, after the stages before it rewrote its inputs, and reruns it when they changed (a sweep that
ran trials rewrites its table, so analyze reruns). With -s only the targets count, as `dvc repro -s` runs them alone.
-S values go into the params files as `dvc exp run -S` puts them (DVC's own function), for the question only: each
file is put back byte for byte.

Stdout: the plan, stage names separated by commas (empty: nothing to run); stderr: one line saying what runs. Where
DVC cannot say (not installed, an invalid dvc.yaml, an invalid -S), stdout is empty, the exit status 1, and the
pipeline runs without a plan: each stage's ETA then counts every later stage.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pipeline import paths
from pipeline.cli.stage_progress import PLAN_SEPARATOR


def plan(root: Path, sets: list[str], targets: list[str], single_item: bool = False) -> tuple[list[str], int]:
    """The stages DVC runs in `root` (stage names, in its order) and how many it looks at."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import get_active_graph, plan_repro
    from dvc.utils.cli_parse import to_path_overrides
    from dvc.utils.hydra import apply_overrides

    kept: dict[Path, bytes | None] = {}
    here = os.getcwd()
    os.chdir(root)  # DVC names a stage relative to the working directory (`sub/dvc.yaml:name`), as $DVC_STAGE does
    try:
        for name, overrides in to_path_overrides(sets).items():
            file = root / name
            kept[file] = file.read_bytes() if file.exists() else None
            apply_overrides(file, overrides)
        with Repo(str(root)) as repo:
            stages = [s for t in targets for s in repo.stage.collect(t)]
            graph = get_active_graph(repo.index.graph)  # as `dvc repro` builds it: a frozen stage cut from its deps
            steps = stages if single_item else plan_repro(graph, stages or None)
            changed = set(repo.status(targets=[s.addressing for s in steps])) if steps else set()
    finally:
        os.chdir(here)
        for file, data in kept.items():
            if data is None:
                file.unlink(missing_ok=True)
            else:
                file.write_bytes(data)
    runs: set = set()
    for s in steps:  # a stage's dependencies come before it; graph.successors(s): the stages whose outputs it reads
        if s.addressing in changed or (not single_item and any(u in runs for u in graph.successors(s))):
            runs.add(s)
    return [s.addressing for s in steps if s in runs], len(steps)


def summary(names: list[str], total: int) -> str:
    """The line said before DVC starts: how many of the stages it looks at run, and which."""
    if not names:
        return f"[pipeline] 0 of {total} stage(s) to run: each is unchanged, DVC skips it"
    if len(names) == total:
        return f"[pipeline] {total} of {total} stage(s) to run"
    return f"[pipeline] {len(names)} of {total} stages to run: {', '.join(names)} (DVC skips the others, unchanged)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.cli.repro_plan",
        description="Print the stages `dvc repro` or `dvc exp run` with these arguments runs, comma-separated "
        "(the value of $PARALLAX_STAGE_PLAN, which each stage's ETA reads).",
    )
    p.add_argument("-S", "--set-param", dest="sets", action="append", default=[], metavar="[FILE:]KEY=VALUE")
    p.add_argument("-s", "--single-item", action="store_true", help="only the targets, as `dvc repro -s`")
    p.add_argument("targets", nargs="*", help="stages, as DVC names them (sweep@ddp); none: the whole pipeline")
    args = p.parse_args(argv)
    try:
        names, total = plan(paths.repo_root(), args.sets, args.targets, args.single_item)
    except Exception as e:  # anything at all: the plan only sharpens an ETA, and the pipeline runs without one
        print(
            f"[pipeline] no plan of the stages to run ({type(e).__name__}: {e}); each stage's ETA counts every later "
            "stage",
            file=sys.stderr,
        )
        return 1
    print(summary(names, total), file=sys.stderr)
    print(PLAN_SEPARATOR.join(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
