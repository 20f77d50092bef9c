"""The ladder's figures (benchmarks/gpu/gpu_epoch.py): a rung that timed no step has no figure (None, never NaN,
which is truthy and compares false), is said to have timed nothing, and is never judged against a bar."""

from __future__ import annotations

from benchmarks.common import med, ratio, show
from benchmarks.gpu import gpu_epoch


def test_no_figure_is_none_never_nan():
    assert med([]) is None and med([None, None]) is None
    assert med([3.0, None, 1.0]) == 2.0
    assert ratio(None, 2.0) is None and ratio(2.0, None) is None and ratio(2.0, 0) is None and ratio(3.0, 2.0) == 1.5
    assert show(None, ".2f") == "n/a" and show(1.5, ".2f") == "1.50"


def test_the_lenet_bar_judges_only_a_rung_that_timed_a_step():
    said: list[str] = []
    rows = {"single": {"img_s": med([None])}, "ddp": {"img_s": 1000.0}}  # single timed nothing
    bar = gpu_epoch.lenet_target(rows, "cpu", said.append)
    assert bar["best_rung"] == "ddp" and bar["met"] is False
    assert not any("nan" in line for line in said), said
    assert gpu_epoch.lenet_target({"single": {"img_s": med([])}}, "cpu", said.append)["best_rung"] is None


def test_a_rung_that_timed_no_step_says_so():
    assert "no step timed" in gpu_epoch.steady({"img_s": None, "steady_s_per_60k": None})
    assert "1,000 img/s = 60.00 s/60k" in gpu_epoch.steady({"img_s": 1000.0, "steady_s_per_60k": 60.0})


def test_the_graph_rungs_read_apart_and_a_small_share_of_the_bar_is_not_zero():
    """The two graph rungs name their strategy (their 'not run' lines would read alike), and a CPU's small share of
    LeNet's bar reads as what it is, not 0%."""
    labels = dict(gpu_epoch.ROWS)
    assert labels["single_bf16_bench_graphs"].strip().startswith("single ")
    assert labels["ddp_amp_bench_graphs"].strip().startswith("ddp_amp ")
    said: list[str] = []
    gpu_epoch.lenet_target({"single": {"img_s": 2019.0}}, "cpu", said.append)
    assert "NOT met (0.4% of it)" in said[0], said


def test_a_benchmarks_help_opens_with_its_whole_first_paragraph():
    from benchmarks.common import parser

    description = parser(gpu_epoch.__doc__, data=False).description
    assert description.endswith("beside the d2l recipe."), description


BF16_ROWS = [key for key, _, sets, _ in gpu_epoch.LADDER if sets.get("amp_dtype") == "bf16"]


def test_a_row_says_how_it_runs_where_its_label_says_more():
    """On a CPU, compile's reduce-overhead row runs as compile's default mode (no CUDA graphs there), and on a host
    without native bf16 every bf16 row is emulated bf16: each says so; an fp32 row, and a GPU with native bf16, add
    nothing."""
    emulated, native = {"bf16": "emulated"}, {"bf16": "native"}
    assert gpu_epoch.ran_as("single_bf16_bench_compile_ro", "cpu", emulated) == [
        "runs as compile's default mode on CPU",
        "emulated bf16",
    ]
    assert gpu_epoch.ran_as("single_bf16_bench_compile_ro", "cpu", native) == ["runs as compile's default mode on CPU"]
    assert {key: gpu_epoch.ran_as(key, "cpu", emulated) for key in BF16_ROWS if "compile_ro" not in key} == {
        key: ["emulated bf16"] for key in BF16_ROWS if "compile_ro" not in key
    }
    assert len(BF16_ROWS) >= 8  # every bf16 rung of single and ddp_amp: a row missed by the test fails here
    assert all(gpu_epoch.ran_as(key, "cuda", native) == [] for key, _ in gpu_epoch.ROWS)
    assert all(gpu_epoch.ran_as(key, "cpu", emulated) == [] for key in ("single", "ddp", "d2l"))
    label = gpu_epoch.labelled("  + compile mode reduce-overhead", ["runs as compile's default mode on CPU"])
    assert label == "  + compile mode reduce-overhead (runs as compile's default mode on CPU)"


def test_each_mfu_names_its_peaks_dtype():
    row = {"mfu_gemm": 0.012, "mfu_datasheet": 0.003}
    assert gpu_epoch.mfu_text(row, "fp32", 1, None) == "MFU 1.2% against the measured fp32 GEMM peak"
    assert gpu_epoch.mfu_text(row, "bf16", 1, 989e12) == (
        "MFU 1.2% against the measured bf16 GEMM peak, 0.3% against the datasheet bf16 peak"
    )
    assert gpu_epoch.mfu_text(row, "fp32", 2, None).endswith("fp32 GEMM peak x 2 cores")
