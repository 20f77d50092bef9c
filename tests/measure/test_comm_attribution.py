"""Exposed-communication attribution of the step-time breakdown (pipeline/measure/comm_probes.py), without a GPU.

The attribution is a pure function over plain event records, so its GPU branch is tested on synthetic events built
like Kineto's CUDA trace (gpu_user_annotation ranges spanning NCCL kernels), on replay fixtures (tests/fixtures/:
one sampled step's events as `doctor --dump-events` writes them on a GPU host; every fixture there is replayed), and
through ProfiledComm with a stand-in torch.profiler.profile. These check the definition and the contract (which
events count, which path a backend takes, how many profiler sessions a trial opens), not CUDA semantics: whether
Kineto emits these events with these times on a given driver, and how large the effects are, only a GPU run shows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from pipeline.measure import breakdown, comm_probes

FIXTURES = Path(__file__).parents[1] / "fixtures"
CUDA0 = torch.device("cuda", 0)  # a device object only: nothing here touches CUDA


def ev(name, start, end, dev="cpu", ann=False, thread=1):
    return {
        "name": name,
        "device_type": dev,
        "is_user_annotation": ann,
        "start_us": start,
        "end_us": end,
        "thread": thread,
    }


def dp_step() -> list[dict]:
    """A dp-like sampled step as Kineto records it on CUDA (microseconds). Exposed by construction: forward
    100-300 (broadcast) + 700-800 (gather copy) = 300 us; backward 2000-2400 (reduce after the last conv) = 400 us;
    the copy in the data phase is moving data in, not communication."""
    return [
        ev("parallax::data", -300, 0, ann=True),
        ev("parallax::forward", 0, 1000, ann=True),
        ev("parallax::backward", 1000, 3000, ann=True),
        ev("cudaLaunchKernel", 50, 60),
        ev("aten::conv2d", 60, 400),
        # Kineto's gpu_user_annotation: one per record_function range, on the device, spanning its kernels
        ev("parallax::forward", 100, 950, "cuda", True),
        ev("parallax::backward", 1100, 2950, "cuda", True),
        ev("DataParallel.forward", 100, 900, "cuda", True),
        ev("nccl:broadcast", 100, 300, "cuda", True),
        ev("Memcpy HtoD (Pageable -> Device)", -250, -50, "cuda"),
        ev("ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 100, 300, "cuda"),
        ev("void cudnn::cnn::conv2d_grouped_direct_kernel", 300, 700, "cuda"),
        ev("Memcpy DtoD (Device -> Device)", 700, 800, "cuda"),
        ev("void cudnn::engines_precompiled::conv_bwd", 1100, 2000, "cuda"),
        ev("ncclDevKernel_Reduce_Sum_f32_RING_LL", 1900, 2400, "cuda"),
        ev("ampere_sgemm_32x32_sliced1x4_nn", 2400, 2500, "cuda"),
    ]


def function_events(records) -> list[FunctionEvent]:
    """The records as torch's own FunctionEvents (what profile.events() returns)."""
    out = []
    for i, r in enumerate(records):
        out.append(
            FunctionEvent(
                id=i,
                name=r["name"],
                thread=r["thread"],
                start_us=r["start_us"],
                end_us=r["end_us"],
                device_type=DeviceType.CUDA if r["device_type"] == "cuda" else DeviceType.CPU,
                is_user_annotation=r["is_user_annotation"],
            )
        )
    return out


class FakeProfile:
    """Stand-in for torch.profiler.profile: counts sessions, returns the given events."""

    sessions: list = []
    events_to_return: list = []

    def __init__(self, activities=(), **kw):
        self.activities = list(activities)
        FakeProfile.sessions.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def events(self):
        return function_events(FakeProfile.events_to_return)

    def export_chrome_trace(self, path):
        """A trace without the clock's labels: the breakdown's track stands alone (chrome_trace.step_trace)."""
        Path(path).write_text('{"traceEvents": []}')


