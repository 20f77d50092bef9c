"""The report's "Host capabilities" section: what the sweeps' hosts can do natively (the sweep table's host_*
columns, from capabilities.py) and the slow rows those capabilities explain; and the line naming the points whose
trials spanned nodes (SLURM jobs of ceil(k / devices per node) nodes).

A pure function of the sweep DataFrame, returning markdown. Its one causal claim: a strategy that autocasts to a
low-precision type ran slower than the fp32 strategy it differs from, on a host where that type is emulated. Where
the type is native, it claims no cause: it says where the step's extra time went (the trials' breakdown, measured),
and that what inside those phases costs it (the low-precision kernels or the casts) is not separated here.
"""

from __future__ import annotations

import math

import pandas as pd

from pipeline import catalog
from pipeline.analysis.tables.points import measured
from pipeline.records.labels import is_bounded

# the sweep table's per-trial host columns (records/table.py, from the trial record), in the section's order
HOST_COLS = (
    "host_cpu_isa",
    "host_bf16",
    "host_fp16",
    "host_gpu_name",
    "host_gpu_cc",
    "host_nccl",
    "host_interconnect",
    "host_tf32",
)
HEADERS = ("host", "CPU ISA", "bf16", "fp16", "GPU", "compute capability", "NCCL", "interconnect", "TF32", "trials")
# a strategy that autocasts, and the fp32 strategy it is a readable difference from (strategies/ddp_amp.py)
SLOWER = 0.9  # below this ratio of its baseline's throughput a point counts as slower (not noise)


