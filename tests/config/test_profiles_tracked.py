"""Every profile defines every key dvc.yaml tracks from `experiments/${profile}.yaml`: DVC raises MissingParamsError
("Parameters 'data' are missing from 'experiments/gpu.yaml'") when it records a stage whose tracked key a profile
lacks (dvc/dependency/param.py, ParamsDependency.get_hash), so `dvc exp run -S profile=NAME` would train and then
fail to record the stage."""

from __future__ import annotations

import pytest
import yaml

from ..conftest import REPO

PROFILE_FILE = "experiments/${profile}.yaml"


def _tracked_keys() -> set[str]:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    keys: set[str] = set()
    for stage in stages.values():
        body = stage.get("do", stage)  # a foreach stage's body sits under `do`
        for entry in body.get("params", []):
            if isinstance(entry, dict) and PROFILE_FILE in entry:
                keys.update(entry[PROFILE_FILE])
    return keys


def _has(doc: dict, dotted: str) -> bool:
    node = doc
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_dvc_yaml_tracks_profile_keys():
    assert {"data", "train", "sweep", "analyze"} <= _tracked_keys()  # the whole sweep section: spaces, budget, ...


# ids end in .yaml: a bare "gpu" id would be taken for the gpu marker (tests/conftest.py) and skipped here
PROFILES = sorted(p.stem for p in (REPO / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: f"{p}.yaml")
def test_every_profile_defines_every_tracked_key(profile):
    doc = yaml.safe_load((REPO / "experiments" / f"{profile}.yaml").read_text())
    missing = sorted(k for k in _tracked_keys() if not _has(doc, k))
    assert not missing, f"experiments/{profile}.yaml lacks {missing}, which dvc.yaml tracks from every profile"
