"""THE training loop: strategy-agnostic, no optuna, no mlflow. One call = one process's part of one trial.

Per-epoch reporting and pruning arrive as a callback `on_epoch(record) -> bool` (True = stop), called on the
main process only; the stop decision is then agreed by every rank.
"""
from __future__ import annotations

import math
import os
import socket
import time

import torch
from torch import nn

from . import data as datamod
from .metrics import cuda_peaks, reset_cuda_peaks
from .models import build_model


class DivergenceError(RuntimeError):
    """The loss became NaN or infinite."""


@torch.no_grad()
def evaluate(model: nn.Module, strategy, x: torch.Tensor, y: torch.Tensor, batch: int = 512,
             channels_last: bool = False) -> float:
    """Test accuracy; the test set is split across processes like the training data, counts summed.

    Batches of 512 in the model's memory format: batches of 2,048 were slower on CPU (their activations no longer
    fit the cache)."""
    model.eval()
    rank, world = strategy.data_shard
    part = torch.arange(rank, x.shape[0], world, device=x.device)
    correct = torch.zeros((), dtype=torch.float64, device=strategy.device)
    for i in range(0, part.numel(), batch):
        idx = part[i:i + batch]
        inputs = datamod.normalize(x[idx], strategy.device)
        if channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        pred = model(inputs).argmax(1)
        correct += (pred == y[idx].to(pred.device)).sum().to(correct.device)
    return strategy.reduce(correct).item() / x.shape[0]


def _check_finite(loss: torch.Tensor, step: int, epoch: int, lr: float) -> None:
    value = loss.item()
    if not math.isfinite(value):
        raise DivergenceError(f"loss became {value} at step {step} (epoch {epoch + 1}): the run diverged; "
                              f"lower the learning rate (train.lr={lr}).")


def train(cfg, strategy, data: datamod.Dataset, on_epoch=None, progress=None) -> dict:
    """Train cfg.train.model with `strategy` (already set up) on `data`; returns this process's results."""
    t = cfg.train
    # --- model and parallelism, applied before the loop
    model = build_model(t.model, t.seed, t.init).to(strategy.device)
    if t.channels_last and strategy.channels_last_params:
        model = model.to(memory_format=torch.channels_last)
    model, criterion = strategy.wrap(model, nn.CrossEntropyLoss())
    if t.compile:
        model = torch.compile(model)
    optimizer = strategy.build_optimizer(model)
    # --- data: uint8 tensors resident on the input device, normalised there per batch
    train_x, train_y = data.train_x.to(strategy.device), data.train_y.to(strategy.device)
    test_x, test_y = data.test_x.to(strategy.device), data.test_y.to(strategy.device)
    rank, world = strategy.data_shard
    steps = train_x.shape[0] // t.batch_size
    if steps == 0:
        raise ValueError(f"the training set ({train_x.shape[0]} images) is smaller than one global batch "
                         f"(train.batch_size={t.batch_size}); lower the batch size or raise data.train_limit.")
    reset_cuda_peaks(strategy.devices)
    warmup = max(t.warmup_steps, 1)  # step 0 is the memory probe on CPU: never timed
    history = {"epoch_s": [], "test_acc": [], "train_loss": [], "epoch_throughput_img_s": []}
    timed_images, timed_s, step, stopped, cpu_peaks = 0, 0.0, 0, False, None
    time_to_acc = None
    for epoch in range(t.epochs):
        batches = datamod.epoch_batches(train_x.shape[0], t.batch_size, epoch, t.seed, rank, world)
        batches = batches.to(strategy.device)
        model.train()
        loss_sum = torch.zeros((), device=strategy.device)
        n_steps, epoch_timed = 0, 0
        strategy.synchronize()
        t0 = t_steady = time.perf_counter()
        for i in range(steps):
            if step == warmup:  # steady state starts: synchronise, read the clock
                strategy.synchronize()
                t_steady = time.perf_counter()
            x = datamod.normalize(train_x[batches[i]], strategy.device)
            y = train_y[batches[i]]
            if t.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            if step == 0 and strategy.device.type == "cpu":
                with strategy.memory_tracker(model, optimizer) as probe:
                    loss = strategy.train_step(model, criterion, optimizer, x, y)
                cpu_peaks = probe.peaks()
            else:
                loss = strategy.train_step(model, criterion, optimizer, x, y)
            loss_sum += loss
            step, n_steps = step + 1, n_steps + 1
            epoch_timed += step > warmup
            if step % t.check_every == 0:
                _check_finite(loss, step, epoch, t.lr)
            if progress is not None:
                progress(epoch, i + 1, steps)
            if t.max_steps and step >= t.max_steps:
                break
        strategy.synchronize()
        t_end = time.perf_counter()
        _check_finite(loss, step, epoch, t.lr)
        # --- end of epoch: timing, loss, evaluation
        epoch_s = t_end - t0
        if epoch_timed:
            timed_images += epoch_timed * t.batch_size
            timed_s += t_end - t_steady
        mean_loss = (strategy.reduce(loss_sum) / (n_steps * world)).item()
        acc = evaluate(strategy.eval_model(model), strategy, test_x, test_y, channels_last=t.channels_last)
        history["epoch_s"].append(epoch_s)
        history["test_acc"].append(acc)
        history["train_loss"].append(mean_loss)
        history["epoch_throughput_img_s"].append(epoch_timed * t.batch_size / (t_end - t_steady) if epoch_timed else None)
        if time_to_acc is None and acc >= t.target_acc:
            time_to_acc = sum(history["epoch_s"])
        record = {"epoch": epoch + 1, "epochs": t.epochs, "step": step, "epoch_s": epoch_s, "test_acc": acc,
                  "train_loss": mean_loss, "throughput_img_s": history["epoch_throughput_img_s"][-1]}
        stop = on_epoch(record) if (on_epoch is not None and strategy.is_main()) else False
        if strategy.broadcast_flag(bool(stop)):
            stopped = True
            break
        if t.max_steps and step >= t.max_steps:
            break
    state = strategy.state_dict(model)  # collective for sharded parameters: every rank calls it
    devices = strategy.devices
    peaks = cuda_peaks(devices) if strategy.device.type == "cuda" else cpu_peaks
    throughput = timed_images / timed_s if timed_s > 0 else None
    # every rank's devices, on every node: the main rank reports the whole trial
    ranks = strategy.gather({"rank": rank, "node": os.environ.get("GROUP_RANK", "0"),
                             "host": socket.gethostname(), "peak_mem_bytes": peaks,
                             "device_names": [str(d) for d in devices], "throughput_img_s": throughput})
    return {
        "ranks": ranks,
        "rank": rank, "world_size": world, "steps": step, "stopped": stopped,
        "throughput_img_s": throughput,
        "timed_steps": timed_images // t.batch_size,
        "time_to_acc_s": time_to_acc,
        **history,
        "peak_mem_bytes": peaks,
        "amp_dtype": None, "comm_hook_used": None,
        **strategy.facts(),  # what the strategy resolved at run time (ddp: comm_hook_used; ddp_amp: amp_dtype)
        "mem_method": "cuda_allocator" if strategy.device.type == "cuda" else "memtracker",
        "device_names": [str(d) for d in devices],
        "state_dict": state if strategy.is_main() else None,
    }
