"""Every execution mode keeps the arithmetic: one step of a strategy in a mode its row takes equals the eager fp32
step of single-device SGD (cuda_graphs: its steps up to the capture's, as many of single's; compile: fp32 tolerance,
IEEE fp32; autocast: the bf16/fp16 tolerance), and a mode a row leaves out is refused with the design's reason.
Modes this host cannot run are skipped with theirs.

The modes (catalog.MODES) are recorded knobs: a trial's MLflow params, the sweep table and the report carry them
(tests/records), and the sweep space takes them like batch and lr.
"""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.gpu import gpu_epoch
from pipeline import catalog
from pipeline.config.schema import TrainConfig
from pipeline.doctor import equivalence
from pipeline.errors import Infeasible
from pipeline.host.devices import probe
from pipeline.strategies import STRATEGIES
from pipeline.trial import graphs, launch
from pipeline.trial.launch import check_batch_fits, check_feasible

TWO = probe().n >= 2
# why a mode cannot run on this kind of host, whatever the row (None: it runs here)
HOST_LIMITS = {
    "cudnn_benchmark": {
        "cpu": "cuDNN's autotuner needs CUDA: on a CPU host the setting changes nothing, so its step is the eager one"
    },
    "cuda_graphs": {"cpu": "CUDA graphs need a GPU (launch.mode_refusal refuses them on a CPU host)"},
}
# the settings that turn a mode on (a mode of a mode needs its parent on)
MODE_ON = {
    "compile_mode": ("train.compile=true", "train.compile_mode=reduce-overhead"),
    "cuda_graphs": ("train.cuda_graphs=true", "train.breakdown_every=0", "train.warmup_steps=12"),
}
# compile's modes compile the same module: one row shows the arithmetic holds (each compile costs a minute of CPU)
CASES = [
    (s.name, mode)
    for s in catalog.STRATEGIES
    for mode in catalog.MODES
    if mode in s.knobs and (mode != "compile_mode" or s.name == catalog.REFERENCE)
]


def on(mode: str) -> tuple[str, ...]:
    return MODE_ON.get(mode, (f"train.{mode}=true",))


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
    # a graph runs from its capture on: its trial and the reference run to the capture step's update (launch refuses
    # a graph trial that ends before it), on one_step's batch of 64
    steps = graphs.capture_step(strategy) + 1 if mode == "cuda_graphs" else 1
    span = (f"train.max_steps={steps}", f"data.train_limit={64 * steps}") if steps > 1 else ()
    ref, _ = equivalence.one_step(cfg, tmp_path / "ref", "single", 1, extra=span)
    got, metrics = equivalence.one_step(cfg, tmp_path / mode, strategy, k, extra=(*on(mode), *span))
    assert metrics["steps"] == steps and metrics["devices"] == k
    assert metrics[mode] == {"compile_mode": "reduce-overhead"}.get(mode, True), "the mode is recorded as it ran"
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
    alone = ("train.compile_mode=reduce-overhead",) if mode == "compile_mode" else on(mode)  # the knob by itself
    cfg = make_cfg(f"train.strategy={strategy}", *alone)
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
    """The reference row of every comparison runs eager, fp32, unautotuned, uncaptured (compile's mode applies only
    with compile on)."""
    t = TrainConfig()
    assert not any(getattr(t, m) for m in catalog.MODES if m != "compile_mode")
    assert t.compile_mode == "default" and not t.compile


@pytest.mark.parametrize(
    "sets,why",
    [
        (("train.compile_mode=reduce-overhead",), "applies with train.compile=true"),
        (("train.cuda_graphs=true", "train.breakdown_every=0", "train.warmup_steps=12"), "needs a GPU"),
    ],
)
def test_a_mode_that_could_not_apply_is_refused(make_cfg, sets, why):
    """compile's mode without compile, and CUDA graphs on a CPU host: refused with the reason, never recorded as if
    they ran."""
    cfg = make_cfg("train.strategy=single", *sets)
    with pytest.raises(Infeasible, match=why):
        check_feasible(cfg, dataclasses.replace(probe(), kind="cpu"))


GPU_HOST = dict(kind="cuda", n=2)


