"""A GPU's fixed cost and capacity for "will it fit?": what every process on it holds apart from any tensor the
model makes, and how much memory it has. Each figure carries its source: measured on the device (kept by `doctor`,
by device name, in runs/device_basis.json), read from the device, given on the command line, or assumed (a default
written here, with where it comes from).

    python -m pipeline doctor      # on a CUDA host: keeps this device's fixed cost in runs/device_basis.json
    python -m pipeline fit --model resnet18 --batch-size 256 --strategies ddp --devices 2   # reads it

Fixed cost per device and process:
    context      the CUDA context and the kernels loaded into it: outside the caching allocator, so no allocator
                 figure holds it. Measured as NVML's used memory less the allocator's reserved peak (a doctor row at
                 k=1, one process on the device; NVML's "used" also holds what the driver reserves, so the figure
                 is an upper one).
    workspaces   cuBLAS's workspace, one per handle and stream (the forward's thread and autograd's device thread
                 use different handles: two in a training step), and what cuDNN keeps: allocated through the
                 caching allocator once used, kept for the process.

The defaults (assumed where no measurement is kept for the device): a probe on an NVIDIA H100 80GB HBM3, 2026-11-27
(torch 2.11.0+cu130, CUDA 13.0, cuDNN 9.19, driver 580.159.04): NVML's per-process used memory 518 MiB after CUDA
initialisation, 828 MiB after LeNet and ResNet-18 training steps with 68 MiB reserved by the allocator, so context and
loaded kernels about 760 MiB (rounded up to 800); one cuBLAS workspace 32 MiB per handle and stream, and LeNet's first
step peaked 33.5 MiB above its steady steps (ResNet-18 at B=256: 46 MiB), so 2 x 32 MiB. On an NVIDIA H200
(2026-11-26) NVML's used memory reads 1,490 MiB beside 108 MiB reserved: the context differs by device and driver,
which is why doctor measures it where it runs.

Reading the store loads no torch; only `cuda_device` does, and only where an NVIDIA driver is visible.
"""

from __future__ import annotations

import datetime
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
DEFAULT_CONTEXT_MIB = 800.0
DEFAULT_WORKSPACE_MIB = 2 * 32.0  # two cuBLAS workspaces: the forward's handle and autograd's
DEFAULT_CAPACITY_MIB = 81_559  # what an "80 GB" H100 reports (torch.cuda.mem_get_info's total): 79.6 GiB
DEFAULT_SOURCE = "an H100 probe, 2026-11-27"


@dataclass(frozen=True)
class Figure:
    """A figure in bytes, what kind it is (measured, assumed, given) and where it comes from."""

    bytes: int
    source: str
    kind: str = "assumed"

    @property
    def measured(self) -> bool:
        return self.kind == "measured"

    @property
    def label(self) -> str:
        return f"{self.kind} ({self.source})"


@dataclass(frozen=True)
class FixedCost:
    """A device's fixed cost per process: the CUDA context (with its loaded kernels) and the libraries' workspaces."""

    device: str
    context: Figure
    workspaces: Figure
    note: str = ""  # a device named with no kept figure: said where the fixed cost is, so a misspelt name is seen

    @property
    def bytes(self) -> int:
        return self.context.bytes + self.workspaces.bytes


def store_file(store=None) -> Path:
    if store is not None:
        return Path(store)
    from pipeline import paths

    return paths.repo_root() / "runs" / "device_basis.json"


def _read(store=None) -> dict:
    """The store as written (its entries unchecked; `_kept` checks them): {} where it is missing, and where it is
    not JSON or not an object of entries by device name, said once on stderr."""
    return read_object(store_file(store), "figures by device name", "every device's fixed cost is the assumed default")


def read_object(path, holds: str, instead: str) -> dict:
    """A kept JSON file's object of entries: {} where the file is missing, and where it is not JSON or not an object
    (of what it `holds`), said once on stderr (`ignored`) with what is taken `instead`."""
    try:
        data = json.loads(path.read_text())
    except OSError:
        return {}
    except ValueError as e:
        ignored(path, None, f"not JSON ({e})", instead)
        return {}
    if not isinstance(data, dict):
        ignored(path, None, f"a JSON {type(data).__name__}, not {holds}", instead)
        return {}
    return data


def _number(value) -> bool:
    """A figure a kept entry may hold: a finite, non-negative int or float (JSON's true and false are not)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def entry_problem(entry) -> str | None:
    """Why a kept entry cannot be read (None: it can): its figures (context_mib, workspace_mib: a non-negative
    number of MiB or null, at least one a number) and what its source line says (date, torch, source: text)."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an object of figures"
    for key in ("context_mib", "workspace_mib"):
        if entry.get(key) is not None and not _number(entry[key]):
            return f"{key} {entry[key]!r} is not a non-negative number of MiB"
    if entry.get("context_mib") is None and entry.get("workspace_mib") is None:
        return "neither context_mib nor workspace_mib is a figure"
    for key in ("date", "torch"):
        if not isinstance(entry.get(key), str) or not entry[key].strip():
            return f"{key} {entry.get(key)!r} is not the text its source line says"
    if "source" in entry and not isinstance(entry["source"], str):
        return f"source {entry['source']!r} is not text"
    return None


