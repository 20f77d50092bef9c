"""A Gloo world of CPU ranks for the strategy tests that run a worker function of their own (not a trial).

Ranks start from the trials' forkserver (trial/start.py) unless a test asks for fork: forking pytest itself, after
other tests left threads in it, once hung a rank before it reached init_process_group (CI, after test_scaleout).
"""

from __future__ import annotations

import uuid

from pipeline.trial import start


def launch(worker, *args, nproc: int = 2, start_method: str = "forkserver", rdzv_timeout_s: float | None = None):
    """{rank: worker(*args)} over `nproc` fresh ranks."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    lc = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        rdzv_configs={"timeout": int(rdzv_timeout_s)} if rdzv_timeout_s else {},
        max_restarts=0,
        monitor_interval=0.05,
        start_method=start.prepared(start_method),
    )
    return elastic_launch(lc, worker)(*args)
