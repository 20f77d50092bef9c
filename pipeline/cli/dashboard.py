"""`make dashboard`: optuna-dashboard on 127.0.0.1 over the sweeps' Optuna store, named by $OPTUNA_STORAGE (default:
mlruns/optuna.db). The URL comes from the environment, never argv, and is shown with its password hidden; a store
that cannot be opened, a missing optuna-dashboard or a busy port ends in one paragraph, not a traceback.

    OPTUNA_STORAGE=postgresql://user@host/db .venv/bin/python -m pipeline.cli.dashboard --port 8080
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from pipeline.cli.types import port as port_type
from pipeline.errors import StoreError
from pipeline.paths import repo_root
from pipeline.redact import redact
from pipeline.user_errors import user_errors

KEY = "OPTUNA_STORAGE"
_PORTS = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}


def storage_url() -> str:
    return os.environ.get(KEY) or f"sqlite:///{repo_root() / 'mlruns' / 'optuna.db'}"


def open_store(url: str):
    """The Optuna store at `url`, reachable and readable, or StoreError naming it (password hidden) and the fix."""
    from pipeline import preflight

    if url.startswith("sqlite:///") and not os.path.exists(url[len("sqlite:///") :]):
        raise StoreError(
            f"No Optuna store at {redact(url)} ({KEY}): run a sweep first (`make pipeline` or `dvc "
            f"repro`), or set {KEY} to the sweep.storage URL of a shared study."
        )
    if url.startswith("sqlite:"):
        preflight.check_store(url, KEY)
    else:
        _reach(url)
    import optuna

    try:
        storage = optuna.storages.RDBStorage(url)
        storage.get_all_studies()
    except Exception as e:  # the driver's, SQLAlchemy's or Optuna's error: its first line, password hidden
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise StoreError(
            f"Cannot open the Optuna store {redact(url)} ({KEY}): {type(e).__name__}: {redact(first)}. "
            f"Check the URL, the user's rights and the server; the password is best kept in "
            f"PGPASSWORD or ~/.pgpass rather than in the URL."
        ) from None
    return storage


def _reach(url: str) -> None:
    """A database server that does not answer fails in seconds, not after the driver's retries. The host and port
    are SQLAlchemy's reading of the URL (urllib's ends a password at its first `/?#`)."""
    from sqlalchemy.engine import make_url

    from pipeline.preflight import PREFLIGHT_TIMEOUT_S

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - SQLAlchemy's ArgumentError, ValueError for a bad port
        raise StoreError(
            f"{KEY}={redact(url)!r} is not a database URL (dialect://user@host:port/db). Fix it."
        ) from None
    if not parsed.host:  # a unix socket, or a file
        return
    port = parsed.port or _PORTS.get(parsed.get_backend_name())
    if port is None:
        return
    try:
        with socket.create_connection((parsed.host, port), timeout=PREFLIGHT_TIMEOUT_S):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, socket.timeout) else (e.strerror or type(e).__name__)
        raise StoreError(
            f"Cannot reach {redact(url)} ({KEY}): {parsed.host}:{port} gave {why} within "
            f"{PREFLIGHT_TIMEOUT_S:.0f} s. Start the server or fix the address (docs/scale-out.md), or "
            f"unset {KEY} for the sweeps' mlruns/optuna.db."
        ) from None


def _check_port(port: int) -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise StoreError(
                f"Port {port} on 127.0.0.1 is in use (another dashboard, `make ui`?). Stop that one, "
                f"or pick another port: make dashboard DASHBOARD_PORT=NNNN."
            ) from None


def run(port: int) -> None:
    try:
        import optuna_dashboard
    except ModuleNotFoundError:
        raise StoreError(
            f"optuna-dashboard is not installed: {sys.executable} -m pip install optuna-dashboard"
        ) from None
    url = storage_url()
    storage = open_store(url)
    _check_port(port)
    print(f"Optuna dashboard on http://127.0.0.1:{port} for {redact(url)} (local only; Ctrl-C to stop)", flush=True)
    optuna_dashboard.run_server(storage, host="127.0.0.1", port=port)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.cli.dashboard", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=port_type, default=8080, help="port on 127.0.0.1 (default 8080)")
    args = parser.parse_args(argv)
    with user_errors() as status:
        run(args.port)
    return status.code


if __name__ == "__main__":
    sys.exit(main())