_SAID: set[tuple[str, str | None, str]] = set()


def ignored(path, entry: str | None, why: str, instead: str) -> None:
    """Say once per process, on stderr, that a kept file (or its `entry`) is ignored, why, and what is taken
    instead: a cache or store edited by hand, or from other code, is read as absent, never trusted."""
    key = (str(path), entry, why)
    if key in _SAID:
        return
    _SAID.add(key)
    what = f"{path}, entry {entry!r}" if entry is not None else str(path)
    print(f"ignored {what}: {why}; {instead}", file=sys.stderr, flush=True)


def _kept(store=None) -> dict:
    """The store's entries that can be read (entry_problem); each other one ignored, said once on stderr."""
    path, kept = store_file(store), {}
    for name, entry in _read(store).items():
        if why := entry_problem(entry):
            ignored(path, name, why, "its fixed cost is the assumed default")
        else:
            kept[name] = entry
    return kept


def fixed_cost(device: str | None, store=None) -> FixedCost:
    """The fixed cost of `device` (a CUDA device name): what doctor kept for it, else the assumed defaults; each
    part on its own (a kept context without a kept workspace figure takes the default workspaces). An entry that
    cannot be read (entry_problem) is ignored, said on stderr: the assumed defaults, never a negative figure."""
    stored = _kept(store)
    kept = stored.get(device or "") or {}
    when = f"doctor on {device}, {kept.get('date', '?')}, torch {kept.get('torch', '?')}"
    # a name given (or found) with nothing kept for it: said, so a misspelt --device-name is seen
    note = (
        f"no kept figure for {device!r} in {store_file(store).name} (kept: {', '.join(map(repr, stored)) or 'none'}), "
        "so the assumed default"
        if device and not kept
        else ""
    )
    if kept.get("context_mib") is not None:
        context = Figure(
            int(kept["context_mib"] * MIB), f"{when}: {kept.get('source', 'NVML used - reserved')}", "measured"
        )
    else:
        context = Figure(
            int(DEFAULT_CONTEXT_MIB * MIB),
            f"default, {DEFAULT_SOURCE}: NVML used 828 - reserved 68 MiB, rounded up",
        )
    if kept.get("workspace_mib") is not None:
        workspaces = Figure(int(kept["workspace_mib"] * MIB), f"{when}: what warming cuBLAS and cuDNN left", "measured")
    else:
        workspaces = Figure(int(DEFAULT_WORKSPACE_MIB * MIB), "default: 2 cuBLAS workspaces x 32 MiB")
    return FixedCost(device or "", context, workspaces, note)


def capacity(given: int | None, device: tuple[str, int] | None) -> Figure:
    """The memory of one device: `given` (--device-memory), else the CUDA device's total, else the assumed part's."""
    if given is not None:
        return Figure(given, "--device-memory", "given")
    if device is not None:
        return Figure(device[1], f"torch.cuda.mem_get_info() total of {device[0]}", "measured")
    return Figure(DEFAULT_CAPACITY_MIB * MIB, "default: an 80 GB part as NVIDIA counts it: 81,559 MiB")


def _driver_visible() -> bool:
    """An NVIDIA device node: only then is torch loaded to ask CUDA (a CPU host answers without torch)."""
    return any(Path("/dev").glob("nvidia[0-9]*"))


def cuda_device() -> tuple[str, int] | None:
    """This host's first CUDA device: its name and total memory in bytes (torch.cuda.mem_get_info); None without one."""
    if not _driver_visible():
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(0), int(torch.cuda.mem_get_info(0)[1])


def measured_from_doctor(report: dict) -> tuple[str, dict] | None:
    """The device's name and its fixed cost as a doctor report on CUDA measured it (module docstring), from the
    passed rows at k=1 (one process on the device): the context as the least NVML used - allocator reserved peak
    (the run least crowded by other processes), the workspaces as the most any row's warm-up left allocated
    (`workspace_mib`, a row's share of `mem_workspace_bytes`), where rows carry it. None off CUDA or without rows."""
    host = report.get("host") or {}
    if host.get("kind") != "cuda":
        return None
    rows = [r for r in report.get("rows", []) if r.get("status") == "passed" and r.get("k") == 1]
    contexts = [
        r["nvml_used_mib"][0] - r["reserved_peak_mib"][0]
        for r in rows
        if r.get("nvml_used_mib") and r.get("reserved_peak_mib")
    ]
    if not contexts:
        return None
    workspaces = [r["workspace_mib"][0] for r in rows if r.get("workspace_mib")]
    name = host.get("name") or (host.get("gpus") or [{}])[0].get("name", "")
    return name, {
        "context_mib": round(min(contexts), 1),
        "workspace_mib": round(max(workspaces), 1) if workspaces else None,
        "source": f"NVML used - allocator reserved peak, least of {len(contexts)} k=1 row(s)",
        "date": datetime.date.today().isoformat(),
        "torch": host.get("torch", ""),
    }


def keep_from_doctor(report: dict, store=None) -> str | None:
    """Keep the fixed cost a doctor report measured, under its device's name; returns the name (None: nothing kept)."""
    found = measured_from_doctor(report)
    if found is None:
        return None
    name, entry = found
    data = _read(store)
    data[name] = entry
    path = store_file(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return name
