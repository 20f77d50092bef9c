"""Profiler events saved and replayed: a real CPU profile dumps and loads back, the shipped fixtures replay to their
recorded attribution, other formats are refused, and doctor writes replayable files.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from torch.profiler import record_function

from pipeline.measure import breakdown, comm_probes
from tests.measure.test_comm_attribution import FIXTURES, FakeStrategy, no_process_group  # noqa: F401 (shared with test_comm_attribution.py)


def busy_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def test_dump_and_load_round_trip_with_a_real_cpu_profiler(tmp_path, monkeypatch):
    """A real CPU profiler session through ProfiledComm and Breakdown, dumped as PARALLAX_DUMP_EVENTS asks, loads
    back into records whose replay gives exactly the sample's attribution (CPU spans only: no CUPTI here)."""
    no_process_group(monkeypatch)
    monkeypatch.setenv(comm_probes.DUMP_ENV, str(tmp_path))
    probe = comm_probes.ProfiledComm(("FSDP::all_gather",), torch.device("cpu"), "fsdp on CPU")
    b = breakdown.Breakdown(FakeStrategy(probe), None, every=1)
    for n in range(2):
        assert b.is_sampled(n)
        with b.sample() as clock:
            with clock("forward"):
                with record_function("FSDP::all_gather"):
                    busy_ms(2)
    files = sorted(tmp_path.glob("*.json"))
    assert [f.name for f in files] == ["events-fake-k1-none-rank0.json"]  # the first sampled step only
    dump = comm_probes.load_events(files[0])
    assert dump["synthetic"] is False and dump["probe"]["path"] == "spans"
    assert any(e["name"] == "FSDP::all_gather" for e in dump["events"])
    replay = comm_probes.attribute(dump["events"], dump["probe"]["path"], dump["probe"]["comm_names"])
    assert replay == pytest.approx(b.samples[0]["comm"]) and replay["forward"] > 0
    assert dump["expected_s"] == pytest.approx(replay)


def fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))


def test_a_synthetic_fixture_is_shipped_and_labelled():
    synthetic = [f for f in fixtures() if comm_probes.load_events(f)["synthetic"]]
    assert synthetic and all("SYNTHETIC" in f.name for f in synthetic)


@pytest.mark.parametrize("path", fixtures(), ids=lambda p: p.name)
def test_replay_fixture(path):
    """Every fixture in tests/fixtures/ (synthetic, or one a GPU run dumped) replays to the attribution it records,
    and the attribution does not depend on the device-side user annotations (G1)."""
    dump = comm_probes.load_events(path)
    events, probe = dump["events"], dump["probe"]
    got = comm_probes.attribute(events, probe["path"], probe["comm_names"])
    assert got == pytest.approx(dump["expected_s"], abs=1e-12)
    plain = [e for e in events if not (e["device_type"] != "cpu" and e["is_user_annotation"])]
    assert comm_probes.attribute(plain, probe["path"], probe["comm_names"]) == pytest.approx(got, abs=1e-12)
    phases = {
        e["name"][len(comm_probes.PHASE) :]: (e["end_us"] - e["start_us"]) / 1e6
        for e in events
        if e["device_type"] == "cpu" and e["name"].startswith(comm_probes.PHASE)
    }
    assert set(got) <= {"forward", "backward"}
    assert all(0 <= s <= phases[name] + 1e-12 for name, s in got.items())


def test_load_refuses_other_formats(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"format": "chrome-trace"}))
    with pytest.raises(ValueError, match="parallax-profiler-events"):
        comm_probes.load_events(p)


def test_doctor_dump_events_writes_replayable_files(make_cfg, tmp_path):
    """`doctor --dump-events DIR` reaches the trial processes: fsdp's first sampled step is dumped there (on this
    CPU host through the host-span path) and replays to what the trial attributed. On a GPU host the same files hold
    Kineto's CUDA events; copying one into tests/fixtures/ makes CI replay it."""
    from pipeline.doctor import checks

    checks.run(
        make_cfg("train.breakdown_every=5"),
        tmp_path / "doctor",
        ["fsdp"],
        max_devices=1,
        steps=10,
        per_device_batch=32,
        say=lambda *_: None,
        dump_events=tmp_path / "events",
    )
    assert comm_probes.DUMP_ENV not in os.environ  # the doctor leaves the environment as it was
    files = sorted((tmp_path / "events").glob("events-fsdp-*.json"))
    assert files and any("-rank0" in f.name for f in files)
    for f in files:
        dump = comm_probes.load_events(f)
        assert dump["strategy"] == "fsdp" and dump["synthetic"] is False
        replay = comm_probes.attribute(dump["events"], dump["probe"]["path"], dump["probe"]["comm_names"])
        assert replay == pytest.approx(dump["expected_s"], abs=1e-12)