def _text(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    s = str(v).strip()
    return "" if s.lower() in ("nan", "none", "null") else s


def _cell(v) -> str:
    return (_text(v) or "—").replace("|", "\\|")


def _row_cells(r: dict) -> list[str]:
    """A capabilities row's cells; TF32 only where there is a GPU (the switches change nothing on a CPU)."""
    return [_cell(r[c] if c != "host_tf32" or _text(r["host_gpu_name"]) else "") for c in ("host", *HOST_COLS)]


def _hosts(df) -> pd.DataFrame:
    """One row per distinct (host, capabilities) with its trial count; empty without the host_* columns."""
    if not any(c in df for c in HOST_COLS):
        return pd.DataFrame(columns=["host", *HOST_COLS, "trials"])
    d = df.assign(**{c: df[c].map(_text) if c in df else "" for c in ("host", *HOST_COLS)})
    d = d.loc[d[list(HOST_COLS)].ne("").any(axis=1).astype(bool)]
    return d.groupby(["host", *HOST_COLS], sort=True).size().reset_index(name="trials")


def _dtype(caps: dict, device_kind: str) -> str:
    """The type ddp_amp's train.amp_dtype=auto picks there: bf16 on CPU, and on GPUs with native bf16; else fp16."""
    return "bf16" if device_kind != "cuda" or caps.get("host_bf16") == "native" else "fp16"


def _cause(caps: dict, device_kind: str, dtype: str) -> str:
    status, isa = caps.get(f"host_{dtype}", ""), caps.get("host_cpu_isa") or "none"
    if not any(caps.values()):
        return (
            "these sweep tables do not record whether this host runs bf16/fp16 natively, so the cause is not "
            "known here (rerun the sweeps to record it)"
        )
    if device_kind == "cuda":
        where = f"this GPU ({caps.get('host_gpu_name') or 'unnamed'}, compute capability {caps.get('host_gpu_cc')})"
    else:
        where = f"this CPU (ISA {isa})"
    if status == "emulated":
        missing = (
            ("no AVX-512-BF16/AMX-BF16" if dtype == "bf16" else "no AMX-FP16 (AVX-512-FP16 alone is not used)")
            if device_kind != "cuda"
            else f"no {dtype} tensor cores"
        )
        if device_kind != "cuda" and "oneDNN capped at" in isa:  # capabilities.cpu_capabilities' isa_text
            missing = "ONEDNN_MAX_CPU_ISA keeps oneDNN from the instructions for it"
        return (
            f"{dtype} is emulated on {where}: {missing}, so autocast converts through fp32 and adds work "
            f"instead of saving it"
        )
    if status == "native":
        return (
            f"{dtype} is native on {where}, so emulation does not explain it; whether the {dtype} kernels or "
            f"the casts around them cost the difference is not separated here"
        )
    return f"this sweep table does not record whether {dtype} is native on {where}"


def _medians(rows, col: str = "throughput_img_s") -> dict:
    keep = rows[~rows["interfered"]] if "interfered" in rows else rows
    if col not in keep:
        return {}
    return keep.groupby(["model", "k", "batch_size"])[col].median().dropna().to_dict()


# the breakdown's phases (sweep table bd_*_s, breakdown.py) a slow autocast step is compared on, with their words
PHASES = (("bd_forward_s", "forward"), ("bd_backward_compute_s", "backward"), ("bd_comm_exposed_s", "exposed comm"))


def _where_it_went(amp_rows, base_rows, key, base: str) -> str:
    """Per step at `key`, the breakdown's phases of the autocast strategy against its baseline's, in ms (measured);
    "" where either has no breakdown."""
    parts = []
    for col, word in PHASES:
        a, b = _medians(amp_rows, col).get(key), _medians(base_rows, col).get(key)
        if a is None or b is None:
            return ""
        parts.append(f"{word} {1e3 * a:.1f} ms vs {1e3 * b:.1f}")
    model, k, bs = key
    return f"; per step at k={k:g}, B={bs:g} (the trials' breakdown, measured): " + ", ".join(parts) + f" ({base})"


def slow_rows(df) -> list[str]:
    """One sentence per (host, autocasting strategy) whose points ran slower than its fp32 baseline's, with the
    figures and the cause the host's capabilities give."""
    out = []
    m = measured(df)
    for host, g in m.groupby(m["host"].map(_text) if "host" in m else pd.Series("", index=m.index)):
        caps = {c: _text(g[c].iloc[0]) if c in g else "" for c in HOST_COLS}
        kind = _text(g["device_kind"].iloc[0]) if "device_kind" in g else ""
        for amp, base in catalog.autocast_baselines().items():
            amp_rows, base_rows = g[g["strategy"] == amp], g[g["strategy"] == base]
            a, b = _medians(amp_rows), _medians(base_rows)
            slow = [(key, a[key], b[key]) for key in sorted(a) if key in b and a[key] < SLOWER * b[key]]
            if not slow:
                continue
            dtype = _dtype(caps, kind)
            figures = "; ".join(
                f"k={k:g}, B={bs:g}{'' if model == 'lenet' else f' ({model})'}: {x:,.0f} img/s vs "
                f"{base}'s {y:,.0f} ({y / x:.1f}× slower)"
                for (model, k, bs), x, y in slow
            )
            where = f" on {host}" if host else ""
            went = _where_it_went(amp_rows, base_rows, slow[0][0], base)
            out.append(f"**{amp}** ran slower than **{base}**{where} ({figures}{went}): {_cause(caps, kind, dtype)}.")
    return out


def bounded_rows(df) -> list[str]:
    """The trials a sweep bounded because their autocast type is emulated here (records/labels.py), per strategy."""
    if "reason" not in df:
        return []
    b = df.loc[df["reason"].map(is_bounded).astype(bool)]
    return [f"**{s}**: {len(g)} trial(s) {g['reason'].iloc[0]}." for s, g in b.groupby("strategy", sort=True)]


def host_capabilities_section(df) -> list[str]:
    """The section's markdown: the capabilities table, then the slow and bounded rows they explain."""
    h = _hosts(df)
    s = [
        "\n## Host capabilities\n\n",
        "What the host computes natively (pipeline/host/capabilities.py, recorded per trial): CPU instruction sets, "
        "whether bf16/fp16 run natively or are emulated through fp32, the GPU and its compute capability, NCCL, "
        "the GPU interconnect (`nvidia-smi topo -m`; — on CPU hosts, whose ranks share memory), and whether "
        '"fp32" cuDNN convolutions and matmuls ran in TF32 (PyTorch\'s switches; — on CPU hosts).\n\n',
    ]
    if h.empty:
        s.append(
            "_Not recorded: these sweep tables have no host_* columns (sweeps from before they existed); "
            "rerun the sweeps to record them._\n"
        )
    else:
        s += ["| " + " | ".join(HEADERS) + " |\n", "|" + "---|" * len(HEADERS) + "\n"]
        s += ["| " + " | ".join(_row_cells(r)) + f" | {r['trials']} |\n" for r in h.to_dict("records")]
    lines = slow_rows(df) + bounded_rows(df)
    if lines:
        s.append("\n" + "\n".join(f"- {line}" for line in lines) + "\n")
    return s


def nodes_line(df) -> list[str]:
    """One line where trials spanned nodes: which k ran on how many nodes (devices N above is per node)."""
    if "nnodes" not in df:
        return []
    n = pd.to_numeric(df["nnodes"], errors="coerce")
    multi = df[(n > 1) & (df["state"] == "complete")]
    if multi.empty:
        return []
    pairs = sorted({(int(k), int(m)) for k, m in zip(multi["k"], pd.to_numeric(multi["nnodes"]))})
    return [
        "\nTrials across nodes (SLURM jobs; devices N is one node's): "
        + ", ".join(f"k={k} on {m} nodes" for k, m in pairs)
        + ". Past one node the collectives cross the network between nodes, not only the node's own links.\n"
    ]
