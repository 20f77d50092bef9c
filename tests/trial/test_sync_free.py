"""The timed region of a trial never makes the host wait for the device.

Between the meter's `start_epoch` and `end_epoch` (the epoch's steps, warm-up and throughput windows included) no
step reads a device value back to the host: no `aten::_local_scalar_dense` (what `.item()`, `float()`, `bool()` and
`int()` of a tensor dispatch), no `.cpu()`/`.tolist()`, no `torch.cuda.synchronize` and no `strategy.synchronize`.
They are counted through a TorchDispatchMode (every aten operator, wherever in the step it is called) and mocks, for
every strategy this host runs in one process at k=1 (and the fp16 rows, whose optimizer is fused so GradScaler's
found_inf stays on the device), with the breakdown off. The epoch-end read (outside the region) is where they
belong. On a GPU such a read stalls the stream and hides the step's real cost behind it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch.utils import _foreach_utils
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline import catalog
from pipeline.data import store
from pipeline.host.devices import probe
from pipeline.measure import meter
from pipeline.models import build_model
from pipeline.strategies import STRATEGIES
from pipeline.strategies.base import Learner
from pipeline.trial import loop

READS = {"aten::_local_scalar_dense"}


def has_fused_kernels(device_type: str) -> bool:
    """Whether torch.optim's fused kernels run on `device_type` in this torch (the list their device check reads)."""
    return device_type in _foreach_utils._get_fused_kernels_supported_devices()


class Region:
    """What is read back to the host, by (step, what), while the timed region is open."""

    def __init__(self):
        self.open, self.step, self.seen = False, None, Counter()

    def note(self, what: str) -> None:
        if self.open:
            self.seen[(self.step, what)] += 1


