"""The launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK) is read in one place, pipeline/rank_env.py,
once at a rank's entry, and passed down as one value: no other module of pipeline/ reads it."""

from __future__ import annotations

import re

import pytest

from pipeline.rank_env import RankEnv
from tests.project import REPO

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_RANK")
READ = re.compile(r"""environ(?:\.get\(|\[)\s*["'](%s)["']""" % "|".join(LAUNCHER))


def test_only_rank_env_reads_the_launchers_variables():
    readers = sorted(
        f"{p.relative_to(REPO)}: {m.group(1)}"
        for p in (REPO / "pipeline").rglob("*.py")
        if p.name != "rank_env.py" or p.parent.name != "pipeline"
        for m in READ.finditer(p.read_text())
    )
    assert not readers, "read the launcher's environment through pipeline.rank_env.RankEnv:\n" + "\n".join(readers)


def test_a_ranks_place_is_read_from_the_launchers_environment():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "2", "MASTER_ADDR": "10.0.0.1"}
    assert RankEnv.read(env) == RankEnv(rank=5, world_size=8, local_rank=1, node="2")
    # one node: LOCAL_RANK and GROUP_RANK may be unset
    assert RankEnv.read({"RANK": "1", "WORLD_SIZE": "2"}) == RankEnv(rank=1, world_size=2, local_rank=1, node="0")
    with pytest.raises(KeyError):  # outside the launcher there is no rank to read
        RankEnv.read({})
