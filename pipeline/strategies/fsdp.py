"""FSDP2 (`fully_shard`): parameters, gradients and optimizer state sharded across ranks.

Delta from `ddp`: instead of replicating the model, each block with parameters is sharded, then the root
(torchtitan's apply_fsdp order: leaves first, root last). Parameters are all-gathered for each block's forward
and backward and gradients reduce-scattered, so per-device memory falls as devices are added.
"""

from __future__ import annotations

from torch import nn

from pipeline.measure.comm_probes import ProfiledComm

from .distributed import DistributedStrategy

# FSDP2's record_function labels of its collectives (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py):
# all-gather (copy-in + collective), its copy-out, the reduce-scatter (copy-in, collective, division) and its wait
COMM_SPANS = ("FSDP::all_gather", "FSDP::post_backward_reduce", "FSDP::post_backward_rs_wait")


def _blocks(model: nn.Module):
    """The units to shard: each direct child that owns parameters (a layer of LeNet, a stage block of ResNet)."""
    for child in model.children():
        if isinstance(child, nn.Sequential) and len(list(child.children())) > 1:
            yield from (b for b in child.children() if any(True for _ in b.parameters()))
        elif any(True for _ in child.parameters()):
            yield child


class FSDPStrategy(DistributedStrategy):
    name = "fsdp"
    channels_last_params = False  # fully_shard needs contiguous parameters; inputs may still be NHWC
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

        for block in list(_blocks(model)):
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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.detach().clone() for k, v in full.items()}

    def memory_tracker(self, model, optimizer):
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        from pipeline.measure.memory import CpuMemProbe

        return CpuMemProbe(self.devices, model, optimizer, tracker=FSDPMemTracker(model, optimizer))
