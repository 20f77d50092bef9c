"""Gradient all-reduce through shared memory for DDP ranks on one CPU host (a DDP communication hook).

Why: on a CPU host DDP's default transport is Gloo over TCP loopback. Between two 1-thread ranks its 0.5 MB
all-reduce is fast back to back but several times slower right after a compute phase, which is when DDP calls it
(its threads have gone to sleep and must be woken through the kernel; `benchmarks/scaling/ddp_sync.py` measures both
transports both ways, benchmarks/RESULTS.md has the figures). NCCL on GPUs uses shared memory
within a node for the same reason; the Gloo in this PyTorch build has no shared-memory path, so this hook provides
one: every rank copies its bucket into its own slot of a segment in /dev/shm, publishes a sequence number, waits
for the others' (spinning, yielding the core), and sums the slots in rank order. The order is the same on every
rank, so the replicas stay bit-identical; for two ranks the result equals Gloo's exactly (a/2 + b/2).

Two slot sets alternate between calls, so a rank never overwrites a slot a slower peer may still be reading: to
reuse a set it must first have seen every peer publish the call in between, which each does only after reading.
Publishing relies on x86-64's store ordering (the slot is written before the sequence number); other
architectures use Gloo (`available()` says why).
"""

from __future__ import annotations

import os
import platform
import threading
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

SHM_DIR = Path("/dev/shm")
_LINE = 64  # one cache line per rank's sequence number: no false sharing between spinning ranks
_FENCE = threading.Lock()  # acquire/release = a locked instruction = a full store fence on x86-64


def available(nbytes: int) -> str | None:
    """Why a shared-memory all-reduce of `nbytes`-byte buckets cannot run here, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"it relies on x86-64 store ordering and this host is {platform.machine()}"
    if not SHM_DIR.is_dir():
        return f"{SHM_DIR} does not exist"
    free = os.statvfs(SHM_DIR).f_bavail * os.statvfs(SHM_DIR).f_frsize
    if free < 2 * nbytes:
        return f"{SHM_DIR} has {free / 2**20:.0f} MiB free and the gradient slots need {2 * nbytes / 2**20:.0f} MiB"
    return None


class ShmAllreduce:
    """Sum of a tensor over the ranks of the default process group, all on this host. Collective to construct."""

    def __init__(self, max_bytes: int, timeout_s: float):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.max_bytes, self.timeout_s, self.seq = max_bytes, timeout_s, 0
        head = self.world * _LINE
        size = head + 2 * self.world * max_bytes
        name = [f"parallax-{os.getpid()}-{uuid.uuid4().hex[:12]}" if self.rank == 0 else None]
        dist.broadcast_object_list(name, src=0)
        self.path = path = SHM_DIR / name[0]
        try:
            if self.rank == 0:
                self.mem = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)  # zero-filled
            dist.barrier()
            if self.rank != 0:
                self.mem = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
            dist.barrier()
        finally:
            if self.rank == 0:
                path.unlink(missing_ok=True)  # the mappings live on; nothing is left in /dev/shm, even on a crash
        self.flags = self.mem[:head].view(torch.int64)[:: _LINE // 8]
        self.slots = self.mem[head:].view(2, self.world, max_bytes)

    def __call__(self, flat: torch.Tensor) -> torch.Tensor:
        """In place: flat <- sum over ranks of flat (1-D, contiguous, at most max_bytes)."""
        nbytes = flat.numel() * flat.element_size()
        if nbytes > self.max_bytes:
            raise ValueError(f"bucket of {nbytes} bytes exceeds the shared slots of {self.max_bytes} bytes")
        self.seq += 1
        slots = self.slots[self.seq % 2, :, :nbytes].view(flat.dtype)  # [world, n]
        slots[self.rank].copy_(flat)
        with _FENCE:
            pass
        self.flags[self.rank] = self.seq
        self._wait()
        # two ranks: a + b, exactly Gloo's sum; one rank (comm_hook=shm at k=1): its own slot
        torch.add(slots[0], slots[1], out=flat) if self.world == 2 else torch.sum(slots, dim=0, out=flat)
        return flat

    def _wait(self) -> None:
        deadline, spins = None, 0
        while int(self.flags.min()) < self.seq:
            os.sched_yield()  # the peer's threads (and the agent) may need this core
            spins += 1
            if spins % 1024 == 0:
                now = time.monotonic()
                deadline = deadline or now + self.timeout_s
                if now > deadline:
                    late = [r for r in range(self.world) if int(self.flags[r]) < self.seq]
                    raise RuntimeError(
                        f"shared-memory all-reduce timed out after {self.timeout_s:.0f} s "
                        f"(train.timeout_s): rank(s) {late} never reached step {self.seq}'s "
                        f"gradient exchange"
                    )


def shm_allreduce_hook(state: ShmAllreduce, bucket):  # no return annotation: DDP checks it literally
    """DDP comm hook: average the bucket over ranks through shared memory (same numerics as DDP's default)."""
    buf = bucket.buffer()
    state(buf.div_(state.world))
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
