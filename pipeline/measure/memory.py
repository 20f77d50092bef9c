"""Per-device memory measurement and the derived figures every strategy reports the same way.

What "memory per device" means here, on GPUs (CUDA caching allocator, read per device, no sync needed):

- **workspace** (`mem_workspace_bytes`): what the CUDA libraries keep allocated once used, apart from any strategy:
  one cuBLAS workspace per handle and stream (32 MiB each on Hopper by PyTorch's default; the forward's thread and
  autograd's device thread use different handles) and what cuDNN keeps. Before the window first opens, the meter
  runs the libraries once on each device (`warm_libraries`: a matrix product and a convolution, forward and
  backward, on the step's stream) and records what that left allocated. It is a fixed cost per device and process,
  the same for every strategy; it is in `resident`, never in the step's peak. Threads a strategy starts of its own
  (DataParallel's replicas) use handles of their own: their workspaces are that strategy's cost, and stay in its
  step figure.
- **resident**: `memory_allocated(d)` when the measured window first opens, before step 0 and after the libraries'
  warm-up, the model, the optimizer and the data (and the epoch's batch order) have been placed. It is what Parallax
  put there, not what the strategy costs: every rank holds the whole uint8 training and test sets (about 53 MiB for
  Fashion-MNIST), and for LeNet they dwarf the model.
- **step peak above resident** (`peak_mem_bytes`, basis `steady_step_above_resident`): the allocator's peak over the
  steady-state steps (`max_memory_allocated`, its peak reset at the first step after the warm-up and after each
  evaluation) less the resident bytes. The warm-up steps are outside it: cuDNN's autotuner (`train.cudnn_benchmark`)
  tries its algorithms with workspaces of their own in the first step, and a compiled step compiles there.
  `reset_peak_memory_stats` sets the peak to the current allocation (2.11 `torch/cuda/memory.py:360`), so without
  the subtraction everything resident would sit inside every peak. What remains is what the strategy itself costs
  per device: gradients, optimizer state, activations, temporaries, DataParallel's replicas and gathered outputs,
  DDP's buckets in flight, FSDP's all-gathered parameters. **Imbalance and device-0 excess use this figure**: it is
  the one a strategy changes. The window holds the training steps only: the peaks are read before each evaluation and
  reset at the next step, so evaluation's batches (on device 0 only for dp, dp_criterion and scratch), the next
  epoch's batch order and the final state_dict (an all-gather under FSDP) do not count. A run with no steady-state
  step (no more steps than the warm-up) reports its warm-up steps' peak instead: the only one it has.
- **reserved peak**: `max_memory_reserved`, what the caching allocator held from the driver at its peak, resident
  included (what an out-of-memory error is about).
- **NVML used**: the device's used memory as NVML sees it, read before each evaluation (largest kept): every
  process's allocations and CUDA contexts, so extra contexts that other ranks open on device 0 show here and in no
  allocator figure. Optional: None without `pynvml` or on any NVML error (MIG, containers).

CPU worker processes: tensor memory of one probe step (the first step, which is a warm-up step and so never
timed), seen through PyTorch's MemTracker (FSDPMemTracker for FSDP): parameters, gradients, optimizer state,
activations and temporaries that pass through the dispatcher (basis `memtracker_step`), DDP's gradient buckets
among them (DDP rebuilds them in the first step, through the dispatcher: a ddp probe step is single's plus one set
of gradients, to the byte; with train.grad_as_bucket_view the gradients are the buckets' views, so single's).
Buffers a backend allocates outside the dispatcher (a communication library's own) are not counted: the figure is a
lower bound. A torch optimizer makes its state lazily, inside the probe step's `step()`, after the forward and
backward that hold the step's peak, yet it stays resident through every later step's peak: where the probe's peak
came before the state existed, the state the step ends with is added to it (the later steps' peak, with no step but
the first to probe). A hand-written optimizer (scratch's) makes its state before training, as d2l does, and the probe
tracks its tensors. It includes the parameters, which on GPUs are resident, so CPU and GPU figures are different
measures; the method and basis fields say which one a record holds.
"""

from __future__ import annotations

import contextlib

import torch


