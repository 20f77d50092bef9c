"""The shared-memory gradient transport (strategies/shm_allreduce.py): sums, DDP numerics, timeouts, clean-up, and
that a trial uses it only when asked (comm_hook=shm; the default is DDP's own Gloo all-reduce).
pytest tests/strategies/test_shm.py -q"""

from __future__ import annotations

import datetime
import os

import pytest
import torch

from pipeline.config import loader
from pipeline.host.devices import probe
from pipeline.strategies import shm_allreduce
from pipeline.trial.launch import Infeasible, check_feasible
from tests.strategies import world

pytestmark = pytest.mark.skipif(
    shm_allreduce.available(1 << 20) is not None,
    reason=f"no shared-memory transport here: {shm_allreduce.available(1 << 20)}",
)


def _worker(case: str) -> dict:
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        if case == "sums":
            ar = shm_allreduce.ShmAllreduce(4 * 1000, timeout_s=30)
            out = []
            for step, n in enumerate((1000, 7, 1000, 333, 1)):  # more calls than slot sets, varying sizes
                x = torch.arange(n, dtype=torch.float32) * (rank + 1) + step
                out.append(ar(x).clone())
            try:
                ar(torch.zeros(1001))
                too_big = ""
            except ValueError as e:
                too_big = str(e)
            return {
                "out": out,
                "too_big": too_big,
                "world": world,
                "path": str(ar.path),
                "exists_while_running": ar.path.exists(),
            }
        if case == "late":
            ar = shm_allreduce.ShmAllreduce(64, timeout_s=1)
            if rank == 0:
                try:
                    ar(torch.ones(4))
                except RuntimeError as e:
                    return {"error": str(e)}
                return {"error": ""}
            dist.barrier()  # rank 1 never joins the all-reduce; it waits here for rank 0 to give up
            return {}
    finally:
        if case == "late" and rank == 0:
            dist.barrier()
        dist.destroy_process_group()


def _launch(case: str, nproc: int) -> list[dict]:
    results = world.launch(_worker, case, nproc=nproc)
    return [results[r] for r in sorted(results)]


@pytest.mark.slow
def test_sums_over_three_ranks_in_rank_order_and_leaves_nothing_in_dev_shm():
    res = _launch("sums", 3)
    for step, n in enumerate((1000, 7, 1000, 333, 1)):
        want = torch.arange(n, dtype=torch.float32) * (1 + 2 + 3) + 3 * step
        for r in res:
            assert torch.equal(r["out"][step], want)
    assert "exceeds the shared slots" in res[0]["too_big"]
    assert len({r["path"] for r in res}) == 1 and res[0]["path"].startswith(str(shm_allreduce.SHM_DIR))
    assert not any(r["exists_while_running"] for r in res)  # unlinked as soon as every rank has mapped it
    assert not os.path.exists(res[0]["path"])


@pytest.mark.slow
def test_a_rank_that_never_arrives_fails_the_exchange_with_its_number():
    res = _launch("late", 2)
    assert "timed out after 1 s" in res[0]["error"] and "rank(s) [1]" in res[0]["error"]


@pytest.mark.slow
def test_ddp_over_shared_memory_equals_gloo_which_is_the_default(tmp_path):
    from tests.strategies.test_knobs import launch  # DDP on 2 ranks through the strategy, as a trial builds it

    if probe().n < 2:
        pytest.skip("needs 2 devices")
    shm, gloo = launch("train.comm_hook=shm"), launch()
    assert "shm_allreduce_hook" in shm[0]["comm_hook"]
    assert gloo[0]["comm_hook"] in ("None", "")  # the default: DDP's built-in all-reduce
    for a, b in zip(shm[0]["params"], gloo[0]["params"]):
        assert torch.equal(a, b)  # for two ranks a/2 + b/2 is exact either way: bit-identical training
    assert all(torch.equal(a, b) for a, b in zip(shm[0]["params"], shm[1]["params"]))


def test_explicit_shm_needs_one_cpu_host():
    host = probe()
    cfg = loader.override(
        loader.Config(),
        [
            "train.strategy=ddp",
            "train.devices=2",
            "train.nnodes=2",
            "train.rdzv_endpoint=127.0.0.1:29999",
            "train.comm_hook=shm",
            "train.oversubscribe=true",
        ],
    )
    with pytest.raises(Infeasible, match="comm_hook=shm"):
        check_feasible(cfg, host)


@pytest.mark.slow
def test_transport_is_reported_with_the_trial(make_cfg, tmp_path):
    from pipeline.trial.launch import run_trial

    if probe().n < 2:
        pytest.skip("needs 2 devices")
    cfg = make_cfg("train.strategy=ddp", "train.devices=2", "train.batch_size=64", "train.max_steps=6")
    assert run_trial(cfg, tmp_path / "k2", progress=False)["comm_hook_used"] == "none"  # DDP as PyTorch ships it
    shm = loader.replace_train(cfg, comm_hook="shm")
    assert run_trial(shm, tmp_path / "k2shm", progress=False)["comm_hook_used"] == "shm"
    one = loader.replace_train(shm, devices=1, batch_size=32)  # the cpu-comm profile's k=1 point: one slot
    assert run_trial(one, tmp_path / "k1shm", progress=False)["comm_hook_used"] == "shm"
    assert os.path.exists(tmp_path / "k2shm" / "metrics.json")
