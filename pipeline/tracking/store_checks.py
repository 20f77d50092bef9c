"""The MLflow store's first contact, checked: a quick first request, a writable artifact folder, and no store
tracebacks in the log (Parallax reports a store fault itself, in one message).
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from pipeline.errors import StoreError
from pipeline.preflight import writable_dir


class _NoStoreTracebacks(logging.Filter):
    """MLflow's SQL store logs a full traceback for each failed write (a locked or full database) before raising it;
    Parallax reports that fault itself, in one message, so the log record is dropped."""

    def filter(self, record):
        return not (record.exc_info and record.getMessage().startswith("SQLAlchemy database error"))


logging.getLogger("mlflow.store.db.utils").addFilter(_NoStoreTracebacks())


@contextlib.contextmanager
def first_contact():
    """MLflow's HTTP client retries 7 times over about two minutes, and waits 120 s per request: right for a long
    sweep against a busy server, wrong for the first request, which should say at once that nobody answers."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update({k: v for k, v in quick.items() if saved[k] is None})  # the user's settings win
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)


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
