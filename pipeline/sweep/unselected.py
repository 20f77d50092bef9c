"""A strategy that params.yaml does not select (sweep.strategies): its sweep table lists every point of its space with
the reason, and no trial runs.

DVC runs every sweep@ stage, selected or not. This module imports neither torch, Optuna nor MLflow (about 5 s of
imports on a 2-core host), so `python -m pipeline sweep` ends an unselected stage in the time its configuration takes
to load (cli/commands.py asks here before it imports the sweep itself)."""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.records.table import trial_row, write_rows
from pipeline.sweep.space import Space


def selected(cfg, strategy: str) -> bool:
    return strategy in cfg.sweep.strategies


def write_table(space: Space, out_csv: Path) -> Path:
    """The table of a strategy params.yaml does not select: every point of its space, with the reason, and no trial
    run."""
    strategy = space.strategy
    why = f"not selected: `{strategy}` is not in sweep.strategies ({', '.join(space.cfg.sweep.strategies)})"
    stand_in = type("Unselected", (), {"study_name": space.name, "user_attrs": space.facts})
    write_rows([trial_row(stand_in, strategy, point=p, reason=why) for p in space.points], out_csv)
    print(f"[sweep {strategy}] {why}: no trial run", file=sys.stderr, flush=True)
    return out_csv