class CountReads(TorchDispatchMode):
    def __init__(self, region: Region):
        super().__init__()
        self.region = region

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in READS:
            self.region.note(name)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting(monkeypatch, region: Region):
    """Mocks on every other way to a host read, and the meter's boundaries opening and closing the region."""
    start, tick, end = meter.Meter.start_epoch, meter.Meter.tick, meter.Meter.end_epoch

    def start_epoch(self, step):
        start(self, step)
        region.open = True

    def ticked(self, step):
        region.step = step
        tick(self, step)

    def end_epoch(self, step):
        region.open = False  # the epoch-end read belongs here
        return end(self, step)

    monkeypatch.setattr(meter.Meter, "start_epoch", start_epoch)
    monkeypatch.setattr(meter.Meter, "tick", ticked)
    monkeypatch.setattr(meter.Meter, "end_epoch", end_epoch)
    for name in ("cpu", "tolist"):
        original = getattr(torch.Tensor, name)

        def read(self, *a, _name=name, _original=original, **k):
            region.note(f"Tensor.{_name}")
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, read)
    sync = torch.cuda.synchronize
    monkeypatch.setattr(
        torch.cuda, "synchronize", lambda *a, **k: (region.note("torch.cuda.synchronize"), sync(*a, **k))
    )
    with CountReads(region):
        yield


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def one_process(monkeypatch, strategy):
    """The strategy set up as the only rank of a one-process group, torn down after (threads and the cores a rank
    pins itself to restored: a later test's host probe counts this process's cores)."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    threads = torch.get_num_threads()
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        strategy.setup(0, 1)
        yield strategy
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        if cores is not None:
            os.sched_setaffinity(0, cores)


ONE_PROCESS = [(s.name, ()) for s in catalog.STRATEGIES]
# fp16 with GradScaler, the rows that can run it (ddp_amp's variant, single's autocast mode): bf16 on a CPU otherwise
FP16 = [("ddp_amp", ("train.amp_dtype=fp16",)), ("single", ("train.autocast=true", "train.amp_dtype=fp16"))]


@pytest.mark.parametrize("name,sets", ONE_PROCESS + FP16, ids=lambda v: "+".join(v) if isinstance(v, tuple) else v)
def test_no_host_read_in_any_step_of_the_timed_region(make_cfg, synthetic_root, monkeypatch, name, sets):
    """24 steps of LeNet (one warm-up, two throughput windows, a finite-loss check on every other step): nothing in
    the region reads the device back; the epoch-end read still finds a diverged loss (test_train.py)."""
    host = probe()
    why = STRATEGIES[name].unavailable_reason(host)
    if why:
        pytest.skip(f"{name} cannot run on this host: {why}")
    if sets and not has_fused_kernels(host.kind):
        pytest.skip(f"torch {torch.__version__} has no fused optimizer on {host.kind}: fp16 steps synchronise here")
    cfg = make_cfg(
        *sets,
        f"train.strategy={name}",
        "train.devices=1",
        "train.batch_size=32",
        "train.max_steps=24",
        "train.check_every=2",
        "train.breakdown_every=0",
        "train.pin_cores=false",
        "train.channels_last=false",
    )
    data = store.load(synthetic_root, "synthetic", train_limit=32 * 24, test_limit=64)
    region = Region()
    strategy = STRATEGIES[name](cfg.train, host)
    synchronize = strategy.synchronize
    monkeypatch.setattr(strategy, "synchronize", lambda: (region.note("strategy.synchronize"), synchronize()))
    with one_process(monkeypatch, strategy), counting(monkeypatch, region):
        out = loop.train(cfg, strategy, data)
    assert out["steps"] == 24 and out["throughput_img_s"] and len(out["throughput_windows"]) == 2
    assert not region.seen, f"{name}: host reads inside the timed region, by (step, what): {dict(region.seen)}"
    assert out.get("amp_step_syncs") is (False if sets else None)


# (name, dtype, optimizer, the device has fused kernels) -> GradScaler reads found_inf to the host on every step
STEP_SYNCS = {
    ("ddp_amp", "fp16", "sgd", True): False,
    ("ddp_amp", "fp16", "adamw", True): False,
    ("single", "fp16", "sgd", True): False,
    ("ddp_amp", "fp16", "sgd_momentum", True): True,  # fused SGD mishandles a skipped first step: stock, synchronising
    ("ddp_amp", "fp16", "sgd", False): True,  # no fused kernels on the device
    ("ddp_amp", "bf16", "sgd", True): None,  # no loss scaling: nothing to read, the optimizer as it was
}


@pytest.mark.parametrize("case", STEP_SYNCS, ids=lambda c: "-".join(map(str, c)))
def test_fp16_steps_read_found_inf_on_the_host_only_where_the_trial_says_so(make_cfg, monkeypatch, case):
    """Three steps of the strategy's train_step, each skipped by GradScaler (scale 2**60 overflows fp16): the
    optimizer is fused under fp16 loss scaling where that is safe and the device has the kernels, and then no step
    reads found_inf back (`.item()`); elsewhere each does, and `amp_step_syncs` says so. The skipped-step count
    holds either way, read once, after the steps."""
    name, dtype, optimizer, fused_here = case
    if fused_here and not has_fused_kernels("cpu"):
        pytest.skip(f"torch {torch.__version__} has no fused optimizer on CPU")
    if not fused_here:
        kept = [d for d in _foreach_utils._get_fused_kernels_supported_devices() if d != "cpu"]
        monkeypatch.setattr(_foreach_utils, "_get_fused_kernels_supported_devices", lambda: kept)
    sets = ("train.autocast=true",) if name == "single" else ()
    cfg = make_cfg(
        *sets,
        f"train.strategy={name}",
        f"train.amp_dtype={dtype}",
        f"train.optimizer={optimizer}",
        f"train.amp_init_scale={2.0**60}",
        "train.lr=0.1",
    )
    strategy, steps = STRATEGIES[name](cfg.train, probe()), 3
    region = Region()
    with one_process(monkeypatch, strategy):
        model, criterion = strategy.wrap(build_model("lenet", 0), torch.nn.CrossEntropyLoss())
        optimizer_ = strategy.build_optimizer(model)
        before = [p.detach().clone() for p in model.parameters()]
        x, y = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 10
        with CountReads(region):
            region.open = True
            for region.step in range(steps):
                strategy.train_step(Learner(model, criterion, optimizer_), x, y)
            region.open = False
        facts = strategy.facts()
    syncs = STEP_SYNCS[case]
    assert sum(region.seen.values()) == (steps if syncs else 0), dict(region.seen)
    assert facts.get("amp_step_syncs") is syncs
    assert bool(optimizer_.defaults.get("fused")) is (syncs is False)  # fused only on the fp16 path that needs it
    if dtype == "fp16":
        assert facts["amp_skipped_steps"] == steps and facts["amp_scale"] == 2.0 ** (60 - steps)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # every step skipped, fused or not


def test_the_count_sees_a_host_read(monkeypatch):
    """The instrument can fail: an `.item()`, a `.tolist()` and a device synchronisation in the region are counted."""
    region = Region()
    with counting(monkeypatch, region):
        region.open, region.step = True, 7
        torch.ones(2).sum().item()
        torch.ones(2).tolist()
        torch.cuda.synchronize() if torch.cuda.is_available() else region.note("torch.cuda.synchronize")
        region.open = False
        torch.ones(1).item()  # outside: not counted
    assert region.seen == Counter(
        {(7, "aten::_local_scalar_dense"): 1, (7, "Tensor.tolist"): 1, (7, "torch.cuda.synchronize"): 1}
    )


def test_breakdown_steps_are_the_only_ones_that_synchronise(make_cfg, synthetic_root, monkeypatch):
    """With the breakdown on, the strategy's synchronize is called around its sampled steps only (the rare eager
    probe segment), never on another step of the region."""
    host = probe()
    cfg = make_cfg(
        "train.devices=1",
        "train.batch_size=32",
        "train.max_steps=24",
        "train.breakdown_every=5",
        "train.pin_cores=false",
    )
    data = store.load(synthetic_root, "synthetic", train_limit=32 * 24, test_limit=64)
    region, strategy = Region(), STRATEGIES["single"](cfg.train, host)
    monkeypatch.setattr(strategy, "synchronize", lambda: region.note("strategy.synchronize"))
    with one_process(monkeypatch, strategy), counting(monkeypatch, region):
        loop.train(cfg, strategy, data)
    steps = {step for step, what in region.seen if what == "strategy.synchronize"}
    # warm-up 1: steady steps 1..23; sampled = every 5th steady step (breakdown.is_sampled)
    probe_meter = meter.Meter(strategy, 32, 1, 0.5, _breakdown(strategy, 5))
    sampled = {s for s in range(1, 24) if probe_meter.breakdown.is_sampled(s - 1)}
    assert steps and steps == sampled, (steps, sampled)


def _breakdown(strategy, every):
    from pipeline.measure import breakdown

    return breakdown.Breakdown(strategy, torch.nn.Linear(1, 1), every)


class PendingEvent:
    """torch.cuda.Event's stand-in: query() answers from a shared script (False: the copy is still in flight)."""

    script: list = []
    made = 0

    def __init__(self):
        PendingEvent.made += 1

    def record(self):
        pass

    def query(self):
        return PendingEvent.script.pop(0)


