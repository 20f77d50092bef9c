"""The overlap stage's GPU arms, structurally: the overlapped arm ships each result on a side CUDA stream that waits
for the product (so the copy engine can run beside the next product), and both arms copy into pinned memory with
non_blocking=True (so the only difference between them is the overlap, not pinned vs pageable transfers).

measure_cuda runs on this CPU host with torch.cuda's streams, synchronize and device count replaced by fakes and
pinned allocation by plain allocation that remembers it was asked for. This checks intent and call structure, not
CUDA semantics: whether the copy really overlaps the product, and by how much, needs a GPU."""

from __future__ import annotations

import contextlib

import torch

from pipeline.config import loader
from pipeline.scaling import overlap


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def __repr__(self):
        return f"FakeStream({self.name})"


def _fake_cuda(monkeypatch):
    """Fakes for the torch.cuda calls measure_cuda makes; returns the event log and the pinned tensors' ids."""
    log, pinned, state = [], set(), {}
    default = FakeStream("default", log)
    state["current"] = default
    made = []

    def stream_ctor(device=None, **kw):
        s = FakeStream(f"side{len(made)}", log)
        made.append(s)
        return s

    @contextlib.contextmanager
    def stream_ctx(s):
        prev, state["current"] = state["current"], s
        try:
            yield
        finally:
            state["current"] = prev

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "Stream", stream_ctor)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state["current"])
    monkeypatch.setattr(torch.cuda, "stream", stream_ctx)
    randn, empty = torch.randn, torch.empty
    monkeypatch.setattr(torch, "randn", lambda *a, device=None, **kw: randn(*a, **kw))

    def fake_empty(*a, pin_memory=False, device=None, **kw):
        t = empty(*a, **kw)
        if pin_memory:
            pinned.add(id(t))
            log.append(("keep", t))  # keeps the id unique for the test's life
        return t

    monkeypatch.setattr(torch, "empty", fake_empty)
    copy_, to = torch.Tensor.copy_, torch.Tensor.to

    def fake_copy(self, src, non_blocking=False):
        log.append(("copy", id(self), state["current"].name, non_blocking))
        return copy_(self, src, non_blocking=non_blocking)

    def fake_to(self, *a, **kw):
        log.append(("to", a, kw))  # on a GPU: a device-to-host copy into pageable memory
        return to(self, *a, **kw)

    def fake_record_stream(self, s):
        log.append(("record_stream", s.name))

    monkeypatch.setattr(torch.Tensor, "copy_", fake_copy)
    monkeypatch.setattr(torch.Tensor, "to", fake_to)
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self, *a, **kw: fake_to(self, "cpu"))
    monkeypatch.setattr(torch.Tensor, "record_stream", fake_record_stream)
    return log, pinned


def _arms(monkeypatch, log):
    """Replaces _timed by one run of each measurement, labelled by call number (returned as its time), so the
    result's sequential / overlapped medians say which call was which arm; returns the log split per call."""
    calls = []

    def once(fn, sync, reps, warmup):
        calls.append(len(log))
        fn()
        return [float(len(calls) - 1)]

    monkeypatch.setattr(overlap, "_timed", once)
    return calls


def test_overlapped_arm_copies_on_a_side_stream_and_both_arms_copy_into_pinned_memory(monkeypatch):
    """Sequential: each item's copy is queued on the compute stream. Overlapped: on a side stream, after
    side.wait_stream(compute) and with record_stream(side) on the product. Both: every item copied once into
    memory allocated with pin_memory=True, non_blocking, and no pageable .to('cpu') / .cpu()."""
    log, pinned = _fake_cuda(monkeypatch)
    calls = _arms(monkeypatch, log)
    cfg = loader.override(
        loader.Config(),
        ["overlap.size=16", "overlap.chain=2", "overlap.items=3", "overlap.reps=1", "overlap.warmup=0"],
    )
    res = overlap.measure_cuda(cfg)
    calls.append(len(log))
    per_call = [log[a:b] for a, b in zip(calls, calls[1:])]
    arms = {arm: per_call[int(res["communication"][arm]["median_s"])] for arm in ("sequential", "overlapped")}
    for arm, events in arms.items():
        assert not [e for e in events if e[0] == "to"], f"{arm}: a pageable device-to-host copy"
        copies = [e for e in events if e[0] == "copy"]
        assert len(copies) == cfg.overlap.items, f"{arm}: {len(copies)} copies for {cfg.overlap.items} items"
        assert all(dst in pinned for _, dst, _, _ in copies), f"{arm}: a copy into memory that is not pinned"
        assert all(nb for *_, nb in copies), f"{arm}: a blocking copy"
    assert {e[2] for e in arms["sequential"] if e[0] == "copy"} == {"default"}
    ov = [e for e in arms["overlapped"] if e[0] != "keep"]
    sides = {e[2] for e in ov if e[0] == "copy"}
    assert len(sides) == 1 and "default" not in sides, f"overlapped copies ran on {sides}, not one side stream"
    side = sides.pop()
    waited = False  # the side stream waited for the compute stream since the last copy
    for e in ov:
        if e == ("wait_stream", side, "default"):
            waited = True
        elif e[0] == "copy":
            assert waited, "a copy on the side stream not ordered after its product"
            waited = False
    assert [e for e in ov if e[0] == "record_stream"] == [("record_stream", side)] * cfg.overlap.items
