"""The report's host section: capabilities from the sweep table's host_* columns, slow rows explained by their cause;
the GPU interconnect read from `nvidia-smi topo -m`."""

from pipeline.analysis import stage
from pipeline.analysis.report.host import host_capabilities_section, slow_rows
from pipeline.host import capabilities, topology

from .test_analyze import frame, row, write

AVX2 = {
    "host_cpu_isa": "avx2",
    "host_bf16": "emulated",
    "host_fp16": "emulated",
    "host_gpu_name": "",
    "host_gpu_cc": "",
    "host_nccl": "",
    "host_interconnect": "",
}
BF16 = {**AVX2, "host_cpu_isa": "avx2,avx512f,avx512_bf16,amx_tile,amx_bf16", "host_bf16": "native"}


def sweep(caps, amp_thr, ddp_thr, **kw):
    """ddp and ddp_amp at k=1 and 2 (B=128) on a CPU host with capabilities `caps`."""
    base = {"device_kind": "cpu", "device_name": "cpu", "host": "box", **caps, **kw}
    return frame(
        [row(s, k=k, B=128, thr=t * k, **base) for s, t in (("ddp", ddp_thr), ("ddp_amp", amp_thr)) for k in (1, 2)]
    )


def text(df) -> str:
    return "".join(host_capabilities_section(df))


def test_avx2_host_names_its_isa_and_explains_the_slow_amp_rows_with_figures():
    s = text(sweep(AVX2, amp_thr=700.0, ddp_thr=4900.0))
    assert "| box | avx2 | emulated | emulated |" in s
    [line] = slow_rows(sweep(AVX2, amp_thr=700.0, ddp_thr=4900.0))
    assert "**ddp_amp** ran slower than **ddp**" in line
    assert "k=1, B=128: 700 img/s vs ddp's 4,900 (7.0× slower)" in line
    assert "k=2, B=128: 1,400 img/s vs ddp's 9,800" in line
    assert "bf16 is emulated on this CPU (ISA avx2): no AVX-512-BF16/AMX-BF16" in line


def test_a_onednn_cap_is_named_as_the_cause_not_missing_instructions():
    capped = {**AVX2, "host_cpu_isa": "avx2,avx512f,avx512_bf16 (oneDNN capped at AVX2)"}
    [line] = slow_rows(sweep(capped, amp_thr=700.0, ddp_thr=4900.0))
    assert "bf16 is emulated on this CPU (ISA avx2,avx512f,avx512_bf16 (oneDNN capped at AVX2))" in line
    assert "ONEDNN_MAX_CPU_ISA keeps oneDNN from the instructions" in line and "no AVX-512-BF16" not in line


def test_bf16_native_host_makes_no_emulation_claim():
    slow = text(sweep(BF16, amp_thr=2000.0, ddp_thr=4000.0))
    assert "avx512_bf16" in slow and "emulated on" not in slow
    assert "bf16 is native on this CPU" in slow and "emulation does not explain it" in slow
    # as fast as fp32: nothing to explain
    assert "ran slower" not in text(sweep(BF16, amp_thr=4000.0, ddp_thr=4000.0))


def test_native_but_slower_says_where_the_step_went_and_claims_no_cause():
    """A native bf16 step that is still slower (seen on an AVX-512-BF16 Xeon, RESULTS section 10): the sentence gives
    the breakdown's measured phases beside the baseline's and names no cause it did not measure."""
    phases = {"ddp": (0.008, 0.019, 0.0001), "ddp_amp": (0.013, 0.029, 0.0001)}
    df = frame(
        [
            row(
                s,
                k=1,
                B=128,
                thr=t,
                device_kind="cpu",
                host="box",
                **BF16,
                bd_forward_s=phases[s][0],
                bd_backward_compute_s=phases[s][1],
                bd_comm_exposed_s=phases[s][2],
            )
            for s, t in (("ddp", 4600.0), ("ddp_amp", 3000.0))
        ]
    )
    [line] = slow_rows(df)
    assert (
        "per step at k=1, B=128 (the trials' breakdown, measured): forward 13.0 ms vs 8.0, backward 29.0 ms vs "
        "19.0, exposed comm 0.1 ms vs 0.1 (ddp)"
    ) in line
    assert "bf16 is native on this CPU" in line and "not separated here" in line and "casts autocast" not in line
    # without a breakdown (breakdown_every=0) the sentence gives the throughputs only
    [plain] = slow_rows(sweep(BF16, amp_thr=2000.0, ddp_thr=4000.0))
    assert "breakdown" not in plain and "k=1, B=128: 2,000 img/s vs ddp's 4,000" in plain


