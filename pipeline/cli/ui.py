"""`python -m pipeline ui`: MLflow's own UI on 127.0.0.1 over the tracking store, started only on a port that is a
port and free (MLflow's server prints a traceback and exits 0 on either), after the experiment's shared runs-table
view is written (ui_view.py). The link is printed once the server listens (MLflow takes 10-30 s to start), so a
click never meets "connection refused". Its --port is parsed by pipeline.cli.types.port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from pipeline.config import loader


def _port_in_use(port: int) -> int | None:
    """None if 127.0.0.1:port can be bound now (as MLflow's server binds it, address reuse on), else a free port to
    suggest."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return None
        except OSError:
            pass
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args) -> int:
    from pipeline.redact import redact
    from pipeline.tracking import client

    free = _port_in_use(args.port)
    if free is not None:  # before MLflow starts: its server would print a traceback and still exit 0
        raise loader.ConfigError(
            f"Port {args.port} on 127.0.0.1 is in use (another MLflow UI, `make ui` or "
            f"`make dashboard`?). Stop that one, or pick another port: --port {free} is "
            f"free now (make ui UI_PORT={free})."
        )
    cfg = loader.load(args.params, args.overrides)
    # the store's URL through the environment, not argv: a password in it stays out of the process list; MLflow 3's
    # job runners (a huey consumer per task queue, a folder in /dev/shm) serve features Parallax never uses
    env = {
        **os.environ,
        "MLFLOW_BACKEND_STORE_URI": client.tracking_uri(cfg),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    cmd = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(args.port)]
    base = f"http://127.0.0.1:{args.port}"
    print(f"Starting MLflow's UI for {redact(env['MLFLOW_BACKEND_STORE_URI'])} (10-30 s) ...", flush=True)
    route = None
    if not args.no_view:
        from pipeline.tracking import ui_view

        route = ui_view.publish_for(client.Tracker(cfg))
    server = start(cmd, env)  # argument vector, no shell
    try:
        if not listening(args.port, server):
            print(f"MLflow's UI ended before it listened on {base} (exit {server.returncode})", file=sys.stderr)
            return server.returncode or 1
        print(f"MLflow UI on {base} (local only; Ctrl-C to stop)", flush=True)
        if route:
            print(
                f"The runs table with throughput, efficiency and accuracy columns, in any browser:\n  {base}/{route}",
                flush=True,
            )
        return server.wait()
    except KeyboardInterrupt:  # the terminal's Ctrl-C reached the server too: let it finish, then leave
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        return 130


def start(cmd: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env)


def listening(port: int, server: subprocess.Popen, poll_s: float = 0.25) -> bool:
    """Wait until 127.0.0.1:port accepts a connection (True) or the server has ended (False)."""
    while server.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=poll_s):
                return True
        except OSError:
            time.sleep(poll_s)
    return False
