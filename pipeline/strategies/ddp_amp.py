"""DDP + torch.amp, the modern replacement for NVIDIA Apex: autocast the forward, scale the loss for fp16.

Delta from `ddp`: an autocast context (bf16 on CPUs and on GPUs with native bf16, else fp16) and a GradScaler, which is
a no-op object for bf16 (bf16 keeps fp32's exponent range, so no loss scaling is needed).
"""
from __future__ import annotations

import torch

from .ddp import DDPStrategy


class DDPAmpStrategy(DDPStrategy):
    name = "ddp_amp"
    VARIANTS = (("bf16", ("train.amp_dtype=bf16",)), ("fp16+GradScaler", ("train.amp_dtype=fp16",)))

    @classmethod
    def autocast_dtype(cls, t, device_type: str) -> str:
        if t.amp_dtype != "auto":
            return t.amp_dtype
        # native bf16 only: PyTorch's default also counts emulated bf16 (pre-Ampere GPUs), slower than fp16 there
        native = device_type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
        return "bf16" if native else "fp16"

    def setup(self, rank=0, world_size=1):
        device = super().setup(rank, world_size)
        want = self.autocast_dtype(self.cfg, device.type)
        self.dtype = torch.bfloat16 if want == "bf16" else torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)
        return device

    def facts(self) -> dict:
        return {**super().facts(), "amp_dtype": str(self.dtype).replace("torch.", "")}

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def optimizer_step(self, optimizer):
        self.scaler.step(optimizer)
        self.scaler.update()
