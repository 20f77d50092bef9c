"""Precision facts and pins: TF32 pinned off in the equivalence check and recorded (G6), GradScaler's skipped steps
reported as skipped (G12).

These run on a CPU build, where the TF32 switches are readable and settable but change no arithmetic, and where
fp16 autocast overflows under a huge GradScaler scale exactly as it would on a GPU (GradScaler's skip logic is the
same code on both devices). What only a GPU can show: whether cuDNN's TF32 algorithms move the one-step result
outside the fp32 tolerance, and whether the default scale (2**16) overflows on a GPU's first fp16 step.
"""

from __future__ import annotations

import pytest
import torch

from pipeline.doctor import checks, equivalence
from pipeline.doctor.checks import Case
from pipeline.host.devices import probe


def _tf32_now() -> tuple[bool, bool]:
    """(cuDNN convolutions may use TF32, cuBLAS matmuls may use TF32), as this process has them now."""
    b = torch.backends
    try:
        return bool(b.cudnn.allow_tf32), bool(b.cuda.matmul.allow_tf32)
    except RuntimeError:  # the legacy flags refuse a mixed legacy/new state: read the fp32_precision API
        return b.cudnn.conv.fp32_precision == "tf32", b.cuda.matmul.fp32_precision == "tf32"


@pytest.fixture
def tf32_on():
    """Both TF32 switches on for the test (the worst case a user's process can bring), restored afterwards."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_equivalence_run_pins_fp32_and_restores_the_switches(make_cfg, tmp_path, monkeypatch, tf32_on):
    """G6: the one-step check trains with TF32 off for cuDNN and cuBLAS, observed inside the run (a spy on the
    training call), and leaves the switches as it found them. Checks intent on a CPU build: that the flags are set,
    not what cuDNN does with them."""
    from pipeline.trial import ranks

    log = tmp_path / "tf32-inside.txt"  # the trial trains in a child process: the spy writes what it saw to a file
    real = ranks.train

    def spy(*a, **k):
        with open(log, "a") as f:
            f.write(f"{_tf32_now()}\n")
        return real(*a, **k)

    monkeypatch.setattr(ranks, "train", spy)
    _, metrics = equivalence.one_step(make_cfg(), tmp_path / "eq", "single", 1)
    assert log.read_text().splitlines() == [str((False, False))]  # inside: IEEE fp32 convolutions and matmuls
    assert _tf32_now() == (True, True)  # after it: the caller's switches, untouched
    if probe().kind == "cuda":
        assert "conv fp32" in metrics["tf32"] and "matmul fp32" in metrics["tf32"]  # the record says how it ran


def test_the_pin_restores_every_switch_exactly():
    """G6: pinning and restoring leaves every TF32 switch this torch has as it was (the legacy booleans and, where
    the fp32_precision API exists, its per-operation strings), also from a state set through the new API."""
    from pipeline.host import capabilities

    before = capabilities.tf32_flags()
    with capabilities.fp32_pinned():
        assert _tf32_now() == (False, False)
    assert capabilities.tf32_flags() == before
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        return  # a torch without the fp32_precision API
    saved = conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision
    try:
        conv.fp32_precision = "ieee"  # convs fp32, RNNs TF32: the legacy cuDNN flag cannot be read now
        mixed = capabilities.tf32_flags()
        with capabilities.fp32_pinned():
            assert _tf32_now() == (False, False)
        assert capabilities.tf32_flags() == mixed
    finally:
        conv.fp32_precision, torch.backends.cudnn.rnn.fp32_precision = saved
        torch.backends.cudnn.allow_tf32 = True


def test_the_tf32_mode_turns_every_switch_on_and_the_check_follows_it(make_cfg, monkeypatch):
    """G6: train.fp32_precision=tf32 turns TF32 on for convolutions and matmuls inside the pin (the other side of the
    first GPU run's TF32-on/off equivalence comparison), restores the switches after, and the equivalence check then
    runs in TF32 rather than pinning IEEE fp32. The switches change no CPU arithmetic: only a GPU shows the effect."""
    from pipeline.config import loader
    from pipeline.host import capabilities

    before = capabilities.tf32_flags()
    with capabilities.fp32_pinned(tf32=True):
        assert _tf32_now() == (True, True)
    assert capabilities.tf32_flags() == before
    seen = []
    monkeypatch.setattr(
        equivalence, "run_trial", lambda cfg, out, progress, timeout_s=None: seen.append(cfg.train.fp32_precision)
    )
    monkeypatch.setattr(equivalence.torch, "load", lambda *a, **k: {})
    for mode, pinned in (("default", "ieee"), ("ieee", "ieee"), ("tf32", "tf32")):
        equivalence.one_step(loader.override(make_cfg(), [f"train.fp32_precision={mode}"]), "/nowhere", "single", 1)
        assert seen[-1] == pinned


def test_host_facts_carry_the_tf32_switches(make_cfg, tmp_path):
    """G6: the TF32 state is a host fact (the doctor's header, every trial's host_* fields)."""
    from pipeline.host import capabilities
    from pipeline.trial import launch

    launch.host_fields.cache_clear()  # read once per process: another test may have run a trial with other switches
    host = probe()
    caps = capabilities.host_capabilities(host)
    assert set(caps["tf32"]) >= {"cudnn_allow_tf32", "matmul_allow_tf32"}
    assert caps["tf32_text"] is None if host.kind != "cuda" else caps["tf32_text"].startswith("cuDNN conv ")
    _, metrics = equivalence.one_step(make_cfg(), tmp_path / "eq", "single", 1)
    assert metrics["host_tf32"] == caps["tf32_text"]


def test_a_cpu_trial_carries_no_gpu_only_tf32_tag(make_cfg, tmp_path, tf32_on):
    """The TF32 switches are cuDNN's and cuBLAS's: a CPU host's facts and a trial on CPU devices carry no TF32 text
    (so no MLflow tag `host_tf32` or `tf32` reads "cuDNN conv TF32" on a CPU trial), even with both switches on."""
    from pipeline.host import capabilities, devices
    from pipeline.trial import launch

    cpu = devices.Host("cpu", 2, "a CPU", "cpubox", torch.__version__, "")
    caps = capabilities.host_capabilities(cpu)
    assert caps["tf32_text"] is None and caps["tf32"]["cudnn_allow_tf32"] is True  # read, not worded
    if probe().kind == "cuda":
        return  # this host's trial trains on a GPU, where its TF32 text is right
    launch.host_fields.cache_clear()  # read once per process: another test may have read them before
    _, metrics = equivalence.one_step(make_cfg(), tmp_path / "eq", "single", 1)
    assert metrics["tf32"] is None and metrics["host_tf32"] is None
    assert not {k: v for k, v in metrics.tags().items() if "TF32" in str(v)}  # MLflow's tags


@pytest.mark.slow
def test_spawned_ranks_train_pinned_too(make_cfg, tmp_path):
    """G6: a spawned rank starts with PyTorch's defaults (cuDNN TF32 on), so a pin in the parent alone would not
    reach ddp/ddp_amp/fsdp on a GPU host (spawn there); the pin travels with the trial's configuration. Observed
    through the main rank's record of the switches it trained under."""
    _, metrics = equivalence.one_step(make_cfg(), tmp_path / "eq", "ddp", 1, extra=("train.start_method=spawn",))
    if probe().kind != "cuda":
        assert metrics.get("tf32") is None  # a CPU rank records no TF32 text: the switches change nothing there
        return
    assert "conv fp32" in metrics["tf32"] and "matmul fp32" in metrics["tf32"]


def test_fp32_rows_on_a_tf32_gpu_are_labelled_tf32_convs():
    """G6: where results are labelled by precision (the doctor's table), an fp32 row on a CUDA host whose cuDNN
    convolutions use TF32 (compute capability >= 8.0) says so; a CPU host's fp32 row does not. Pure function."""

    def report(kind, cc):
        host = {
            "hostname": "h",
            "kind": kind,
            "devices": 1,
            "name": "n",
            "torch": "t",
            "python": "p",
            "cuda": "13",
            "cudnn": "9",
            "nccl": "2",
            "gloo": True,
            "bf16": "native",
            "fp16": "native",
            "cpu": {"isa_text": "avx2", "torch_cpu_capability": "AVX2", "bf16_why": "b", "fp16_why": "f"},
            "gpus": [{"index": 0, "name": "H100", "compute_capability": cc}] if kind == "cuda" else [],
            "tf32": {"cudnn_allow_tf32": True, "matmul_allow_tf32": False},
            "tf32_text": "cuDNN conv TF32, matmul fp32",
        }
        rows = [
            dict(
                strategy=s,
                k=1,
                variant=v,
                tag="",
                status="passed",
                reason="",
                check="ok",
                img_s=1.0,
                step_ms=1.0,
                peak_mem_mib_dev=[],
                mem_method="m",
                backend="",
                steps=30,
                timed_steps=30,
            )
            for s, v in (("single", ""), ("ddp_amp", "bf16"))
        ]
        return checks.markdown(
            {
                "host": host,
                "data_source": "synthetic",
                "synthetic": True,
                "rows": rows,
                "settings": {"model": "lenet", "steps": 30, "per_device_batch": 64, "equivalence": "e"},
                "counts": {"passed": 2, "failed": 0, "unavailable": 0},
            }
        )

    md = report("cuda", "9.0")
    assert "TF32: cuDNN conv TF32, matmul fp32" in md  # the header
    single = next(line for line in md.splitlines() if line.startswith("| single k=1"))
    bf16 = next(line for line in md.splitlines() if line.startswith("| ddp_amp k=1"))
    assert "| fp32 (TF32 convs) |" in single and "TF32" not in bf16
    assert "TF32 convs" not in report("cuda", "7.0")  # Volta: no TF32 tensor cores, the flag does nothing
    assert "TF32 convs" not in report("cpu", "")
    assert "- TF32:" not in report("cpu", "")  # a CPU host's doctor report has no TF32 line


def test_a_step_skipped_by_gradscaler_is_reported_as_skipped(make_cfg, tmp_path, monkeypatch):
    """G12: GradScaler("cpu", init_scale=2**60) overflows fp16 gradients on the first step and skips it. The doctor's
    fp16 row then says "skipped by GradScaler" (no update to compare), not "does not match"; the trial records the
    skipped steps and the final scale. The timed run is stubbed: only the one-step check is under test."""
    monkeypatch.setattr(equivalence, "FP16_INIT_SCALE", 2.0**60, raising=False)
    monkeypatch.setattr(
        checks,
        "run_trial",
        lambda cfg, out, progress=False, timeout_s=None: {
            "throughput_img_s": 1.0,
            "peak_mem_bytes": [],
            "mem_method": "m",
        },
    )
    base = make_cfg()
    ref, _ = equivalence.one_step(base, tmp_path / "ref", "single", 1)
    case = Case("ddp_amp", 1, ("train.amp_dtype=fp16",), "fp16+GradScaler")
    row = checks.run_case(case, base, probe(), ref, equivalence.initial_state(), tmp_path, 1, 16, "lenet")
    assert "skipped by GradScaler" in row.reason, row.reason
    assert row.status == "skipped" and "does not match" not in row.reason
    _, metrics = equivalence.one_step(
        base, tmp_path / "fp16", "ddp_amp", 1, extra=("train.amp_dtype=fp16", f"train.amp_init_scale={2.0**60}")
    )
    assert metrics["amp_skipped_steps"] == 1 and metrics["amp_scale"] == 2.0**59  # halved by the skip


def test_the_fp16_check_starts_from_a_scale_that_applies_its_step(make_cfg, tmp_path):
    """G12: the one-step fp16 check starts GradScaler at equivalence.FP16_INIT_SCALE, so its one step is applied
    (not skipped) and compared. A CPU's fp16 kernels are not cuDNN's: whether 2**16 would overflow on a GPU is for
    hardware to show."""
    _, metrics = equivalence.one_step(make_cfg(), tmp_path / "fp16", "ddp_amp", 1, extra=("train.amp_dtype=fp16",))
    assert metrics["amp_skipped_steps"] == 0 and metrics["amp_scale"] == equivalence.FP16_INIT_SCALE


def test_the_reports_host_table_shows_tf32_on_gpu_hosts_only():
    """G6: the report's host table carries the trials' TF32 switches for a GPU host, and — for a CPU host, where
    they change nothing. Pure function of a hand-made sweep table."""
    from pipeline.analysis.report.host import host_capabilities_section

    from ..analysis.test_analyze import frame, row

    caps = {
        "host_cpu_isa": "avx2",
        "host_bf16": "native",
        "host_fp16": "native",
        "host_nccl": "2.27",
        "host_interconnect": "NV18",
        "host_tf32": "cuDNN conv TF32, matmul fp32",
    }
    gpu = {**caps, "host_gpu_name": "NVIDIA H100", "host_gpu_cc": "9.0", "device_kind": "cuda", "host": "gpubox"}
    cpu = {
        **caps,
        "host_gpu_name": "",
        "host_gpu_cc": "",
        "device_kind": "cpu",
        "host": "cpubox",
        "host_interconnect": "",
    }
    s = "".join(
        host_capabilities_section(
            frame([row("ddp", k=1, B=128, thr=1.0, **gpu), row("ddp", k=1, B=128, thr=1.0, **cpu)])
        )
    )
    assert "| TF32 |" in s
    assert "| NV18 | cuDNN conv TF32, matmul fp32 | 1 |" in s
    assert "| — | — | 1 |" in s.split("| cpubox |")[1].splitlines()[0] + "\n"
