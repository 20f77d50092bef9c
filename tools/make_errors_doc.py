"""Regenerate docs/errors.md from the bad-input cases the test suite checks (tests/config/test_errors.py).

.venv/bin/python tools/make_errors_doc.py > docs/errors.md
"""

import contextlib
import io
import os
import shlex
import shutil
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONWARNINGS"] = "ignore"


def main():
    import pytest  # noqa: F401  (the cases' module imports it)

    from pipeline.cli import main as cli
    from pipeline.data import store
    from tests.config import test_errors as te

    tmp = Path(tempfile.mkdtemp())
    synth = tmp / "synthetic"
    store.prepare(synth, "synthetic", progress=False)

    class MP:  # the fixture's monkeypatch, by hand
        def setenv(self, k, v):
            os.environ[k] = v

        def chdir(self, p):
            os.chdir(p)

    os.environ["DVC_ROOT"] = str(tmp)

    class Factory:  # the fixture's tmp_path_factory, by hand
        def mktemp(self, name):
            (tmp / name).mkdir()
            return tmp / name

    te.env.__wrapped__(lambda: None, tmp, synth, MP())
    damaged = te.damaged.__wrapped__(synth, Factory())
    print("# Errors: every bad input and the message it gets\n")
    print(
        "Each stops before any work, exits non-zero and writes nothing to the MLflow or Optuna stores "
        "(checked by `tests/config/test_errors.py`; regenerate this page with `python tools/make_errors_doc.py`). "
        "Paths below come from a temporary directory. Exit status 2: bad input (nothing was run); 1: a store "
        "that cannot be used, a failed trial, or a fault after runs were opened; 130 / 143: interrupted by "
        "SIGINT (Ctrl-C) / SIGTERM. Any URL in a message has its password replaced by `***`.\n"
    )
    for name, argv, _ in te.CASES:
        if argv is None:
            continue
        argv = [a.replace("{tmp}", str(tmp)).replace("{damaged}", str(damaged)) for a in argv]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli(argv)
            except SystemExit as e:
                code = e.code
        msg = " ".join(err.getvalue().split()).replace(str(tmp), "$TMP")
        msg = msg[msg.find("error:") :] if "error:" in msg else msg
        print(f"## {name}\n\n`python -m pipeline {shlex.join(argv).replace(str(tmp), '$TMP')}` → exit {code}\n")
        print("> " + "\n> ".join(textwrap.wrap(msg, 110)) + "\n")
    after_runs_opened(cli, tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def after_runs_opened(cli, tmp):
    """Faults that can only happen once runs are open: what is recorded, and the message
    (tests/sweep/test_faults.py)."""
    import sqlite3

    from pipeline.tracking import client

    print("# Faults after runs are open\n")
    print(
        "Some faults can only happen once a trial's MLflow run and Optuna trial are open: a full disk, a store "
        "that becomes read-only or unreachable. The trial is then closed as FAILED with the reason (MLflow tag "
        "`failure`, Optuna user attribute `reason`) and enqueued again, the study's parent run ends FAILED with "
        "the same reason, nothing is left RUNNING, and the command prints one paragraph and exits 1. A rerun "
        "after the cause is fixed finishes the study without repeating finished trials "
        "(`tests/sweep/test_faults.py`).\n"
    )
    real = client.log_completed_run

    def disk_full(*a, **kw):
        raise sqlite3.OperationalError("database or disk is full")

    client.log_completed_run = disk_full
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli(
                [
                    "sweep",
                    "--strategy",
                    "single",
                    "--set",
                    "data.train_limit=512",
                    "--set",
                    "sweep.spaces.single={devices: [1], batch_size: [64], lr: [0.1]}",
                ]
            )
    finally:
        client.log_completed_run = real
    msg = " ".join(err.getvalue().split()).replace(str(tmp), "$TMP")
    msg = msg[msg.find("error:") :]
    print(
        f"## the MLflow store's disk fills up during a trial\n\n`python -m pipeline sweep --strategy single` "
        f"→ exit {code}\n"
    )
    print("> " + "\n> ".join(textwrap.wrap(msg, 110)) + "\n")
    print(
        "## a live trial whose heartbeat is late\n\nOn a loaded host a worker's heartbeat can be later than "
        "`PARALLAX_GRACE_S`. A trial whose worker runs on the same host and is alive is never failed as stale. "
        "If a worker on another host fails it anyway, its own worker notices at the next heartbeat, stops the "
        "trial at the end of the epoch, ends its MLflow run KILLED and goes on; its output says `-> taken over: "
        "another worker failed this trial as stale (late heartbeat) and runs it again; nothing recorded here`. "
        "Nothing is recorded twice.\n"
    )


if __name__ == "__main__":
    main()
