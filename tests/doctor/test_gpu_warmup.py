"""Every GPU timing opens its window after DDP's synchronised iterations: DDP's reducer collects runtime stats (a
host sync on GPUs) on iterations 1-10, so the GPU profiles, the ladder's rungs and doctor all warm up past them,
from the one constant in pipeline/config/settle.py."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.gpu import gpu_epoch
from pipeline.config import loader, settle
from pipeline.doctor import checks
from pipeline.errors import Infeasible
from pipeline.host.devices import probe
from pipeline.trial import graphs, launch

from ..conftest import REPO

GPU = dataclasses.replace(probe(), kind="cuda", n=1)
CPU = dataclasses.replace(probe(), kind="cpu", n=2)
GRAPH_RUNGS = [key for key, _, sets, _ in gpu_epoch.LADDER if sets.get("cuda_graphs")]


def test_the_settled_step_is_past_ddps_synchronised_iterations_and_named_once():
    assert settle.DDP_SETTLE_STEPS == settle.DDP_RUNTIME_STATS_ITERATIONS + 1 == 11
    assert checks.WARMUP_STEPS == graphs.DDP_SETTLE_STEPS == settle.DDP_SETTLE_STEPS


@pytest.mark.parametrize("profile", ["gpu", "slurm"], ids=lambda p: f"{p}.yaml")  # "gpu" alone marks a CUDA test
def test_the_gpu_profiles_time_no_step_ddp_synchronises(profile):
    cfg = loader.load(None, [f"profile={profile}"], root=REPO)
    assert cfg.train.warmup_steps >= checks.WARMUP_STEPS  # as doctor's timed rows


def test_the_ladders_rungs_warm_up_past_ddps_statistics_and_time_at_least_one_step(tmp_path):
    cfg = gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * 234, 234)
    assert cfg.train.warmup_steps >= checks.WARMUP_STEPS
    assert cfg.train.breakdown_every == 0 and cfg.train.epochs == 2
    assert gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * 4, 4).train.warmup_steps == 3  # a short smoke epoch


@pytest.mark.parametrize("rung", GRAPH_RUNGS)
def test_a_graph_rung_captures_in_its_cold_epoch_and_times_its_warm_one_or_is_refused(tmp_path, rung):
    """At every epoch length the ladder takes (2 steps and up), a graph rung either captures inside its cold epoch
    and opens its timed window by the warm epoch's first step (so the warm epoch is replays only, all timed), or is
    refused with the numbers: never an eager epoch under the graph's label."""
    strategy = next(s for key, s, _, _ in gpu_epoch.LADDER if key == rung)
    at = graphs.capture_step(strategy)
    for steps in range(2, 2 * at + 4):
        cfg = gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * steps, steps)
        if steps <= at:
            with pytest.raises(Infeasible, match=rf"{steps} steps of 256.* --images {(at + 1) * 256} or more"):
                gpu_epoch.rung_cfg(cfg, "lenet", rung, 256, GPU)
            continue
        t = gpu_epoch.rung_cfg(cfg, "lenet", rung, 256, GPU).train
        assert t.cuda_graphs and t.strategy == strategy and t.devices == 1 and t.batch_size == 256
        assert at + 1 <= t.warmup_steps <= steps, (steps, t.warmup_steps)


@pytest.mark.parametrize("rung", GRAPH_RUNGS)
def test_a_graph_rung_on_a_cpu_gives_the_trials_reason_alone(tmp_path, rung):
    """On a CPU a graph rung is refused for the host, with the trial's own reason (launch.mode_refusal), at every
    epoch length: never advice on --images, which cannot make a CPU capture a CUDA graph."""
    strategy = next(s for key, s, _, _ in gpu_epoch.LADDER if key == rung)
    at = graphs.capture_step(strategy)
    for steps in (2, at, at + 1, 60000 // 256):
        cfg = gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * steps, steps)
        with pytest.raises(Infeasible) as refused:
            gpu_epoch.rung_cfg(cfg, "lenet", rung, 256, CPU)
        t = dataclasses.replace(cfg.train, strategy=strategy, cuda_graphs=True)
        assert str(refused.value) == launch.mode_refusal(t, CPU, oversubscribed=False), steps
        assert "needs a GPU" in str(refused.value) and "--images" not in str(refused.value)
