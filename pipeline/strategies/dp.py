"""torch.nn.DataParallel (d2l's concise multi-GPU chapter): one process replicates the model onto k GPUs each step,
scatters the batch, and gathers every output onto `output_device`, where the loss is computed: the source of the
device-0 memory imbalance. `train.output_device` moves the gather (the usual attempted fix).

DataParallel silently becomes a plain one-device call without CUDA, so on a CPU-only host it is unavailable.

Every replica computes in device 0's memory format (`match_layout`): `replicate` broadcasts the parameters through
`broadcast_coalesced`, which flattens them with `.contiguous()` and hands devices 1.. contiguous copies while
replica 0 keeps the originals (torch/nn/parallel/comm.py `broadcast_coalesced`, torch/_utils.py
`_flatten_dense_tensors`). With channels_last weights (train.channels_last) cuDNN would then convert the weights on
every convolution call, forward and backward, on devices 1.. only: per-device work a user did not ask for, in dp's
and dp_criterion's step time. Copying each such weight back to channels_last once per step (one more pass over the
bytes the broadcast already wrote) gives every device's convolutions the same layouts; the copy is differentiable, so
gradients still reach the broadcast.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.host.devices import device_for
from pipeline.measure.comm_probes import ProfiledComm

from .base import Strategy

NEEDS_CUDA = (
    "torch.nn.DataParallel needs CUDA GPUs: without CUDA it runs the module unchanged on one device, "
    "so a k-device run would be a disguised single-device job"
)


def match_layout(module: nn.Module, replicas: list[nn.Module]) -> list[nn.Module]:
    """`replicas` (replicate's output, modified in place), each channels_last parameter of `module` channels_last in
    every replica too; nothing to do (one pass over the parameters) when none is."""
    cl = torch.channels_last
    wanted = [
        (i, key)
        for i, m in enumerate(module.modules())
        for key, p in m._parameters.items()
        if p is not None and p.dim() == 4 and p.is_contiguous(memory_format=cl) and not p.is_contiguous()
    ]
    for replica in replicas if wanted else ():
        mods = list(replica.modules())  # replicate copies module.modules() in this order
        for i, key in wanted:
            t = getattr(mods[i], key)  # replicas hold parameters as plain attributes (replicate.py)
            if not t.is_contiguous(memory_format=cl):
                t = t.contiguous(memory_format=cl)
                setattr(mods[i], key, t)
                if hasattr(mods[i], "_former_parameters"):
                    mods[i]._former_parameters[key] = t
    return replicas


class SameLayoutDataParallel(nn.DataParallel):
    """nn.DataParallel whose replicas keep device 0's memory format (module docstring)."""

    def replicate(self, module, device_ids):
        return match_layout(module, super().replicate(module, device_ids))


class DataParallelStrategy(Strategy):
    one_device_only = False
    name = "dp"

    @classmethod
    def unavailable_reason(cls, host):
        return None if host.kind == "cuda" else f"unavailable on this CPU-only host: {NEEDS_CUDA}"

    def check_devices(self) -> None:
        if self.cfg.output_device >= self.cfg.devices:
            raise ValueError(
                f"train.output_device={self.cfg.output_device} is not one of the trial's devices "
                f"0..{self.cfg.devices - 1}."
            )

    @property
    def devices(self):
        return [device_for(self.host, i) for i in range(self.cfg.devices)]

    def wrap(self, model, criterion):
        out = self.devices[self.cfg.output_device]
        return (
            SameLayoutDataParallel(model, device_ids=list(range(self.cfg.devices)), output_device=out),
            criterion.to(out),
        )

    def place_batch(self, model, x, y):
        # the loss is computed where the outputs are gathered: the targets go there
        return [(model, x, y.to(self.devices[self.cfg.output_device], non_blocking=True))]

    def comm_probe(self, model):
        # replicate/scatter/gather (forward) and the gradients' reduce onto device 0 (backward) run inside the
        # phases: NCCL broadcasts and device-to-device copies, exposed where no other kernel runs
        return ProfiledComm(
            (),
            self.devices[0],
            "torch.profiler on the sampled step: NCCL and memcpy kernel time "
            "(replicate, scatter, gather, gradient reduce) not overlapped by other kernels; charged to "
            "the phase it falls in",
            kernels=("nccl", "memcpy"),
        )

    def eval_model(self, model):
        return model.module

    def state_dict(self, model):
        return super().state_dict(model.module)

    def memory_tracker(self, model, optimizer):
        raise RuntimeError(NEEDS_CUDA)