class CpuMemProbe:
    """Context: peak tensor bytes of one step, one entry per device this process drives."""

    method = "memtracker"

    def __init__(self, devices, model, optimizer, tracker=None):
        from torch.distributed._tools.mem_tracker import MemTracker

        self.devices = devices
        self.tracker = tracker or MemTracker()
        if isinstance(optimizer, torch.optim.Optimizer):
            self.tracker.track_external(model, optimizer)
        else:  # a hand-written optimizer (scratch's): its state tensors, if it keeps any, one by one
            self.tracker.track_external(model, *getattr(optimizer, "state_tensors", list)())
        self.peak = 0

    def __enter__(self):
        self.tracker.__enter__()
        return self

    def __exit__(self, *exc):
        self.tracker.__exit__(*exc)
        peak, end = self.tracker.get_tracker_snapshot("peak"), self.tracker.get_tracker_snapshot("current")
        # the optimizer state made after the peak (module docstring): resident at every later step's peak
        made_after = sum(max(0, _opt_state(end.get(d, {})) - _opt_state(v)) for d, v in peak.items())
        self.peak = int(sum(v.get("Total", 0) for v in peak.values())) + made_after
        return False

    def peaks(self) -> list[int]:
        # On a CPU host a process is one device; a single process driving k replicas (scratch)
        # holds them all in one address space, so one figure is reported for it.
        return [self.peak]


def _opt_state(snap: dict) -> int:
    """Optimizer-state bytes of one device's tracker snapshot (MemTracker's and FSDPMemTracker's OPT categories)."""
    return sum(v for k, v in snap.items() if getattr(k, "name", None) == "OPT")


class CudaPeaks:
    """Per-device memory on GPUs over the measured window (module docstring); no step is probed. Before step 0 the
    libraries are warmed up on the step's stream (`warm`) and what is resident is read (`open`); the steady window
    opens at the first step after the warm-up (`open(steady=True)`), closes before each evaluation (`close`) and
    reopens at the next step; a CUDA graph's capture is measured as the step (`capture`)."""

    method, basis = "cuda_allocator", "steady_step_above_resident"  # points.MEM_BASIS says what each basis means

    def __init__(self, strategy):
        self.devices = list(strategy.devices)
        self.resident: list[int] | None = None  # read when the window first opens
        self.workspace: list[int] | None = None  # what the libraries' warm-up left allocated, per device
        self.step = [0] * len(self.devices)
        self.warmup = [0] * len(self.devices)  # the warm-up steps' peak above resident (no steady step: the figure)
        self.reserved = [0] * len(self.devices)
        self.nvml: list[int] | None = None
        self.is_open, self.steady = False, False

    def probe(self, step: int, model, optimizer):
        return contextlib.nullcontext()

    def warm(self) -> None:
        """Once, before the window first opens, on the stream the step runs on (the loop calls it there: under
        train.cuda_graphs the side stream that captures, trial/graphs.py), since cuBLAS keeps a workspace per handle
        and stream: the libraries are used once and what they keep allocated is the workspace figure."""
        if self.workspace is not None:
            return
        before = [int(torch.cuda.memory_allocated(d)) for d in self.devices]
        warm_libraries(self.devices)
        self.workspace = [max(0, int(torch.cuda.memory_allocated(d)) - b) for d, b in zip(self.devices, before)]

    def open(self, steady: bool = True) -> None:
        """Before a step (`steady`: a step after the warm-up): the first time, the resident is read (the libraries
        warmed first, if the loop has not); at the first steady step the warm-up's peaks are set aside; the peaks
        restart from what is allocated now."""
        if self.resident is None:
            self.warm()
            self.resident = [int(torch.cuda.memory_allocated(d)) for d in self.devices]
        elif self.is_open and not (steady and not self.steady):
            return
        if self.is_open:  # the warm-up's stretch ends: its peaks are not the step's
            self.warmup = self._above_resident(self.warmup)
        reset_cuda_peaks(self.devices)
        self.is_open, self.steady = True, steady

    @contextlib.contextmanager
    def capture(self):
        """Around a CUDA graph's capture (trial/graphs.py), inside the open window: the capture allocates what an
        eager step does while its replays allocate nothing, so its peak is the step's. The stretch before it keeps
        its own peaks, and the stretch after it starts from what is allocated then."""
        self._fold()
        reset_cuda_peaks(self.devices)
        yield
        self.step = self._above_resident(self.step)
        reset_cuda_peaks(self.devices)

    def _fold(self) -> None:
        """This stretch's peaks into its figure: the step's in the steady window, else the warm-up's."""
        if self.steady:
            self.step = self._above_resident(self.step)
        else:
            self.warmup = self._above_resident(self.warmup)

    def _above_resident(self, so_far: list[int]) -> list[int]:
        return [max(s, p - r) for s, p, r in zip(so_far, cuda_peaks(self.devices), self.resident)]

    def close(self) -> None:
        """Before an evaluation, and at the end: fold this stretch's peaks into the figures."""
        if not self.is_open:
            return
        self.is_open = False
        self._fold()
        self.reserved = [max(s, int(torch.cuda.max_memory_reserved(d))) for s, d in zip(self.reserved, self.devices)]
        used = nvml_used_bytes(self.devices)
        if used is not None:
            self.nvml = used if self.nvml is None else [max(a, b) for a, b in zip(self.nvml, used)]

    def peaks(self) -> list[int]:
        self.close()
        return list(self.step if self.steady else self.warmup)

    def figures(self) -> dict:
        self.close()
        return {
            "mem_workspace_bytes": self.workspace,
            "mem_resident_bytes": self.resident,
            "mem_reserved_peak_bytes": list(self.reserved),
            "mem_nvml_used_bytes": self.nvml,
        }


