"""Fixtures of the CLI tests."""

from __future__ import annotations

import pytest

from pipeline.scaling import memory


@pytest.fixture
def fit_root(tmp_path, monkeypatch, tmp_path_factory):
    """A project root for `fit` under tmp_path (its runs/device_basis.json), with the memory model's counts in one
    file for the session (each model counted once)."""
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    counts = tmp_path_factory.getbasetemp() / "fit-counts.json"
    monkeypatch.setattr(memory, "_cache_file", lambda cache: counts)
    return tmp_path
