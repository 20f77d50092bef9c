"""Where a `dvc repro` (or `dvc exp run`) stands over the stages it runs, and how long the rest of them takes.

Each stage is its own `python -m pipeline COMMAND` process, so no process sees the whole run: the sweep stages time
their own trials (pipeline/sweep/progress.py); this module says which stage of how many is running and how long the
rest takes. At its start a stage run by DVC prints one line on stderr (wrapped here). Under `make pipeline`, `make
pipeline-offline` and `make stage-offline`, which ask DVC before it starts which stages it runs (the plan,
$PARALLAX_STAGE_PLAN, written by pipeline/cli/repro_plan.py: a stage's own command cannot ask, DVC holds the
repository's lock), the line counts only those:

    [pipeline] stage 1/2 of this run (DVC skips the other 10 of 12 stages): sweep@ddp (ETA for the rest of this run:
    about 3 min, from this host's last run of each of its stages)

With no plan (a plain `dvc repro`, or a stage DVC runs outside its plan) it counts every stage of the pipeline and says
so:

    [pipeline] stage 3/12: sweep@scratch (ETA for the rest of the pipeline: about 12 min, from this host's last run of
    each stage; it counts every later stage, those DVC skips as unchanged too)

The position is the stage's place in the plan, or in dvc.yaml's stage list with foreach and matrix expanded, DVC's
own order for this project's dvc.yaml (tests/cli/test_stage_progress.py compares it with DVC's plan). dvc.yaml is read
as a YAML file rather than through `dvc.repo.Repo(...).index`, which costs about a second per stage (1.1 s, measured
on a 2-core host under load). The ETA is the sum of the wall times this host recorded for this stage and every later
one it counts, at their last successful run (runs/stage_times.json at the store root: under DVC's temporary executors
the parent repository's, so experiments share it). Until each of them has run once it says so and gives no number.
A planned stage downstream of a changed one that DVC skips after all (its inputs came out unchanged) makes the figure
an overestimate. A stage that fails records nothing. Outside DVC ($DVC_STAGE unset), or in a process that is not the
stage's own command (a helper started from it inherits $DVC_STAGE), `begin` returns OFF and nothing is printed or
recorded.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pipeline import paths
from pipeline.config import safe_yaml

COMMAND = re.compile(r"python3?\s+-m\s+pipeline\s+([A-Za-z_]\w*)")
UNKNOWN_ETA = "ETA: not known until each stage has run once on this host"
PLAN_ENV = "PARALLAX_STAGE_PLAN"  # the stages this run's entry point planned (pipeline/cli/repro_plan.py)
PLAN_SEPARATOR = ","


class Off:
    """Not a DVC stage's own process: nothing to say, nothing to record."""

    def end(self, code: int) -> None:
        pass


OFF = Off()


class StageClock:
    """One stage's run: `end(code)` records its wall time when it succeeded."""

    def __init__(self, stage: str, times_file: Path, started: float, clock=time.monotonic):
        self.stage, self.times_file, self.started, self.clock = stage, times_file, started, clock

    def end(self, code: int) -> None:
        if code != 0:
            return
        try:
            record(self.times_file, self.stage, self.clock() - self.started)
        except OSError as e:  # the stage succeeded: a timing it cannot keep costs only the next run's ETA
            print(f"[pipeline] could not record {self.stage}'s time in {self.times_file}: {e}", file=sys.stderr)


def begin(command: str, clock=time.monotonic) -> StageClock | Off:
    """Print this stage's position and the rest's ETA, and start its clock; OFF outside a DVC stage's own command."""
    stage = os.environ.get("DVC_STAGE")
    if not stage:
        return OFF
    started = clock()
    root = paths.repo_root()
    try:
        dvc_yaml = safe_yaml.load(safe_yaml.read_text(root / "dvc.yaml"), "dvc.yaml")
        params = root / "params.yaml"
        values = safe_yaml.load(safe_yaml.read_text(params), "params.yaml") if params.exists() else {}
        if stage_command(dvc_yaml, stage) != command:
            return OFF
        names = stage_names(dvc_yaml, values if isinstance(values, dict) else {})
    except (OSError, ValueError, yaml.YAMLError, AttributeError, TypeError):  # unreadable: no line; the stage runs on
        return OFF
    times_file = paths.store_root() / "runs" / "stage_times.json"
    plan = read_plan()
    if plan and stage in plan:
        skipped = len(names) - len(plan) if names and set(plan) <= set(names) else None
        print(position_line(plan, stage, read_times(times_file), skipped, planned=True), file=sys.stderr, flush=True)
    elif names and stage in names:
        print(position_line(names, stage, read_times(times_file)), file=sys.stderr, flush=True)
    return StageClock(stage, times_file, started, clock)


