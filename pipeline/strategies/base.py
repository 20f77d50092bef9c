"""The strategy interface; `single` (one device, one process) *is* the base class.

Every hook has a do-nothing default, so each strategy module reads as a small difference from this one
(pytorch/examples ddp-tutorial-series: set up, wrap, shard, autocast, step, reduce, unwrap, tear down).
`train_step` is the only step: a strategy changes it through its hooks (zero_grad, sync_context, place_batch,
autocast, forward_loss, backward, reduce_gradients, optimizer_step), never by rewriting it. It takes the run's
Learner (what stays fixed for the whole run) and one batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch
from torch import nn

from pipeline import catalog
from pipeline.host.devices import Host, device_for, keep_freed_memory
from pipeline.measure.breakdown import NO_CLOCK
from pipeline.measure.comm_probes import NoComm
from pipeline.rank_env import RankEnv

from .amp import Amp, resolve_dtype

# train.optimizer -> (class, settings besides lr). sgd is d2l's recipe and keeps no state; the stateful two are what
# a user who weighs ZeRO-1 or FSDP against DDP trains with: momentum keeps one buffer per parameter, AdamW two (its
# PyTorch defaults: betas (0.9, 0.999), eps 1e-8, weight_decay 0.01). scratch.py writes the same updates by hand.
MOMENTUM = 0.9
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {}),
    "sgd_momentum": (torch.optim.SGD, {"momentum": MOMENTUM}),
    "adamw": (torch.optim.AdamW, {}),
}
# The optimizers built fused=True under fp16 loss scaling, so GradScaler hands found_inf to the kernel and the step
# reads nothing to the host (amp.py). Not sgd_momentum: fused SGD allocates its momentum buffers uninitialised
# (empty_like) on its first step and its kernel skips that step when found_inf is set, so an overflowing first step,
# GradScaler's usual start, leaves garbage as the momentum (torch 2.14; the stock optimizer makes no buffer then).
FUSED_UNDER_SCALING = ("sgd", "adamw")


@dataclasses.dataclass(frozen=True)
class Learner:
    """What a run trains, built once before its first step (trial/loop.py's `build`) and the same at every step: the
    model with the strategy's parallelism applied, its criterion, and the optimizer over its parameters."""

    model: nn.Module
    criterion: nn.Module
    optimizer: torch.optim.Optimizer


class Strategy:
    name = "single"
    multiprocess = False  # True: one process per device, started by PyTorch's elastic launcher
    parallel_on_cpu = True  # False: the k "devices" are run one after another in one process
    one_device_only = True  # `single`; every parallel strategy sets False
    # the settings worth checking separately (doctor runs each): (name, --set overrides); one plain run by default
    VARIANTS: tuple[tuple[str, tuple[str, ...]], ...] = (("", ()),)
    channels_last_params = True  # False where parameters must stay contiguous (FSDP's flat shards)
    HEAVY_MODULES: tuple[str, ...] = ()  # imported once by the trial's parent before forking ranks (ranks.py)
    rank_env = RankEnv()  # this process's place in the trial (setup's `rank_env`): one process of one, on node 0
    # True: the forward always runs under autocast (ddp_amp); otherwise it does with train.autocast, a mode only the
    # rows that list it take (launch.check_feasible refuses it elsewhere)
    always_autocast = False

    def __init__(self, train_cfg, host: Host):
        self.cfg, self.host = train_cfg, host
        self.rank, self.world_size = 0, 1
        self._micro = 0  # micro-batches run (train_step)

    # --- availability -----------------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls, host: Host) -> str | None:
        """Why this strategy cannot run on `host`, or None."""
        return None

    def check_devices(self) -> None:
        """Strategy-specific limits on the device count (beyond k <= N)."""
        if self.cfg.devices != 1:
            parallel = ", ".join(s.name for s in catalog.STRATEGIES if not s.one_device_only)
            raise ValueError(
                f"`{self.name}` runs on exactly one device; use train.devices=1 (or a parallel strategy: {parallel})."
            )

    # --- set-up -------------------------------------------------------------------------------------
    def setup(self, rank: int = 0, world_size: int = 1, rank_env: RankEnv | None = None) -> torch.device:
        """Prepare this process; returns the device its inputs live on. `rank_env`: the launcher's environment as the
        rank's entry read it (rank, world size, local rank, node), taken over `rank` and `world_size` when given."""
        self.rank_env = rank_env or self.rank_env
        torch.set_num_threads(1)  # one device = one core = one intra-op thread
        keep_freed_memory()
        self.device = device_for(self.host, 0)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        return self.device

    @property
    def data_shard(self) -> tuple[int, int]:
        """(rank, world) of this process's share of each global batch."""
        return 0, 1

    @property
    def devices(self) -> list[torch.device]:
        """Devices this process drives, in device order (memory is reported per entry)."""
        return [self.device]

    def wrap(self, model: nn.Module, criterion: nn.Module):
        """Apply parallelism to the model (and criterion) before the loop."""
        return model, criterion

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cls, settings = OPTIMIZERS[self.cfg.optimizer]
        if self.cfg.cuda_graphs and cls is torch.optim.AdamW:  # its step count on the device: capturable
            settings = {**settings, "capturable": True}
        if self.amp:  # fp16: fused where that steps without a host read (bf16: nothing changes)
            settings = {**settings, **self.amp.optimizer_settings(self.cfg.optimizer in FUSED_UNDER_SCALING)}
        return cls(model.parameters(), lr=self.cfg.lr, **settings)

    # --- the step: base.train_step is the only step; strategies override the hooks it calls -----------------
    accum_steps = 1  # micro-batches per optimizer step (ddp: train.accum_steps)

    def train_step(self, learner: Learner, x, y, clock=NO_CLOCK) -> torch.Tensor:
        """One micro-batch (`x`, `y`) of this process's share of the global batch; `learner`'s optimizer steps on
        every `accum_steps`-th call (every call by default). Returns the (detached) loss. `clock` times the hooks as
        the phases of a sampled step (breakdown.py); the default does nothing."""
        model, criterion, optimizer = learner.model, learner.criterion, learner.optimizer
        a = self.accum_steps
        if self._micro % a == 0:  # a new optimizer step begins
            with clock("optimizer"):
                self.zero_grad(optimizer)
        self._micro += 1
        is_step = self._micro % a == 0
        losses = []
        with self.sync_context(model, is_step):
            for module, xs, ys in clock.iterate("data", self.place_batch(model, x, y)):
                with clock("forward"), self.autocast():
                    loss = self.forward_loss(module, criterion, xs, ys)
                with clock("backward"):
                    self.backward(loss / a if a > 1 else loss)
                losses.append(loss.detach())
        if is_step:
            with clock("reduce_gradients"):
                self.reduce_gradients(model)
            with clock("optimizer"):
                self.optimizer_step(optimizer)
        return losses[0] if len(losses) == 1 else torch.stack([v.to(losses[0].device) for v in losses]).sum()

    def zero_grad(self, optimizer) -> None:
        optimizer.zero_grad(set_to_none=True)

    def sync_context(self, model, is_step: bool):
        """Around a micro-batch's forward and backward (ddp: `no_sync()` on those that do not step)."""
        return contextlib.nullcontext()

    def place_batch(self, model, x, y):
        """Where this process's batch runs: (module, inputs, targets) per part, each part forward and backward
        before the next (scratch: one part per replica; dp: targets on the output device)."""
        return [(model, x, y)]

    def autocast(self):
        return self.amp.autocast() if self.amp else contextlib.nullcontext()

    @classmethod
    def autocast_dtype(cls, t, device_type: str) -> str | None:
        """The low-precision type `autocast` will compute in for train config `t` ("bf16", "fp16"), None = fp32;
        known before set-up, so a sweep can tell whether this host runs it natively (capabilities.py)."""
        return resolve_dtype(t, device_type) if (cls.always_autocast or t.autocast) else None

    @functools.cached_property
    def amp(self) -> Amp | None:
        """This process's autocast and loss scaling (after set-up), or None for an fp32 step."""
        return Amp(self.cfg, self.device) if (self.always_autocast or self.cfg.autocast) else None

    def forward_loss(self, model, criterion, x, y) -> torch.Tensor:
        return criterion(model(x), y)

    def backward(self, loss) -> None:
        if self.amp:
            self.amp.backward(loss)
        else:
            loss.backward()

    def reduce_gradients(self, model) -> None:
        """Sum gradients across devices before the update, where no wrapper does it during backward (scratch)."""

    def optimizer_step(self, optimizer) -> None:
        if self.amp:
            self.amp.step(optimizer)
        else:
            optimizer.step()

    # --- across processes -----------------------------------------------------------------------------
    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over processes (a no-op in one process)."""
        return t

    def gather(self, obj) -> list:
        """Every process's `obj`, in rank order (a list of one in one process)."""
        return [obj]

    def broadcast_flag(self, flag: bool) -> bool:
        """Rank 0's decision, agreed by every rank."""
        return flag

    def facts(self) -> dict:
        """Settings this strategy resolved at run time (ddp: the comm hook used; autocast: amp_dtype=auto's pick)."""
        return self.amp.facts() if self.amp else {}

    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Wait until every process gets here (the breakdown's sampled steps); nothing to wait for in one process."""

    def comm_probe(self, model):
        """How the breakdown finds the communication inside a sampled step's phases (breakdown.py)."""
        return NoComm("one device: no communication (0)")

    def synchronize(self) -> None:
        """Wait for queued device work before reading a clock."""
        for d in {d for d in self.devices if d.type == "cuda"}:
            torch.cuda.synchronize(d)

    # --- after training -------------------------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module evaluation runs: the eager one under torch.compile (the compiled training graph would compile
        twice more for eval mode and the last, partial test batch, outside every figure but inside the trial)."""
        return getattr(model, "_orig_mod", model)

    def state_dict(self, model: nn.Module) -> dict:
        """The full, unwrapped state_dict on the main process (collective where parameters are sharded)."""
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the plain model's keys
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def memory_tracker(self, model, optimizer):
        """A context measuring tensor memory of one probe step on a CPU host (measure/memory.py)."""
        from pipeline.measure.memory import CpuMemProbe

        return CpuMemProbe(self.devices, model, optimizer)

    def teardown(self) -> None:
        pass