@pytest.mark.parametrize(
    "strategy,sets,why",
    [
        ("single", ("train.compile=true",), "compile_mode=reduce-overhead"),
        ("single", ("train.breakdown_every=10",), "breakdown_every=0"),
        ("ddp", ("train.accum_steps=2",), "accum_steps"),
        ("ddp", ("train.comm_hook=fp16",), "comm hook"),
        ("ddp_amp", ("train.amp_dtype=fp16",), "GradScaler"),
        ("ddp", ("train.warmup_steps=5",), "warmup_steps >= 12"),
        ("single", ("train.warmup_steps=2",), "warmup_steps >= 3"),
    ],
)
def test_cuda_graphs_refuse_what_a_graph_cannot_replay(make_cfg, strategy, sets, why):
    """On a GPU host (as far as the check goes), each setting a captured step cannot honour is refused by name."""
    base = {"train.breakdown_every": "0", "train.warmup_steps": "12"}
    base.update(dict(s.split("=", 1) for s in sets))
    cfg = make_cfg(f"train.strategy={strategy}", "train.cuda_graphs=true", *(f"{k}={v}" for k, v in base.items()))
    with pytest.raises(Infeasible, match=why):
        check_feasible(cfg, dataclasses.replace(probe(), **GPU_HOST))


def test_cuda_graphs_on_ranks_sharing_a_gpu_are_refused(make_cfg):
    """Oversubscribed ranks talk over Gloo, which a graph cannot capture."""
    cfg = make_cfg(
        "train.strategy=ddp",
        "train.devices=2",
        "train.oversubscribe=true",
        "train.cuda_graphs=true",
        "train.breakdown_every=0",
        "train.warmup_steps=12",
    )
    with pytest.raises(Infeasible, match="Gloo"):
        check_feasible(cfg, dataclasses.replace(probe(), kind="cuda", n=1))


GRAPH_RUNGS = [key for key, _, sets, _ in gpu_epoch.LADDER if sets.get("cuda_graphs")]


@pytest.mark.parametrize("rung", GRAPH_RUNGS)
def test_the_ladders_graph_rungs_pass_the_check(tmp_path, rung):
    """The ladder's graph rungs, built as the ladder builds them (gpu_epoch.ladder_cfg, then rung_cfg), are feasible
    on a GPU host at the full 60,000 images and at the smallest epoch the rung accepts: a drift of the ladder's
    settings fails here, not on a GPU."""
    strategy = next(s for key, s, _, _ in gpu_epoch.LADDER if key == rung)
    for steps in (60000 // 256, graphs.capture_step(strategy) + 1):
        host = dataclasses.replace(probe(), **GPU_HOST)
        cfg = gpu_epoch.rung_cfg(
            gpu_epoch.ladder_cfg(tmp_path, "synthetic", 256 * steps, steps), "lenet", rung, 256, host
        )
        assert cfg.train.cuda_graphs
        check_feasible(cfg, host)


def test_the_ladder_has_its_graph_rungs():
    """The rows the check above runs over: a graph rung per strategy the ladder climbs (none would skip the check)."""
    assert {s for key, s, _, _ in gpu_epoch.LADDER if key in GRAPH_RUNGS} == {"single", "ddp_amp"}


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_cuda_graphs_on_a_trial_that_ends_before_the_capture_are_refused(make_cfg, strategy):
    """A graph trial whose steps (train.epochs x whole batches, or train.max_steps) end before its capture step is
    refused with the numbers, never recorded as cuda_graphs=true with no graph run; one step more passes."""
    at = graphs.capture_step(strategy)
    sets = (
        f"train.strategy={strategy}",
        "train.cuda_graphs=true",
        "train.breakdown_every=0",
        f"train.warmup_steps={at + 1}",
        "train.batch_size=64",
        "train.epochs=1",
    )
    host = dataclasses.replace(probe(), **GPU_HOST)
    with pytest.raises(Infeasible, match=rf"captured at step {at + 1} .* at most {at} step\(s\)"):
        check_feasible(make_cfg(*sets, f"data.train_limit={64 * at}"), host)
    with pytest.raises(Infeasible, match=f"train.max_steps={at}"):
        check_feasible(make_cfg(*sets, f"data.train_limit={64 * (at + 1)}", f"train.max_steps={at}"), host)
    check_feasible(make_cfg(*sets, f"data.train_limit={64 * (at + 1)}"), host)
    whole = make_cfg(*sets)  # data.train_limit=0: the count is the data's, checked once it is loaded
    check_feasible(whole, host)
    with pytest.raises(Infeasible, match=f"at most {at} step"):
        check_batch_fits(whole, 64 * at)
    check_batch_fits(whole, 64 * (at + 1))