class CpuStepPeaks:
    """Per-device memory on a CPU host: the strategy's tracker around step 0 (a warm-up step, never timed); every
    other step runs unprobed."""

    method, basis = "memtracker", "memtracker_step"

    def __init__(self, strategy):
        self.strategy, self.tracker = strategy, None

    def probe(self, step: int, model, optimizer):
        if step != 0:
            return contextlib.nullcontext()
        self.tracker = self.strategy.memory_tracker(model, optimizer)
        return self.tracker

    def warm(self) -> None:
        """No libraries' workspaces are measured on a CPU host."""

    def open(self, steady: bool = True) -> None:
        """No window: the probe step is the whole measurement."""

    @staticmethod
    def capture():
        """No CUDA graph runs on a CPU host."""
        return contextlib.nullcontext()

    def close(self) -> None:
        pass

    def peaks(self) -> list[int] | None:
        return self.tracker.peaks() if self.tracker else None

    def figures(self) -> dict:
        return {
            "mem_workspace_bytes": None,
            "mem_resident_bytes": None,
            "mem_reserved_peak_bytes": None,
            "mem_nvml_used_bytes": None,
        }


def memory_meter(strategy) -> CudaPeaks | CpuStepPeaks:
    """How this process's devices report memory: the CUDA allocator's window, or a probe step on CPU."""
    return CudaPeaks(strategy) if strategy.device.type == "cuda" else CpuStepPeaks(strategy)


def warm_libraries(devices) -> None:
    """Use cuBLAS and cuDNN once on each device, forward and backward, on its current stream (the step's), so that
    what they keep allocated once used (workspaces per handle and stream) is resident before the window opens, not
    in step 0's peak. The tensors are freed; what stays allocated is the libraries'."""
    for d in devices:
        if d.type != "cuda":
            continue
        with torch.cuda.device(d), torch.enable_grad():
            x = torch.randn(64, 64, device=d, requires_grad=True)
            w = torch.randn(4, 1, 3, 3, device=d, requires_grad=True)
            img = torch.randn(8, 1, 12, 12, device=d, requires_grad=True)
            ((x @ x).sum() + torch.nn.functional.conv2d(img, w).sum()).backward()
            del x, w, img
        torch.cuda.synchronize(d)


def cuda_peaks(devices) -> list[int]:
    return [int(torch.cuda.max_memory_allocated(d)) for d in devices]


def reset_cuda_peaks(devices) -> None:
    for d in devices:
        if d.type == "cuda":
            torch.cuda.reset_peak_memory_stats(d)


def nvml_used_bytes(devices) -> list[int] | None:
    """Each CUDA device's used memory as NVML sees it (all processes, contexts included), or None: no `pynvml`, a
    device that is not CUDA, or any NVML error. NVML numbers GPUs in PCI order and ignores CUDA_VISIBLE_DEVICES and
    CUDA_DEVICE_ORDER, so each device is looked up as the GPU monitor does (interference.py): by the UUID torch
    reports for it (a GPU's, else a MIG instance's), else by its PCI bus id (capabilities.cuda_identity)."""
    if not devices or any(d.type != "cuda" for d in devices):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return [_used(pynvml, _nvml_handle(pynvml, d.index)) for d in devices]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # an optional figure: MIG, containers and drivers raise many kinds of error
        return None


def _used(nvml, handle) -> int:
    """A device's used memory without the driver's own reserve: NVML's v2 memory info keeps that reserve apart
    (480 MiB on an idle H100, 2026-11-27), where v1 counts it as used; v1 on drivers without v2."""
    try:
        return int(nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2).used)
    except Exception:  # an older driver or pynvml: no v2
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def _nvml_handle(nvml, ordinal: int):
    from pipeline.host.capabilities import cuda_identity

    ident = cuda_identity(ordinal)
    tries = [(nvml.nvmlDeviceGetHandleByUUID, f"{p}{ident['uuid']}") for p in ("GPU-", "MIG-") if ident["uuid"]]
    if ident["pci"]:
        tries.append((nvml.nvmlDeviceGetHandleByPciBusId, "{:08X}:{:02X}:{:02X}.0".format(*ident["pci"])))
    error: Exception = LookupError(f"CUDA device {ordinal}: no UUID or PCI bus id")
    for call, key in tries:
        try:
            return call(key)
        except Exception as e:  # NVMLError_NotFound: try the next key
            error = e
    raise error
