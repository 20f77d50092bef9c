"""`python -m pipeline train`: the contract (metrics.json, final_state.pt, MLflow run) and that it learns."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.cli import main
from pipeline.tracking import client


def test_train_writes_contract_and_tracks_run(make_cfg, tmp_path, synthetic_root, monkeypatch, capsys):
    make_cfg()
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, train_limit: 16384, test_limit: 2000}}\n"
        "train: {interference_threshold: 1.0e+6}\n"  # a busy host's run would be named [under load] (flagged)
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--model",
            "lenet",
            "--batch-size",
            "128",
            "--lr",
            "0.3",
            "--epochs",
            "1",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    m = json.loads((out / "metrics.json").read_text())
    for key in (
        "model",
        "strategy",
        "devices",
        "batch_size",
        "lr",
        "epochs",
        "data_source",
        "device_kind",
        "host",
        "throughput_img_s",
        "epoch_s",
        "test_acc",
        "peak_mem_bytes",
        "mem_imbalance",
    ):
        assert key in m, key
    assert m["strategy"] == "single" and m["data_source"] == "synthetic" and len(m["epoch_s"]) == 1
    assert m["test_acc"][-1] > 0.3, "one epoch of LeNet should learn the synthetic classes well above chance"
    state = torch.load(out / "final_state.pt", weights_only=True)
    assert set(state) == {f"{i}.{p}" for i in (0, 3, 7, 9) for p in ("weight", "bias")}

    tr = client.Tracker(make_cfg())
    runs = tr.find_runs("tags.strategy = 'single'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name == "single k=1 B=128 lr=0.3"
    assert run.data.params["batch_size"] == "128" and run.data.tags["data_source"] == "synthetic"
    assert run.data.tags["synthetic"] == "true" and run.data.tags["device_kind"] == m["device_kind"]
    assert {"host", "mlflow.user", "mlflow.source.name"} <= set(run.data.tags)  # git: tests/tracking/test_provenance.py
    history = tr.client.get_metric_history(run.info.run_id, "test_acc")
    assert [h.step for h in history] == [1] and abs(history[0].value - m["test_acc"][0]) < 1e-9
    assert [h.step for h in tr.client.get_metric_history(run.info.run_id, "train_loss")] == [1]
    assert run.data.metrics["peak_mem_mib_dev0"] > 0 and run.data.tags["host_bf16"] in ("native", "emulated")
    (ds,) = tr.client.get_run(run.info.run_id).inputs.dataset_inputs
    assert ds.dataset.name == "synthetic" and ds.dataset.digest == client.data_digest(synthetic_root)
    artifacts = [a.path for a in tr.client.list_artifacts(run.info.run_id)]
    assert {"metrics.json", "breakdown.json", "trace"} <= set(artifacts), artifacts
    # the sampled step as a Chrome trace, beside the breakdown's table
    assert [a.path for a in tr.client.list_artifacts(run.info.run_id, "trace")] == ["trace/rank0.pt.trace.json"]
    assert json.loads((out / "trace" / "rank0.pt.trace.json").read_text())["parallax"]["rank"] == 0


def test_max_steps_stops_early(make_cfg, tmp_path):
    from pipeline.trial.launch import run_trial

    m = run_trial(
        make_cfg("train.max_steps=3", "train.batch_size=32", "data.train_limit=1024", "data.test_limit=128"),
        tmp_path / "o",
        progress=False,
    )
    assert m["steps"] == 3 and len(m["epoch_s"]) == 1


def test_divergence_is_a_failure_with_reason(make_cfg, tmp_path):
    import pytest

    from pipeline.trial.launch import TrialFailed, run_trial

    with pytest.raises(TrialFailed) as e:
        run_trial(
            make_cfg(
                "train.lr=100",
                "train.batch_size=64",
                "data.train_limit=2048",
                "data.test_limit=128",
                "train.check_every=5",
            ),
            tmp_path / "o",
            progress=False,
        )
    assert e.value.kind == "diverged" and "lower the learning rate" in str(e.value)


def test_a_run_of_warm_up_steps_only_says_why_it_has_no_throughput(
    make_cfg, tmp_path, synthetic_root, monkeypatch, capsys
):
    """2 steps, 3 of warm-up: nothing timed. The line says why img/s is missing (no `nan img/s`), and so does the
    MLflow run."""
    make_cfg()
    (tmp_path / "params.yaml").write_text(
        f"profile: ''\ndata: {{source: synthetic, dir: {synthetic_root}, "
        f"train_limit: 512, test_limit: 128}}\ntrain: {{warmup_steps: 3}}\n"
    )
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "train",
            "--strategy",
            "single",
            "--devices",
            "1",
            "--batch-size",
            "256",
            "--epochs",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "nan" not in out and "img/s" not in out.splitlines()[0]
    assert "no steady-state step was timed: all 2 step(s) of the run were warm-up (the first 3" in out
    assert "raise data.train_limit or lower train.warmup_steps" in out
    m = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert m["throughput_img_s"] is None and m["test_acc"][-1] >= 0  # accuracy still stands
    (run,) = client.Tracker(make_cfg()).find_runs("tags.strategy = 'single'")
    assert run.info.status == "FINISHED" and "all 2 step(s)" in run.data.tags["parallax.untimed"]


class _OnAnotherDevice(torch.Tensor):
    """A loss that lives on a device other than the loop's, as dp's loss on cuda:j (train.output_device=j) while the
    loop's tensors are on cuda:0. Mixing it with a tensor of the loop's device raises TensorIterator's error; moving
    it with `.to()` gives a tensor of the loop's device. `meta` cannot stand in here: a CPU 0-dim tensor is excused
    from the same-device check, so `cpu_scalar += meta_scalar` passes (checked on 2.14), and a meta tensor cannot be
    copied to the CPU after the fix."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs).as_subclass(torch.Tensor)
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if any(type(a) is torch.Tensor for a in tensors) and any(isinstance(a, cls) for a in tensors):
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, cuda:1 and cuda:0!"
            )
        return super().__torch_function__(func, types, args, kwargs)


