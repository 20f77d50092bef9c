"""The analysis stage end to end on small sweep tables: summary.json, the tidy CSVs, figures, the report, tolerance of
odd or missing data, and the knob-effect tables.
"""

import json

import pandas as pd
import pytest

from pipeline.analysis import stage
from tests.analysis.test_analyze import one, row, write  # noqa: F401 (shared with test_analyze.py)


def _sweeps(d):
    d.mkdir()
    rows = {
        "single": [row("single", k=1, B=B, thr=1000) for B in (128, 256)],
        "ddp": [
            row("ddp", k=1, B=128, thr=1000),
            row("ddp", k=2, B=256, thr=1800),
            row("ddp", k=1, B=256, thr=1250),
            row("ddp", k=2, B=256, lr=0.2, thr=1600),
            row("ddp", k=4, B=512, thr=3000, data_source="synthetic"),
            row("ddp", k=4, B=1024, state="failed", reason="CUDA out of memory"),
            row("ddp", k=2, B=256, lr=0.3, state="pruned", reason="pruned at epoch 1"),
            row("ddp", k=8, B=1024, state="skipped", reason="k=8 > N=4 devices", trial=None),
        ],
        "dp": [
            row("dp", k=k, B=128 * k, state="skipped", trial=None, reason="unavailable: nn.DataParallel needs CUDA")
            for k in (1, 2)
        ],
        "scratch": [
            row("scratch", k=2, B=256, thr=1100, parallel_devices=False, peaks=[300 * 2**20, 100 * 2**20]),
            row("scratch", k=4, B=512, thr=1200, parallel_devices=False, oversubscribed=True),
        ],
    }
    for s, rs in rows.items():
        write(rs, d / f"{s}.jsonl")
    (d / "dp_criterion.jsonl").write_text("")
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("an")
    out = base / "analysis"
    return stage.analyze(_sweeps(base / "sweeps"), out), out


