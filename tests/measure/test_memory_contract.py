"""Memory per device on GPUs, as a contract checked without a GPU: the CUDA allocator's counters are replaced by a
fake allocator (unittest.mock-style patches of torch.cuda.memory_allocated, reset_peak_memory_stats,
max_memory_allocated and max_memory_reserved) and a strategy that reports two CUDA devices while it computes on the
CPU. These tests check the loop's intent (reset after the data is placed, the resident memory recorded at the reset,
the peaks read before each evaluation and reset after it) and the arithmetic of the figures; they do not check the
caching allocator's semantics, nor the sizes a real run has: those need a GPU."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from pipeline.analysis.tables import points
from pipeline.data.store import Dataset
from pipeline.host.devices import Host
from pipeline.measure import memory, meter
from pipeline.records import trial
from pipeline.strategies.base import Strategy
from pipeline.trial import loop

DEVICES = [torch.device("cuda", 0), torch.device("cuda", 1)]
RESIDENT = {0: 100, 1: 10}  # bytes held when the window opens (model, optimizer, data)
STEP_PEAK = {0: (400, 450), 1: (250, 200)}  # the allocator's peak during epoch 1, epoch 2 (resident included)
EVAL_PEAK = 9_999  # what an evaluation would add to every peak
RESERVED = 1_000  # the fake allocator reserves this much beyond its allocated peak
WORKSPACE = 3_000  # what the libraries keep allocated after their first use (cuBLAS's workspaces), per device
AUTOTUNE = 7_000  # the autotuner's trial workspaces in step 0 (cuDNN benchmark): freed, but a peak
NVML_USED = [5_000, 3_000]


class FakeAllocator:
    """peak = current at a reset; a step or an evaluation raises the peak; every call is logged in order."""

    def __init__(self, log, workspace=0, autotune=0):
        self.log, self.epoch, self.steps = log, 0, 0
        self.current = dict(RESIDENT)
        self.peak = dict(RESIDENT)
        self.workspace, self.autotune, self.used = workspace, autotune, False

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "memory_allocated", self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", self.max_allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", self.max_reserved)
        monkeypatch.setattr(memory, "nvml_used_bytes", self.nvml, raising=False)
        monkeypatch.setattr(memory, "warm_libraries", lambda devices: self.first_use(), raising=False)

    def first_use(self):
        """A library's first call on each device: its workspace is allocated and kept."""
        if not self.used:
            self.used = True
            for i in (0, 1):
                self.current[i] += self.workspace
                self.peak[i] = max(self.peak[i], self.current[i])

    def reset(self, d):
        self.log.append(("reset", d.index))
        self.peak[d.index] = self.current[d.index]

    def allocated(self, d):
        self.log.append(("allocated", d.index))
        return self.current[d.index]

    def max_allocated(self, d):
        self.log.append(("max_allocated", d.index))
        return self.peak[d.index]

    def max_reserved(self, d):
        return self.peak[d.index] + RESERVED

    def nvml(self, devices):
        self.log.append(("nvml",))
        return list(NVML_USED)

    def step(self):
        self.first_use()
        for i in (0, 1):
            extra = self.autotune if self.steps == 0 else 0  # the autotuner's trials, in the first step only
            self.peak[i] = max(self.peak[i], self.current[i] + STEP_PEAK[i][min(self.epoch, 1)] - RESIDENT[i] + extra)
        self.steps += 1

    def evaluate(self):
        for i in (0, 1):
            self.peak[i] = max(self.peak[i], EVAL_PEAK)
        self.epoch += 1


def _logged(t, log):
    orig = t.to
    t.to = lambda *a, **k: (log.append(("place",)), orig(*a, **k))[1]
    return t


def _run(make_cfg, monkeypatch, epochs=2, **allocator):
    log = []
    alloc = FakeAllocator(log, **allocator)
    alloc.install(monkeypatch)

    class FakeCuda(Strategy):
        """Two CUDA devices as far as the memory meter is concerned; the computation runs on the CPU."""

        @property
        def devices(self):
            return DEVICES

        def synchronize(self):
            pass

        def train_step(self, *args, **kwargs):
            log.append(("step",))
            alloc.step()
            return super().train_step(*args, **kwargs)

    real_evaluate = loop.evaluate

    def evaluate(*args, **kwargs):
        log.append(("evaluate",))
        alloc.evaluate()
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", evaluate)
    monkeypatch.setattr(memory, "memory_meter", lambda s: memory.CudaPeaks(s))  # the loop builds the meter
    monkeypatch.setattr(meter, "clock_for", meter.HostClock)  # the computation runs on the CPU
    cfg = make_cfg("train.batch_size=32", f"train.epochs={epochs}", "train.breakdown_every=0")
    g = torch.Generator().manual_seed(0)
    data = Dataset(
        *(
            _logged(t, log)
            for t in (
                torch.randint(0, 255, (128, 28, 28), dtype=torch.uint8, generator=g),
                torch.randint(0, 10, (128,), generator=g),
                torch.randint(0, 255, (64, 28, 28), dtype=torch.uint8, generator=g),
                torch.randint(0, 10, (64,), generator=g),
            )
        ),
        "synthetic",
    )
    strategy = FakeCuda(cfg.train, Host("cpu", 1, "cpu", "h", torch.__version__, ""))
    strategy.setup()
    return loop.train(cfg, strategy, data), log