def test_the_gpu_finite_watch_reads_its_copy_only_once_the_copy_is_done(monkeypatch):
    """FiniteWatch's GPU branch, its logic on CPU tensors (the copy is synchronous here; only a GPU shows the copy
    runs beside the step): one asynchronous copy in flight at a time, its host memory read only once its event says
    done, a pending event never waited for (no synchronize), and a NaN seen two looks after the step that made it."""
    monkeypatch.setattr(torch.cuda, "Event", PendingEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("the watch waited for the device"))
    PendingEvent.script, PendingEvent.made = [False, True, True], 0
    w = loop.FiniteWatch(torch.device("cpu"), lr=0.1)
    w.cuda, w.host = True, w.state.clone()  # the GPU branch: a separate host copy, refreshed by copy_
    w.view = w.host.numpy()
    w.add(torch.tensor(1.0), 0)  # no copy yet: the first is started
    w.add(torch.tensor(float("nan")), 1)  # the copy in flight (query False): not read, no second copy
    assert PendingEvent.made == 1 and w.view[0] == -1
    w.add(torch.tensor(1.0), 2)  # the first copy done: it holds step 0, before the NaN; a new copy is started
    assert PendingEvent.made == 2
    with pytest.raises(loop.DivergenceError, match="at step 1"):
        w.add(torch.tensor(1.0), 3)  # the second copy done: it holds step 1's NaN
