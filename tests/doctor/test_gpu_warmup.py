"""Every GPU timing opens its window after DDP's synchronised iterations: DDP's reducer collects runtime stats (a
host sync on GPUs) on iterations 1-10, so the GPU profiles, the ladder's rungs and doctor all warm up past them,
from the one constant in pipeline/config/schema.py."""

from __future__ import annotations

import pytest

from benchmarks.gpu import gpu_epoch
from pipeline.config import loader, schema
from pipeline.doctor import checks
from pipeline.trial import graphs

from ..conftest import REPO


def test_the_settled_step_is_past_ddps_synchronised_iterations_and_named_once():
    assert schema.DDP_SETTLE_STEPS == schema.DDP_RUNTIME_STATS_ITERATIONS + 1 == 11
    assert checks.WARMUP_STEPS == graphs.DDP_SETTLE_STEPS == schema.DDP_SETTLE_STEPS


@pytest.mark.parametrize("profile", ["gpu", "slurm"], ids=lambda p: f"{p}.yaml")  # "gpu" alone marks a CUDA test
def test_the_gpu_profiles_time_no_step_ddp_synchronises(profile):
    cfg = loader.load(None, [f"profile={profile}"], root=REPO)
    assert cfg.train.warmup_steps >= checks.WARMUP_STEPS  # as doctor's timed rows


def test_the_ladders_rungs_warm_up_past_ddps_statistics_and_time_at_least_one_step(tmp_path):
    cfg = gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * 234, 234)
    assert cfg.train.warmup_steps >= checks.WARMUP_STEPS
    assert cfg.train.breakdown_every == 0 and cfg.train.epochs == 2
    assert gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * 4, 4).train.warmup_steps == 3  # a short smoke epoch