def _first(log, event):
    return next(i for i, e in enumerate(log) if e[0] == event)


def test_cuda_window_opens_after_placement_and_closes_before_each_evaluation(make_cfg, monkeypatch):
    """G3 structure: the peaks are reset after the data is placed, the resident memory is read at that reset, and
    every device's peak is read after the epoch's last step and before its evaluation, then reset again before the
    next step (so neither evaluation nor the final state_dict is in them). Intent only: a fake allocator, not
    CUDA's."""
    out, log = _run(make_cfg, monkeypatch)
    places = [i for i, e in enumerate(log) if e == ("place",)]
    first_reset = _first(log, "reset")
    assert len(places) == 4 and max(places) < first_reset, "peaks reset before the data was placed"
    assert max(places) < _first(log, "allocated"), "resident read before the data was placed"
    assert {log[i] for i in range(max(places), _first(log, "step"))} >= {
        ("reset", 0),
        ("reset", 1),
        ("allocated", 0),
        ("allocated", 1),
    }
    evals = [i for i, e in enumerate(log) if e == ("evaluate",)]
    assert len(evals) == 2
    for n, ev in enumerate(evals):
        last_step = max(i for i in range(ev) if log[i] == ("step",))
        between = set(log[last_step:ev])
        assert {("max_allocated", 0), ("max_allocated", 1)} <= between, f"peaks not read before evaluation {n + 1}"
        nxt = [i for i in range(ev, len(log)) if log[i] == ("step",)]
        if nxt:
            assert {("reset", 0), ("reset", 1)} <= set(log[ev : nxt[0]]), "peaks not reset after an evaluation"


def test_cuda_figures_per_device_from_the_fake_allocator(make_cfg, monkeypatch):
    """The figures from the mocked numbers: the step's peak above resident (what imbalance and device-0 excess use),
    the resident bytes, the reserved peak and NVML's used memory; an evaluation's allocations are in none of them."""
    out, _ = _run(make_cfg, monkeypatch)
    assert out["peak_mem_bytes"] == [450 - 100, 250 - 10]
    assert out["mem_resident_bytes"] == [100, 10]
    assert out["mem_reserved_peak_bytes"] == [450 + RESERVED, 250 + RESERVED]
    assert out["mem_nvml_used_bytes"] == NVML_USED
    assert out["mem_method"] == "cuda_allocator" and out["mem_basis"] == "steady_step_above_resident"


def test_the_libraries_workspaces_and_the_autotuners_trials_are_not_the_steps_memory(make_cfg, monkeypatch):
    """A library that allocates a workspace on first use and keeps it (cuBLAS), and an autotuner whose trials raise
    step 0's peak (cuDNN benchmark): the step's figure is the strategy's alone, the same as without them; the
    workspace is its own figure, inside the resident."""
    out, _ = _run(make_cfg, monkeypatch, workspace=WORKSPACE, autotune=AUTOTUNE)
    assert out["peak_mem_bytes"] == [450 - 100, 250 - 10]
    assert out["mem_workspace_bytes"] == [WORKSPACE, WORKSPACE]
    assert out["mem_resident_bytes"] == [100 + WORKSPACE, 10 + WORKSPACE]


def test_a_run_with_no_steady_step_reports_its_warm_up_peak(make_cfg, monkeypatch):
    """Fewer steps than the warm-up: the only peak there is (the warm-up's) is the figure, not zero."""
    monkeypatch.setattr(loop, "steps_per_epoch", lambda n, b: 1)
    out, _ = _run(make_cfg, monkeypatch, epochs=1, workspace=WORKSPACE)
    assert out["timed_steps"] == 0
    assert out["peak_mem_bytes"] == [400 - 100, 250 - 10]


def test_without_nvml_the_nvml_figure_is_none(monkeypatch):
    """No pynvml, or an NVML error: the optional figure is None and the trial goes on."""
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name, *a, **k):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    assert memory.nvml_used_bytes(DEVICES) is None
    assert memory.nvml_used_bytes([torch.device("cpu")]) is None


def test_cpu_keeps_memtracker_and_says_so():
    """Each basis a memory meter reports is one the tables and the report can name."""
    assert memory.CpuStepPeaks.method == "memtracker" and memory.CpuStepPeaks.basis == "memtracker_step"
    assert "MemTracker" in points.MEM_BASIS[memory.CpuStepPeaks.basis]
    assert "above what was resident" in points.MEM_BASIS[memory.CudaPeaks.basis]