def test_amp_as_fast_as_fp32_on_an_emulating_host_is_not_called_slow():
    assert slow_rows(sweep(AVX2, amp_thr=4800.0, ddp_thr=5000.0)) == []


def test_gpu_host_row_and_cause():
    gpu = {
        **AVX2,
        "host_bf16": "emulated",
        "host_fp16": "native",
        "host_gpu_name": "Tesla V100",
        "host_gpu_cc": "7.0",
        "host_nccl": "2.21.5",
        "host_interconnect": "NV2",
    }
    df = frame([row(s, k=1, B=128, thr=t, host="g1", **gpu) for s, t in (("ddp", 5000.0), ("ddp_amp", 3000.0))])
    s = text(df)
    assert "| g1 | avx2 | emulated | native | Tesla V100 | 7.0 | 2.21.5 | NV2 |" in s
    # ddp_amp picks fp16 where bf16 is not native on the GPU; fp16 is native there
    assert "fp16 is native on this GPU (Tesla V100, compute capability 7.0)" in s


def test_sweeps_without_host_columns_say_so():
    s = text(frame([row("ddp"), row("ddp_amp", thr=100.0)]))
    assert "Not recorded" in s
    assert "do not record whether this host runs bf16/fp16 natively" in s


def test_bounded_trials_are_listed():
    why = "bounded: at most 30 steps (sweep.emulated_max_steps) because bf16 autocast is emulated"
    s = text(
        sweep(AVX2, amp_thr=700.0, ddp_thr=4900.0, reason="").assign(
            reason=lambda d: d["reason"].where(d["strategy"] != "ddp_amp", why)
        )
    )
    assert f"**ddp_amp**: 2 trial(s) {why}." in s


def test_report_has_the_section(tmp_path):
    d = tmp_path / "sweeps"
    d.mkdir()
    for s in ("ddp", "ddp_amp"):
        write(
            [
                row(s, k=k, B=128, thr=(700.0 if s == "ddp_amp" else 4900.0) * k, device_kind="cpu", host="box", **AVX2)
                for k in (1, 2)
            ],
            d / f"{s}.jsonl",
        )
    stage.analyze(d, tmp_path / "out")
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Host capabilities" in report and "bf16 is emulated on this CPU" in report


TOPO_NVLINK = (
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\nGPU1\tNV18\t X \tSYS\t0-47\t0\t\tN/A\n"
    "NIC0\tSYS\tSYS\t X \t\t\t\n\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
TOPO_PCIE = (
    "\tGPU0\tGPU1\tGPU2\tCPU Affinity\n"
    "GPU0\t X \tPHB\tSYS\t0-15\nGPU1\tPHB\t X \tSYS\t0-15\nGPU2\tSYS\tSYS\t X \t16-31\n"
)
TOPO_ONE = "\t\x1b[4mGPU0\tNIC0\tCPU Affinity\x1b[0m\nGPU0\t X \tPIX\t0-15\n"


def test_interconnect_from_the_topology_matrix():
    assert capabilities.interconnect(TOPO_NVLINK) == "NV18"
    assert capabilities.interconnect(TOPO_PCIE) == "SYS/PHB"  # slowest first
    assert capabilities.interconnect(topology._ANSI.sub("", TOPO_ONE)) == "single GPU"
    assert capabilities.interconnect(None) is None
    assert capabilities.interconnect("No devices were found") is None


def test_no_nvidia_smi_means_no_topology(monkeypatch):
    monkeypatch.setattr(topology.shutil, "which", lambda name: None)
    assert capabilities.gpu_topology() is None


def test_no_trials_no_claims():
    s = text(frame([row("ddp")]).iloc[0:0])
    assert "## Host capabilities" in s and "Not recorded" in s and "ran slower" not in s


ZEN1 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 23
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu avx avx2

processor\t: 1
cpu family\t: 99
model name\t: other
"""


def test_cpu_name_carries_family_and_model_so_generic_names_differ():
    from pipeline.host.devices import cpu_name

    assert cpu_name(ZEN1) == "AMD EPYC (family 23 model 1)"  # the first processor's block only
    zen4 = ZEN1.replace("cpu family\t: 23\nmodel\t\t: 1", "cpu family\t: 25\nmodel\t\t: 17")
    assert cpu_name(zen4) == "AMD EPYC (family 25 model 17)" != cpu_name(ZEN1)
    assert cpu_name("model name\t: Some CPU\n") == "Some CPU"  # no family/model (e.g. an Arm cpuinfo): name alone
