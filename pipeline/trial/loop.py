"""THE training loop: strategy-agnostic, no optuna, no mlflow. One call = one process's part of one trial.

Per-epoch reporting and pruning arrive as a callback `on_epoch(record) -> bool` (True = stop), called on the
main process only; the stop decision is then agreed by every rank.
"""

from __future__ import annotations

import contextlib
import socket
import time

import torch
from torch import nn

from pipeline.data import store
from pipeline.measure import breakdown, memory
from pipeline.measure.meter import Meter
from pipeline.models import apply_channels_last, build_model, channels_last_at_use
from pipeline.records.trial import rank_keys
from pipeline.strategies.base import Learner
from pipeline.trial.graphs import GraphedStep, capture_step


class DivergenceError(RuntimeError):
    """The loss became NaN or infinite."""


class Inputs:
    """A batch from its sample indices: the uint8 images (resident on the input device) gathered and normalised
    there, in the model's memory format, and their labels; a training step's and evaluation's alike. Six small
    kernels a step: the eager step runs them as its "data" phase; a CUDA graph captures them with the rest of the
    step (trial/graphs.py)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, device, channels_last: bool):
        self.images, self.labels, self.device, self.channels_last = images, labels, device, channels_last

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = store.normalize(self.images[idx], self.device)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, self.labels[idx]


@torch.no_grad()
def evaluate(
    model: nn.Module, strategy, x: torch.Tensor, y: torch.Tensor, batch: int = 512, channels_last: bool = False
) -> float:
    """Test accuracy; the test set is split across processes like the training data, counts summed.

    Batches of 512 in the model's memory format: batches of 2,048 were slower on CPU (their activations no longer
    fit the cache)."""
    model.eval()
    rank, world = strategy.data_shard
    part = torch.arange(rank, x.shape[0], world, device=x.device)
    correct = torch.zeros((), dtype=torch.float64, device=strategy.device)
    batches = Inputs(x, y, strategy.device, channels_last)  # the training steps' data path
    for i in range(0, part.numel(), batch):
        images, labels = batches(part[i : i + batch])
        pred = model(images).argmax(1)
        correct += (pred == labels.to(pred.device)).sum().to(correct.device)
    return strategy.reduce(correct).item() / x.shape[0]


class FiniteWatch:
    """NaN/inf loss detection that never stalls the device inside an epoch.

    Every `train.check_every`-th step records on the device the first step whose loss is not finite and that loss
    (a `where` into a two-number state: no host read). In the epoch the host looks at a host-side copy only: on GPUs
    an asynchronous copy into pinned memory, looked at once its event has completed (`query()` never waits); on CPU
    the state itself, whose operators have finished when their call returns. Either way the look reads host memory
    through NumPy's view, never an `.item()`. At the epoch's end, after its one synchronisation, `settle` reads it
    for certain."""

    def __init__(self, device: torch.device, lr: float):
        self.lr, self.epoch = lr, 0
        self.state = torch.tensor([-1.0, 0.0], dtype=torch.float64, device=device)  # first bad step (-1: none), loss
        self.cuda = device.type == "cuda"
        self.host = self.state.clone().cpu().pin_memory() if self.cuda else self.state
        self.view = self.host.numpy()  # host memory: reading it dispatches nothing to the device
        self.copied = None  # the event after the last asynchronous copy into `host`

    def _record(self, loss: torch.Tensor, step: int) -> None:
        value = loss.detach().to(self.state)
        bad = ~torch.isfinite(value) & (self.state[0] < 0)
        self.state.copy_(torch.where(bad, torch.stack((torch.full_like(value, step), value)), self.state))

    def add(self, loss: torch.Tensor, step: int) -> None:
        self._record(loss, step)
        self._look()
        if self.cuda and self.copied is None:
            self.host.copy_(self.state, non_blocking=True)
            self.copied = torch.cuda.Event()
            self.copied.record()

    def _look(self) -> None:
        if self.cuda:
            if self.copied is None or not self.copied.query():
                return
            self.copied = None
        step, value = self.view
        if step >= 0:
            raise DivergenceError(
                f"loss became {value} at step {int(step)} (epoch {self.epoch + 1}): the run diverged; "
                f"lower the learning rate (train.lr={self.lr})."
            )

    def settle(self, loss: torch.Tensor, step: int) -> None:
        """At the epoch's end (the device settled): the last loss checked too, then the state read for certain."""
        self._record(loss, step)
        if self.cuda:
            self.host.copy_(self.state)
            self.copied = None
        self._look()


