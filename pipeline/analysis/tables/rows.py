"""The sweep tables read for analysis: results/sweeps/*.jsonl (one row per trial, written by records/table.py, typed
by the trial record's schema) into one frame, with notes on missing, empty or unreadable tables. The floor of the
analysis wing: points.py derives every table from this frame.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from pipeline.catalog import KNOBS, NAMES
from pipeline.records.table import SUFFIX, read_table, typed

EXPECTED = NAMES  # strategies in the catalog's order (pipeline/catalog.py); others sort after them
# Grouped on, so that a distinct setting is a distinct point; shown only where they vary. The optimizer too: its
# state is memory (what ZeRO-1 and FSDP shard) and its best lr is its own.
EXTRAS = ("host", "data_source", "optimizer", *KNOBS)
MAX_BAD = 10  # damaged lines of one table named one by one in the notes and on stderr


def key_text(v) -> str:
    """A grouping value as text: '' for absent, '25' for 25.0 (a number column with gaps is float), 'True'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def normalize(df: pd.DataFrame, stem: str) -> pd.DataFrame:
    """Rows as the sweep table holds them, every column of its kind (pipeline.records.table.typed), plus `k` =
    devices; a missing strategy is the file's stem."""
    df = typed(df)
    df["strategy"] = df["strategy"].where(df["strategy"] != "", stem)
    df["state"] = df["state"].str.lower().where(df["state"] != "", "unknown")
    df["oversubscribed"] = df["oversubscribed"].map(lambda v: v is True).astype(bool)
    # measured while other processes used the host beyond interference.py's threshold: its speed is not the
    # strategy's, so it leaves throughput and efficiency (accuracy and memory keep it); listed with the reason
    df["interfered"] = df["interfered"].map(lambda v: v is True).astype(bool)
    df["k"] = df["devices"]
    derived = df["batch_size"] / df["k"]
    df["per_device_batch"] = df["per_device_batch"].fillna(derived.where(derived % 1 == 0))
    for c in EXTRAS:
        df[c] = df[c].map(key_text)
    # a row without train.optimizer (a table written before the column) trained with plain SGD
    df["optimizer"] = df["optimizer"].where(df["optimizer"] != "", "sgd")
    return df


def read_sweeps(sweeps_dir, expected):
    """Rows of every sweep table, notes, and per file stem 'ok' | 'empty' | 'unreadable: …'. A damaged line is
    skipped and named (file, line number) in the notes and on stderr; the table's other rows are kept."""
    d, frames, notes, files = Path(sweeps_dir), [], [], {}
    if not d.is_dir():
        notes.append(f"sweeps directory {d} does not exist")
    for p in sorted(d.glob("*.csv")) if d.is_dir() else []:
        notes.append(
            f"{p.name} is a sweep table of an older Parallax (CSV), not read: rerun its sweep stage to "
            f"write {p.stem}{SUFFIX}"
        )
    for p in sorted(d.glob(f"*{SUFFIX}")) if d.is_dir() else []:
        bad = []
        try:
            raw = read_table(p, bad)
        except OSError as e:
            files[p.stem] = f"unreadable: {type(e).__name__}: {e}".splitlines()[0]
            notes.append(f"{p.name}: {files[p.stem]}")
            continue
        notes += _skipped(p, bad)
        if raw.empty and bad:
            files[p.stem] = f"unreadable: none of its {len(bad)} lines is a row"
            notes.append(f"{p.name}: {files[p.stem]}")
            continue
        if raw.empty:
            files[p.stem] = "empty"
            notes.append(f"{p.name} is empty (no trials)")
            continue
        files[p.stem] = "ok"
        frames.append(normalize(raw, p.stem))
    seen = set(files) | {s for f in frames for s in f["strategy"]}
    for s in expected:
        if s not in seen:
            notes.append(f"no sweep table for strategy '{s}' ({d / (s + SUFFIX)} missing)")
    df = pd.concat(frames, ignore_index=True) if frames else normalize(pd.DataFrame(), "")
    return df, notes, files


def _skipped(p: Path, bad: list) -> list[str]:
    """Notes on a table's damaged lines (each also a warning on stderr: the run goes on without them). The first
    MAX_BAD are named one by one; a file of garbage gets one more line for the rest, not thousands."""
    out = [
        f"{p} line {n} skipped: not a sweep-table row ({why}). Rerun its sweep stage to rewrite the table, or "
        f"mend the line"
        for n, why in bad[:MAX_BAD]
    ]
    if len(bad) > MAX_BAD:
        out.append(f"{p}: {len(bad) - MAX_BAD} more damaged lines skipped (lines {bad[MAX_BAD][0]}..{bad[-1][0]})")
    # not user_errors.say: the wing imports nothing above the sweep table (tests/architecture/test_imports.py)
    for note in out:
        print(f"warning: {note}", file=sys.stderr)
    return out


def load_sweeps(sweeps_dir, expected=EXPECTED) -> tuple[pd.DataFrame, list[str]]:
    """All trial rows (typed; `k` = devices) and notes on missing/empty/bad tables."""
    df, notes, _ = read_sweeps(sweeps_dir, expected)
    return df, notes
