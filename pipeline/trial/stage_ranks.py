"""The ranks of the pipeline's own measurement stages (overlap, collectives) on this node, started as a one-node
trial's are (ranks.py): the rendezvous store and Gloo on the loopback interface only (loopback.py), and the
launcher's scratch (its torchelastic_* log folder, torch.multiprocessing's pytorch-errorfile-* files) in a folder
of the stage's own, removed when the ranks end (and by the next run when a SIGKILL left it).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import uuid

from pipeline.host import loopback
from pipeline.scratch import make

LOCAL_ADDR = "127.0.0.1"
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def launch_config(nproc: int, name: str, start_method: str, log_dir: str):
    """A LaunchConfig for `nproc` ranks on this node whose rendezvous listens on 127.0.0.1 only."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"{name}-{uuid.uuid4().hex[:8]}",
        rdzv_backend=loopback.register(),
        rdzv_endpoint="",
        rdzv_configs={},
        local_addr=LOCAL_ADDR,
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start_method,
        logs_specs=DefaultLogsSpecs(log_dir=log_dir),
    )


def launch(nproc: int, name: str, start_method: str, entrypoint, *args) -> dict[int, object]:
    """Run entrypoint(*args) in `nproc` ranks on this node; every rank's return value by rank. A failed rank raises
    torch's ChildFailedError, as elastic_launch does."""
    from torch.distributed.launcher.api import elastic_launch

    scratch = make(f"parallax-{name}-")  # and removes those of killed runs
    previous = tempfile.tempdir
    # the agent installs handlers that raise SignalException and never removes them: restored afterwards
    handlers = {s: signal.getsignal(s) for s in _AGENT_SIGNALS}
    try:
        with loopback.collectives_on_loopback():
            tempfile.tempdir = scratch  # torch.multiprocessing names its error files in the default temp dir
            return elastic_launch(launch_config(nproc, name, start_method, scratch), entrypoint)(*args)
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(ValueError):  # not the main thread: the agent installed none
            for s, h in handlers.items():
                signal.signal(s, h)