def stage_names(dvc_yaml: dict, params: dict) -> list[str] | None:
    """Every stage's name in dvc.yaml's order, foreach and matrix expanded as DVC names them (`sweep@ddp`);
    None where an item list cannot be resolved here (a `${...}` that names no list in params.yaml)."""
    out: list[str] = []
    for name, spec in ((dvc_yaml or {}).get("stages") or {}).items():
        spec = spec or {}
        if "foreach" in spec:
            items = _resolved(spec["foreach"], params)
            if items is None:
                return None
            keys = (
                list(items)
                if isinstance(items, dict)
                else [str(i) for i in range(len(items))]
                if any(isinstance(v, (dict, list)) for v in items)
                else [_text(v) for v in items]
            )
            out += [f"{name}@{k}" for k in keys]
        elif "matrix" in spec:
            axes = {k: _resolved(v, params) for k, v in (spec["matrix"] or {}).items()}
            if any(not isinstance(v, list) for v in axes.values()):
                return None
            for combo in itertools.product(*(list(enumerate(v)) for v in axes.values())):
                parts = [f"{k}{i}" if isinstance(v, (dict, list)) else _text(v) for k, (i, v) in zip(axes, combo)]
                out.append(f"{name}@{'-'.join(parts)}")
        else:
            out.append(name)
    return out


def stage_command(dvc_yaml: dict, stage: str) -> str | None:
    """The `python -m pipeline COMMAND` a stage of dvc.yaml runs (its first, for a list of commands), or None."""
    spec = ((dvc_yaml or {}).get("stages") or {}).get(stage.split("@", 1)[0]) or {}
    spec = spec.get("do", spec)
    cmds = spec.get("cmd") if isinstance(spec, dict) else None
    found = [m for c in (cmds if isinstance(cmds, list) else [cmds or ""]) for m in COMMAND.findall(str(c))]
    return found[0] if found else None


def read_plan() -> list[str] | None:
    """The stages DVC runs, in its order, as the entry point that started it planned them ($PARALLAX_STAGE_PLAN);
    None where none was given."""
    value = os.environ.get(PLAN_ENV)
    return None if value is None else [s.strip() for s in value.split(PLAN_SEPARATOR) if s.strip()]


def position_line(names: list[str], stage: str, times: dict, skipped: int | None = None, planned: bool = False) -> str:
    """The stage-start line: `stage 3/12: NAME` and the ETA of this stage and every later one of `names`: the
    stages this run planned (`planned`, `skipped` the number of the pipeline's other stages, None where not known)
    or every stage of the pipeline."""
    i = names.index(stage)
    rest = names[i:]
    known = [times[s] for s in rest if isinstance(times.get(s), (int, float))]
    if len(known) < len(rest):
        eta = UNKNOWN_ETA
    elif planned:
        eta = f"ETA for the rest of this run: {duration(sum(known))}, from this host's last run of each of its stages"
    else:
        eta = (
            f"ETA for the rest of the pipeline: {duration(sum(known))}, from this host's last run of each stage; it "
            "counts every later stage, those DVC skips as unchanged too"
        )
    where = f"stage {i + 1}/{len(names)}" + (" of this run" if planned else "")
    if planned and skipped:
        where += f" (DVC skips the other {skipped} of {skipped + len(names)} stages)"
    return f"[pipeline] {where}: {stage} ({eta})"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def read_times(path: Path) -> dict:
    """This host's recorded stage times ({stage: seconds}); empty where none (or the file is unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    mine = data.get(socket.gethostname()) if isinstance(data, dict) else None
    return mine if isinstance(mine, dict) else {}


def record(path: Path, stage: str, seconds: float) -> None:
    """Keep `seconds` as this host's time of `stage`, written whole (a temporary file renamed over the old one).
    Concurrent stages (`dvc queue start -j N`) may each keep their own time and drop the other's: a later run puts
    it back."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict):
        data = {}
    host = data.get(socket.gethostname())
    data[socket.gethostname()] = {**(host if isinstance(host, dict) else {}), stage: round(seconds, 1)}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _resolved(value, params: dict):
    """A foreach or matrix value: itself, or the params.yaml value a whole-string `${a.b}` names (None if none)."""
    if not isinstance(value, str):
        return value
    m = re.fullmatch(r"\$\{\s*([\w.-]+)\s*\}", value.strip())
    if not m:
        return None
    cur = params
    for part in m.group(1).split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur if isinstance(cur, (list, dict)) else None


def _text(v) -> str:
    """A scalar item as DVC writes it into a stage name (booleans lower-case, as in YAML)."""
    return str(v).lower() if isinstance(v, bool) else str(v)
