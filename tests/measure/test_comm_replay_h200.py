"""The real GPU replay fixture: one sampled fsdp k=1 step over NCCL on one NVIDIA H200 (torch 2.11.0+cu130, CUDA
13.0, NCCL 2.28.9), as `doctor --dump-events` wrote it, replayed through `comm_probes.attribute`. Each expected figure
is computed here from the raw events by a plain sum, not copied from the function's output.

What the dump shows about the GPU branch (G1): Kineto repeats a record_function range under which kernels ran as a
device-side user annotation that spans exactly the kernels launched under it on the annotating thread; FSDP2 names
its spans after the unit (`FSDP::post_backward_reduce (7)`), which COMM_SPANS matches by prefix. What it cannot show:
at world size 1 FSDP2 skips the all-gather and copies instead of reduce-scattering, and Parallax's one-element
all-reduce runs no kernel, so the step holds no NCCL kernel and its exposed communication is zero. The size of
exposed NCCL communication needs k >= 2 on two GPUs.
"""

from __future__ import annotations

import pytest

from pipeline.measure import comm_probes
from pipeline.models import blocks, build_lenet
from pipeline.strategies import fsdp
from tests.measure.test_comm_attribution import CUDA0, FIXTURES

H200 = FIXTURES / "H200-fsdp-k1-nccl-kineto-cuda.json"


@pytest.fixture(scope="module")
def dump() -> dict:
    return comm_probes.load_events(H200)


def host(events, prefix=""):
    return [e for e in events if e["device_type"] == "cpu" and e["name"].startswith(prefix)]


def kernels(events):
    """Device-side records that are not user annotations: what ran on the GPU."""
    return [e for e in events if e["device_type"] != "cpu" and not e["is_user_annotation"]]


def annotations(events):
    return [e for e in events if e["device_type"] != "cpu" and e["is_user_annotation"]]


def phase(events, name) -> tuple[float, float]:
    (p,) = host(events, comm_probes.PHASE + name)  # exactly one host range per charged phase in one step
    return p["start_us"], p["end_us"]


def inside(e, a, b) -> bool:
    return a <= e["start_us"] and e["end_us"] <= b


def duration(es) -> float:
    return sum(e["end_us"] - e["start_us"] for e in es)


def unit(name: str) -> str:
    """FSDP2's span suffix: the unit's module name, `FSDP::pre_forward (3)` -> `3`."""
    return name.rsplit("(", 1)[1].rstrip(")")


def test_the_fixture_is_a_real_fsdp_k1_step_over_nccl_with_fsdps_probe(dump):
    assert dump["synthetic"] is False and "SYNTHETIC" not in H200.name
    assert (dump["strategy"], dump["k"], dump["world"], dump["device"]) == ("fsdp", 1, 1, "cuda:0")
    assert dump["torch"].startswith("2.11.") and dump["cuda"] == "13.0"
    probe = dump["probe"]
    assert (probe["path"], probe["backend"]) == ("kernels", "nccl")
    strategy = fsdp.FSDPStrategy.__new__(fsdp.FSDPStrategy)  # no set-up: only the probe's names are read
    strategy.device = CUDA0
    p = strategy.comm_probe(None)
    p.path = comm_probes.comm_path("nccl", "cuda")
    assert probe["comm_names"] == list(p.names) == ["nccl"]  # what the fsdp probe looks for on NCCL
    assert {e.get("device") for e in dump["events"] if e["device_type"] != "cpu"} == {0}


def test_kineto_repeats_each_range_on_the_device_spanning_its_own_threads_kernels(dump):
    """G1's premise on a real trace: each device-side user annotation starts at a kernel's start and ends at a
    kernel's end (Kineto's gpu_user_annotation), and has a host range of the same name. The device-side
    parallax::backward spans only the kernels its own thread launched (autograd's thread launches the rest), so
    phases must come from host ranges, as the attribution takes them."""
    events = dump["events"]
    ks, anns = kernels(events), annotations(events)
    assert ks and anns
    host_names = {e["name"] for e in host(events)}
    for a in anns:
        spanned = [k for k in ks if inside(k, a["start_us"], a["end_us"])]
        assert spanned, a["name"]
        assert min(k["start_us"] for k in spanned) == a["start_us"], a["name"]
        assert max(k["end_us"] for k in spanned) == a["end_us"], a["name"]
        assert a["name"] in host_names, a["name"]
    b0, b1 = phase(events, "backward")
    (dev_backward,) = [a for a in anns if a["name"] == comm_probes.PHASE + "backward"]
    in_host_backward = [k for k in ks if inside(k, b0, b1)]
    in_dev_backward = [k for k in ks if inside(k, dev_backward["start_us"], dev_backward["end_us"])]
    assert len(in_dev_backward) < len(in_host_backward)
    assert {k["thread"] for k in in_host_backward} - {dev_backward["thread"]}  # kernels from another thread