def _rank(rank, peaks, resident=None, reserved=None, nvml=None, method="cuda_allocator"):
    return {
        "rank": rank,
        "node": "0",
        "host": "h",
        "peak_mem_bytes": peaks,
        "device_names": ["cuda:%d" % rank],
        "mem_resident_bytes": resident,
        "mem_reserved_peak_bytes": reserved,
        "mem_nvml_used_bytes": nvml,
        "throughput_img_s": 1.0,
        "throughput_windows": [],
    }


def test_record_joins_ranks_and_names_the_basis(make_cfg):
    """Per rank lists are joined in rank order; imbalance and device-0 excess use the step's peak above resident."""
    from types import SimpleNamespace

    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.batch_size=64")
    host = SimpleNamespace(kind="cuda", n=2, name="H100", hostname="h", torch="t", cuda="12")
    ranks = [_rank(0, [300], [50], [1000], [4000]), _rank(1, [100], [50], [900], [2000])]
    main = {
        **ranks[0],
        "ranks": ranks,
        "steps": 1,
        "stopped": False,
        "timed_steps": 1,
        "epoch_s": [1.0],
        "test_acc": [0.5],
        "train_loss": [1.0],
        "epoch_throughput_img_s": [1.0],
        "time_to_acc_s": None,
        "mem_method": "cuda_allocator",
        "mem_basis": "step_above_resident",
        "amp_dtype": None,
    }
    r = trial.summarize(cfg, host, SimpleNamespace(multiprocess=True, parallel_on_cpu=True), [main], 1.0)
    assert r.peak_mem_bytes == [300, 100] and r.mem_resident_bytes == [50, 50]
    assert r.mem_reserved_peak_bytes == [1000, 900] and r.mem_nvml_used_bytes == [4000, 2000]
    assert r.mem_imbalance == pytest.approx(1.5) and r.mem_device0_excess == 200
    assert r.mem_basis == "step_above_resident" and r.table_row()["mem_basis"] == r.mem_basis
    m = r.metrics()
    assert m["mem_resident_mib_dev1"] == pytest.approx(50 / 2**20)
    assert m["mem_nvml_used_mib_dev0"] == pytest.approx(4000 / 2**20)


def _row(**kw):
    base = {
        "state": "complete",
        "oversubscribed": False,
        "strategy": "dp",
        "model": "lenet",
        "devices": 2,
        "batch_size": 64,
        "per_device_batch": 32,
        "lr": 0.1,
        "peak_mem_bytes": [300, 100],
        "mem_method": "cuda_allocator",
        "host": "h",
        "data_source": "synthetic",
    }
    return {**base, **kw}


def test_memory_table_carries_the_new_figures_and_loads_old_rows():
    """New rows carry resident, reserved and NVML per device and the basis; a row of an older table (no such
    columns) still makes a memory row, its basis read from its method."""
    from pipeline.analysis.tables.rows import normalize

    new = _row(
        mem_resident_bytes=[50, 50],
        mem_reserved_peak_bytes=[1000, 900],
        mem_nvml_used_bytes=[4000, 2000],
        mem_basis="step_above_resident",
    )
    old = _row(strategy="ddp", mem_method="memtracker")
    m = points.memory_table(normalize(pd.DataFrame([new, old]), "x")).set_index("strategy")
    assert m.loc["dp", "resident"] == [50, 50] and m.loc["dp", "nvml_used"] == [4000, 2000]
    assert m.loc["dp", "reserved_peaks"] == [1000, 900] and m.loc["dp", "dev0_excess_bytes"] == 200
    assert m.loc["dp", "mem_basis"] == "step_above_resident"
    assert m.loc["ddp", "resident"] == [] and m.loc["ddp", "mem_basis"] == "memtracker_step"
    assert not math.isnan(m.loc["ddp", "mem_imbalance"])


def test_report_memory_section_names_the_basis_and_shows_gpu_figures():
    """The report says what imbalance and device-0 excess are computed from, and shows the GPU figures where a row
    has them (a CPU-only report keeps its columns)."""
    from pipeline.analysis.report import document
    from pipeline.analysis.tables.rows import normalize

    gpu = _row(
        mem_resident_bytes=[50 * 2**20, 50 * 2**20],
        mem_reserved_peak_bytes=[2**30, 2**30],
        mem_basis="step_above_resident",
        throughput_img_s=100.0,
        test_acc=[0.5],
        final_test_acc=0.5,
    )
    for rows, shown in (([gpu], True), ([_row(mem_method="memtracker", throughput_img_s=100.0)], False)):
        df = normalize(pd.DataFrame(rows), "x")
        pts, eff, mem, acc = (
            points.point_table(df),
            points.scaling_table(df),
            points.memory_table(df),
            points.accuracy_table(df),
        )
        text = "".join(document._tables(df, pts, eff, mem, acc))
        reading = " ".join(document._reading(pts, eff, mem, {}, df))
        basis = points.MEM_BASIS["step_above_resident" if shown else "memtracker_step"]
        assert basis in reading and "mem_basis" in text
        assert ("resident_mib" in text and "50.0 / 50.0" in text) is shown
        assert "nvml_used_mib" not in text  # no row measured it
