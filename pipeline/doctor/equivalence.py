"""One-step equivalence: one optimizer step of any strategy, from the same weights on the same global batch, gives
the parameters of single-device SGD. The one check the tests (tests/strategies/test_strategies.py) and `doctor` share.

fp32 strategies must match to float tolerance; mixed precision (ddp_amp) must move the weights the same way
within a bf16/fp16 tolerance, measured on the update (new - initial), not on the weights themselves.

The step runs with TF32 off (train.fp32_precision=ieee: IEEE fp32 cuDNN convolutions and matmuls in every process of the
trial, each switch restored afterwards, capabilities.fp32_pinned): cuDNN picks algorithms per shape, and TF32 ones
(on by default for convolutions on Ampere and newer) differ from fp32 by about 1e-3 relative, so two batch splits
would compare TF32 noise against the fp32 tolerance. fp16 starts GradScaler at FP16_INIT_SCALE: at PyTorch's 2**16
a first step can overflow and be skipped, and a skipped step has no update to compare; one that is still skipped is
reported as "skipped by GradScaler", never as a mismatch. A config with train.fp32_precision=tf32 runs the check in
TF32 instead (benchmarks/gpu/gpu_first_run.py compares the two on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.config import loader
from pipeline.models import build_model
from pipeline.trial.launch import run_trial

LR = 0.5  # large enough that one step moves every weight well beyond float noise
FP32_TOL = {"cpu": (1e-6, 1e-4), "cuda": (1e-5, 1e-3)}  # (atol, rtol); cuDNN picks algorithms per shape
LOW_PRECISION_REL = 0.05  # relative difference of the update, for bf16/fp16 autocast
# fp16 GradScaler's first scale in the check: 64x below PyTorch's 2**16 against overflow on the first step, still
# large enough to keep LeNet's small fp16 gradients above fp16's normal range (6e-5)
FP16_INIT_SCALE = 2.0**10


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str  # what was compared and the worst difference, in words
    worst: float  # the worst difference (absolute for fp32, relative to the update for mixed precision)
    skipped: bool = False  # GradScaler skipped the step: nothing was compared


def own_settings(base_cfg) -> dict:
    """The train settings the step takes whatever `base_cfg` (params.yaml and doctor's --set) says, beyond its row's
    strategy, k, model and batch: a --set of one of these reaches doctor's timed run only, and doctor.md says so."""
    return {
        "train.lr": LR,
        "train.fp32_precision": "tf32" if base_cfg.train.fp32_precision == "tf32" else "ieee",
        "train.amp_init_scale": FP16_INIT_SCALE,
        "train.cuda_graphs": False,  # one step is eager under train.cuda_graphs too: captured after its warm-up
    }


def one_step(
    base_cfg, out_dir: Path, strategy: str, k: int, model: str = "lenet", batch: int = 64, extra=()
) -> tuple[dict, dict]:
    """Run one step of `strategy` on k devices, eager (a CUDA graph replays only after its warm-up steps, so the
    step a graph trial starts with is this one), with `own_settings`; returns (final state_dict, trial metrics)."""
    cfg = loader.override(
        base_cfg,
        [
            f"train.strategy={strategy}",
            f"train.devices={k}",
            f"train.model={model}",
            f"train.batch_size={batch}",
            "train.max_steps=1",
            f"data.train_limit={batch * 2}",
            "data.test_limit=64",
            *extra,
            *(f"{key}={str(v).lower() if isinstance(v, bool) else v}" for key, v in own_settings(base_cfg).items()),
        ],
    )
    # GradScaler's first scale reaches the autocast rows only: the others run its default, which a trial refuses to
    # record unrun otherwise (loader.unapplied_refusal)
    cfg = loader.replace_train(cfg, **loader.unapplied(cfg.train))
    metrics = run_trial(cfg, out_dir, progress=False, timeout_s=cfg.sweep.trial_timeout_s)  # a hang fails the row
    return torch.load(Path(out_dir) / "final_state.pt", weights_only=True), metrics


def initial_state(model: str = "lenet", seed: int = 0) -> dict:
    return build_model(model, seed).state_dict()


def compare(
    ref: dict,
    got: dict,
    init: dict | None = None,
    low_precision: bool = False,
    device_kind: str = "cpu",
    keys=None,
    tol: tuple[float, float] | None = None,
) -> Verdict:
    """Does `got` (a strategy's state after one step) match `ref` (single's)?"""
    if ref.keys() != got.keys():
        missing, extra = sorted(ref.keys() - got.keys()), sorted(got.keys() - ref.keys())
        return Verdict(False, f"different parameters: missing {missing[:3]}, unexpected {extra[:3]}", float("inf"))
    if init is not None:
        moved = max((ref[n].float() - init[n].float()).abs().max().item() for n in ref)
        if moved <= 1e-4:  # two untouched models would compare equal: that proves nothing
            return Verdict(False, f"the reference step did not move the weights (max change {moved:.2g})", 0.0)
    names = list(keys or ref)
    if low_precision:
        if init is None:
            raise ValueError("a low-precision comparison needs the initial weights")
        rel = {
            n: ((ref[n].float() - init[n].float()) - (got[n].float() - init[n].float())).norm().item()
            / max((ref[n].float() - init[n].float()).norm().item(), 1e-12)
            for n in names
        }
        worst = max(rel, key=rel.get)
        ok = rel[worst] < LOW_PRECISION_REL
        return Verdict(
            ok,
            f"update within {rel[worst]:.3f} of single's relative to its size (tolerance "
            f"{LOW_PRECISION_REL}; worst: {worst})",
            rel[worst],
        )
    atol, rtol = tol or FP32_TOL.get(device_kind, FP32_TOL["cuda"])
    diffs = {n: (ref[n].float() - got[n].float()).abs().max().item() for n in names}
    worst = max(diffs, key=diffs.get)
    ok = all(torch.allclose(ref[n].float(), got[n].float(), atol=atol, rtol=rtol) for n in names)
    return Verdict(
        ok, f"max abs diff {diffs[worst]:.3g} vs single (atol {atol:g}, rtol {rtol:g}; worst: {worst})", diffs[worst]
    )


def skipped_by_scaler(metrics) -> Verdict | None:
    """A Verdict saying GradScaler skipped the one step (so there is no update to compare), or None."""
    skipped, steps = metrics.get("amp_skipped_steps") or 0, metrics.get("steps") or 0
    if not skipped or skipped < steps:
        return None
    return Verdict(
        False,
        f"skipped by GradScaler: inf/NaN in the fp16 gradients, so the step left the weights "
        f"unchanged and nothing was compared (scale after it: {metrics.get('amp_scale'):g})",
        float("nan"),
        skipped=True,
    )


def check(
    ref: dict, got: dict, metrics, init: dict | None = None, low_precision: bool = False, device_kind: str = "cpu"
) -> Verdict:
    """compare(), unless GradScaler skipped the step (`metrics`: the trial's record)."""
    return skipped_by_scaler(metrics) or compare(ref, got, init, low_precision, device_kind)
