"""Shared set-up for the one-process-per-device strategies (ddp, ddp_amp, fsdp).

The process group is created from the launcher's environment: the rank, world size and local rank as the rank's
entry read them (pipeline.rank_env.RankEnv), MASTER_ADDR/PORT read by torch's env:// rendezvous. NCCL when each rank
has its own GPU, Gloo on CPU, and Gloo also when ranks share a GPU (an oversubscribed functional check: NCCL refuses
two ranks on one device; shares_gpu holds the rule). Its
timeout is train.timeout_s, so a rank that stops participating fails the trial instead of hanging the sweep.
"""

from __future__ import annotations

import datetime
import gc
import os

import torch
import torch.distributed as dist

from pipeline.host.devices import device_for, keep_freed_memory
from pipeline.rank_env import RankEnv

from .base import Strategy


class DistributedStrategy(Strategy):
    one_device_only = False
    multiprocess = True
    # DDP's and FSDP's constructors import torch._dynamo: most of a second in every rank of every trial, unless
    # the parent has it already when it forks them
    HEAVY_MODULES = ("torch._dynamo",)

    def check_devices(self) -> None:
        pass

    def setup(self, rank: int = 0, world_size: int = 1, rank_env: RankEnv | None = None) -> torch.device:
        torch.set_num_threads(1)
        keep_freed_memory()
        self.rank_env = rank_env or RankEnv(rank, world_size, local_rank=rank)  # without it: one node, local = global
        self.rank, self.world_size = self.rank_env.rank, self.rank_env.world_size
        self.local_rank = self.rank_env.local_rank
        self.device = device_for(self.host, self.local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        elif self.cfg.pin_cores and hasattr(os, "sched_setaffinity"):
            # one device = one core: keep each worker on its own core (no migrations, warm caches)
            cores = sorted(os.sched_getaffinity(0))
            os.sched_setaffinity(0, {cores[self.local_rank % len(cores)]})
        if not dist.is_initialized():
            nccl = self.device.type == "cuda" and not self.shares_gpu
            dist.init_process_group(
                "nccl" if nccl else "gloo",
                rank=self.rank,
                world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.cfg.timeout_s),
                device_id=self.device if nccl else None,
            )
        self.backend = dist.get_backend()
        return self.device

    @property
    def shares_gpu(self) -> bool:
        """Ranks of this node share GPUs round-robin: an oversubscribed trial (train.oversubscribe) with more ranks
        per node than this rank sees GPUs.

        Not from the count of visible GPUs alone: under a per-rank GPU binding (SLURM --gpus-per-task=1) each rank
        sees one GPU, its own. Without train.oversubscribe the trial's feasibility check, made where all of the
        node's GPUs are visible, has given each rank a GPU of its own; should a binding still put two ranks on one
        GPU, NCCL refuses it by name ("Duplicate GPU detected") instead of a silent Gloo run."""
        return self.host.kind == "cuda" and self.cfg.oversubscribe and self.cfg.devices // self.cfg.nnodes > self.host.n

    def facts(self) -> dict:
        return {**super().facts(), "backend": self.backend}

    @property
    def data_shard(self) -> tuple[int, int]:
        return self.rank, self.world_size

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    def gather(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_flag(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], device=self.device)
        dist.broadcast(t, src=0)
        return bool(t.item())

    def barrier(self) -> None:
        # a 1-element all-reduce rather than dist.barrier: the same call on Gloo and NCCL, finished when synchronised
        dist.all_reduce(torch.zeros(1, device=self.device))
        self.synchronize()

    def teardown(self) -> None:
        # collect the wrapped model first: a comm hook's state (PowerSGD) that outlives the process group
        # aborts the worker at exit ("Resource deadlock avoided")
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