def test_one_nccl_rank_runs_no_kernel_so_no_communication_is_exposed(dump):
    """At k=1 the GPU ran kernels in forward and backward but none of NCCL's: the kernel path finds nothing, which
    is right (nothing left the device), and the dump recorded the same. The collective the host did call (a
    one-element all-reduce) falls outside forward and backward."""
    events = dump["events"]
    ks = kernels(events)
    assert not [k for k in ks if "nccl" in k["name"].lower()]
    calls = host(events, "nccl:")
    assert calls and {e["name"] for e in calls} == {"nccl:all_reduce"}
    for name in comm_probes.CHARGED:
        a, b = phase(events, name)
        assert 0 < duration(k for k in ks if inside(k, a, b)) < b - a  # a real device timeline, idle in between
        assert not [c for c in calls if c["start_us"] < b and c["end_us"] > a]
    got = comm_probes.attribute(events, "kernels", dump["probe"]["comm_names"])
    assert got == {"forward": 0.0, "backward": 0.0} == dump["expected_s"]


def test_fsdps_spans_are_found_under_torch_2_11s_names(dump):
    """COMM_SPANS against the real names: one post-backward reduce per sharded unit, named by the unit's module
    (the blocks `models.blocks` names in LeNet); no all-gather span, as FSDP2 skips it at world size 1. Taken as
    host spans (the Gloo path) they give backward the plain sum of the reduce spans (disjoint, one thread) and
    forward nothing."""
    events = dump["events"]
    model = build_lenet()
    units = {id(m) for _, m in blocks(model)}
    sharded = {name for name, m in model.named_children() if id(m) in units}
    assert sharded == {"0", "3", "7", "9"}
    assert {unit(e["name"]) for e in host(events, "FSDP::pre_forward")} == sharded
    spans = [e for e in host(events) if e["name"].startswith(fsdp.COMM_SPANS)]
    assert spans and all(e["name"].startswith("FSDP::post_backward_reduce (") for e in spans)
    assert sorted(unit(e["name"]) for e in spans) == sorted(sharded)
    assert not host(events, "FSDP::all_gather")
    b0, b1 = phase(events, "backward")
    assert all(inside(e, b0, b1) for e in spans)
    ordered = sorted(spans, key=lambda e: e["start_us"])
    assert all(x["end_us"] <= y["start_us"] for x, y in zip(ordered, ordered[1:]))
    expected = duration(spans) / 1e6
    got = comm_probes.attribute(events, "spans", fsdp.COMM_SPANS)
    assert got == pytest.approx({"forward": 0.0, "backward": expected}, abs=1e-12)
    assert 0 < got["backward"] < (b1 - b0) / 1e6


def test_copies_inside_fsdps_device_annotations_count_only_because_annotations_are_not_busy(dump):
    """G1 on real events: taking the copies as the communication (names 'memcpy'), the kernel path charges each
    phase the plain sum of its copies (no other kernel overlaps them here). FSDP2's device-side annotations span
    exactly those copies, so counting annotations as busy kernels, the error G1 fixed, hides all of them."""
    events = dump["events"]
    ks = kernels(events)
    copies = [k for k in ks if "memcpy" in k["name"].lower()]
    others = [k for k in ks if k not in copies]
    assert not [(c, o) for c in copies for o in others if o["start_us"] < c["end_us"] and o["end_us"] > c["start_us"]]
    expected = {}
    for name in comm_probes.CHARGED:
        a, b = phase(events, name)
        expected[name] = duration(c for c in copies if inside(c, a, b)) / 1e6
        assert expected[name] > 0
    assert comm_probes.attribute(events, "kernels", ("memcpy",)) == pytest.approx(expected, abs=1e-12)
    as_busy = [{**e, "is_user_annotation": False} if e["device_type"] != "cpu" else e for e in events]
    assert comm_probes.attribute(as_busy, "kernels", ("memcpy",)) == pytest.approx(
        {"forward": 0.0, "backward": 0.0}, abs=1e-12
    )
