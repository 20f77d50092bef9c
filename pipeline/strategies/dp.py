"""torch.nn.DataParallel (d2l's concise multi-GPU chapter): one process replicates the model onto k GPUs each step,
scatters the batch, and gathers every output onto `output_device`, where the loss is computed: the source of the
device-0 memory imbalance. `train.output_device` moves the gather (the usual attempted fix).

DataParallel silently becomes a plain one-device call without CUDA, so on a CPU-only host it is unavailable.
"""
from __future__ import annotations

from torch import nn

from ..comm_probes import ProfiledComm
from ..devices import device_for
from .base import Strategy

NEEDS_CUDA = ("torch.nn.DataParallel needs CUDA GPUs: without CUDA it runs the module unchanged on one device, "
              "so a k-device run would be a disguised single-device job")


class DataParallelStrategy(Strategy):
    one_device_only = False
    name = "dp"

    @classmethod
    def unavailable_reason(cls, host):
        return None if host.kind == "cuda" else f"unavailable on this CPU-only host: {NEEDS_CUDA}"

    def check_devices(self) -> None:
        if self.cfg.output_device >= self.cfg.devices:
            raise ValueError(f"train.output_device={self.cfg.output_device} is not one of the trial's devices "
                             f"0..{self.cfg.devices - 1}.")

    @property
    def devices(self):
        return [device_for(self.host, i) for i in range(self.cfg.devices)]

    def wrap(self, model, criterion):
        out = self.devices[self.cfg.output_device]
        return (nn.DataParallel(model, device_ids=list(range(self.cfg.devices)), output_device=out),
                criterion.to(out))

    def place_batch(self, model, x, y):
        # the loss is computed where the outputs are gathered: the targets go there
        return [(model, x, y.to(self.devices[self.cfg.output_device], non_blocking=True))]

    def comm_probe(self, model):
        # replicate/scatter/gather (forward) and the gradients' reduce onto device 0 (backward) run inside the
        # phases: NCCL broadcasts and device-to-device copies, exposed where no other kernel runs
        return ProfiledComm((), self.devices[0], "torch.profiler on the sampled step: NCCL and memcpy kernel time "
                            "(replicate, scatter, gather, gradient reduce) not overlapped by other kernels; charged to "
                            "the phase it falls in", kernels=("nccl", "memcpy"))

    def eval_model(self, model):
        return model.module

    def state_dict(self, model):
        return super().state_dict(model.module)

    def memory_tracker(self, model, optimizer):
        raise RuntimeError(NEEDS_CUDA)
