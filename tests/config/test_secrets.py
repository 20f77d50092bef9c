"""Passwords in store URLs: shown as *** whatever characters they hold (`/ # ?`, a space, a quote, an `@`) and in
password-like query values; `make dashboard` neither prints nor passes the store URL on a command line, and an
unreachable store there ends in one paragraph, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.redact import redact
from tests.conftest import REPO

SECRET = "PW_s3cret-4711"
HOSTILE = [
    f"p/a#s?w{SECRET}",
    f"my pass {SECRET}",
    f"it's{SECRET}",
    f'q"{SECRET}',
    f"a@b/c{SECRET}",
    f"{SECRET}:x@y",
    f"{SECRET}/1?2#3 4'5\"6",
]


@pytest.mark.parametrize("password", HOSTILE)
def test_a_password_of_any_characters_is_hidden(password):
    """Everything between `user:` and the last `@` before the host is the secret, whatever it holds."""
    url = f"postgresql+psycopg://user:{password}@db.example:5432/optuna?sslmode=require"
    for text in (url, repr(url), f"Cannot reach {url} (sweep.storage): refused.", f"{url!r} and {url}"):
        shown = redact(text)
        assert SECRET not in shown and "://***@db.example:5432/optuna?sslmode=require" in shown, shown
    assert redact(f"Cannot reach {url} (sweep.storage): refused.") == (
        "Cannot reach postgresql+psycopg://***@db.example:5432/optuna?sslmode=require (sweep.storage): refused."
    )


def test_password_like_query_values_are_hidden():
    """sslpassword= and other password-like query keys are hidden; the rest of the URL and message is kept."""
    for key in ("password", "sslpassword", "PGPASSWORD", "api_token", "client_secret"):
        text = f"'postgresql://h/db?sslmode=require&{key}={SECRET}&user=x' (sweep.storage)"
        assert redact(text) == f"'postgresql://h/db?sslmode=require&{key}=***&user=x' (sweep.storage)"
    assert SECRET not in redact(f"postgresql://h/db?sslpassword=it's{SECRET}")


def test_urls_without_a_password_are_kept():
    """A host:port, a file path and an e-mail address in prose are not redacted; a user alone is (it may be a
    token)."""
    for text in (
        "http://127.0.0.1:5000/ answered 503; mail admin@example.org",
        "sqlite:////abs/mlruns/optuna.db",
        "postgresql://h:5432/db?sslmode=require",
        "postgresql://:@host/db",
    ):
        assert redact(text) == text.replace("//:@", "//***@")


def _dashboard(env_url: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    env.update(OPTUNA_STORAGE=env_url, PYTHONPATH=str(REPO), PARALLAX_PREFLIGHT_TIMEOUT_S="2")
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli.dashboard"], capture_output=True, text=True, timeout=60, env=env, cwd=REPO
    )


def test_dashboard_on_an_unreachable_store_is_one_paragraph_without_the_password():
    """The launcher reads the URL from the environment and names the store, password hidden, in one message."""
    pytest.importorskip("optuna_dashboard", reason="optuna-dashboard is not installed")
    p = _dashboard(f"postgresql://user:my pass/{SECRET}@127.0.0.1:1/db")
    out = p.stdout + p.stderr
    assert p.returncode == 1 and "Traceback" not in out and SECRET not in out, out
    assert "Cannot reach postgresql://***@127.0.0.1:1/db (OPTUNA_STORAGE)" in " ".join(out.split()), out


def test_make_dashboard_keeps_the_url_off_the_command_line():
    """The recipe passes OPTUNA_STORAGE through the environment: neither echoed nor in any process's argv."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}
    env["OPTUNA_STORAGE"] = f"postgresql://user:{SECRET}@127.0.0.1:1/db"
    p = subprocess.run(
        ["make", "-n", "-W", ".venv/.installed", "dashboard"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert p.returncode == 0 and "pipeline.cli.dashboard" in p.stdout, p.stdout + p.stderr
    assert SECRET not in p.stdout + p.stderr, p.stdout


def test_the_store_check_reads_the_host_after_a_password_with_reserved_characters():
    """The pre-run check finds the host and port after a password holding `/ # ?` (urllib alone ends the password
    at the first of them and calls the URL's port invalid), and names the store with its password hidden."""
    from pipeline import preflight
    from pipeline.errors import StoreError

    url = f"postgresql://user:p/a#s?w {SECRET}@127.0.0.1:1/db"
    with pytest.raises(StoreError) as e:
        preflight.check_store(url, "sweep.storage")
    assert SECRET not in str(e.value) and "127.0.0.1:1 gave" in str(e.value), str(e.value)