def build(t, strategy) -> Learner:
    """The model with its parallelism applied (before the loop), its criterion and optimizer, in the trial's
    execution modes (catalog.MODES: compile, cuDNN's autotuner; autocast is the strategy's step)."""
    torch.backends.cudnn.benchmark = t.cudnn_benchmark
    model = build_model(t.model, t.seed, t.init).to(strategy.device)
    if t.channels_last:  # a strategy whose parameters must stay contiguous (fsdp) gets the layout at each call
        layout = apply_channels_last if strategy.channels_last_params else channels_last_at_use
        model = layout(model, strategy.device.type)
    model, criterion = strategy.wrap(model, nn.CrossEntropyLoss())
    if t.compile:
        model = torch.compile(model, mode=t.compile_mode)
    return Learner(model, criterion, strategy.build_optimizer(model))


class EagerStep:
    """The step as the strategy runs it (every mode but train.cuda_graphs): the batch in, then `train_step` inside
    the memory probe (the probe sees the step, not its input), its loss added to the epoch's sum (`loss_sum`)."""

    def __init__(self, strategy, inputs: Inputs):
        self.strategy, self.inputs = strategy, inputs
        self.loss_sum = torch.zeros((), device=inputs.device)

    def start_epoch(self) -> None:
        self.loss_sum.zero_()

    @staticmethod
    def side():
        return contextlib.nullcontext()

    def joined(self) -> None:
        pass

    def __call__(self, step: int, learner: Learner, idx, clock, probe) -> torch.Tensor:
        with clock("data"):
            x, y = self.inputs(idx)
        with probe:
            loss = self.strategy.train_step(learner, x, y, clock)
        self.loss_sum += loss.detach().to(self.loss_sum.device)  # dp with train.output_device=j returns it on cuda:j
        return loss


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Whole global batches of `batch_size` in `n` training images: an epoch's steps (the partial one is dropped,
    data/store.epoch_batches)."""
    if n < batch_size:
        raise ValueError(
            f"the training set ({n} images) is smaller than one global batch "
            f"(train.batch_size={batch_size}); lower the batch size or raise data.train_limit."
        )
    return n // batch_size


def trial_steps(t, n_train: int | None) -> int | None:
    """The most steps `train` runs for train config `t` on `n_train` training images (None: not known): train.epochs
    epochs of whole global batches, ended at train.max_steps where set (a pruned or early-stopped trial runs
    fewer)."""
    per_epoch = None
    if n_train is not None:
        per_epoch = t.epochs * steps_per_epoch(n_train, t.batch_size) if n_train >= t.batch_size else 0
    caps = [c for c in (per_epoch, t.max_steps or None) if c is not None]
    return min(caps) if caps else None


def _set_up(t, strategy, inputs: Inputs) -> tuple[EagerStep | GraphedStep, Learner, Meter]:
    """The step (eager, or graphed under train.cuda_graphs), the learner and the meter, sharing one memory meter.
    Under graphs the model, DDP's hooks and the libraries' workspaces are on the stream that captures
    (trial/graphs.py), and the meter measures the capture as the step."""
    device_memory = memory.memory_meter(strategy)
    if t.cuda_graphs:
        run_step = GraphedStep(strategy, capture_step(t.strategy), inputs, device_memory.capture)
    else:
        run_step = EagerStep(strategy, inputs)
    with run_step.side():
        learner = build(t, strategy)
        device_memory.warm()
    run_step.joined()
    every = t.breakdown_every  # 0 = off
    sampled = breakdown.Breakdown(strategy, learner.model, every) if every else breakdown.Off()
    meter = Meter(strategy, t.batch_size, t.warmup_steps, t.target_acc, sampled, memory=device_memory)
    return run_step, learner, meter


def train(cfg, strategy, data: store.Dataset, on_epoch=None, progress=None, marks: dict | None = None) -> dict:
    """Train cfg.train.model with `strategy` (already set up) on `data`; returns this process's results. `marks`: the
    trial's timeline, given the times the model is built and training ends, and the seconds in steps and evaluation."""
    t, device = cfg.train, strategy.device
    marks = {} if marks is None else marks
    # --- data: uint8 tensors resident on the input device, normalised there per batch. Every rank holds the whole
    # set (its batches index into it); the memory meter counts it as resident, not as the step's (measure/memory.py)
    train_x, train_y, test_x, test_y = (v.to(device) for v in (data.train_x, data.train_y, data.test_x, data.test_y))
    run_step, learner, meter = _set_up(t, strategy, Inputs(train_x, train_y, device, t.channels_last))
    rank, world = strategy.data_shard
    steps = steps_per_epoch(train_x.shape[0], t.batch_size)
    history = {"test_acc": [], "train_loss": []}
    watch = FiniteWatch(device, t.lr)
    step, stopped = 0, False
    marks.update(built=time.time(), steps_s=0.0, eval_s=0.0)
    for epoch in range(t.epochs):
        t_steps, watch.epoch = time.perf_counter(), epoch
        batches = store.epoch_batches(train_x.shape[0], t.batch_size, epoch, t.seed, rank, world).to(device)
        learner.model.train()
        n_steps = 0
        run_step.start_epoch()
        meter.start_epoch(step)
        for i in range(steps):
            meter.tick(step)
            with meter.sample(step) as clock:  # the step-time breakdown's phases on sampled steps, else no-ops
                loss = run_step(step, learner, batches[i], clock, meter.probe(step, learner.model, learner.optimizer))
            step, n_steps = step + 1, n_steps + 1
            if step % t.check_every == 0:
                watch.add(loss, step)
            if progress is not None:
                progress(epoch, i + 1, steps)
            if t.max_steps and step >= t.max_steps:
                break
        epoch_s, throughput = meter.end_epoch(step)
        watch.settle(loss, step)
        t_eval = time.perf_counter()
        marks["steps_s"] += t_eval - t_steps
        # --- end of epoch: loss, evaluation, then the caller's verdict (report, prune), agreed by every rank
        history["train_loss"].append((strategy.reduce(run_step.loss_sum) / (n_steps * world)).item())
        with meter.evaluation():  # outside the memory window: evaluation is not the strategy's step
            history["test_acc"].append(
                evaluate(strategy.eval_model(learner.model), strategy, test_x, test_y, channels_last=t.channels_last)
            )
        meter.note_accuracy(history["test_acc"][-1])
        marks["eval_s"] += time.perf_counter() - t_eval
        record = {
            "epoch": epoch + 1,
            "epochs": t.epochs,
            "step": step,
            "epoch_s": epoch_s,
            "test_acc": history["test_acc"][-1],
            "train_loss": history["train_loss"][-1],
            "epoch_throughput_img_s": throughput,  # this epoch's; the trial's is throughput_img_s (the record's)
        }
        stop = on_epoch(record) if (on_epoch is not None and strategy.is_main()) else False
        if strategy.broadcast_flag(bool(stop)):
            stopped = True
            break
        if t.max_steps and step >= t.max_steps:
            break
    marks["trained"] = time.time()
    state = strategy.state_dict(learner.model)  # collective for sharded parameters: every rank calls it
    return _results(strategy, meter.results(), history, step, stopped, state)


def _results(strategy, measured: dict, history: dict, steps: int, stopped: bool, state: dict) -> dict:
    """This process's part of the trial; the main rank's carries every rank's devices, on every node."""
    rank, world = strategy.data_shard
    devices = [str(d) for d in strategy.devices]
    ranks = strategy.gather(
        {
            "rank": rank,
            "node": strategy.rank_env.node,
            "host": socket.gethostname(),
            "device_names": devices,
            **{k: measured[k] for k in rank_keys()},  # what the record takes from every rank (records/trial.py)
        }
    )
    return {
        "ranks": ranks,
        "rank": rank,
        "world_size": world,
        "steps": steps,
        "stopped": stopped,
        **measured,
        **history,
        "amp_dtype": None,
        "comm_hook_used": None,
        **strategy.facts(),  # what the strategy resolved at run time (ddp: comm_hook_used; ddp_amp: amp_dtype)
        "device_names": devices,
        "state_dict": state if strategy.is_main() else None,
    }
