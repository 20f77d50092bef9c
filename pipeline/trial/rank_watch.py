"""What the caller sees of a trial's ranks: their epoch records as the main rank writes them (watch_epochs, which
hands each to the caller's on_epoch and answers it), and how a failed rank reads (failure_reason, is_out_of_memory).
"""

from __future__ import annotations

import json
import os
import select
import threading
from pathlib import Path

from pipeline.errors import TrialFailed
from pipeline.records import files


def watch_epochs(
    out_dir: Path, on_epoch, stop: threading.Event, wake_fd: int | None = None, failed: list | None = None
):
    """Tail progress.jsonl, hand each record to on_epoch, answer with ack-<epoch>. An error of on_epoch (its store
    is down) answers "stop" and goes to `failed`, for the caller to raise once the ranks have ended."""
    seen = 0
    path = out_dir / "progress.jsonl"
    while True:
        last = stop.is_set()  # after the ranks end, one more pass: records written during a slow on_epoch
        if wake_fd is not None and not last and select.select([wake_fd], [], [], 0.1)[0]:
            os.read(wake_fd, 4096)
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines[seen:]:
            record = json.loads(line)
            try:
                stop_it = bool(failed) or bool(on_epoch and on_epoch(record))
            except Exception as e:
                failed.append(e)
                stop_it = True
            # whole or not at all: the main rank reads the answer as soon as the file exists (ranks._file_reporter)
            files.write_text(out_dir / f"ack-{record['epoch']}", "stop" if stop_it else "go")
        seen = len(lines)
        if last:
            return
        if wake_fd is None:
            stop.wait(0.1)  # an epoch record waits at most this long; polling faster steals a core


def failure_reason(err) -> TrialFailed:
    """The launcher's ChildFailedError as the trial's failure: each failed rank and why, and its kind (worker_died,
    diverged, oom, timeout, error)."""
    parts, kind = [], "error"
    for rank, f in sorted(getattr(err, "failures", {}).items()):
        if f.exitcode < 0 or f.message == "" or "Signal" in str(f.message):
            sig = f.signal_name() if f.exitcode < 0 else f"exit code {f.exitcode}"
            parts.append(f"rank {rank} (pid {f.pid}) died: {sig}")
            kind = "worker_died" if kind == "error" else kind
        else:
            msg = f.message.get("message", str(f.message)) if isinstance(f.message, dict) else str(f.message)
            msg = msg.strip().splitlines()[0] if msg.strip() else f"exit code {f.exitcode}"
            parts.append(f"rank {rank} failed: {msg}")
            if "DivergenceError" in msg or "diverged" in msg:
                kind = "diverged"
            elif is_out_of_memory(msg):
                parts[-1] = f"rank {rank} ran out of memory: {msg}"
                kind = "oom"
            elif "timed out" in msg.lower() or "timeout" in msg.lower():
                kind = "timeout" if kind == "error" else kind
            elif any(s in msg for s in PEER_GONE):
                # Gloo's all-reduce failed because another rank's connection closed: that rank most likely died.
                # PyTorch's launcher reports only the first failed rank it polls, which may be this one.
                parts[-1] += (
                    " (a peer rank's connection closed first: that rank most likely died; the launcher "
                    "reports only one failed rank)"
                )
                kind = "worker_died" if kind == "error" else kind
    return TrialFailed("; ".join(parts) or str(err), kind)


PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")
# How running out of memory reads, on every device: CUDA's torch.OutOfMemoryError ("CUDA out of memory"), PyTorch's
# CPU allocator (a RuntimeError: "DefaultCPUAllocator: can't allocate memory" on Linux, "not enough memory"
# elsewhere), and Python's own MemoryError.
OUT_OF_MEMORY = ("out of memory", "defaultcpuallocator", "can't allocate memory", "not enough memory", "memoryerror")


def is_out_of_memory(message: str) -> bool:
    """Whether an error's text (its type name first, as a rank's error file has it) says memory ran out."""
    low = message.lower()
    return any(m in low for m in OUT_OF_MEMORY)


def stacks_kept(out_dir: Path) -> str:
    """Where a stopped trial's ranks left their Python stacks, for its failure's text ("" when none did)."""
    written = sorted(str(f) for f in out_dir.glob("stacks-rank*.txt") if f.stat().st_size)
    return f"; their Python stacks when stopped: {', '.join(written)}" if written else ""
