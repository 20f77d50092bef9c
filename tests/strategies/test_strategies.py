"""Every strategy trains the same model to the same result: one step from the same weights on the same global
batch gives the parameters of single-device SGD (LeNet: float tolerance; ddp_amp: a bf16/fp16 tolerance)."""

from __future__ import annotations

import pytest
import torch

from pipeline import catalog
from pipeline.doctor import equivalence
from pipeline.host.devices import probe
from pipeline.strategies import STRATEGIES
from pipeline.strategies.scratch import allreduce
from pipeline.trial.launch import Infeasible, check_feasible

TWO = probe().n >= 2


def one_step(make_cfg, tmp_path, strategy, k, model="lenet", batch=64, extra=()):
    return equivalence.one_step(make_cfg(), tmp_path / f"{strategy}-{k}-{model}", strategy, k, model, batch, extra)


def assert_same(a, b, atol, rtol=1e-4, keys=None):
    verdict = equivalence.compare(a, b, keys=keys, tol=(atol, rtol))
    assert verdict.ok, verdict.detail


# every row of the catalog but the reference, at k = 1 and 2: a new row adds its own check
PARITY_CASES = [(s.name, k) for s in catalog.STRATEGIES if s.name != catalog.REFERENCE for k in (1, 2)]


@pytest.mark.parametrize("strategy,k", PARITY_CASES)
def test_one_step_matches_single(make_cfg, tmp_path, strategy, k):
    """One step of each catalog strategy this host can run equals single-device SGD's step (fp32: float
    tolerance; an autocast row: its update within the bf16/fp16 tolerance)."""
    row, host = catalog.spec(strategy), probe()
    why = STRATEGIES[strategy].unavailable_reason(host)
    if why:
        pytest.skip(f"{strategy} cannot run on this host: {why}")
    if k > 1 and row.one_device_only:
        pytest.skip(f"{strategy} runs on one device only")
    if k > 1 and not TWO:
        pytest.skip("needs 2 devices")
    ref, _ = one_step(make_cfg, tmp_path, "single", 1)
    got, metrics = one_step(make_cfg, tmp_path, strategy, k)
    assert metrics["steps"] == 1 and metrics["devices"] == k
    if row.autocast:
        assert metrics["amp_dtype"] in ("bfloat16", "float16")
    # the step must move the weights too (two untouched models would compare equal): compare() checks it
    verdict = equivalence.check(
        ref, got, metrics, init=equivalence.initial_state(), low_precision=row.autocast, device_kind=host.kind
    )
    assert verdict.ok, verdict.detail


def test_parity_cases_cover_the_catalog():
    """Every strategy of the catalog but the reference has a parity case at k = 1 and at k = 2."""
    names = {s for s, _ in PARITY_CASES}
    assert names == set(catalog.NAMES) - {catalog.REFERENCE}
    assert all((s, k) in PARITY_CASES for s in names for k in (1, 2))


def test_equivalence_check_can_fail():
    init = equivalence.initial_state()
    moved = {n: v + 0.01 for n, v in init.items()}
    off = {n: v + (0.02 if n.endswith("bias") else 0.01) for n, v in init.items()}
    assert not equivalence.compare(moved, off, init=init).ok
    assert not equivalence.compare(init, init, init=init).ok  # nothing moved: proves nothing
    assert equivalence.compare(moved, moved, init=init).ok
    assert not equivalence.compare(moved, off, init=init, low_precision=True).ok


def test_resnet_batchnorm_keeps_per_device_statistics(make_cfg, tmp_path):
    """BatchNorm normalises each device's chunk with that chunk's statistics (by design, as in d2l):
    k=1 matches single exactly; at k=2 ddp matches scratch (both per-device) but not single."""
    if not TWO:
        pytest.skip("needs 2 devices")
    ref, _ = one_step(make_cfg, tmp_path, "single", 1, model="resnet18", batch=8)
    ddp1, _ = one_step(make_cfg, tmp_path, "ddp", 1, model="resnet18", batch=8)
    assert_same(ref, ddp1, atol=1e-5, rtol=1e-3)
    ddp2, _ = one_step(make_cfg, tmp_path, "ddp", 2, model="resnet18", batch=8)
    scr2, _ = one_step(make_cfg, tmp_path, "scratch", 2, model="resnet18", batch=8)
    assert_same(ddp2, scr2, atol=1e-5, rtol=1e-3)
    bn = [n for n in ref if n.endswith("running_mean")]
    assert any(not torch.allclose(ref[n], ddp2[n], atol=1e-6) for n in bn)


def test_training_loop_has_no_strategy_branches():
    import inspect

    from pipeline.trial import loop

    src = inspect.getsource(loop)
    for name in STRATEGIES:
        assert f'"{name}"' not in src and f"'{name}'" not in src