def test_summary_json(run):
    summary, out = run
    text = (out / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    loaded = json.loads(text)
    assert loaded == summary
    assert loaded["host"] == "node1" and loaded["synthetic_data"] is True
    assert loaded["data_source"] == "fashion-mnist, synthetic"
    ddp, st = loaded["strategies"]["ddp"], loaded["strategies"]
    # T(2, B=256) = median over lrs (1800, 1600) = 1700; k=4 ran on synthetic data: no k=1 reference
    assert ddp["weak_efficiency"] == pytest.approx(0.85) and ddp["weak_efficiency_at"]["k"] == 2
    assert ddp["strong_efficiency"] == pytest.approx(0.68)  # 1700 / (2 * 1250)
    assert ddp["best_throughput_img_s"] == 3000 and ddp["n_failed"] == 1 and ddp["n_pruned"] == 1
    assert st["scratch"]["weak_efficiency"] is None  # no k=1 reference
    assert st["scratch"]["worst_mem_imbalance"] == pytest.approx(1.5)
    assert st["scratch"]["parallel_devices"] is False
    assert st["single"]["weak_efficiency"] is None and st["single"]["best_throughput_img_s"] == 1000
    assert st["dp"]["status"] == "unavailable" and "needs CUDA" in st["dp"]["reason"]
    assert st["dp"]["best_throughput_img_s"] is None
    assert st["dp_criterion"]["status"] == "empty" and st["fsdp"]["status"] == "missing"
    assert st["ddp_amp"]["status"] == "missing"


def test_tidy_csvs(run):
    _, out = run
    eff = pd.read_csv(out / "efficiency.csv")
    # data_source varies within ddp, so it is a column; host does not
    assert list(eff.columns) == [
        "strategy",
        "model",
        "data_source",
        "k",
        "per_device_batch",
        "batch_size",
        "kind",
        "efficiency",
        "efficiency_lo",
        "efficiency_hi",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "throughput_img_s",
        "n_windows",
        "n_repeats",
        "comparable",
        "measured",
    ]
    assert eff["comparable"].all()  # every point measured quietly
    assert eff["efficiency"].notna().all() and (eff["efficiency"] > 0).all()
    assert "scratch" not in set(eff["strategy"])  # undefined efficiency is absent, not 0
    w = eff[(eff["strategy"] == "ddp") & (eff["kind"] == "weak") & (eff["k"] == 2)]
    assert w["efficiency"].tolist() == [pytest.approx(0.85)]
    thr = pd.read_csv(out / "throughput.csv")
    assert list(thr.columns) == [
        "strategy",
        "model",
        "data_source",
        "k",
        "batch_size",
        "per_device_batch",
        "throughput_img_s",
        "throughput_lo",
        "throughput_hi",
        "measured",
    ]
    assert 1200 not in set(thr["throughput_img_s"])  # oversubscribed scratch k=4
    mem = pd.read_csv(out / "memory.csv")
    assert list(mem.columns) == [
        "strategy",
        "model",
        "data_source",
        "k",
        "batch_size",
        "point",
        "device",
        "peak_mem_bytes",
        "peak_mem_mib_dev",
        "peak_mem_mib",
    ]
    assert mem["device"].dtype.kind == "i"
    assert one(mem, strategy="scratch", device=0)["peak_mem_mib_dev"] == pytest.approx(300)
    acc = pd.read_csv(out / "accuracy.csv")
    assert list(acc.columns) == [
        "strategy",
        "model",
        "data_source",
        "k",
        "batch_size",
        "lr",
        "final_test_acc",
        "time_to_acc_s",
    ]
    assert not set(acc["k"]) & {8} and len(acc[acc["strategy"] == "ddp"]) == 5


def test_figures_written(run):
    _, out = run
    for name in ("efficiency", "throughput", "memory", "accuracy"):
        data = (out / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_report(run):
    _, out = run
    text = (out / "report.md").read_text()
    assert text.index("SYNTHETIC DATA") < text.index("## Host")
    first_screen = "".join(text.splitlines(True)[:25])  # the answer: strategy, k, and a command to run it
    assert "## Answer" in first_screen and "python -m pipeline train --model lenet --strategy" in first_screen
    assert "train:" in (out / "best.yaml").read_text()
    unavailable = text.split("## Unavailable on this host")[1].split("\n## ")[0]
    assert "**dp**: unavailable: nn.DataParallel needs CUDA" in unavailable
    assert "**fsdp**" in unavailable and "**dp_criterion**" in unavailable
    failures = text.split("## Failed and pruned trials")[1].split("\n## ")[0]
    assert "CUDA out of memory" in failures and "pruned at epoch 1" in failures
    assert "k=8 > N=4 devices" in text.split("## Other skipped points")[1]
    reading = text.split("## Reading")[1].split("\n## ")[0]
    assert "Best weak-scaling efficiency" in reading and "**ddp** 0.85" in reading
    assert "Fastest: **ddp**" in reading and "Worst memory imbalance (max/mean): **scratch**" in reading
    assert "**scratch**: its k devices do not run in parallel" in reading
    assert "### What sharding saved" in text.split("## Memory per device")[1].split("\n## ")[0]
    assert "](efficiency.png)" in text and "| --- |" not in text and "|---|" in text


def test_no_warning_without_synthetic_and_nothing_to_analyze(tmp_path):
    summary = stage.analyze(tmp_path / "nope", tmp_path / "out")
    text = (tmp_path / "out" / "report.md").read_text()
    assert "SYNTHETIC" not in text and "nothing to compare" in text
    assert summary["host"] is None and summary["strategies"]["ddp"]["status"] == "missing"
    assert all(
        (tmp_path / "out" / f).exists()
        for f in ("summary.json", "efficiency.csv", "memory.csv", "efficiency.png", "memory.png")
    )
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == summary


def test_partial_and_odd_data_never_crash(tmp_path):
    d = tmp_path / "sweeps"
    d.mkdir()
    # k=1 only, no memory, a complete row without numbers
    write(
        [row("single", k=1, peaks=[]), row("single", k=1, B=256, thr=None, final_test_acc=None, test_acc=None)],
        d / "single.jsonl",
    )
    write(
        [
            row("fsdp", k=2, B=256, state="failed", reason="worker died"),
            row("fsdp", k=4, B=512, state="pruned", reason="pruned"),
        ],
        d / "fsdp.jsonl",
    )
    write(
        [row("ddp", k=2, B=256, thr=1800, peak_mem_bytes="not a list", parallel_devices=None, oversubscribed=None)],
        d / "ddp.jsonl",
    )
    (d / "broken.jsonl").write_bytes(b'{"a": 1}\n{"unterminated\n')
    s = stage.analyze(d, tmp_path / "out", target_acc=0.5)
    st = s["strategies"]
    assert st["single"]["status"] == "measured" and st["single"]["largest_k"] == 1
    assert st["single"]["best_throughput_img_s"] == 1000 and st["single"]["worst_mem_imbalance"] is None
    assert st["fsdp"]["status"] == "no complete trials" and st["fsdp"]["best_throughput_img_s"] is None
    assert st["ddp"]["weak_efficiency"] is None and st["ddp"]["best_throughput_img_s"] == 1800
    assert s["target_acc"] == 0.5
    text = (tmp_path / "out" / "report.md").read_text()
    assert "worker died" in text and "Weak-scaling efficiency: undefined" in text
    assert json.loads((tmp_path / "out" / "summary.json").read_text()) == s


def test_json_has_no_nan():
    import numpy as np

    out = stage._jsonable(
        {"a": float("nan"), "b": [np.float64("inf"), np.int64(3)], "c": np.bool_(True), "d": {"e": 2.5, "f": 4.0}}
    )
    assert out == {"a": None, "b": [None, 3], "c": True, "d": {"e": 2.5, "f": 4}}
    json.dumps(out, allow_nan=False)


def test_knob_effects_get_a_table_and_a_plot_per_varied_knob(tmp_path):
    import pandas as pd

    from pipeline.analysis.stage import analyze

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    rows = []
    for i, (k, hook, tput, acc) in enumerate(
        [(1, "none", 1000, 0.8), (2, "none", 1900, 0.8), (1, "fp16", 1000, 0.79), (2, "fp16", 1980, 0.7)]
    ):
        rows.append(
            {
                "trial": i,
                "strategy": "ddp",
                "model": "lenet",
                "devices": k,
                "batch_size": 128 * k,
                "per_device_batch": 128,
                "lr": 0.1,
                "state": "complete",
                "throughput_img_s": tput,
                "final_test_acc": acc,
                "data_source": "synthetic",
                "device_kind": "cpu",
                "host": "h",
                "host_devices": 2,
                "parallel_devices": True,
                "oversubscribed": False,
                "peak_mem_bytes": [100] * k,
                "bucket_cap_mb": 25,
                "grad_as_bucket_view": False,
                "accum_steps": 1,
                "comm_hook": hook,
            }
        )
    write(rows, sweeps / "ddp.jsonl")
    analyze(sweeps, tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "knobs.csv")
    assert set(table["knob"]) == {"comm_hook"}
    fp16 = table[(table["value"] == "fp16") & (table["k"] == 2)].iloc[0]
    assert fp16["weak_efficiency"] == pytest.approx(1980 / (2 * 1000)) and fp16["final_test_acc"] == pytest.approx(0.7)
    assert (tmp_path / "out" / "knob_comm_hook.png").exists()
    assert "### comm_hook" in (tmp_path / "out" / "report.md").read_text()


def test_resolved_transport_does_not_split_the_scaling_groups(tmp_path):
    """comm_hook=auto runs k=1 without communication (none) and k=2 over shared memory (shm): the tables group by
    the setting (auto), so the efficiency is still computed, and the report names the transport actually used."""
    from pipeline.analysis.stage import analyze

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    rows = [
        {
            "trial": i,
            "strategy": "ddp",
            "model": "lenet",
            "devices": k,
            "batch_size": 128 * k,
            "per_device_batch": 128,
            "lr": 0.1,
            "state": "complete",
            "throughput_img_s": tput,
            "final_test_acc": 0.8,
            "data_source": "synthetic",
            "device_kind": "cpu",
            "host": "h",
            "host_devices": 2,
            "parallel_devices": True,
            "oversubscribed": False,
            "peak_mem_bytes": [100] * k,
            "bucket_cap_mb": 25,
            "grad_as_bucket_view": False,
            "accum_steps": 1,
            "comm_hook": "auto",
            "comm_hook_used": used,
        }
        for i, (k, used, tput) in enumerate([(1, "none", 1000), (2, "shm", 1900)])
    ]
    write(rows, sweeps / "ddp.jsonl")
    analyze(sweeps, tmp_path / "out")
    eff = pd.read_csv(tmp_path / "out" / "efficiency.csv")
    weak = eff[(eff["kind"] == "weak") & (eff["k"] == 2)]
    assert weak["efficiency"].iloc[0] == pytest.approx(0.95)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "ddp k=1: DDP's own all-reduce (Gloo/NCCL); ddp k=2: shared memory" in report
    assert not (tmp_path / "out" / "knob_comm_hook.png").exists()  # one setting: not a varied knob


def test_the_memory_plot_keeps_two_optimizers_at_one_point_apart(tmp_path):
    """ddp at k=2 B=256 with SGD and with AdamW: memory.csv labels each configuration on its own (`point`, what the
    DVC memory plot draws one bar per device of), so the plot never stacks the two into a peak nobody measured."""
    from pipeline.analysis.stage import analyze

    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    rows = [
        row("ddp", k=k, B=128 * k, optimizer=opt, peaks=[mib * 2**20] * k)
        for k in (1, 2)
        for opt, mib in (("sgd", 20.8), ("adamw", 21.8))
    ]
    write(rows, sweeps / "ddp.jsonl")
    analyze(sweeps, tmp_path / "out")
    mem = pd.read_csv(tmp_path / "out" / "memory.csv")
    k2 = mem[mem["k"] == 2]
    assert sorted(set(k2["point"])) == ["ddp lenet k=2 B=256 optimizer=adamw", "ddp lenet k=2 B=256 optimizer=sgd"]
    assert not k2.duplicated(["point", "device"]).any()
    assert sorted(k2.groupby("point")["peak_mem_mib_dev"].max().round(1)) == [20.8, 21.8]


def test_the_memory_figure_shows_each_optimizer_as_its_own_bars(tmp_path, monkeypatch):
    """memory.png at k=2: ddp with SGD and with AdamW are two labelled bar groups, not the first row of the two."""
    from pipeline.analysis.plots import figures
    from pipeline.analysis.tables import points

    shown = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path, *a, **kw: shown.update(fig=fig))
    rows = [
        row("ddp", k=2, B=256, optimizer=opt, peaks=[mib * 2**20] * 2) for opt, mib in (("sgd", 20.8), ("adamw", 21.8))
    ]
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir()
    write(rows, sweeps / "ddp.jsonl")
    from pipeline.analysis.tables.rows import load_sweeps

    df, _ = load_sweeps(sweeps, expected=("ddp",))
    figures.plot_memory(points.memory_table(df), tmp_path / "memory.png")
    (ax,) = shown["fig"].axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ddp sgd", "ddp adamw"]
    heights = sorted(round(p.get_height(), 1) for p in ax.patches)
    assert heights == [20.8, 20.8, 21.8, 21.8]


def test_the_dvc_line_plots_draw_each_optimizer_as_its_own_line():
    """efficiency and throughput: a line per strategy, model, batch and (where the CSV has it, because it varies)
    optimizer, so AdamW's k=2 point and SGD's are two lines, not one line folded back at k=2."""
    from tests.conftest import REPO

    for name in ("efficiency_by_strategy", "throughput_by_strategy"):
        spec = json.loads((REPO / ".dvc" / "plots" / f"{name}.json").read_text())
        (series,) = [t["calculate"] for t in spec["transform"] if t.get("as") == "series"]
        assert "datum.optimizer" in series and "datum.strategy" in series, name
