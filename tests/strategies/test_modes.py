"""Every execution mode keeps the arithmetic: one step of a strategy in a mode its row takes equals the eager fp32
step of single-device SGD (compile: fp32 tolerance, IEEE fp32; autocast: the bf16/fp16 tolerance), and a mode a
row leaves out is refused with the design's reason. Modes this host cannot run are skipped with theirs.

The modes (catalog.MODES) are recorded knobs: a trial's MLflow params, the sweep table and the report carry them
(tests/records), and the sweep space takes them like batch and lr.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import catalog
from pipeline.config.schema import TrainConfig
from pipeline.doctor import equivalence
from pipeline.errors import Infeasible
from pipeline.host.devices import probe
from pipeline.strategies import STRATEGIES
from pipeline.trial import launch
from pipeline.trial.launch import check_feasible

TWO = probe().n >= 2
# why a mode cannot run on this kind of host, whatever the row (None: it runs here)
HOST_LIMITS = {
    "cudnn_benchmark": {
        "cpu": "cuDNN's autotuner needs CUDA: on a CPU host the setting changes nothing, so its step is the eager one"
    },
}
CASES = [(s.name, mode) for s in catalog.STRATEGIES for mode in catalog.MODES if mode in s.knobs]


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory):
    """One torch.compile cache for the module's trials (a cold LeNet compile takes most of a minute on 2 cores)."""
    return tmp_path_factory.mktemp("inductor")


@pytest.mark.parametrize("strategy,mode", CASES)
def test_every_mode_keeps_the_step_of_single_device_sgd(
    make_cfg, tmp_path, monkeypatch, inductor_cache, strategy, mode
):
    host = probe()
    why = STRATEGIES[strategy].unavailable_reason(host) or HOST_LIMITS.get(mode, {}).get(host.kind)
    if why:
        pytest.skip(f"{strategy} with {mode} cannot run on this host: {why}")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor_cache))
    monkeypatch.setattr(launch, "_USER_INDUCTOR_CACHE", str(inductor_cache))
    k = 1 if catalog.spec(strategy).one_device_only or not TWO else 2
    cfg = make_cfg()
    ref, _ = equivalence.one_step(cfg, tmp_path / "ref", "single", 1)
    got, metrics = equivalence.one_step(cfg, tmp_path / mode, strategy, k, extra=(f"train.{mode}=true",))
    assert metrics["steps"] == 1 and metrics["devices"] == k and metrics[mode] is True
    low = mode == "autocast" or catalog.spec(strategy).autocast
    if low:
        assert metrics["amp_dtype"] in ("bfloat16", "float16")
    verdict = equivalence.check(
        ref, got, metrics, init=equivalence.initial_state(), low_precision=low, device_kind=host.kind
    )
    assert verdict.ok, verdict.detail


REFUSED = [(s.name, mode) for s in catalog.STRATEGIES for mode in catalog.MODES if mode not in s.knobs]


@pytest.mark.parametrize("strategy,mode", REFUSED)
def test_a_mode_a_row_leaves_out_is_refused_with_the_reason(make_cfg, strategy, mode):
    """Never a silent no-op: the trial is refused before it runs, naming the rows that take the mode and, where the
    row gives it, why the design cannot."""
    cfg = make_cfg(f"train.strategy={strategy}", f"train.{mode}=true")
    host = probe()
    if STRATEGIES[strategy].unavailable_reason(host):
        host = dataclasses.replace(host, kind="cuda", n=2)  # a GPU host, as far as the check goes
    with pytest.raises(Infeasible) as e:
        check_feasible(cfg, host)
    takers = [n for n in catalog.NAMES if mode in catalog.knobs(n)]
    assert f"`{strategy}` has no `{mode}` knob" in str(e.value) and ", ".join(takers) in str(e.value)
    assert catalog.why_not(strategy, mode) in str(e.value)


def test_every_left_out_mode_has_the_designs_reason():
    """The catalog says why each row leaves out each mode another row takes."""
    missing = [
        (s.name, m)
        for s in catalog.STRATEGIES
        for m in catalog.MODES
        if m not in s.knobs and not catalog.why_not(s.name, m)
    ]
    assert not missing, missing


def test_modes_are_off_by_default():
    """The reference row of every comparison runs eager, fp32, unautotuned."""
    assert not any(getattr(TrainConfig(), m) for m in catalog.MODES)