def test_a_loss_on_another_device_is_moved_to_the_loops_device(make_cfg):
    """G5: train() moves each step's loss to its own device before summing it (dp with train.output_device=1 returns
    a loss on cuda:1, the sum lives on cuda:0). A CPU stand-in for the second device checks the loop's intent; that
    DataParallel's gathered loss really lands on the output device needs two GPUs."""
    from pipeline.data import store
    from pipeline.host.devices import Host
    from pipeline.strategies.base import Strategy
    from pipeline.trial.loop import train

    class LossElsewhere(Strategy):
        def train_step(self, *args, **kwargs):
            return super().train_step(*args, **kwargs).as_subclass(_OnAnotherDevice)

    cfg = make_cfg("train.batch_size=32", "train.epochs=1", "train.breakdown_every=0")
    g = torch.Generator().manual_seed(0)
    data = store.Dataset(
        torch.randint(0, 255, (128, 28, 28), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (128,), generator=g),
        torch.randint(0, 255, (64, 28, 28), dtype=torch.uint8, generator=g),
        torch.randint(0, 10, (64,), generator=g),
        "synthetic",
    )
    strategy = LossElsewhere(cfg.train, Host("cpu", 1, "cpu", "h", torch.__version__, ""))
    strategy.setup()
    out = train(cfg, strategy, data)
    assert out["steps"] == 4 and type(out["train_loss"][0]) is float and out["train_loss"][0] > 0


def _store_down(record):
    raise RuntimeError("the tracking store is down")


@pytest.mark.parametrize("on_epoch", [None, _store_down], ids=["success", "failure"])
def test_a_finished_trial_leaves_no_answer_files_in_its_folder(make_cfg, tmp_path, on_epoch):
    """The watcher's answers to the main rank's epochs (ack-<epoch>) are the trial's scratch: gone once it ends,
    whether it ends with its record or with its caller's error (an epoch its store could not take)."""
    from pipeline.trial.launch import run_trial

    out = tmp_path / "o"
    cfg = make_cfg("train.epochs=2", "train.batch_size=32", "data.train_limit=256", "data.test_limit=64")
    try:
        run_trial(cfg, out, on_epoch=on_epoch, progress=False)
    except RuntimeError as e:
        assert on_epoch and "store is down" in str(e), e
    else:
        assert not on_epoch and (out / "metrics.json").exists()
    assert (out / "progress.jsonl").exists()  # the epochs were reported, and answered
    assert sorted(f.name for f in out.glob("ack-*")) == []
