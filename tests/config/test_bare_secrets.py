"""A password in a URL without its scheme (`user:password@host`, a forgotten `http://` or `postgresql://`) is hidden
like one with a scheme: in every message of every URL-like setting, also where the message quotes a library's
exception text holding the URL, and such a store address is refused by name before any library sees it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.errors import StoreError
from pipeline.redact import has_password, redact
from tests.conftest import REPO

SECRET = "S3CRETpw"
BARE = [
    f"alice:{SECRET}@host",
    f"alice:{SECRET}@host:5556/db",
    f"user:{SECRET}@127.0.0.1:55432/db",
    f"pguser:{SECRET}@127.0.0.1:55432/db?sslmode=require",
    f"alice:p@ss{SECRET}@127.0.0.1:5556",  # an `@` in the password: the secret runs to the word's last `@`
    f"ghp_{SECRET}:x-oauth-basic@github.com",  # the user is the secret: the whole userinfo goes
]


@pytest.mark.parametrize("url", BARE)
def test_a_password_without_a_scheme_is_hidden(url):
    host = url.rsplit("@", 1)[1]
    for text in (
        url,
        repr(url),
        f"Cannot use the MLflow tracking store {url} (tracking.uri): refused.",
        f"--set tracking.uri={url}",
        f"{url} and {url!r}.",
        f"error: unsupported URI {url!r}. See the docs",  # a library's own text, quoted
    ):
        shown = redact(text)
        assert SECRET not in shown and f"***@{host}" in shown, shown
    assert has_password(url)  # so the dvc.lock warning is given


def test_prose_without_a_url_is_kept():
    for text in (
        "error: mail admin@example.org for access",
        "key: value; user@host",
        "at 10:00:00 the sweep stopped",
        "http://127.0.0.1:5000/ answered 503",
        "sqlite:////abs/mlruns/optuna.db",
        "postgresql://h:5432/db?sslmode=require",
    ):
        assert redact(text) == text


@pytest.mark.parametrize("key", ["tracking.uri", "sweep.storage"])
def test_a_store_without_its_scheme_is_refused_by_name(key):
    from pipeline import preflight

    with pytest.raises(StoreError) as e:
        preflight.check_store(f"alice:{SECRET}@127.0.0.1:5556/db", key)
    msg = str(e.value)
    assert SECRET not in msg and f"{key}='***@127.0.0.1:5556/db'" in msg and "without its scheme" in msg, msg


def test_the_optuna_storage_error_hides_it_in_the_library_text(make_cfg, monkeypatch):
    """Past the pre-run check, SQLAlchemy's own message quotes the URL: both copies are hidden."""
    from pipeline.sweep import claims

    monkeypatch.setattr(claims, "check_store", lambda url, key: None)
    url = f"pguser:{SECRET}@127.0.0.1:55432/db"
    with pytest.raises(StoreError) as e:
        claims.open_storage(claims.storage_url(make_cfg(f"sweep.storage={url}")))
    msg = str(e.value)
    assert SECRET not in msg and "'***@127.0.0.1:55432/db' (sweep.storage)" in msg, msg


def test_the_mlflow_store_error_hides_it_in_the_library_text(make_cfg, monkeypatch):
    from pipeline.tracking import client

    monkeypatch.setattr(client, "check_store", lambda url, key: None)
    url = f"alice:{SECRET}@127.0.0.1:5556"
    with pytest.raises(StoreError) as e:
        client.Tracker(make_cfg(f"tracking.uri={url}"))
    msg = str(e.value)
    assert SECRET not in msg and "store ***@127.0.0.1:5556 (tracking.uri)" in msg, msg


@pytest.mark.parametrize("key", ["tracking.uri", "sweep.storage", "data.mirror"])
def test_no_command_prints_it(key, tmp_path, synthetic_root):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPTUNA_"))}
    env.update(PYTHONPATH=str(REPO), DVC_ROOT=str(tmp_path), PARALLAX_PREFLIGHT_TIMEOUT_S="2")
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    sets = {
        "data.source": "synthetic",
        "data.dir": str(synthetic_root),
        "sweep.storage": f"sqlite:///{tmp_path / 'o.db'}",
        "tracking.uri": f"sqlite:///{tmp_path / 'm.db'}",
        key: f"alice:{SECRET}@127.0.0.1:5556/db",
    }
    command = ["sweep", "--strategy", "single"]
    if key == "data.mirror":
        command = ["download"]
        sets.update({"data.source": "fashion-mnist", "data.dir": str(tmp_path / "fm")})
    p = subprocess.run(
        [sys.executable, "-m", "pipeline", *command, *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert SECRET not in out and "***@127.0.0.1:5556/db" in out, out[-3000:]
