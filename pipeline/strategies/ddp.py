"""DistributedDataParallel: one process per device, bucketed gradient all-reduce overlapped with backward.

Delta from `single`: a process group (DistributedStrategy), the model wrapped in DDP, each rank trains on its
chunk of every global batch, and the communication knobs of the DDP design (bucket size, gradients as bucket
views, a compression hook, and `no_sync` accumulation: all-reduce only every `accum_steps` micro-batches).

The gradient transport is DDP's own all-reduce by default (comm_hook=none: Gloo on CPU, NCCL on GPUs), so `ddp`
measures what users run. comm_hook=shm exchanges gradients through shared memory between the ranks of one CPU host
(shm_allreduce.py, as NCCL does between the GPUs of one node); the cpu-comm profile and benchmarks/scaling/scaling.py
measure it beside Gloo. fp16/bf16/powersgd are PyTorch's compression hooks.
"""

from __future__ import annotations

import contextlib
import inspect

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from pipeline.measure.comm_probes import DDPStats

from . import shm_allreduce
from .distributed import DistributedStrategy

# DDP's switch of the buffer sync before each forward, by the name the installed torch takes: forward_sync_buffers
# from torch 2.13, where the older broadcast_buffers warns a FutureWarning in every trial; broadcast_buffers on the
# floor (2.11), which lacks the new name. The two differ only at init, where broadcast_buffers=False also leaves the
# buffers out of the first sync: wrap passes False only in a world of one, where that sync has no other copy to match.
SYNC_BUFFERS = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
    else "broadcast_buffers"
)

COMM_HOOKS = {
    "fp16": lambda: (None, default_hooks.fp16_compress_hook),
    "bf16": lambda: (None, default_hooks.bf16_compress_hook),
    "powersgd": lambda: (
        powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2, use_error_feedback=True
        ),
        powerSGD_hook.powerSGD_hook,
    ),
}


class DDPStrategy(DistributedStrategy):
    name = "ddp"

    def check_devices(self) -> None:
        if self.cfg.comm_hook != "shm":
            return
        if self.host.kind != "cpu" or self.cfg.nnodes > 1:
            raise ValueError(
                "train.comm_hook=shm exchanges gradients through this host's shared memory: it needs "
                "every rank on one CPU host (train.nnodes=1, no GPU); use comm_hook=none (Gloo/NCCL)."
            )
        why = shm_allreduce.available(0)  # the architecture and /dev/shm; the gradients' size is checked in wrap
        if why:
            raise ValueError(f"train.comm_hook=shm cannot run here: {why}; use comm_hook=none (Gloo).")

    def wrap(self, model, criterion):
        ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = DDP(
            model,
            device_ids=ids,
            bucket_cap_mb=self.cfg.bucket_cap_mb,
            gradient_as_bucket_view=self.cfg.grad_as_bucket_view,
            static_graph=self.cfg.cuda_graphs,  # its buckets final before the capture (trial/graphs.py)
            # BatchNorm's buffers from rank 0 before every forward: with one rank there is no other copy to match
            **{SYNC_BUFFERS: self.world_size > 1},
        )
        self.comm_hook = self.cfg.comm_hook  # reported as comm_hook_used
        if self.comm_hook == "shm":
            grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
            why = shm_allreduce.available(grad_bytes * self.world_size)
            if why:
                raise RuntimeError(f"train.comm_hook=shm cannot run here: {why}; use comm_hook=none (Gloo).")
            ddp.register_comm_hook(
                shm_allreduce.ShmAllreduce(grad_bytes, self.cfg.timeout_s), shm_allreduce.shm_allreduce_hook
            )
        elif self.comm_hook != "none":
            state, hook = COMM_HOOKS[self.comm_hook]()
            ddp.register_comm_hook(state, hook)
        return ddp, criterion

    def facts(self) -> dict:
        return {**super().facts(), "comm_hook_used": self.comm_hook}

    @property
    def accum_steps(self) -> int:
        return self.cfg.accum_steps

    def sync_context(self, model, is_step):
        # accum_steps = a: gradients are all-reduced only on the micro-batch that steps (no_sync skips the
        # reducer on the other a-1), so a x fewer all-reduces per image
        return contextlib.nullcontext() if is_step else model.no_sync()

    def comm_probe(self, model):
        return DDPStats(model)

    def eval_model(self, model):
        return getattr(model, "_orig_mod", model).module

    def state_dict(self, model):
        return super().state_dict(model.module)
