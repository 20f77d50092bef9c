"""How the step-time breakdown (breakdown.py) finds the communication inside a sampled step's phases: one probe
per kind of strategy, chosen by the strategy's `comm_probe`. DDPStats reads DDP's own runtime statistics (ddp,
ddp_amp); ProfiledComm runs torch.profiler around the step (fsdp, dp, dp_criterion); NoComm has nothing to split off
(single; scratch, whose reduce_gradients phase is communication in full). `stop()` returns the exposed seconds per
clock phase; `exposed_spans` places the last step's exposed communication on the clock's own timeline (the
Chrome trace of chrome_trace.py).

ProfiledComm's attribution is `attribute`, a pure function over plain event records (`records` makes them from
torch's FunctionEvents), so it is tested without a profiler and replayed from events a GPU run dumped
(`dump_events`/`load_events`; `doctor --dump-events DIR`). Its two paths, chosen by the process group's backend
(`comm_path`), not by the device type:
- kernels (NCCL, and in-process dp on CUDA: torch.cuda.nccl plus device copies): device-side kernel records whose
  name holds one of the probe's names, less the time any other kernel ran, on one timeline for all devices;
  device-side user annotations (Kineto's gpu_user_annotation: one per record_function range, spanning the range's
  kernels, device type CUDA) are not kernels;
- spans (Gloo, even on CUDA tensors; any host-side backend): host-side time inside the strategy's collective spans.
Phases are the clock's `parallax::<phase>` ranges on the host only (Kineto repeats each as a device-side
annotation: counted once), and only forward and backward are charged: a copy in the data phase moves data in.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import torch

PHASE = "parallax::"  # profiler label of each clock phase (ProfiledComm attributes collectives to phases by it)
CHARGED = ("forward", "backward")  # the phases exposed communication is taken out of
DUMP_ENV = "PARALLAX_DUMP_EVENTS"  # a directory: the first profiled step of each trial process is dumped there
FORMAT = "parallax-profiler-events"  # the dump's format name (version 1)
CUPTI_SESSIONS = 1  # profiler sessions with CUDA activity per trial process (breakdown.py: why one)


class NoComm:
    """No communication inside a phase to split off. `whole`: clock phases that are communication in full
    (scratch: reduce_gradients, its hand-written all-reduce, which nothing overlaps)."""

    labelled = False  # does it read the clock's phase labels from a profiler?
    spent = False  # True once the probe must not run again in this trial (the breakdown then samples no more)
    events = None  # the last session's event records (ProfiledComm), for the dump
    traced = None  # the first session's torch.profiler.profile (ProfiledComm), exported as a Chrome trace

    def __init__(self, method: str, whole: tuple[str, ...] = ()):
        self.method, self.whole = method, whole

    def start(self) -> None:
        pass

    def stop(self) -> dict[str, float]:
        """Seconds of exposed communication inside each clock phase of the step just run."""
        return {}

    def facts(self) -> dict:
        """Which path measured the communication (recorded with the breakdown)."""
        return {"path": "none"}

    def exposed_spans(self, spans) -> list[tuple[float, float]]:
        """The step just run's exposed communication as intervals of the clock's time (perf_counter seconds), given
        the clock's phases [(phase, start, end)]: here the phases that are communication in full."""
        return [(a, b) for phase, a, b in spans if phase in self.whole]

    def chrome_trace(self, path: Path) -> bool:
        """The first profiler session's events as torch.profiler's own Chrome trace (Kineto's JSON) at `path`; False
        where the profiler wrote none (no profiler, or torch's CUPTI monitor skipped the export)."""
        if self.traced is None:
            return False
        self.traced.export_chrome_trace(str(path))
        return Path(path).is_file() and Path(path).stat().st_size > 0


