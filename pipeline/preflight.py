"""Checks made before any MLflow run or Optuna trial is opened: stores reachable and usable, output paths writable.

A store that cannot be reached fails within seconds (PREFLIGHT_TIMEOUT_S) with its address, credentials redacted,
instead of after MLflow's or the database driver's minutes of retries. A relative SQLite URL is resolved against the
store root, like the default store (store_url); an in-memory one is refused. Torch-free and MLflow-free: SQLite URLs
are split by hand rather than by SQLAlchemy's make_url, which `train --no-track` on the core install does not have.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import sqlite3
import tempfile
import urllib.parse
from pathlib import Path

from .env import env_number
from .errors import DataError, PathError, StoreError
from .paths import store_root, too_long
from .redact import has_password, redact
from .user_errors import say

PREFLIGHT_TIMEOUT_S = env_number(
    "PARALLAX_PREFLIGHT_TIMEOUT_S",
    5.0,
    lo=0,
    lo_open=True,
    hi=3600,
    what="how many seconds the check before a run waits for a store's server to answer",
)
_WARNED: set[str] = set()
_ENV = {"tracking.uri": "MLFLOW_TRACKING_URI", "sweep.storage": "OPTUNA_STORAGE"}  # read by the tools, not by us
_BARE_FIX = {
    "tracking.uri": ("http(s)://HOST:PORT for an MLflow server", "MLFLOW_TRACKING_PASSWORD"),
    "sweep.storage": ("postgresql+psycopg://USER@HOST:PORT/DB", "PGPASSWORD or ~/.pgpass"),
}
_PORTS = {"http": 80, "https": 443, "postgresql": 5432, "postgres": 5432, "mysql": 3306, "mssql": 1433}


_SQLITE = re.compile(r"(?P<scheme>sqlite(?:\+\w+)?)://(?P<rest>.*)", re.I | re.S)


def _sqlite(url: str) -> tuple[str, str, str] | None:
    """(scheme, database path, query) of a SQLite URL as SQLAlchemy reads it (the path "" or ":memory:" for an
    in-memory database); None for any other URL."""
    m = _SQLITE.fullmatch(url)
    if not m:
        return None
    path, _, query = m["rest"][1:].partition("?") if m["rest"].startswith("/") else ("", "", "")
    return m["scheme"], path, query


def _in_memory(path: str, query: str) -> bool:
    return path in ("", ":memory:") or path.startswith("file::memory:") or "mode=memory" in query.lower()


def store_url(value: str, key: str, default: str) -> str:
    """The URL of the store `key` names: `value`, with a relative SQLite path taken from the store root ($DVC_ROOT
    when set, else the repository root: paths.store_root), as the empty default, mlruns/<default> there, is. Never
    the current directory: under `dvc exp run --temp` it is a checkout DVC deletes with the stores in it, and a
    command run from a sub-directory would start other stores than the one run from the root."""
    if not value:
        return f"sqlite:///{store_root() / 'mlruns' / default}"
    parts = _sqlite(value)
    if parts is None or _in_memory(parts[1], parts[2]):
        return value
    scheme, path, query = parts
    file_uri = path.startswith("file:")  # sqlite:///file:o.db?uri=true
    inner = path[len("file:") :] if file_uri else path
    if Path(inner).is_absolute():
        return value
    resolved = store_root() / inner
    if f"{key}/relative" not in _WARNED:
        _WARNED.add(f"{key}/relative")
        say(
            f"note: {key}={redact(value)} is relative: the store is {resolved} (a relative SQLite path is taken "
            f"from $DVC_ROOT when set, else the repository root, like the default store; never from the current "
            f"directory)."
        )
    return f"{scheme}:///{'file:' if file_uri else ''}{resolved}" + (f"?{query}" if query else "")


def check_store(url: str, key: str) -> None:
    """Raise StoreError unless the store at `url` (the value of `key`) can be used: a server answers on its port,
    or a local SQLite file is a database in a writable directory."""
    if has_password(url) and key not in _WARNED:
        _WARNED.add(key)
        say(
            f"warning: {key} carries a password or token ({redact(url)}). Parallax never shows or stores it, but "
            f"DVC records tracked parameters verbatim in dvc.lock and the shell keeps --set options in its history: "
            f"prefer PGPASSWORD, ~/.pgpass, MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_PASSWORD (docs/scale-out.md)."
        )
    _unused_env(url, key)
    if "://" not in url and redact(url) != url:  # user:password@host: a forgotten http:// or postgresql://
        form, env = _BARE_FIX.get(key, ("SCHEME://HOST:PORT", "the environment"))
        raise StoreError(
            f"{key}={redact(url)!r} is a server's address without its scheme: write it as a URL, {form}, with the "
            f"password in {env} rather than in the URL (docs/scale-out.md). Nothing was run."
        )
    if (parts := _sqlite(url)) is not None:
        _, path, query = parts
        if _in_memory(path, query):
            raise StoreError(
                f"{key}={redact(url)} is a SQLite database in memory: everything written to it ("
                f"{'the study and its trials' if key == 'sweep.storage' else 'the MLflow runs'}) would vanish when "
                f"this process ends, and no other process or worker could see it. Give a database file "
                f"(sqlite:////abs/path/file.db, or sqlite:///file.db, relative to $DVC_ROOT when set, else the "
                f"repository root), or leave {key} empty for the default store in mlruns/. Nothing was run."
            )
        _check_sqlite(Path(path[len("file:") :] if path.startswith("file:") else path), url, key)
        return
    parts = urllib.parse.urlsplit(redact(url))  # a password may hold `/?#`, where urllib alone ends the netloc
    scheme = parts.scheme.split("+")[0].lower()
    if scheme not in _PORTS or not parts.hostname:  # a unix socket, a file store, a scheme we do not know
        return
    try:
        port = parts.port or _PORTS[scheme]
    except ValueError:
        raise StoreError(f"{key}={redact(url)!r} has an invalid port. Fix the URL.") from None
    try:
        with socket.create_connection((parts.hostname, port), timeout=PREFLIGHT_TIMEOUT_S):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, socket.timeout) else (e.strerror or type(e).__name__)
        raise StoreError(
            f"Cannot reach {redact(url)} ({key}): {parts.hostname}:{port} gave {why} within "
            f"{PREFLIGHT_TIMEOUT_S:.0f} s. Start the server or fix the address (docs/scale-out.md), or leave {key} "
            f"empty for the local SQLite store in mlruns/. Nothing was run."
        ) from None


def _unused_env(url: str, key: str) -> None:
    """Warn, once per key, when the environment names another store than `key` does: MLflow's and optuna-dashboard's
    own variable (`make dashboard` reads OPTUNA_STORAGE) are not read by the pipeline, whose stores DVC tracks."""
    env = _ENV.get(key)
    if not env or not os.environ.get(env) or os.environ[env] == url or f"{key}/{env}" in _WARNED:
        return
    _WARNED.add(f"{key}/{env}")
    say(
        f"warning: {env} is set ({redact(os.environ[env])}), but Parallax writes to {key}, {redact(url)}: the "
        f"pipeline reads its stores from params.yaml, which DVC tracks, not from the environment. To use that store, "
        f"set {key}=URL (params.yaml or --set)."
    )


def _check_sqlite(path: Path, url: str, key: str) -> None:
    where = f"{redact(url)} ({key})"
    if why := too_long(path):
        raise StoreError(f"Cannot use {where}: the path {why}. Point {key} at a shorter path. Nothing was run.")
    if path.parent == store_root() / "mlruns":  # the default store: its folder is ours to create
        path.parent.mkdir(parents=True, exist_ok=True)
    if not path.parent.is_dir():
        raise StoreError(
            f"Cannot use {where}: the directory {path.parent} does not exist. Create it, or fix "
            f"the path (sqlite:////abs/path/file.db has four slashes). Nothing was run."
        )
    if path.exists():
        if not path.is_file():
            raise StoreError(f"Cannot use {where}: {path} is not a file. Point {key} at a database file.")
        _check_sqlite_file(path, where, key)
        if not os.access(path, os.W_OK):
            raise StoreError(
                f"Cannot write the store {where}: {path} is read-only. Make it writable (chmod u+w) or "
                f"point {key} at a copy you can write. Nothing was run."
            )
    writable_dir(path.parent, f"the store {where}")


def _check_sqlite_file(path: Path, where: str, key: str) -> None:
    """Raise StoreError unless `path` reads as a SQLite database. A read-only open is the cheap test; when it fails,
    only SQLite's integrity_check decides "corrupt": a writer killed mid-transaction leaves a hot journal that a
    read-only open cannot roll back ("attempt to write a readonly database"), and one read-write open does."""
    try:
        with contextlib.closing(
            sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, timeout=60)
        ) as con:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads and parses the schema
        return
    except sqlite3.DatabaseError as e:
        first = str(e)
    if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
        raise StoreError(
            f"Cannot open the store {where}: {path} did not open read-only ({first}), and it or its "
            f"directory is read-only, so SQLite cannot roll back an unfinished write (a -journal file "
            f"next to it). Make both writable (chmod u+w) and rerun; the store is not discarded. "
            f"Nothing was run."
        )
    hot = Path(f"{path}-journal").exists()
    try:
        with contextlib.closing(sqlite3.connect(str(path), timeout=60)) as con:  # rolls a hot journal back
            report = [r[0] for r in con.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            raise StoreError(
                f"Cannot use {where}: {path} stayed locked by another process for 60 s ({e}). Let "
                f"that process finish or stop it, then rerun. Nothing was run."
            ) from None
        report = [str(e)]
    except sqlite3.DatabaseError as e:
        report = [str(e)]
    if report == ["ok"]:
        if hot:
            say(
                f"note: {where} had an unfinished write (a process was stopped mid-write); SQLite rolled it back "
                f"and its integrity check passes."
            )
        return
    raise StoreError(
        f"Cannot use {where}: {path} is not a usable SQLite database: SQLite's integrity check fails "
        f"({'; '.join(report[:3])}). It is corrupt or not a database. Keep it: copy it aside "
        f"(cp {path} {path}.damaged); `sqlite3 {path}.damaged .recover` salvages what rows it can. To run now, "
        f"point {key} at a new store file. Nothing was run."
    )


def writable_dir(d: Path, what: str) -> None:
    """Raise StoreError unless a file can be created in the existing directory `d`."""
    try:
        with tempfile.NamedTemporaryFile(dir=d, prefix=".parallax-write-check-"):
            pass
    except OSError as e:
        raise StoreError(
            f"Cannot write {what}: {d} is not writable ({e.strerror or e}). Free space or fix the permissions "
            f"(a read-only or full file system refuses every write), or point it elsewhere. Nothing was run."
        ) from None


def _fits(path: Path, option: str, error=PathError) -> Path:
    if why := too_long(path):
        raise error(f"{option} {_short(path)} cannot be used: the path {why}. Give a shorter path. Nothing was run.")
    return Path(path)


def _short(path) -> str:
    text = str(path)
    return text if len(text) <= 160 else f"{text[:80]}...{text[-60:]}"


def output_file(path: Path, option: str) -> Path:
    """`path` is where a file will be written: not a directory, in a directory that can be written."""
    path = _fits(path, option)
    if path.is_dir():
        raise PathError(
            f"{option} {path} is a directory, but it names the file to write (e.g. "
            f"{path / 'out.csv'}). Give a file path. Nothing was run."
        )
    if path.exists() and not path.is_file():  # a device, FIFO or socket: written through a temp file, replaced
        raise PathError(
            f"{option} {path} is not a regular file (a device, FIFO or socket), and the output is "
            f"written beside it and then moved onto it, replacing it. Give the path of a regular file "
            f"(new or existing). Nothing was run."
        )
    _writable(path.parent, option, path)
    return path


def output_table(path: Path, option: str, strategy: str, foreign) -> Path:
    """`path` is where the sweep of `strategy` writes its table, replacing the file: output_file's checks, and the
    file, when it exists and holds anything, is a table of this strategy already (an earlier run's, which the sweep
    rewrites from its study). Anything else (a README, another strategy's table) is refused, unread by the sweep.
    `foreign(path)`: what the file holds when it is not such a table, else None (records.table.foreign, which the
    caller passes: the records wing is above this one)."""
    path = output_file(path, option)
    ours = f"this strategy's table (results/sweeps/{strategy}.jsonl, the default)"
    _replaces(path, option, foreign(path), f"the sweep of {strategy}", "table", ours)
    return path


def output_result(path: Path, option: str, command: str, key: str, what: str, default: str) -> Path:
    """`path` is where a command writes its JSON result (a JSON object with `key`), replacing the file:
    output_file's checks, and the file, when it exists and holds anything, is such a result already (an earlier
    run's). Anything else (a README, another command's output) is refused."""
    path = output_file(path, option)
    holds = None
    if path.exists():
        try:
            text = path.read_bytes().decode("utf-8")
            if text.strip() and not (isinstance(obj := json.loads(text), dict) and key in obj):
                holds = f"JSON that is not {what}"
        except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
            holds = f"text that is not {what}"
    _replaces(path, option, holds, command, "result", f"a result it wrote before ({default}, the default)")
    return path


def _replaces(path: Path, option: str, holds: str | None, writer: str, output: str, ours: str) -> None:
    """PathError when the file at `path` holds something else than `writer`'s output (`holds` says what)."""
    if holds:
        raise PathError(
            f"{option} {path} holds {holds}, and {writer} replaces the whole file with its own {output}. Point "
            f"{option} at a new file or at {ours}, or move the file aside first. Nothing was run."
        )


def output_dir(path: Path, option: str) -> Path:
    """`path` is a directory to write into: a directory already, or creatable."""
    path = _fits(path, option)
    if path.exists() and not path.is_dir():
        raise PathError(
            f"{option} {path} is an existing file, but it names the directory to write into. Give a "
            f"directory path (new or existing). Nothing was run."
        )
    _writable(path, option, path)
    return path


def input_dir(path: Path, option: str, holds: str) -> Path:
    """`path` is a directory to read from: it exists (an empty one is read as holding nothing). Checked first, so
    that a mistyped path stops the command instead of giving an empty result that looks like a real one."""
    path = _fits(path, option, DataError)
    if not path.is_dir():
        state = "is not a directory" if path.exists() else "does not exist"
        raise DataError(f"{option} {path} {state}; it names the directory of {holds}. Nothing was run.")
    return path


def _writable(d: Path, option: str, path: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".parallax-write-check-"):
            pass
    except OSError as e:
        raise PathError(
            f"{option} {path} cannot be written: {d} is not a writable directory ({e.strerror or e}). "
            f"Choose a path in a directory you can write to. Nothing was run."
        ) from None
