"""An MLflow server's requests, bounded and said while they wait. MLflow's HTTP client retries a request 7 times with
a backoff doubling from 2 s and waits 120 s for each answer: a sweep whose server is lost sits silent for minutes per
request, and a trial's stop makes several. Parallax sets MLflow's own environment variables instead (a user's
settings of them win): after the first request (`first_contact`: 1 retry, 10 s), every request gives up after
RETRIES retries, each waiting at most TIMEOUT_S for an answer, BACKOFF seconds doubling between them; each retry
prints one line naming the server and what it waits for. The lines come from urllib3's own "Retrying" log record,
rewritten here: neither MLflow nor requests offers a hook per retry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys

from pipeline.redact import redact

RETRIES_VAR, TIMEOUT_VAR, BACKOFF_VAR = (
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
    "MLFLOW_HTTP_REQUEST_TIMEOUT",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
)
RETRIES, TIMEOUT_S, BACKOFF = 3, 15, 2  # a lost server: ~13 s per request refused, ~75 s per request unanswered
STEADY = {RETRIES_VAR: str(RETRIES), TIMEOUT_VAR: str(TIMEOUT_S), BACKOFF_VAR: str(BACKOFF)}
QUICK = {RETRIES_VAR: "1", TIMEOUT_VAR: "10"}  # the first request: says at once that nobody answers
_SET: dict[str, str] = {}  # the values Parallax set, never taken for the user's


def _users(key: str) -> bool:
    value = os.environ.get(key)
    return value is not None and value != _SET.get(key)


def _apply(values: dict) -> None:
    for key, value in values.items():
        if not _users(key):
            os.environ[key] = value
            _SET[key] = value


def bounds() -> str:
    """The bound in force, in words, with the variables that set it."""
    return (
        f"{os.environ.get(RETRIES_VAR, '7')} retries of at most {os.environ.get(TIMEOUT_VAR, '120')} s each "
        f"({RETRIES_VAR}, {TIMEOUT_VAR} and {BACKOFF_VAR} set them)"
    )


def reason(error) -> str:
    """What an HTTP request to the server met, in a few words: the system's own (`[Errno 111] Connection refused`),
    no answer in time, or the connection closed; else the error's type."""
    text = str(error)
    if m := re.search(r"\[Errno -?\d+\] [^'\")]+", text):
        return m[0].strip()
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        return f"no answer within {os.environ.get(TIMEOUT_VAR, '120')} s"
    if "aborted" in low or "closed" in low or "reset" in low:
        return "the connection closed"
    return type(error).__name__


class _Said(logging.Filter):
    """urllib3's "Retrying (Retry(total=N ...)) after connection broken by ERR: /api/2.0/mlflow/..." log record, as one
    line on the console naming the server; the record itself is dropped."""

    server = ""

    def filter(self, record) -> bool:
        if not (self.server and str(record.msg).startswith("Retrying") and len(record.args or ()) == 3):
            return True
        retry, error, url = record.args
        if "mlflow" not in str(url):
            return True
        most = int(os.environ.get(RETRIES_VAR, "7"))
        left = getattr(retry, "total", None)
        n = f"{most - left}/{most}" if isinstance(left, int) else f"of {most}"
        print(
            redact(f"waiting for the MLflow server {self.server} (retry {n}: {reason(error)}; {bounds()})"),
            file=sys.stderr,
            flush=True,
        )
        return False


_SAID = _Said()
logging.getLogger("urllib3.connectionpool").addFilter(_SAID)


def bound(uri: str) -> None:
    """Every later request to the MLflow server `uri` bounded (STEADY, unless the user set MLflow's variables) and
    each retry said on the console. A store that is no server (SQLite) makes no HTTP request: nothing to say."""
    _apply(STEADY)
    if uri.lower().startswith(("http://", "https://")):
        _SAID.server = uri


@contextlib.contextmanager
def first_contact():
    """The first request runs with 1 retry and a 10 s timeout (unless the user set them): it should say at once that
    nobody answers. Later requests run under `bound`."""
    _apply(QUICK)
    try:
        yield
    finally:
        _apply(STEADY)
