"""Which GPUs this host has and how they are linked: `nvidia-smi topo -m` and its GPU table, read once and mapped onto
CUDA ordinals by UUID or PCI bus id, so a trial's interconnect is that of the GPUs it runs on.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import torch

# `nvidia-smi topo -m`'s link codes, fastest first (its legend): NV# = that many NVLinks; the rest are PCIe paths
LINK_ORDER = ("NV", "PIX", "PXB", "PHB", "NODE", "SYS")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# which `topo -m` row is which GPU: nvidia-smi numbers GPUs as NVML does (PCI bus order), blind to CUDA_VISIBLE_DEVICES
# and CUDA_DEVICE_ORDER, so a CUDA ordinal is placed by its UUID (or PCI bus id), never by its number
GPU_TABLE_QUERY = ("--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")


def _nvidia_smi(args, timeout_s: float) -> str | None:
    """nvidia-smi's output for `args`, ANSI codes removed; None where it is absent, fails or does not answer."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return _ANSI.sub("", out.stdout) if out.returncode == 0 and out.stdout.strip() else None


def gpu_topology(timeout_s: float = 10.0) -> str | None:
    """`nvidia-smi topo -m`'s matrix as text; None where nvidia-smi is absent, fails or does not answer."""
    return _nvidia_smi(["topo", "-m"], timeout_s)


def gpu_table(timeout_s: float = 10.0) -> str | None:
    """nvidia-smi's index, UUID and PCI bus id of every GPU it sees, as CSV lines; None without nvidia-smi."""
    return _nvidia_smi(list(GPU_TABLE_QUERY), timeout_s)


def _pci(bus_id: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI bus id such as "00000000:1B:00.0"."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def _uuid(u: str) -> str:
    """A GPU UUID without its "GPU-"/"MIG-" prefix, lower case: CUDA prints none, NVML and nvidia-smi one."""
    u = u.strip().lower()
    return u[4:] if u[:4] in ("gpu-", "mig-") else u


def cuda_identity(ordinal: int) -> dict:
    """CUDA device `ordinal` as NVML and nvidia-smi know it: {"uuid": without prefix, "pci": (domain, bus, device)
    or None}. CUDA has applied CUDA_VISIBLE_DEVICES (indices, UUIDs or MIG ids) and CUDA_DEVICE_ORDER to its
    ordinals, so this is the ordinal's physical GPU (or MIG instance) whatever they hold. The PCI ids are read with
    getattr: torch builds without them leave only the UUID."""
    p = torch.cuda.get_device_properties(ordinal)
    pci = tuple(getattr(p, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    return {"uuid": _uuid(str(getattr(p, "uuid", "") or "")) or None, "pci": None if None in pci else pci}


def trial_rows(ordinals, table: str | None, identity=cuda_identity) -> list[int] | None:
    """The `topo -m` row (nvidia-smi index) of each CUDA ordinal, by UUID, else by PCI bus id (a MIG instance's
    UUID is no row's: its GPU's bus id is); None where any cannot be placed."""
    gpus = []
    for line in (table or "").splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit():
            gpus.append((int(cells[0]), _uuid(cells[1]), _pci(cells[2])))
    rows = []
    try:
        for i in ordinals:
            ident = identity(i)
            row = next((g[0] for g in gpus if ident["uuid"] and g[1] == ident["uuid"]), None)
            if row is None and ident["pci"]:
                row = next((g[0] for g in gpus if g[2] == ident["pci"]), None)
            if row is None:
                return None
            rows.append(row)
    except Exception:  # a device torch cannot describe: no claim about links, no failed doctor run
        return None
    return rows


def _matrix(topo: str | None) -> list[list[str]] | None:
    """The GPU-to-GPU cells of a `topo -m` matrix (square, "X" on the diagonal); None without one."""
    if not topo:
        return None
    rows = [line.split() for line in _ANSI.sub("", topo).splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0].startswith("GPU0")), None)
    if header is None:  # nvidia-smi's header row starts with a tab: its first cell is GPU0
        return None
    n = sum(1 for c in header if re.fullmatch(r"GPU\d+", c))  # NIC and affinity columns follow the GPUs
    body = {r[0]: r[1 : n + 1] for r in rows if r is not header and re.fullmatch(r"GPU\d+", r[0])}
    if any(len(body.get(f"GPU{i}", ())) < n for i in range(n)):
        return None
    return [body[f"GPU{i}"] for i in range(n)]


def interconnect(topo: str | None, rows=None) -> str | None:
    """The links between `rows` (topo -m row numbers; None: every GPU in the matrix), slowest first: "NV18"
    (NVLink), "PIX"/"PXB"/"PHB" (PCIe), "NODE"/"SYS" (across a host bridge or socket); "single GPU" for one GPU,
    "same GPU" for MIG instances of one GPU; None without a matrix or where a row is not in it."""
    m = _matrix(topo)
    if m is None:
        return None
    rows = list(range(len(m))) if rows is None else list(rows)
    distinct = sorted(set(rows))
    if not distinct or distinct[-1] >= len(m):
        return None
    if len(distinct) == 1:
        return "same GPU" if len(rows) > 1 else "single GPU"
    links = {m[i][j] for i in distinct for j in distinct if i != j}

    def rank(link):
        return next((i for i, p in enumerate(LINK_ORDER) if link.startswith(p)), len(LINK_ORDER))

    return "/".join(sorted(links, key=rank, reverse=True)) or None


def trial_interconnect(ordinals, topo: str | None = None, table: str | None = None) -> str | None:
    """interconnect() of the GPUs behind these CUDA ordinals (nvidia-smi is run where topo/table are not given)."""
    ordinals = list(ordinals)
    if len(ordinals) == 1:
        return "single GPU"
    topo = gpu_topology() if topo is None else topo
    table = (gpu_table() if topo else None) if table is None else table
    rows = trial_rows(ordinals, table)
    return None if rows is None else interconnect(topo, rows)