class DDPStats(NoComm):
    """DDP's own runtime statistics (the reducer's timer: c10::getTime on CPU, CUDA events on GPUs) for the sampled
    iteration. Exposed = backward_comm_time - backward_compute_comm_overlap_time: from the moment autograd finished
    the last gradient to the moment the last bucket's all-reduce completed. The reducer records iterations 1-10 and
    then every sample_rate-th (100 by default): the rate is set to 1 for the sampled step only, its stats logged right
    after backward (DDP itself would log them at the next forward), then the default rate is restored, so DDP runs
    as shipped on every other step. No profiler: no CUPTI session on GPUs."""

    DEFAULT_RATE = 100  # kDDPRuntimeLoggingSampleRate (torch/csrc/distributed/c10d/reducer.hpp)

    def __init__(self, model):
        super().__init__(
            "DDP's runtime stats of the sampled iteration (_get_ddp_logging_data): backward_comm_time "
            "- backward_compute_comm_overlap_time, i.e. last gradient ready -> last bucket reduced; "
            "taken out of the backward phase"
        )
        self.model = model
        self.last_iteration, self.t_start, self.exposed_s = None, 0, 0.0

    def facts(self) -> dict:
        return {"path": "ddp_stats"}

    def start(self) -> None:
        self.t_start = time.time_ns()  # the reducer's host timestamps are c10::getTime: CLOCK_REALTIME on Linux
        self.model._set_ddp_runtime_logging_sample_rate(1)

    def stop(self) -> dict[str, float]:
        self.model.logger.set_runtime_stats_and_log()
        self.model._set_ddp_runtime_logging_sample_rate(self.DEFAULT_RATE)
        d = self.model._get_ddp_logging_data()
        iteration, comm_end = d.get("iteration"), d.get("backward_comm_time_end")
        # a micro-batch under no_sync (accumulation) leaves the last synchronising iteration's stats: not this step's
        fresh = (
            iteration is not None and iteration != self.last_iteration and (not comm_end or comm_end >= self.t_start)
        )
        self.last_iteration, self.exposed_s = iteration, 0.0
        if not fresh:
            return {}
        exposed = d.get("backward_comm_time", 0) - d.get("backward_compute_comm_overlap_time", 0)
        self.exposed_s = max(0, exposed) / 1e9
        return {"backward": self.exposed_s}

    def exposed_spans(self, spans) -> list[tuple[float, float]]:
        """At the end of the last backward phase: the reducer's wait from the last gradient to the last bucket."""
        ends = [(a, b) for phase, a, b in spans if phase == "backward"]
        if not ends or self.exposed_s <= 0:
            return []
        a, b = ends[-1]
        return [(max(a, b - self.exposed_s), b)]


PATH_WORDS = {
    "kernels": "device kernels whose name holds {names} (NCCL collectives; copies where listed), less the time "
    "any other kernel ran on any device: one timeline for all devices, so NCCL on device 0 overlapping "
    "compute on device 1 counts as hidden; device-side user annotations (gpu_user_annotation) are not "
    "kernels; one profiler session (CUDA activity: CUPTI) per trial, at its first sampled step",
    "spans": "host-side time inside the spans {names} (the collective runs on the host: Gloo blocks its caller, "
    "even for CUDA tensors), on any thread; no CUDA activity requested (no CUPTI session)",
}


class ProfiledComm(NoComm):
    """torch.profiler around the sampled step; the path (kernels or spans: the module docstring) follows the
    process group's backend, resolved at the first start. Each exposed interval is charged to the clock phase
    (parallax::<phase>, host side) it falls in."""

    labelled = True

    def __init__(self, spans: tuple[str, ...], device: torch.device, method: str, kernels: tuple[str, ...] = ("nccl",)):
        self.whole, self.what = (), method
        self.spans, self.device, self.kernels = spans, device, kernels
        self.backend = self.path = self.prof = None
        self.sessions, self.exposed_us = 0, []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.kernels if self.path == "kernels" else self.spans)

    @property
    def cupti(self) -> bool:
        """Does a session request CUDA activity (a CUPTI session)?"""
        return self.path == "kernels" and self.device.type == "cuda"

    @property
    def spent(self) -> bool:
        return self.cupti and self.sessions >= CUPTI_SESSIONS

    @property
    def method(self) -> str:
        if self.path is None:
            return self.what
        return f"{self.what}. Path taken: {self.path} (backend {self.backend or 'none: in-process'}): " + PATH_WORDS[
            self.path
        ].format(names=", ".join(self.names) or "(none)")

    def facts(self) -> dict:
        return {
            "path": self.path,
            "backend": self.backend,
            "comm_names": list(self.names),
            "profiler_sessions": self.sessions,
            "cupti": self.cupti,
            "teardown_cupti": os.environ.get("TEARDOWN_CUPTI"),
        }

    def start(self) -> None:
        if self.path is None:
            dist = torch.distributed
            self.backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
            self.path = comm_path(self.backend, self.device.type)
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.cupti:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        else:
            # Kineto logs two lines per profiled step (and, in a CUDA build without a GPU, a spurious
            # "gpuGetDeviceCount failed"): silenced unless the user set a level. (The autograd profiler,
            # quieter, cannot parse FSDP's record_function spans that close on another thread.)
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        self.prof = torch.profiler.profile(activities=acts)
        self.prof.__enter__()
        self.sessions += 1

    def stop(self) -> dict[str, float]:
        self.prof.__exit__(None, None, None)
        self.events = records(self.prof.events())
        if self.traced is None:  # kept for its Chrome trace, exported once training ends (breakdown.py)
            self.traced = self.prof
        self.prof = None
        self.exposed_us = exposed(self.events, self.path, self.names)
        return charge(self.exposed_us, self.events)

    def exposed_spans(self, spans) -> list[tuple[float, float]]:
        """The exposed intervals charged to a phase, each placed in the clock's phase by its offset from the phase's
        profiler label (the labels and the clock's phases are one-to-one, in order); none where they disagree."""
        labels = sorted(_phases(self.events or []), key=lambda p: p[1])
        if [p[0] for p in labels] != [p[0] for p in spans]:
            return []
        out = []
        for (name, la, lb), (_, a, b) in zip(labels, spans):
            if name not in CHARGED:
                continue
            for x, y in self.exposed_us:
                lo, hi = max(x, la), min(y, lb)
                if hi > lo:
                    out.append((min(b, a + (lo - la) / 1e6), min(b, a + (hi - la) / 1e6)))
        return out


