"""The report's "Why it scales" section: where a sampled step goes (the measured breakdown), one plain sentence per
strategy at each k > 1 on what its step lost against k=1, and the scaling model beside the measurements.

Pure: breakdown, loss and model tables in, markdown lines out; stage.py places the section in report.md.
"""

from __future__ import annotations

import math

from pipeline import catalog
from pipeline.analysis.report.markdown import md_table
from pipeline.analysis.tables.step_parts import BD_ALL
from pipeline.records.derived import BD_PARTS

# What each part is, in plain words (comm_exposed: what the strategy issues; see pipeline/scaling/collectives.py)
PART_WORDS = {
    "data": "moving data in",
    "forward": "forward compute",
    "backward_compute": "backward compute",
    "optimizer": "the optimizer",
    "idle": "waiting for the slower rank",
    "residual": "unattributed loop overhead (residual)",
}
# what a step's exposed communication is, per collective pattern of the catalog (catalog.COMM_PATTERNS)
COMM_WORDS = {
    "bucket_allreduce": "exposed all-reduce",
    "shard_units": "exposed all-gather/reduce-scatter",
    "copy_allreduce": "the hand-written all-reduce",
    "dp_gather_logits": "exposed scatter/replicate/gather copies",
    "dp_gather_losses": "exposed scatter/replicate/gather copies",
}
MIN_SHOWN = 0.005  # a part that changed by less than half a percent of the step is not named


def _pct(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def part_words(part, strategy) -> str:
    if part != "comm_exposed":
        return PART_WORDS[part]
    row = catalog.SPECS.get(strategy)
    return COMM_WORDS.get(row.comm if row else "", "exposed communication")


def loss_sentence(r) -> str:
    """One plain sentence from a breakdown_losses row: the step's loss against k=1, its parts largest first."""
    s, k, loss = r["strategy"], r["k"], r["loss"]
    parts = sorted(((r[f"loss_{p}"], p) for p in BD_ALL if abs(r[f"loss_{p}"]) >= MIN_SHOWN), reverse=True)
    worse = [f"{v:.0%} {part_words(p, s)}" for v, p in parts if v > 0]
    better = [f"{-v:.0%} less {part_words(p, s)}" for v, p in parts if v < 0]
    verb = "loses" if loss >= 0 else "gains"
    text = f"{s} at k={k:g} (b={r['per_device_batch']:g}) {verb} {abs(loss):.0%} of its step against k=1"
    text += (": " + ", ".join(worse)) if worse else ": no part grew by half a percent of the step or more"
    text += ("; offset by " + ", ".join(better)) if better else ""
    e = r["measured_efficiency"]
    apart = (
        ", not comparable on this host: its two ends were measured under loads that are not comparable "
        "(docs/metrics.md)"
        if not r.get("measured_comparable", True)
        else ""
    )
    return text + (
        "."
        if isinstance(e, float) and math.isnan(e)
        else f" (measured weak-scaling efficiency from throughput: {e:.2f}{apart})."
    )


def _check_line(r) -> str:
    return (
        f"{r['strategy']} at k={r['k']:g} (b={r['per_device_batch']:g}): measured efficiency "
        f"{r['measured_efficiency']:.3f}, modelled {r['modelled_efficiency']:.3f} (modelled on "
        f"{r['interconnect']}); modelled error {r['rel_error']:+.1%}: "
        + (f"within the {r['tolerance']:.0%} tolerance." if r["within_tolerance"] else f"{r['verdict']}.")
    )


def why_section(bd, losses, model, model_notes) -> list[str]:
    """ "Why it scales": the measured breakdown in percent, one sentence per strategy at each k > 1, and the scaling
    model beside the measurements (every modelled number on a line that says "modelled")."""
    s = [
        "\n## Why it scales\n\n",
        "Where a sampled step goes (measured: synchronised wall clock around the step's phases, DDP's own statistics "
        "or the profiler for exposed communication, a timed barrier for idle; pipeline/measure/breakdown.py). "
        "Median over "
        "the point's complete trials, as a share of the median step; the residual is what the parts leave "
        "unexplained, shown, never folded into a part.\n\n",
    ]
    t = bd.assign(step_ms=bd["step_s"] * 1e3, **{f"{p}_pct": bd[f"{p}_share"].map(_pct) for p in BD_ALL})
    s.append(
        md_table(
            t,
            [
                "strategy",
                "model",
                "k",
                "per_device_batch",
                "n_trials",
                "samples",
                "step_ms",
                *(f"{p}_pct" for p in BD_ALL),
            ],
            [
                "strategy",
                "model",
                "k",
                "b",
                "trials",
                "samples",
                "step (ms)",
                *(p.replace("_", " ") for p in BD_PARTS),
                "residual",
            ],
        )
    )
    s.append("\n![breakdown](breakdown.png)\n\n")
    if len(losses):
        s.append(
            "Against k=1 at the same per-device batch, each part's change as a share of the step at k (they "
            "add up to the step's loss 1 − step(1)/step(k)):\n\n"
        )
        s.append("\n".join(f"- {loss_sentence(r)}" for r in losses.to_dict("records")) + "\n")
    else:
        s.append("No strategy has a breakdown at k=1 and k>1 at the same per-device batch: no loss to explain.\n")
    s.append(
        "\n### The scaling model beside the measurements (modelled)\n\n"
        "Fitted only on each strategy's k=1 compute per image and the interconnect's collectives "
        "(pipeline/scaling/model.py); every number in this subsection is modelled unless it says measured.\n\n"
    )
    checks = model[model["role"] == "check"] if len(model) else model
    if len(checks):
        s.append("\n".join(f"- {_check_line(r)}" for r in checks.to_dict("records")) + "\n")
    else:
        s.append("- No modelled error at a measured k: it needs this host's collectives (see below).\n")
    proj = model[model["role"] == "projection"] if len(model) else model
    if len(proj):
        proj = proj.assign(
            eff=proj["modelled_efficiency"].map(lambda v: f"{v:.3f}"),
            step=proj["modelled_step_s"].map(lambda v: f"{v * 1e3:.1f}"),
        )
        s += [
            "\nProjections past the host's devices (modelled, not measured):\n\n",
            md_table(
                proj,
                ["basis", "strategy", "model", "per_device_batch", "k", "interconnect", "eff", "step"],
                ["basis", "strategy", "model", "b", "k", "interconnect", "modelled efficiency", "modelled step (ms)"],
            ),
        ]
    s += [f"\n- {n}" for n in model_notes]
    s.append("\n\n![model: measured vs modelled efficiency (modelled dashed)](model.png)\n")
    return s
