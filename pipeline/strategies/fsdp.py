"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks.

Delta from `ddp`: instead of replicating the model, each block with parameters is sharded, then the root
(torchtitan's apply_fsdp order: leaves first, root last). Parameters are all-gathered for each block's forward
and backward and gradients reduce-scattered, so per-device memory falls as devices are added.

The final state: on NCCL, distributed checkpointing's full state_dict (`get_model_state_dict`). On Gloo (CPU hosts,
and ranks sharing a GPU) rank 0 joins CPU copies of every rank's shards instead (`full_state_from_cpu_shards`): the
full-state gather all-gathers the shards where they live, and a functional all-gather of CUDA tensors over Gloo
crashes the rank (SIGSEGV with two ranks on one GPU); `cpu_offload` moves the tensors only after that gather.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from pipeline.measure.comm_probes import ProfiledComm
from pipeline.models import blocks

from .distributed import DistributedStrategy

# FSDP2's record_function labels of its collectives (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
# all-gather (copy-in + collective), its copy-out, the reduce-scatter (copy-in, collective, division) and its wait
COMM_SPANS = ("FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::post_backward_rs_wait")


def full_state_from_cpu_shards(model: nn.Module) -> dict:
    """Collective: the full state_dict on rank 0 ({} on the others), joined from CPU copies of each rank's shards
    with one c10d gather_object, so no collective touches a device tensor.

    A sharded parameter is a DTensor on a 1-D mesh of the world: Shard(d) shards are concatenated along d in the
    mesh's rank order (FSDP2 splits dim 0 as torch.chunk does: the last ranks may hold fewer rows, or none), a
    Replicate one is rank 0's. Buffers are not sharded: rank 0's are kept (BatchNorm's statistics are each rank's
    own), as get_model_state_dict does."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the plain model's keys
    state = model.state_dict()
    local = {k: (v.to_local() if isinstance(v, DTensor) else v).detach().cpu() for k, v in state.items()}
    rank, world = dist.get_rank(), dist.get_world_size()
    parts = [None] * world if rank == 0 else None
    dist.gather_object(local, parts, dst=0)
    if rank != 0:
        return {}
    full = {}
    for k, v in state.items():
        if not isinstance(v, DTensor):
            full[k] = local[k].clone()
            continue
        ranks = v.device_mesh.mesh.flatten().tolist()
        if v.device_mesh.ndim != 1 or sorted(ranks) != list(range(world)):
            raise RuntimeError(f"{k}: sharded over {v.device_mesh}, not a 1-D mesh of the world's {world} ranks")
        placement = v.placements[0]
        if isinstance(placement, Shard):
            full[k] = torch.cat([parts[r][k] for r in ranks], dim=placement.dim)
        elif isinstance(placement, Replicate):
            full[k] = local[k].clone()
        else:
            raise RuntimeError(f"{k}: placement {placement} cannot be joined from CPU shards")
        if full[k].shape != v.shape:
            raise RuntimeError(f"{k}: joined shards have shape {tuple(full[k].shape)}, not {tuple(v.shape)}")
    return full


def full_state_from_dcp(model: nn.Module) -> dict:
    """Collective: the full state_dict on rank 0 ({} on the others), through distributed checkpointing."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().clone() for k, v in full.items()}


def full_state_fn(backend: str):
    """How the final state is gathered on a process group of `backend` (module docstring)."""
    return full_state_from_dcp if backend == "nccl" else full_state_from_cpu_shards


class FSDPStrategy(DistributedStrategy):
    name = "fsdp"
    channels_last_params = False  # fully_shard needs contiguous parameters: channels_last at use (models.py)
    # distributed checkpointing is a heavy import: loaded when an FSDP trial starts, not by every process that
    # lists the strategies
    HEAVY_MODULES = (
        *DistributedStrategy.HEAVY_MODULES,
        "torch.distributed.fsdp",
        "torch.distributed.checkpoint.state_dict",
        "torch.distributed._tools.fsdp2_mem_tracker",
    )

    def wrap(self, model, criterion):
        from torch.distributed.fsdp import fully_shard

        for _, block in list(blocks(model)):  # each block its own unit, then the root
            fully_shard(block)
        fully_shard(model)
        return model, criterion

    def comm_probe(self, model):
        return ProfiledComm(
            COMM_SPANS,
            self.device,
            "torch.profiler on the sampled step: CPU, main-thread time inside FSDP's all-gather "
            "(+copy-out) and reduce-scatter spans (Gloo blocks the caller: all exposed); CUDA, NCCL "
            "kernel time not overlapped by other kernels; charged to the phase it falls in",
        )

    def state_dict(self, model):
        # Collective: every rank must call it; full tensors land on CPU, rank 0 keeps them.
        return full_state_fn(self.backend)(model)

    def memory_tracker(self, model, optimizer):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        from pipeline.measure.memory import CpuMemProbe

        plain = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the tracker needs the FSDP module itself
        return CpuMemProbe(self.devices, plain, optimizer, tracker=FSDPMemTracker(plain, optimizer))
