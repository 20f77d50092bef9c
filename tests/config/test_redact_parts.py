"""Credentials in any part of a URL (the user, the password, a token given as the user, a secret-like query or
fragment value) never reach a message: one helper, pipeline.redact.redact, hides it for every path that shows a URL."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline import preflight
from pipeline.errors import StoreError
from pipeline.redact import has_password, redact
from tests.conftest import REPO

SECRET = "ghp_S3cretT0ken"

# every part of a URL that may hold a credential, each with the SECRET in it
SECRET_URLS = [
    f"http://{SECRET}@127.0.0.1:1/",  # a token given as the URL's user
    f"https://{SECRET}:x-oauth-basic@127.0.0.1:1/",  # a token as the user, with a password
    f"https://{SECRET}:@127.0.0.1:1/",  # a token as the user, with an empty password
    f"postgresql://u:{SECRET}@127.0.0.1:1/db",
    f"postgresql://u@127.0.0.1:1/db?sslmode=require&api_key={SECRET}",
    *(
        f"http://127.0.0.1:1/api?x=1&{name}={SECRET}"
        for name in (
            "token",
            "access_token",
            "api_key",
            "apikey",
            "key",
            "secret",
            "password",
            "passwd",
            "pwd",
            "auth",
            "sig",
            "signature",
            "credential",
            "credentials",
            "X-Auth",
            "X-Amz-Signature",
            "AccessToken",
            "API_KEY",
            "PASSWORD",
            "Sig",
            "client_secret",
            "sslkey",
            "private_key",
            "session",
            "jwt",
            "bearer",
        )
    ),
    f"http://127.0.0.1:1/api;token={SECRET}",
    f"http://127.0.0.1:1/cb#access_token={SECRET}&state=1",
    f"postgresql://u@127.0.0.1:1/db?options=-c%20password%3D{SECRET}",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_every_url_part_that_may_hold_a_secret_is_hidden(url):
    for text in (url, repr(url), f"Cannot reach {url} (tracking.uri): refused.", f"{url} and {url}"):
        shown = redact(text)
        assert SECRET not in shown and "***" in shown, shown
    assert "127.0.0.1:1" in redact(url)  # the host and port stay: they are what the user must check
    assert has_password(url)  # so the dvc.lock warning is given


def test_what_holds_no_secret_is_kept():
    for text in (
        "http://127.0.0.1:5000/ answered 503; mail admin@example.org",
        "sqlite:////abs/mlruns/optuna.db",
        "postgresql://h:5432/db?sslmode=require&application_name=parallax",
        "train.lr=0.2 key: value",
    ):
        assert redact(text) == text


def test_the_user_of_a_url_is_hidden_whole():
    assert redact(f"http://{SECRET}@127.0.0.1:1/x") == "http://***@127.0.0.1:1/x"
    assert redact("postgresql://user:pw@db:5432/o?sslmode=require") == "postgresql://***@db:5432/o?sslmode=require"


@pytest.mark.parametrize("url", [SECRET_URLS[0], SECRET_URLS[4], SECRET_URLS[7]])
def test_cannot_reach_and_the_dvc_lock_warning_hide_it(url, capsys):
    preflight._WARNED.clear()
    with pytest.raises(StoreError) as e:
        preflight.check_store(url, "tracking.uri")
    err = capsys.readouterr().err
    assert "Cannot reach" in str(e.value) and SECRET not in str(e.value), str(e.value)
    assert "dvc.lock" in err and SECRET not in err, err


def test_the_environment_variable_warning_hides_it(tmp_path, monkeypatch, capsys):
    preflight._WARNED.clear()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://{SECRET}@127.0.0.1:1?api_key={SECRET}")
    monkeypatch.setenv("OPTUNA_STORAGE", f"postgresql://u:{SECRET}@127.0.0.1:1/db")
    preflight.check_store(f"sqlite:///{tmp_path / 'mlflow.db'}", "tracking.uri")
    preflight.check_store(f"sqlite:///{tmp_path / 'optuna.db'}", "sweep.storage")
    err = capsys.readouterr().err
    assert "MLFLOW_TRACKING_URI is set" in " ".join(err.split()) and "OPTUNA_STORAGE is set" in err, err
    assert SECRET not in err, err


def test_every_command_prints_the_token_of_no_url(tmp_path, synthetic_root):
    """The probe's case end to end: a token as the URL's user in tracking.uri and in MLFLOW_TRACKING_URI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "OPTUNA_"))}
    env.update(
        PYTHONPATH=str(REPO),
        DVC_ROOT=str(tmp_path),
        PARALLAX_PREFLIGHT_TIMEOUT_S="2",
        MLFLOW_TRACKING_URI=f"http://{SECRET}@127.0.0.1:1",
    )
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text((REPO / "experiments" / "cpu.yaml").read_text())
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "train",
            "--out",
            str(tmp_path / "o"),
            "--max-steps",
            "1",
            "--set",
            "data.source=synthetic",
            "--set",
            f"data.dir={synthetic_root}",
            "--set",
            f"tracking.uri=http://{SECRET}@127.0.0.1:1?api_key={SECRET}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert SECRET not in out and "Cannot reach http://***@127.0.0.1:1?api_key=***" in out, out[-3000:]
    assert "warning: MLFLOW_TRACKING_URI is set (http://***@127.0.0.1:1)" in " ".join(out.split()), out[-3000:]
