"""`RankEnv`: what PyTorch's elastic launcher (torchrun, torch.distributed.run) tells one rank through its
environment, read once at the rank's entry (`RankEnv.read()`) and passed down as one value. MASTER_ADDR and
MASTER_PORT are torch's own to read (`init_process_group`'s env:// rendezvous); Parallax reads the rest here."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankEnv:
    """One rank's place in the trial: `rank` of `world_size` processes, `local_rank` on its node (its device's
    index there), `node` the launcher's GROUP_RANK. The default is the one process of a single-device trial."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node: str = "0"

    @classmethod
    def read(cls, environ: Mapping[str, str] = os.environ) -> RankEnv:
        """The launcher's RANK and WORLD_SIZE (a KeyError outside it), LOCAL_RANK (RANK when unset: one node) and
        GROUP_RANK ("0" when unset)."""
        rank = int(environ["RANK"])
        return cls(
            rank=rank,
            world_size=int(environ["WORLD_SIZE"]),
            local_rank=int(environ.get("LOCAL_RANK", rank)),
            node=environ.get("GROUP_RANK", "0"),
        )