def comm_path(backend: str | None, device_type: str) -> str:
    """'kernels' where the collectives run on the device (NCCL; no process group on CUDA: DataParallel's
    torch.cuda.nccl and copies), else 'spans' (Gloo and other host-side backends, whatever the tensors' device)."""
    if backend is None:
        return "kernels" if device_type == "cuda" else "spans"
    return "kernels" if backend == "nccl" else "spans"


def records(events) -> list[dict]:
    """Plain records of torch FunctionEvents: name, device_type ('cpu', 'cuda', ...), is_user_annotation,
    start_us, end_us, thread, and the device index of device-side events."""
    out = []
    for e in events:
        kind = e.device_type.name.lower()
        r = {
            "name": e.name,
            "device_type": kind,
            "is_user_annotation": bool(e.is_user_annotation),
            "start_us": float(e.time_range.start),
            "end_us": float(e.time_range.end),
            "thread": int(e.thread),
        }
        if kind != "cpu":
            r["device"] = int(e.device_index)
        out.append(r)
    return out


def attribute(events: list[dict], path: str, names) -> dict[str, float]:
    """Seconds of exposed communication charged to each of forward and backward (the module docstring)."""
    return charge(exposed(events, path, names), events)


def _phases(events: list[dict]) -> list[tuple[str, float, float]]:
    """The clock's phases as the profiler saw them: host-side `parallax::<phase>` ranges (name, start, end)."""
    return [
        (e["name"][len(PHASE) :], e["start_us"], e["end_us"])
        for e in events
        if e["device_type"] == "cpu" and e["name"].startswith(PHASE)
    ]


def exposed(events: list[dict], path: str, names) -> list[tuple[float, float]]:
    """The intervals (profiler microseconds) of communication that nothing else overlapped, on `path`."""
    names = tuple(names)
    if path == "kernels":
        kernels = [e for e in events if e["device_type"] != "cpu" and not e["is_user_annotation"]]
        is_comm = [any(n.lower() in e["name"].lower() for n in names) for e in kernels]
        comm = [(e["start_us"], e["end_us"]) for e, c in zip(kernels, is_comm) if c]
        busy = [(e["start_us"], e["end_us"]) for e, c in zip(kernels, is_comm) if not c]
    elif path == "spans":
        comm = [
            (e["start_us"], e["end_us"])
            for e in events
            if e["device_type"] == "cpu" and names and e["name"].startswith(names)
        ]
        busy = []
    else:
        raise ValueError(f"unknown attribution path {path!r}: 'kernels' or 'spans'")
    return subtract(union(comm), union(busy))


def charge(intervals, events: list[dict]) -> dict[str, float]:
    """Seconds of the exposed `intervals` inside each phase of CHARGED."""
    out: dict[str, float] = defaultdict(float)
    for name, a, b in _phases(events):
        if name in CHARGED:
            out[name] += overlap(intervals, a, b) / 1e6  # profiler times are microseconds
    return dict(out)


# ----------------------------------------------------------------------------- the replay format


def dump_events(
    path: Path,
    events: list[dict],
    probe: dict,
    expected: dict[str, float],
    expected_from: str = "pipeline.measure.comm_probes.attribute when the run dumped it",
    **about,
) -> Path:
    """Write one sampled step's event records with the probe's path and names and the attribution it gave
    (`expected_s`: what a replay must reproduce); `about`: strategy, rank, host... One event per line."""
    head = {
        "format": FORMAT,
        "version": 1,
        "synthetic": False,
        **about,
        "probe": {"path": probe["path"], "backend": probe.get("backend"), "comm_names": list(probe["comm_names"])},
        "expected_s": expected,
        "expected_from": expected_from,
    }
    text = json.dumps(head, indent=1)[:-2] + ',\n "events": [\n' + ",\n".join(json.dumps(e) for e in events) + "\n]}\n"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def load_events(path: Path) -> dict:
    """A dump (or fixture) read back, its format checked."""
    d = json.loads(Path(path).read_text())
    if d.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file (format: {d.get('format')!r})")
    keys = {"name", "device_type", "is_user_annotation", "start_us", "end_us"}
    bad = next((e for e in d["events"] if not keys <= set(e)), None)
    if bad is not None:
        raise ValueError(f"{path}: an event lacks {sorted(keys - set(bad))}: {bad}")
    return d


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, disjoint intervals covering the same time."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def subtract(xs, ys) -> list[tuple[float, float]]:
    """Parts of the disjoint intervals xs not covered by the disjoint intervals ys."""
    out = []
    for a, b in xs:
        for c, d in ys:
            if d <= a or c >= b:
                continue
            if c > a:
                out.append((a, c))
            a = max(a, d)
            if a >= b:
                break
        if a < b:
            out.append((a, b))
    return out


def overlap(intervals, a: float, b: float) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals)
