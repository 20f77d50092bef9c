"""A sampled step as a Chrome trace (Trace Event Format JSON: {"traceEvents": [...], "displayTimeUnit": "ms"}), the
file Perfetto (ui.perfetto.dev), chrome://tracing, TensorBoard's profiler plugin and Holistic Trace Analysis open.

Each rank of a trial writes the first step its breakdown sampled (breakdown.py) as `trace/rank<R>.pt.trace.json` in the
trial directory. Where the probe ran torch.profiler (ProfiledComm: fsdp, dp, dp_criterion), the file is the profiler's
own export (`torch.profiler.profile.export_chrome_trace`: Kineto's trace, with its operators, kernels, the clock's
`parallax::<phase>` labels and the rank's distributedInfo), which TensorBoard and HTA read. Every strategy's file also
holds the breakdown's track: the step, each clock phase, exposed communication and idle as complete events ("X",
microseconds) on the clock that measured them. That track is written here by hand because no profiler ran for the
other strategies (single, scratch, ddp, ddp_amp: a profiler would change the step it measures) and because the parts
(comm_exposed, idle) are the breakdown's own figures, in no profiler's events. On a profiler's trace the track is
placed by the clock's labels: the median offset between each `parallax::<phase>` label and the clock's reading of
that phase (microseconds apart on a CPU; on a GPU the label opens before the phase's synchronisation).
"""

from __future__ import annotations

import os

from pipeline.measure.comm_probes import PHASE

CAT = "parallax_breakdown"  # the breakdown track's event category
TID = 1 << 22  # the breakdown track's thread id: above Linux's largest pid_max, so never a real thread's


def breakdown_events(
    first: dict, idle_s: float, pid: int, t0_us: float = 0.0, step_args: dict | None = None
) -> list[dict]:
    """The track of one sampled step: `first` holds the clock's readings (t0: the step's start, t1: its work's end,
    spans: [(phase, start, end)], exposed: [(start, end)], perf_counter seconds; step: its steady-state index);
    idle_s: the rank's idle (its barrier wait less the barrier's latency); t0_us: where the step starts on the
    trace's time axis; step_args: shown with the step's event."""
    t0, t1 = first["t0"], first["t1"]

    def event(name: str, a: float, b: float, **args) -> dict:
        return {
            "name": name,
            "cat": CAT,
            "ph": "X",
            "ts": t0_us + (a - t0) * 1e6,
            "dur": max(0.0, (b - a) * 1e6),
            "pid": pid,
            "tid": TID,
            "args": args,
        }

    return [
        {"name": "thread_name", "ph": "M", "ts": t0_us, "pid": pid, "tid": TID, "args": {"name": "parallax breakdown"}},
        event("step", t0, t1 + idle_s, step=first["step"], **(step_args or {})),
        *(event(phase, a, b) for phase, a, b in first["spans"]),
        *(event("comm_exposed", a, b) for a, b in first["exposed"]),
        event("idle", t1, t1 + idle_s),
    ]


def label_offset(kineto: dict, first: dict) -> float | None:
    """Microseconds to add to the step's own time axis (0 = its start) to land on the profiler trace's: the median
    over the clock's phases of label start less clock start. None where the labels and the phases do not match."""
    labels = sorted(
        (e["ts"], e["name"][len(PHASE) :])
        for e in kineto.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(PHASE)
    )
    spans = first["spans"]
    if not spans or [name for _, name in labels] != [phase for phase, _, _ in spans]:
        return None
    diffs = sorted(ts - (a - first["t0"]) * 1e6 for (ts, _), (_, a, _) in zip(labels, spans))
    return diffs[len(diffs) // 2]


def step_trace(first: dict, idle_s: float, about: dict, kineto: dict | None = None) -> dict:
    """The trace of one sampled step: the profiler's (`kineto`, its export read back) with the breakdown's track
    added, or the track alone where no profiler ran or its labels do not match the clock's phases. `about`: the
    rank, world size, strategy and the step's parts, kept under the trace's `parallax` key."""
    pid = os.getpid()
    offset = label_offset(kineto, first) if kineto else None
    if offset is None:
        trace = {
            "traceEvents": [
                {
                    "name": "process_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": pid,
                    "tid": 0,
                    "args": {"name": f"rank {about['rank']}"},
                }
            ],
            "distributedInfo": {"rank": about["rank"], "world_size": about["world"]},
        }
        offset, source = 0.0, "the breakdown's clock"
    else:
        trace, source = kineto, "torch.profiler (Kineto) and the breakdown's clock"
        trace.pop("traceName", None)  # the temporary file torch exported it to
    parts = {f"{k}_s": v for k, v in about.get("parts_s", {}).items()}
    trace["traceEvents"] = trace.get("traceEvents", []) + breakdown_events(first, idle_s, pid, offset, parts)
    trace["displayTimeUnit"] = "ms"
    trace["parallax"] = {**about, "source": source}
    return trace
