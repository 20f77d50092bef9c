"""DDP + torch.amp, the modern replacement for NVIDIA Apex: the forward always under autocast (amp.py: bf16, or fp16
with a GradScaler). Its delta from `ddp` is one flag: base.Strategy's hooks run the step through amp.Amp."""

from __future__ import annotations

from .ddp import DDPStrategy


class DDPAmpStrategy(DDPStrategy):
    name = "ddp_amp"
    VARIANTS = (("bf16", ("train.amp_dtype=bf16",)), ("fp16+GradScaler", ("train.amp_dtype=fp16",)))
    always_autocast = True
