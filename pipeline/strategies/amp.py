"""torch.amp for any strategy's step: autocast the forward, scale the loss for fp16 (the modern replacement for
NVIDIA Apex). `ddp_amp` always runs under it; `single` does with train.autocast, so AMP's gain at one device is told
apart from DDP's cost.

The type: bf16 on CPUs and on GPUs with native bf16, else fp16 (train.amp_dtype=auto), with a GradScaler that is a
no-op object for bf16 (bf16 keeps fp32's exponent range, so no loss scaling is needed).

GradScaler skips the optimizer step while its scale overflows the fp16 gradients and halves the scale, the first
steps included (2.11 torch/amp/grad_scaler.py:103-105). The steps it skipped and its final scale are trial facts:
a skipped step leaves the weights unchanged, which must not read as a wrong update. They are counted on the device
and read once, at the end.

Host syncs: bf16 and fp32 steps read no device value back (a stock AdamW's step count is a host tensor). An fp16
step does unless the optimizer steps with the scaler's found_inf itself: a stock optimizer's step behind GradScaler
is `if not found_inf.item()`, one host sync per step. So under fp16 loss scaling the optimizer is built `fused=True`
where that is safe (`optimizer_settings`): GradScaler then hands found_inf and the scale to the fused kernel, which
unscales and skips on the device. Fused needs a device with fused optimizer kernels (CUDA; CPU too in torch 2.14)
and an optimizer whose fused kernel honours a skipped step (base.FUSED_UNDER_SCALING: plain SGD and AdamW, not SGD
with momentum). Where either is missing the stock optimizer runs and each step synchronises; the trial says which
(`amp_step_syncs`: False, True; None without loss scaling). Fused is the same update in one kernel: plain SGD's
result is bitwise the stock one's (CPU, torch 2.14), AdamW's differs in the last bits of fp32; the doctor's one fp16
step (SGD) is within its tolerance.
"""

from __future__ import annotations

import torch


def resolve_dtype(t, device_type: str) -> str:
    """train.amp_dtype as it runs on `device_type`: "bf16" or "fp16"."""
    if t.amp_dtype != "auto":
        return t.amp_dtype
    # native bf16 only: PyTorch's default also counts emulated bf16 (pre-Ampere GPUs), slower than fp16 there
    native = device_type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
    return "bf16" if native else "fp16"


def has_fused_kernels(device_type: str) -> bool:
    """Whether torch.optim's fused SGD/AdamW run on `device_type` (the list their own device check reads)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices  # private; present at the 2.11 floor

    return device_type in _get_fused_kernels_supported_devices()


class Amp:
    """One process's autocast context, loss scaling and skipped-step count."""

    def __init__(self, t, device: torch.device):
        self.device = device
        self.dtype = torch.bfloat16 if resolve_dtype(t, device.type) == "bf16" else torch.float16
        fp16 = self.dtype == torch.float16
        self.scaler = torch.amp.GradScaler(device.type, init_scale=t.amp_init_scale, enabled=fp16)
        self.skipped = None  # a device counter, made at the first step (nothing is allocated before it)
        self.step_syncs = None  # fp16: whether the last step read found_inf to the host (set by step)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype)

    def optimizer_settings(self, is_fusable: bool) -> dict:
        """What the optimizer is built with besides its own settings: fused=True under fp16 loss scaling, where its
        fused kernel honours a skipped step (`is_fusable`) and this device has fused kernels; else nothing."""
        fused = self.scaler.is_enabled() and is_fusable and has_fused_kernels(self.device.type)
        return {"fused": True} if fused else {}

    def backward(self, loss) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer) -> None:
        # GradScaler's own test: an optimizer that takes found_inf itself (fused) is stepped without a host read
        self.step_syncs = self.scaler.is_enabled() and not getattr(optimizer, "_step_supports_amp_scaling", False)
        self.scaler.step(optimizer)
        # found_inf per device as step() just used it (GradScaler's own record; private, present since torch 1.6
        # and at the 2.11 floor; the fused path fills it too, before handing it to the kernel): any > 0 means the
        # step was skipped
        found = self.scaler._found_inf_per_device(optimizer) if self.scaler.is_enabled() else {}
        if found:
            if self.skipped is None:
                self.skipped = torch.zeros((), dtype=torch.int64, device=self.device)
            self.skipped += (sum(v.to(self.skipped.device) for v in found.values()) > 0).long()
        self.scaler.update()

    def facts(self) -> dict:
        on = self.scaler.is_enabled()
        return {
            "amp_dtype": str(self.dtype).replace("torch.", ""),
            "amp_scale": self.scaler.get_scale() if on else None,
            "amp_skipped_steps": (int(self.skipped.item()) if self.skipped is not None else 0) if on else None,
            "amp_step_syncs": self.step_syncs if on else None,
        }
