"""DDP's communication knobs reach DDP (observed, not assumed), and the overlap stage reports its measurements."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.config import loader
from pipeline.host.devices import probe
from pipeline.strategies.base import Learner
from tests.strategies import world

TWO = probe().n >= 2


def _knob_worker(sets: list[str], count_buckets: bool = False) -> dict:
    import torch.distributed as dist

    from pipeline.models import build_model
    from pipeline.strategies import STRATEGIES

    if count_buckets:  # the counting hook below replaces the transport: observe DDP's own all-reduces
        sets = [*sets, "train.comm_hook=none"]
    cfg = loader.override(loader.Config(), sets)
    s = STRATEGIES[cfg.train.strategy](cfg.train, probe())
    s.setup(int(__import__("os").environ["RANK"]), int(__import__("os").environ["WORLD_SIZE"]))
    model, crit = s.wrap(build_model("lenet", 0), torch.nn.CrossEntropyLoss())
    opt = s.build_optimizer(model)
    calls = []
    if count_buckets:  # observe the all-reduces DDP issues: one hook call per bucket per synchronised step
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting(state, bucket):
            calls.append(bucket.buffer().numel())
            return default_hooks.allreduce_hook(state, bucket)

        model.register_comm_hook(dist.group.WORLD, counting)
    g = torch.Generator().manual_seed(s.rank)  # different data per rank
    grads, params = [], []
    per_step = []
    for _ in range(4):
        calls.clear()
        x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
        s.train_step(Learner(model, crit, opt), x, y)
        p = next(model.module.parameters())
        grads.append(None if p.grad is None else p.grad.clone())
        params.append(p.detach().clone())
        per_step.append(len(calls))
    info = model._get_ddp_logging_data()
    del model, opt
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return {
        "grads": grads,
        "params": params,
        "allreduces_per_step": per_step,
        "bucket_sizes": str(info.get("bucket_sizes")),
        "comm_hook": str(info.get("comm_hook")),
        "bucket_cap_bytes": info.get("bucket_cap_bytes"),
        "as_view": info.get("gradient_as_bucket_view"),
    }


def launch(*sets, count_buckets=False):
    return world.launch(
        _knob_worker, ["train.strategy=ddp", "train.devices=2", *sets], count_buckets, start_method="fork"
    )


pytestmark = pytest.mark.skipif(not TWO, reason="needs 2 devices")


def test_no_sync_skips_the_allreduce_until_the_last_micro_batch():
    r = launch("train.accum_steps=2", count_buckets=True)
    assert r[0]["allreduces_per_step"][0] == 0 and r[0]["allreduces_per_step"][1] > 0  # observed, not assumed
    # micro-batch 1 (no_sync): each rank keeps its own gradient and no step is taken
    assert not torch.allclose(r[0]["grads"][0], r[1]["grads"][0])
    assert torch.equal(r[0]["params"][0], r[1]["params"][0])
    # micro-batch 2 synchronises: gradients were all-reduced (then zeroed) and both ranks stepped identically
    assert torch.equal(r[0]["params"][1], r[1]["params"][1])
    assert not torch.equal(r[0]["params"][0], r[0]["params"][1])
    # without accumulation every step synchronises (the step after micro-batch 1 already moved the weights)
    r1 = launch("train.accum_steps=1")
    assert not torch.equal(r1[0]["params"][0], r[0]["params"][0])


def test_bucket_size_and_gradient_view_are_applied():
    small = launch("train.bucket_cap_mb=0.1", count_buckets=True)[0]  # gradient views: the default
    big = launch("train.bucket_cap_mb=25", "train.grad_as_bucket_view=false", count_buckets=True)[0]
    assert small["bucket_cap_bytes"] == int(0.1 * 1024 * 1024) and small["as_view"] == 1
    assert big["as_view"] == 0
    # after the first iteration DDP rebuilds its buckets with the cap: LeNet's 0.5 MB of gradients
    # travel in one all-reduce at 25 MB, in more than one at 0.1 MB
    assert big["allreduces_per_step"][-1] == 1
    assert small["allreduces_per_step"][-1] >= 2  # fc1.weight alone is 0.4 MB: a bucket of its own


@pytest.mark.parametrize(
    "hook,name", [("fp16", "fp16_compress_hook"), ("bf16", "bf16_compress_hook"), ("powersgd", "powerSGD_hook")]
)
def test_compression_hook_is_registered_and_changes_gradients(hook, name):
    r = launch(f"train.comm_hook={hook}")
    assert name in r[0]["comm_hook"]
    ref = launch()
    assert not torch.equal(r[0]["params"][-1], ref[0]["params"][-1])  # compressed all-reduce: different numerics
    assert torch.equal(r[0]["params"][-1], r[1]["params"][-1])  # yet the ranks agree


def test_overlap_stage_reports_three_measurements_with_spread(tmp_path):
    from pipeline.scaling import overlap

    cfg = loader.override(
        loader.Config(),
        ["overlap.size=64", "overlap.chain=3", "overlap.items=3", "overlap.reps=3", "overlap.warmup=1"],
    )
    res = overlap.run(cfg, tmp_path)
    saved = json.loads((tmp_path / "overlap.json").read_text())
    assert saved["ratio_both_to_sum"] == pytest.approx(res["ratio_both_to_sum"])
    for group, keys in (("concurrent", ("A", "B", "both")), ("communication", ("sequential", "overlapped"))):
        for k in keys:
            s = saved[group][k]
            assert len(s["runs_s"]) == 3 and s["min_s"] <= s["median_s"] <= s["max_s"] and s["min_s"] > 0
    both, a, b = (saved["concurrent"][k]["median_s"] for k in ("both", "A", "B"))
    assert saved["ratio_both_to_sum"] == pytest.approx(both / (a + b))
    md = (tmp_path / "overlap.md").read_text()
    assert "| chain on device A |" in md and "overlapped" in md
