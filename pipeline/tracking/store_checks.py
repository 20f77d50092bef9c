"""The MLflow store, checked: a writable artifact folder, a half-made SQLite store named as such, and no store
tracebacks in the log (Parallax reports a store fault itself, in one message).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
from pathlib import Path

from pipeline.errors import StoreError
from pipeline.preflight import writable_dir
from pipeline.store_faults import root_cause, store_fault


class _NoStoreTracebacks(logging.Filter):
    """MLflow's SQL store logs a full traceback for each failed write (a locked or full database) before raising it;
    Parallax reports that fault itself, in one message, so the log record is dropped."""

    def filter(self, record):
        return not (record.exc_info and record.getMessage().startswith("SQLAlchemy database error"))


logging.getLogger("mlflow.store.db.utils").addFilter(_NoStoreTracebacks())


def check_artifacts(location: str, name: str) -> None:
    """Raise StoreError unless the experiment's artifact folder, when it is a local one, can be written: else the
    first artifact fails after the training, as an unexpected error."""
    if location.startswith("file:"):
        import urllib.parse

        location = urllib.parse.unquote(urllib.parse.urlsplit(location).path)
    elif "://" in location or ":/" in location:  # a server's or an object store's artifacts
        return
    path = Path(location)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(
            f"Cannot write the MLflow artifacts of experiment {name!r}: {path} is not a writable folder "
            f"({e.strerror or e}). Put a writable folder there (a file or a read-only mount is in its "
            f"place), or point tracking.uri elsewhere. Nothing was run."
        ) from None
    writable_dir(path, f"the MLflow artifacts of experiment {name!r}")


def half_made(uri: str, error: BaseException) -> str | None:
    """The message for a SQLite store whose creation (or schema upgrade) stopped part-way, as on a disk that filled
    while MLflow made its tables: some tables are there, its schema version is not, and every later open fails
    ("table spans already exists"). None for any other store or error. It names the store, says whether it holds runs
    (only an empty one is worth deleting) and what to do."""
    if not uri.startswith("sqlite:///"):
        return None
    texts, seen, e = [], set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(str(e).lower())
        e = e.__cause__ or e.__context__
    text = " ".join(texts)
    if "already exists" not in text and "disk i/o error" not in text and store_fault(error) != "disk_full":
        return None
    path = Path(uri[len("sqlite:///") :].split("?", 1)[0])
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            runs = db.execute("SELECT count(*) FROM runs").fetchone()[0] if "runs" in tables else 0
    except sqlite3.Error:
        return None
    if not tables:
        return None
    keep = (
        f"Nothing in it is a finished run: move it aside or delete it (rm {path}) and rerun, which makes it anew."
        if not runs
        else f"It holds {runs} run(s): move it aside, keeping the copy, and rerun, which makes a new store (or "
        f"restore it from a backup)."
    )
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = ""
    return (
        f"The MLflow store {path} (tracking.uri) is half-made: its creation stopped part-way (e.g. on a full disk"
        f"{free}), so MLflow can neither finish nor open it ({root_cause(error)}). {keep} "
        f"Nothing was run."
    )