def test_every_strategy_changes_the_step_through_hooks_only():
    """base.train_step is the only step: a strategy overrides hooks (place_batch, backward, ...), never the step."""
    from pipeline.strategies import Strategy

    for name, cls in STRATEGIES.items():
        assert cls.train_step is Strategy.train_step, name
        assert not hasattr(cls, "backward_step"), name  # the old hook, dead for ddp/ddp_amp


def test_handwritten_allreduce_sums_in_place_without_aliasing():
    ts = [torch.full((3,), float(i + 1)) for i in range(3)]
    ids = [id(t) for t in ts]
    allreduce(ts)
    assert all(torch.equal(t, torch.full((3,), 6.0)) for t in ts)
    assert [id(t) for t in ts] == ids
    ts[1].add_(1)  # still distinct storages
    assert ts[0][0].item() == 6.0


def test_ddp_default_transport_is_pytorchs_own(make_cfg, monkeypatch):
    """`ddp` means DDP as PyTorch ships it: no comm hook unless asked; `auto` (shared memory on CPU) is gone."""
    from pipeline.config import loader
    from pipeline.strategies import shm_allreduce

    assert loader.Config().train.comm_hook == "none"
    with pytest.raises(loader.ConfigError, match="'auto' is not one of: none, shm"):
        make_cfg("train.comm_hook=auto")
    if probe().kind != "cpu":
        return  # on GPUs comm_hook=shm is refused before that (test_shm.py)
    # where shared memory cannot work, an explicit comm_hook=shm trial is skipped with the reason, not run
    monkeypatch.setattr(shm_allreduce, "available", lambda nbytes: "it relies on x86-64 store ordering")
    with pytest.raises(Infeasible, match="comm_hook=shm cannot run here: it relies on x86-64"):
        check_feasible(make_cfg("train.strategy=ddp", "train.comm_hook=shm"), probe())


def test_dp_is_unavailable_on_cpu_with_reason(make_cfg):
    host = probe()
    if host.kind == "cuda":
        pytest.skip("CUDA host: dp is available")
    for s in ("dp", "dp_criterion"):
        with pytest.raises(Infeasible, match="CUDA"):
            check_feasible(make_cfg(f"train.strategy={s}"), host)


def test_more_devices_than_host_is_refused_unless_oversubscribed(make_cfg):
    host = probe()
    with pytest.raises(Infeasible, match="exceeds"):
        check_feasible(
            make_cfg("train.strategy=ddp", f"train.devices={host.n + 1}", f"train.batch_size={(host.n + 1) * 8}"), host
        )
    check_feasible(
        make_cfg(
            "train.strategy=ddp",
            f"train.devices={host.n + 1}",
            f"train.batch_size={(host.n + 1) * 8}",
            "train.oversubscribe=true",
        ),
        host,
    )


def test_batch_not_divisible_by_devices_is_refused(make_cfg):
    with pytest.raises(Infeasible, match="divisible"):
        check_feasible(make_cfg("train.strategy=scratch", "train.devices=2", "train.batch_size=255"), probe())


@pytest.mark.gpu
@pytest.mark.parametrize("strategy", ["dp", "dp_criterion"])
def test_dp_one_step_matches_single_on_gpus(make_cfg, tmp_path, strategy):
    k = min(2, torch.cuda.device_count())
    ref, _ = one_step(make_cfg, tmp_path, "single", 1)
    got, metrics = one_step(make_cfg, tmp_path, strategy, k)
    assert_same(ref, got, atol=1e-5, rtol=1e-3)
    assert len(metrics["peak_mem_bytes"]) == k


def test_metrics_carry_per_device_memory_and_host_facts(make_cfg, tmp_path):
    if not TWO:
        pytest.skip("needs 2 devices")
    _, m = one_step(make_cfg, tmp_path, "ddp", 2)
    assert len(m["peak_mem_bytes"]) == 2 and all(p > 0 for p in m["peak_mem_bytes"])
    assert m["mem_imbalance"] >= 1.0
    assert m["device_kind"] == probe().kind and m["host_devices"] == probe().n
    assert m["synthetic"] is True


def test_refusals_name_the_strategies_from_the_catalog(make_cfg):
    """The messages that suggest other strategies list the catalog's rows, so a new row shows up in them."""
    parallel = [s.name for s in catalog.STRATEGIES if not s.one_device_only]
    with pytest.raises(ValueError, match=", ".join(parallel)):
        STRATEGIES["single"](make_cfg("train.devices=2", "train.batch_size=64").train, probe()).check_devices()
    multi = ", ".join(s.name for s in catalog.STRATEGIES if s.multiprocess)
    with pytest.raises(Infeasible, match=rf"multi-process strategy \({multi}\)"):
        check_feasible(
            make_cfg("train.strategy=scratch", "train.nnodes=2", "train.devices=2", "train.batch_size=64"), probe()
        )
