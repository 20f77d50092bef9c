"""The sweep's table: results/sweeps/<strategy>.jsonl, one row per trial (complete, failed, pruned, running) and per
point skipped on this host, rewritten atomically from the study after every trial; and its reader for analysis.

JSON lines keep types and lists (peaks per device, accuracy per epoch): analysis reads the rows back as they were
written and parses nothing. The columns and their kinds are the trial record's (records/trial.py): a row is the record's
table view plus what describes the Optuna trial (study, trial, state, reason, MLflow run id). Optuna-free and
torch-free: analysis imports it.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import stat
from pathlib import Path

from pipeline import scratch
from pipeline.catalog import KNOBS
from pipeline.records.trial import COLUMNS, PROVENANCE, TrialRecord, table_kinds

# what a trial's (or skipped point's) params say
POINT_KEYS = ("model", "devices", "batch_size", "lr", "optimizer", *KNOBS)
STATES = {"COMPLETE": "complete", "FAIL": "failed", "PRUNED": "pruned", "RUNNING": "running", "WAITING": "waiting"}
SUFFIX = ".jsonl"


def point_of(t) -> dict:
    """A stored sweep trial's whole point, wherever a point is read. Its Optuna params hold only the dimensions that
    vary (sweep.space.suggest), and a trial another worker is starting has only some of those yet (suggested one by
    one; seen in CI: a table written at that moment stopped the sweep on KeyError 'batch_size'); every sweep trial is
    enqueued with its whole point (Optuna's system attribute fixed_params), which a retried copy keeps. The params go
    over it; a stored trial whose params list the constant dimensions too (a study made when every dimension was
    suggested) has them in both, equal."""
    return {**(t.system_attrs.get("fixed_params") or {}), **t.params}


def trial_row(study, strategy, t=None, point=None, reason="", state="skipped") -> dict:
    """One row: an Optuna trial (t, its record in user attribute `metrics`) or a point not run (point, reason), with
    the study's PROVENANCE (its user attributes)."""
    m = (t.user_attrs.get("metrics") if t else None) or {}
    p = point_of(t) if t else dict(point)
    row = dict.fromkeys(COLUMNS)
    row.update({k: v for k, v in TrialRecord.from_dict(m).table_row().items() if v is not None})
    row.update({k: p[k] for k in POINT_KEYS if k in p}, strategy=strategy)
    if p.get("devices"):
        row["per_device_batch"] = p["batch_size"] // p["devices"]
    failed = t is not None and t.state.name == "FAIL"
    row.update(
        study=study.study_name,
        trial=t.number if t else None,
        state=STATES[t.state.name] if t else state,
        reason=reason
        or (t.user_attrs.get("reason", "") if t else "")
        or ("worker_died: its sweep process stopped (heartbeat stale); the point was enqueued again" if failed else ""),
        mlflow_run_id=t.user_attrs.get("mlflow_run_id") if t else None,
    )
    facts = getattr(study, "user_attrs", None) or {}  # the code, data and torch the study's trials ran on
    row.update({k: facts.get(k) for k in PROVENANCE})
    return row


def is_flagged(row: dict) -> bool:
    """What `n_flagged` counts, one rule for the study row (sweep/study_view.py) and the analysis (summary.json,
    metrics.json, its MLflow run): a complete trial on devices of its own (not oversubscribed) measured under
    interference (its row's `interfered`, pipeline/measure/interference.py)."""
    return (
        row.get("state") == "complete" and not _is_true(row.get("oversubscribed")) and _is_true(row.get("interfered"))
    )


def n_flagged(rows) -> int:
    """How many of the rows (trial_row's, or the analysis' frame's as dicts) is_flagged counts."""
    return sum(is_flagged(r) for r in rows)


def write_table(study, strategy: str, skipped, out: Path, host) -> None:
    """Every trial of the study (but those still waiting) and every point skipped on `host` that no trial took."""
    trials = study.get_trials(deepcopy=False)
    rows = [trial_row(study, strategy, t=t) for t in trials if t.state.name != "WAITING"]
    in_study = [point_of(t) for t in trials]
    for p, why in skipped:
        if p in in_study:  # infeasible here, but queued by a larger host: its row is the trial's
            continue
        r = trial_row(study, strategy, point=p, reason=why)
        r.update(host=host.hostname, device_kind=host.kind, device_name=host.name, host_devices=host.n)
        rows.append(r)
    write_rows(rows, out)


def write_rows(rows: list[dict], out: Path) -> None:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # per process (workers of one study share the table); a killed writer's is removed here
    tmp = Path(scratch.file_name(f"{out.parent / out.name}.", ".tmp"))
    with open(tmp, "w") as f:
        for r in rows:
            f.write(json.dumps({c: _plain(r.get(c)) for c in COLUMNS}, allow_nan=False) + "\n")
    tmp.replace(out)  # atomic: a crash never leaves half a table


def _plain(v):
    """JSON's null for a number that is not one (NaN, inf)."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


# ---------------------------------------------------------------- reading it back


def read_table(path, bad: list | None = None):
    """One sweep table as a typed DataFrame (see `typed`); an empty file gives an empty frame.

    Line by line, so that one damaged line (a hand edit, a truncated copy) costs that line, not the table: with
    `bad` a list, each line that is not a JSON object is skipped and listed there as (line number, why); without
    it, the first such line raises ValueError naming it. Types are JSON's, as written (nothing is parsed from text).
    """
    import pandas as pd

    records = []
    with _open_regular(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.strip().decode("utf-8"))
                if not isinstance(rec, dict):
                    raise ValueError(f"a JSON {type(rec).__name__}, not an object")
            except json.JSONDecodeError as e:
                why = f"{e.msg}: column {e.colno}"  # its own "line 1" would be the line within the line
            except ValueError as e:  # UnicodeDecodeError is one too
                why = str(e)
            else:
                records.append(rec)
                continue
            if bad is None:
                raise ValueError(f"{path} line {n} is not a sweep-table row: {why}")
            bad.append((n, why))
    return pd.DataFrame(records)


def foreign(path, strategy: str) -> str | None:
    """What the file at `path` holds when it is not a sweep table of `strategy` (one that a sweep of `strategy` may
    rewrite): None for a missing or empty file, or one whose every non-blank line is a JSON object whose "strategy"
    is `strategy` (write_rows' rows); else a phrase naming what it holds ("the sweep table of strategy ddp", "text
    that is not a sweep table (line 1: ...)"). Read until its first row that is not this strategy's."""
    try:
        f = _open_regular(path)
    except FileNotFoundError:
        return None
    with f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line.strip().decode("utf-8"))
            except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
                return f"text that is not a sweep table (line {n} is not JSON)"
            if not isinstance(rec, dict) or "strategy" not in rec:
                return f"JSON that is not a sweep table (line {n} is not a row with a strategy)"
            if rec["strategy"] != strategy:
                return f"the sweep table of strategy {rec['strategy']} (line {n}'s strategy)"
    return None


def _open_regular(path):
    """`path` opened for reading if it is a regular file; else OSError naming its kind. Opened non-blocking and
    checked before any read: a FIFO named like a table would otherwise block the reader for good."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a special file"
        raise OSError(errno.EINVAL, f"not a regular file ({kind})", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def typed(df):
    """Every column of the table, of its kind: numbers float (NaN where absent), text str ('' where absent), flags
    True/False/None, lists lists ([] where absent). Columns a table lacks (an older one) are absent values."""
    df = df.copy()
    for c, kind in table_kinds().items():
        col = df[c] if c in df else _absent(df)
        if kind in ("int", "float"):
            df[c] = col.map(lambda v: math.nan if _is_flag(v) or not isinstance(v, numbers.Real) else float(v))
            df[c] = df[c].astype(float)
        elif kind == "str":
            df[c] = col.map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
        elif kind == "bool":
            df[c] = col.map(lambda v: bool(v) if _is_flag(v) else None).astype(object)
        elif kind == "list":
            df[c] = col.map(lambda v: list(v) if isinstance(v, (list, tuple)) else [])
    return df


def _is_flag(v) -> bool:
    return isinstance(v, bool) or type(v).__name__ == "bool_"  # numpy's bool is no subclass of bool


def _is_true(v) -> bool:
    return _is_flag(v) and bool(v)


def _absent(df):
    import pandas as pd

    return pd.Series([None] * len(df), index=df.index, dtype=object)
