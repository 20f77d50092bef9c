"""The pre-run store check tells a healthy SQLite store that a killed writer left with a hot journal from a corrupt
one: the hot store passes (its journal rolled back, its rows kept), and a damaged one is called corrupt with advice
to copy it aside, never to move or delete it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from pipeline.errors import StoreError
from pipeline.preflight import check_store

# a writer in the store's own journal mode (SQLite's default rollback journal, as MLflow and Optuna leave it)
# changes the store inside a transaction, says so, and waits to be killed before it can commit
_WRITER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA journal_mode=DELETE")
con.execute("PRAGMA cache_size=1")  # spills the change to the file, so the journal is needed to undo it
con.execute("BEGIN IMMEDIATE")
con.executemany("INSERT INTO runs VALUES (?, ?)", [(i, "x" * 2000) for i in range(2, 400)])
con.execute("UPDATE runs SET name = 'half-written' WHERE id = 1")
print("written", flush=True)
time.sleep(600)
"""


def _store(path):
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)")
        con.execute("INSERT INTO runs VALUES (1, 'kept')")


def _kill_mid_write(path):
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()


def test_a_store_with_a_hot_journal_is_rolled_back_and_passes(tmp_path, capsys):
    """A writer SIGKILLed mid-transaction leaves a hot journal; the check accepts the store, and afterwards the store
    holds exactly what was committed (the journal was rolled back, nothing was moved or lost); a note says so."""
    db = tmp_path / "optuna.db"
    _store(db)
    _kill_mid_write(db)
    journal = tmp_path / "optuna.db-journal"
    assert journal.exists() and journal.stat().st_size > 0, "the test did not leave a hot journal"
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # what a read-only open meets
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            con.execute("SELECT count(*) FROM runs").fetchone()

    check_store(f"sqlite:///{db}", "sweep.storage")

    assert "rolled it back" in capsys.readouterr().err
    assert db.exists()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        assert con.execute("SELECT id, name FROM runs").fetchall() == [(1, "kept")]
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_corrupt_store_is_called_corrupt_and_the_advice_copies_it(tmp_path):
    """A store whose pages are damaged (its schema's too, so a reader meets it) fails integrity_check: the message
    says corrupt and advises copying it aside (never moving or deleting it), and the file is left where it was."""
    db = tmp_path / "mlflow.db"
    _store(db)
    with sqlite3.connect(db) as con:
        con.executemany("INSERT INTO runs VALUES (?, ?)", [(i, "y" * 500) for i in range(2, 200)])
        con.execute("CREATE INDEX by_name ON runs(name)")
    raw = bytearray(db.read_bytes())
    page = 4096
    for at in (100, *range(2 * page + 100, len(raw) - page, page)):  # the schema's page and those of the rows
        raw[at : at + 64] = b"\xa5" * 64
    db.write_bytes(bytes(raw))
    size = db.stat().st_size
    with pytest.raises(StoreError) as e:
        check_store(f"sqlite:///{db}", "tracking.uri")
    msg = " ".join(str(e.value).split())
    assert "corrupt" in msg and "cp " in msg, msg
    assert "move it aside" not in msg and "delete" not in msg.lower() and "rm " not in msg, msg
    assert db.exists() and db.stat().st_size == size