@pytest.fixture
def fake_profiler(monkeypatch):
    FakeProfile.sessions, FakeProfile.events_to_return = [], []
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    return FakeProfile


def no_process_group(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)


def process_group(monkeypatch, backend):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda *a, **k: backend)


# ----------------------------------------------------------------------------- G1, G18 through ProfiledComm


def test_gpu_user_annotations_are_not_busy_and_each_phase_is_charged_once(fake_profiler, monkeypatch):
    """G1: device-side user annotations (parallax::*, DataParallel.forward, nccl:*) are not kernels, and the phases
    come from CPU events only, so dp's exposed copies and NCCL reduce are found, each charged once."""
    no_process_group(monkeypatch)  # dp: in-process NCCL (torch.cuda.nccl) and copies
    fake_profiler.events_to_return = dp_step()
    p = comm_probes.ProfiledComm((), CUDA0, "dp", kernels=("nccl", "memcpy"))
    p.start()
    got = p.stop()
    assert got == pytest.approx({"forward": 300e-6, "backward": 400e-6})


def test_gloo_on_cuda_tensors_is_measured_from_host_spans(fake_profiler, monkeypatch):
    """G18: Gloo runs the collective host-side even on CUDA tensors (the doctor's oversubscribed fsdp row): the
    backend, not the device type, picks the host-span path; no CUDA activity (no CUPTI session) is requested."""
    process_group(monkeypatch, "gloo")
    fake_profiler.events_to_return = [
        ev("parallax::forward", 0, 1000, ann=True),
        ev("FSDP::all_gather", 100, 400, ann=True),
        ev("parallax::backward", 1000, 2000, ann=True),
        ev("FSDP::post_backward_reduce", 1500, 1600, ann=True),
        ev("ampere_sgemm_128x64_nn", 0, 2000, "cuda"),
    ]  # the device busy throughout: irrelevant to Gloo
    p = comm_probes.ProfiledComm(("FSDP::all_gather", "FSDP::post_backward_reduce"), CUDA0, "fsdp")
    p.start()
    got = p.stop()
    assert got == pytest.approx({"forward": 300e-6, "backward": 100e-6})
    assert torch.profiler.ProfilerActivity.CUDA not in fake_profiler.sessions[0].activities


def test_nccl_backend_takes_the_kernel_path(fake_profiler, monkeypatch):
    """fsdp on NCCL: device kernels, CUDA activity requested; FSDP's CPU spans do not count."""
    process_group(monkeypatch, "nccl")
    fake_profiler.events_to_return = [
        ev("parallax::forward", 0, 1000, ann=True),
        ev("FSDP::all_gather", 0, 500, ann=True),
        ev("FSDP::all_gather", 50, 450, "cuda", True),
        ev("ncclDevKernel_AllGather_RING_LL", 100, 300, "cuda"),
        ev("sm90_xmma_gemm", 250, 900, "cuda"),
    ]
    p = comm_probes.ProfiledComm(("FSDP::all_gather",), CUDA0, "fsdp")
    p.start()
    assert p.stop() == pytest.approx({"forward": 150e-6})
    assert torch.profiler.ProfilerActivity.CUDA in fake_profiler.sessions[0].activities
    assert "kernel" in p.method and "hidden" in p.method  # the definition is written down


# ----------------------------------------------------------------------------- the pure function


def test_attribute_kernels_definition():
    """NCCL on device 0 that overlaps compute on device 1 counts as hidden (one device timeline: any kernel)."""
    events = [
        ev("parallax::backward", 0, 1000, ann=True),
        {**ev("ncclDevKernel_AllReduce", 100, 500, "cuda"), "device": 0},
        {**ev("conv_bwd", 0, 300, "cuda"), "device": 1},
    ]
    assert comm_probes.attribute(events, "kernels", ("nccl",)) == pytest.approx({"backward": 200e-6})
    assert not any(comm_probes.attribute(events, "spans", ("nccl",)).values())  # no host span of that name


