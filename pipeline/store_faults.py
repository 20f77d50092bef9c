"""What stopped a store, read from an exception's chain: `store_fault` (a key of FAULT_TEXT: disk full, locked, no
answer, unreachable) and `root_cause` (the driver's own words)."""

from __future__ import annotations


def root_cause(e: BaseException) -> str:
    """`Type: first line` of the innermost explicit cause: Optuna wraps every driver error into "... e.g. exceeding
    max length", MLflow into MlflowException; the driver's own words (connection refused, locked, disk full) are
    what the user needs."""
    seen = set()
    while e.__cause__ is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


_FAULTS = (
    ("disk_full", ("no space left", "disk is full", "errno 28", "quota exceeded")),
    ("locked", ("database is locked", "database table is locked")),
    ("no_answer", ("timeout expired", "timed out", "read timeout")),
    (
        "unreachable",
        (
            "connection refused",
            "could not connect",
            "connection failed",
            "server closed the connection",
            "name or service not known",
            "no route to host",
        ),
    ),
)
FAULT_TEXT = {
    "disk_full": "the disk is full",
    "locked": "the store is locked by another process",
    "no_answer": "the store did not answer in time",
    "unreachable": "the store is unreachable",
}


def store_fault(e: BaseException) -> str | None:
    """Which store fault `e` (or any exception in its chain) is: a key of FAULT_TEXT, or None."""
    import errno

    texts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return "disk_full"
        texts.append(str(e).lower())
        e = e.__cause__ or e.__context__
    text = " ".join(texts)
    return next((k for k, needles in _FAULTS if any(n in text for n in needles)), None)