def test_attribute_ignores_phases_other_than_forward_and_backward():
    events = [ev("parallax::data", 0, 100, ann=True), ev("Memcpy HtoD", 10, 90, "cuda")]
    assert comm_probes.attribute(events, "kernels", ("memcpy",)) == {}


@pytest.mark.parametrize(
    "backend,device,path",
    [
        ("nccl", "cuda", "kernels"),
        ("gloo", "cuda", "spans"),
        ("gloo", "cpu", "spans"),
        (None, "cuda", "kernels"),
        (None, "cpu", "spans"),
    ],
)
def test_path_follows_the_backend(backend, device, path):
    assert comm_probes.comm_path(backend, device) == path


# ----------------------------------------------------------------------------- G2: sessions per trial


class FakeStrategy:
    name, data_shard = "fake", (0, 1)

    def __init__(self, probe):
        self.probe, self.devices = probe, [getattr(probe, "device", torch.device("cpu"))]

    def comm_probe(self, model):
        return self.probe

    def synchronize(self):
        pass

    def barrier(self):
        pass

    def gather(self, obj):
        return [obj]


def run_sampled(b: breakdown.Breakdown, steps: int) -> list[int]:
    sampled = []
    for n in range(steps):
        if b.is_sampled(n):
            sampled.append(n)
            with b.sample() as clock:
                with clock("forward"):
                    pass
    return sampled


def test_one_cupti_session_per_trial_on_the_kernel_path(fake_profiler, monkeypatch):
    """G2 contract: on the kernel path (CUDA activity: a CUPTI session) a trial opens one profiler session, at its
    first sampled step, and samples no further step; the regime is recorded. Whether one session still slows the
    steps after it (CUPTI left attached without teardown) only an A/B run on a GPU shows."""
    no_process_group(monkeypatch)
    fake_profiler.events_to_return = dp_step()
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    probe = comm_probes.ProfiledComm((), CUDA0, "dp", kernels=("nccl", "memcpy"))
    b = breakdown.Breakdown(FakeStrategy(probe), None, every=10)
    assert run_sampled(b, 40) == [9]
    assert len(fake_profiler.sessions) == 1
    r = b.results(timed_step_s=0.01, sampled_wall_s=0.02)
    assert r["samples"] == 1 and r["probe"]["profiler_sessions"] == 1
    assert r["probe"]["path"] == "kernels" and r["probe"]["teardown_cupti"] == "1"
    assert "one profiler session per trial" in r["method"]["sampling"]


def test_host_span_path_samples_every_step_it_is_asked_to(fake_profiler, monkeypatch):
    """On the host-span path (CPU activity only: no CUPTI) every sampled step is profiled, as on CPU hosts."""
    process_group(monkeypatch, "gloo")
    probe = comm_probes.ProfiledComm(("FSDP::all_gather",), torch.device("cpu"), "fsdp")
    b = breakdown.Breakdown(FakeStrategy(probe), None, every=10)
    assert run_sampled(b, 40) == [9, 19, 29, 39]
    assert len(fake_profiler.sessions) == 4
    assert b.results()["probe"]["path"] == "spans"


# ----------------------------------------------------------------------------- G13: sampled steps identifiable


def test_sampled_steps_and_their_cost_are_reported():
    """G13: the breakdown names the steady-state steps it sampled and what sampling added to the training time
    (epoch time with and without the sampled steps). How a synchronised step differs from an unsampled one on a GPU
    (launch latency exposed per phase, scratch's replicas serialised) only a GPU shows."""
    b = breakdown.Breakdown(FakeStrategy(comm_probes.NoComm("none")), None, every=10)
    assert run_sampled(b, 30) == [9, 19, 29]
    r = b.results(timed_step_s=0.010, sampled_wall_s=0.025)
    assert r["sampled_steps"] == [9, 19, 29]
    assert r["sampling_added_s"] == pytest.approx(3 * 0.015)
    assert "synchronize" in r["method"]["sampling"]


# ----------------------------------------------------------------------------- dump, load, replay
