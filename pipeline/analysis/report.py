"""report.md of the analysis stage: tables, findings in plain language generated from the numbers.

Built on tables.py's tables (and knobs.py's knob table); writes one file, report.md.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import catalog
from pipeline.analysis import confidence
from pipeline.analysis.report_host import host_capabilities_section, nodes_line
from pipeline.analysis.tables import (BD_ALL, BD_PARTS, MEM_BASIS, MEM_LISTS, MIB, best_row, group_by, is_serial,
    is_unavailable, joined, shown_extras)


def _fmt(v) -> str:
    if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return str(int(v)) if v.is_integer() else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def md_table(df, cols=None, headers=None) -> str:
    """A GitHub-markdown table (no tabulate dependency); '—' marks undefined values."""
    cols = list(cols or df.columns)
    if df.empty:
        return "_none_\n"
    lines = ["| " + " | ".join(headers or cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in df.to_dict("records")]
    return "\n".join(lines) + "\n"


def _mib(v):
    return v / MIB if v is not None and not (isinstance(v, float) and math.isnan(v)) else math.nan


# memory peaks are counted bytes, not timed: the note after each memory claim
MEM_SURE = "how sure: counted (bytes), not timed, so host load does not move it; the median over the point's trials"


def _basis_text(basis: str) -> str:
    """A memory row's mem_basis in words (one or several, comma-joined)."""
    return "; ".join(MEM_BASIS.get(b, b) for b in basis.split(", ")) if basis else "basis not recorded"


def _per_device_mib(lists) -> list[str]:
    return [" / ".join(f"{v / MIB:,.1f}" for v in p) if len(p) else "—" for p in lists]


def _reading(pts, eff, mem, status) -> list[str]:
    """Plain-language findings, generated from the tables (one block per model)."""
    out = []
    for model in sorted(pts["model"].unique()):
        p, e, m = (t[t["model"] == model] for t in (pts, eff, mem))
        tag = f" ({model})" if pts["model"].nunique() > 1 else ""
        fastest = confidence.fastest_claim(confidence.with_throughput_intervals(p, e), tag)
        out += [fastest] if fastest else []
        w = e[(e["kind"] == "weak") & e["efficiency"].notna() & (e["k"] >= 2)]
        # above 1: physically implausible beyond its interval (never presented as a finding), else within noise
        out += [s for s in (confidence.implausible(r, tag) for r in w.to_dict("records")) if s]
        w = confidence.plausible(w)
        if len(w):
            out.append(confidence.efficiency_claim(w, tag))
        else:
            out.append(f"Weak-scaling efficiency{tag}: undefined (no strategy has both k=1 and k≥2 "
                       "at the same per-device batch).")
        # device-0 memory and imbalance only mean something with >= 2 devices reported separately
        m2 = m[(m["k"] >= 2) & (m["peaks"].map(len) >= 2)] if len(m) else m
        if len(m2):
            dev0 = m2.assign(dev0=[q[0] for q in m2["peaks"]])
            r0 = best_row(dev0, "dev0")
            out.append(f"Most memory on device 0 with k≥2{tag}: **{r0['strategy']}**, {r0['dev0'] / MIB:,.1f} MiB "
                       f"(k={r0['k']:g}, B={r0['batch_size']:g}; figure: {_basis_text(r0['mem_basis'])}); {MEM_SURE}.")
            imb = best_row(m2, "mem_imbalance")
            out.append(f"Worst memory imbalance (max/mean){tag}: **{imb['strategy']}**, "
                       f"{imb['mem_imbalance']:.2f}× at k={imb['k']:g}, B={imb['batch_size']:g}; "
                       f"device-0 excess there {_mib(imb['dev0_excess_bytes']):,.1f} MiB (both from: "
                       f"{_basis_text(imb['mem_basis'])}); {MEM_SURE}.")
        if len(m):
            if m["mem_method"].nunique() > 1 or m["mem_basis"].nunique() > 1:
                out.append("Memory was measured with different methods ("
                           + ", ".join(sorted(set(m["mem_method"]) - {""}))
                           + "): compare across those with care.")
        r = best_row(p, "test_acc")
        if r is not None:
            out.append(f"Best final test accuracy{tag}: **{r['strategy']}**, {r['test_acc']:.4f} "
                       f"(k={r['k']:g}, B={r['batch_size']:g}, lr={r['best_lr']:g}); how sure: best of "
                       f"{r['n_lrs']:g} lr(s) over {r['n_trials']:g} trial(s) of one seed, whose seed-to-seed spread "
                       f"is not measured.")
    serial = sorted({r["strategy"] for r in pts.to_dict("records")
                     if r["k"] >= 2 and is_serial(r)})
    for s in serial:
        out.append(f"**{s}**: its k devices do not run in parallel on this host "
                   "(parallel_devices=False), so its \"scaling\" is not real parallel scaling.")
    down = [s for s, st in status.items() if st["status"] != "measured"]
    if down:
        out.append("Not measured here: " + ", ".join(f"{s} ({status[s]['status']})" for s in down) + ".")
    if pts.empty:
        out.insert(0, "No complete, non-oversubscribed trial: nothing to compare.")
    return out


def _transports(df) -> list[str]:
    """Which gradient transport each strategy and k used (comm_hook_used; the tables group by the setting)."""
    if "comm_hook_used" not in df:
        return []
    done = df[(df["state"] == "complete") & (df["comm_hook_used"].astype(str) != "")]
    used = done.groupby(["strategy", "devices"])["comm_hook_used"].agg(lambda v: "/".join(sorted(set(map(str, v)))))
    names = {"shm": "shared memory", "none": "DDP's own all-reduce (Gloo/NCCL)"}
    parts = [f"{s} k={int(k)}: {names.get(v, v)}" for (s, k), v in used.items()]
    setting = "/".join(sorted(set(done["comm_hook"]) - {""})) or "none"  # the grouping key reads `none` as empty
    return [f"Gradient transport (train.comm_hook={setting}): " + "; ".join(parts) + "."] if parts else []


def _host_section(df):
    cols = ["host", "device_kind", "device_name", "host_devices"]
    h = df[df[cols[0]] != ""].groupby(cols, dropna=False).size().reset_index(name="trials")
    src = joined(df["data_source"]) or "unknown"
    return ["## Host and devices\n\n", md_table(h, [*cols, "trials"],
            ["host", "kind", "device", "devices N", "trials"]), f"\nData source: **{src}**.\n", *nodes_line(df)]



def _tables(df, pts, eff, mem, acc):
    x = shown_extras(df)
    n = ["nodes"] if (pts["nodes"] > 1).any() else []  # where some point's k devices spanned nodes (SLURM)
    s = ["\n## Throughput per point\n\n",
         "Median over learning rates (and repeats) of complete trials; accuracy from the best lr"
         + ("; nodes: the nodes its k devices spanned" if n else "") + ".\n\n",
         md_table(pts, ["strategy", "model", *x, "k", *n, "batch_size", "per_device_batch",
                        "throughput_img_s", "n_trials", "n_lrs", "best_lr", "test_acc"]),
         "\n## Scaling efficiency\n\n",
         "E(k) = T(k)/(k·T(1)) with T(1) measured by the same strategy: weak at fixed per-device "
         "batch b, strong at fixed global batch B. '—' = no k=1 reference (undefined, not 0). efficiency_95: its 95% "
         "bootstrap interval over measurement windows and trials ('—': one measurement, unknown); n_measured: "
         "windows/trials at k, then at k=1.\n"]
    for kind in ("weak", "strong"):
        e = confidence.interval_columns(eff[(eff["kind"] == kind) & (eff["k"] >= 2)])
        s += [f"\n### {kind.capitalize()} scaling\n\n",
              md_table(e, ["strategy", "model", *x, "k", *n, "per_device_batch", "batch_size",
                           "throughput_img_s", "base_throughput_img_s", "speedup", "efficiency", "efficiency_95",
                           "n_measured", "parallel_devices"])]
    mm = mem.assign(per_device_mib=_per_device_mib(mem["peaks"]),
                    **{f"{c}_mib": _per_device_mib(mem[c]) for c in MEM_LISTS},
                    peak_max_mib=mem["peak_max"] / MIB, dev0_excess_mib=mem["dev0_excess_bytes"] / MIB)
    gpu = [f"{c}_mib" for c in MEM_LISTS if mem[c].map(len).any()]  # GPU figures, shown where a row has them
    s += ["\n## Memory per device\n\n",
          "Per device in MiB, device 0 first. per_device_mib holds the figure mem_basis names; imbalance = max/mean "
          "and device-0 excess = peak[0] − mean(peak[1:]) (k ≥ 2) are computed from it. step_above_resident (GPUs): "
          f"{MEM_BASIS['step_above_resident']}, what the strategy itself costs, data and evaluation left out. "
          f"memtracker_step (CPU): {MEM_BASIS['memtracker_step']}."
          + (" resident: allocated before the first step (model, optimizer, the whole data set on every device); "
             "reserved_peaks: the caching allocator's reserved peak; nvml_used: the device's used memory as NVML "
             "sees it (every process and CUDA context on it, so extra contexts on device 0 show here); '—': not "
             "measured." if gpu else "") + "\n\n",
          md_table(mm, ["strategy", "model", *x, "k", "batch_size", "mem_method", "mem_basis", "per_device_mib",
                        *gpu, "peak_max_mib", "mem_imbalance", "dev0_excess_mib"]),
          "\n## Accuracy\n\n",
          "Final test accuracy and time to the target accuracy ('—': not reached).\n\n",
          md_table(acc, ["strategy", "model", *x, *(["epochs"] if acc["epochs"].nunique() > 1 else []),
                         "k", "batch_size", "lr", "test_acc", "time_to_acc_s", "target_acc"])]
    return s


def _problems(df, status):
    s = ["\n## Unavailable on this host\n\n"]
    un = df[(df["state"] == "skipped") & df["reason"].map(is_unavailable)]
    lines = [f"- **{st}**: {r} ({len(g)} point(s) skipped)"
             for (st, r), g in group_by(un, ("strategy", "reason"))]
    lines += [f"- **{n}**: {st['reason']}" for n, st in status.items() if st["status"] in ("missing", "empty")
              or st["status"].startswith("unreadable")]
    s += ["\n".join(lines) + "\n" if lines else "_none_\n"]
    other = df[(df["state"] == "skipped") & ~df["reason"].map(is_unavailable)]
    s += ["\n## Other skipped points\n\n",
          md_table(other.groupby(["strategy", "reason"], sort=False).size().reset_index(name="points"))]
    bad = df[~df["state"].isin(["complete", "skipped"])]
    s += ["\n## Failed and pruned trials\n\n",
          md_table(bad, ["strategy", "model", "k", "batch_size", "lr", "trial", "state", "reason"])]
    inter = df[df["interfered"] & (df["state"] == "complete")]
    s += ["\n## Excluded from throughput and efficiency: measured under interference\n\n",
          "Other processes used this host's cores while these trials ran (beyond the threshold of "
          "`pipeline/measure/interference.py`); their speed is not the strategy's. Accuracy and memory keep them.\n\n"
          if len(inter) else "",
          md_table(inter, ["strategy", "model", "k", "batch_size", "lr", "throughput_img_s", "foreign_cores",
                           "interference_reason"])]
    ov = df[df["oversubscribed"]]
    s += ["\n## Excluded: oversubscribed runs (functional tests, not in scaling or memory)\n\n",
          md_table(ov, ["strategy", "model", "k", "batch_size", "lr", "state", "throughput_img_s"])]
    return s


def knob_section(table) -> list[str]:
    """The DDP communication knobs' section: one table and one figure per varied knob (knobs.knob_table)."""
    if table.empty:
        return ["\n## DDP communication knobs\n\nNo knob was varied in these sweeps (turn them on with the "
                "`cpu-comm` profile or `sweep.spaces.ddp.<knob>: [...]`).\n"]
    out = ["\n## DDP communication knobs\n\nEach row is one measured point; accuracy beside throughput shows a "
           "faster but worse setting.\n"]
    for knob in table["knob"].unique():
        t = table[table["knob"] == knob].sort_values(["strategy", "k", "batch_size", "value"])
        out += [f"\n### {knob}\n\n", md_table(t, ["value", "strategy", "model", "k", "batch_size",
                                                  "throughput_img_s", "weak_efficiency", "test_acc"]),
                f"\n![{knob}](knob_{knob}.png)\n"]
    return out


def overlap_section(overlap_md: Path) -> list[str]:
    """The overlap stage's own markdown (results/overlap/overlap.md), or how to make it."""
    if not overlap_md.exists():
        return ["\n## Automatic parallelism and communication overlap\n\nNot measured: run the `overlap` stage "
                "(`dvc repro -s overlap`).\n"]
    return ["\n" + overlap_md.read_text()]


# What each part is, in plain words (comm_exposed: what the strategy issues; see pipeline/scaling/collectives.py)
PART_WORDS = {"data": "moving data in", "forward": "forward compute", "backward_compute": "backward compute",
              "optimizer": "the optimizer", "idle": "waiting for the slower rank",
              "residual": "unattributed loop overhead (residual)"}
# what a step's exposed communication is, per collective pattern of the catalog (catalog.COMM_PATTERNS)
COMM_WORDS = {"bucket_allreduce": "exposed all-reduce", "shard_units": "exposed all-gather/reduce-scatter",
              "copy_allreduce": "the hand-written all-reduce",
              "dp_gather_logits": "exposed scatter/replicate/gather copies",
              "dp_gather_losses": "exposed scatter/replicate/gather copies"}
MIN_SHOWN = 0.005  # a part that changed by less than half a percent of the step is not named


def _pct(v) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def _words(part, strategy) -> str:
    if part != "comm_exposed":
        return PART_WORDS[part]
    row = catalog.SPECS.get(strategy)
    return COMM_WORDS.get(row.comm if row else "", "exposed communication")


def loss_sentence(r) -> str:
    """One plain sentence from a breakdown_losses row: the step's loss against k=1, its parts largest first."""
    s, k, loss = r["strategy"], r["k"], r["loss"]
    parts = sorted(((r[f"loss_{p}"], p) for p in BD_ALL if abs(r[f"loss_{p}"]) >= MIN_SHOWN), reverse=True)
    worse = [f"{v:.0%} {_words(p, s)}" for v, p in parts if v > 0]
    better = [f"{-v:.0%} less {_words(p, s)}" for v, p in parts if v < 0]
    verb = "loses" if loss >= 0 else "gains"
    text = f"{s} at k={k:g} (b={r['per_device_batch']:g}) {verb} {abs(loss):.0%} of its step against k=1"
    text += (": " + ", ".join(worse)) if worse else ": no part grew by half a percent of the step or more"
    text += ("; offset by " + ", ".join(better)) if better else ""
    e = r["measured_efficiency"]
    return text + ("." if isinstance(e, float) and math.isnan(e)
                   else f" (measured weak-scaling efficiency from throughput: {e:.2f}).")


def _check_line(r) -> str:
    return (f"{r['strategy']} at k={r['k']:g} (b={r['per_device_batch']:g}): measured efficiency "
            f"{r['measured_efficiency']:.3f}, modelled {r['modelled_efficiency']:.3f} (modelled on "
            f"{r['interconnect']}); modelled error {r['rel_error']:+.1%}: "
            + (f"within the {r['tolerance']:.0%} tolerance." if r["within_tolerance"] else f"{r['verdict']}."))


def why_section(bd, losses, model, model_notes) -> list[str]:
    """"Why it scales": the measured breakdown in percent, one sentence per strategy at each k > 1, and the scaling
    model beside the measurements (every modelled number on a line that says "modelled")."""
    s = ["\n## Why it scales\n\n",
         "Where a sampled step goes (measured: synchronised wall clock around the step's phases, DDP's own statistics "
         "or the profiler for exposed communication, a timed barrier for idle; pipeline/measure/breakdown.py). "
         "Median over "
         "the point's complete trials, as a share of the median step; the residual is what the parts leave "
         "unexplained, shown, never folded into a part.\n\n"]
    t = bd.assign(step_ms=bd["step_s"] * 1e3, **{f"{p}_pct": bd[f"{p}_share"].map(_pct) for p in BD_ALL})
    s.append(md_table(t, ["strategy", "model", "k", "per_device_batch", "n_trials", "samples", "step_ms",
                          *(f"{p}_pct" for p in BD_ALL)],
                      ["strategy", "model", "k", "b", "trials", "samples", "step (ms)",
                       *(p.replace("_", " ") for p in BD_PARTS), "residual"]))
    s.append("\n![breakdown](breakdown.png)\n\n")
    if len(losses):
        s.append("Against k=1 at the same per-device batch, each part's change as a share of the step at k (they "
                 "add up to the step's loss 1 − step(1)/step(k)):\n\n")
        s.append("\n".join(f"- {loss_sentence(r)}" for r in losses.to_dict("records")) + "\n")
    else:
        s.append("No strategy has a breakdown at k=1 and k>1 at the same per-device batch: no loss to explain.\n")
    s.append("\n### The scaling model beside the measurements (modelled)\n\n"
             "Fitted only on each strategy's k=1 compute per image and the interconnect's collectives "
             "(pipeline/scaling/model.py); every number in this subsection is modelled unless it says measured.\n\n")
    checks = model[model["role"] == "check"] if len(model) else model
    if len(checks):
        s.append("\n".join(f"- {_check_line(r)}" for r in checks.to_dict("records")) + "\n")
    else:
        s.append("- No modelled error at a measured k: it needs this host's collectives (see below).\n")
    proj = model[model["role"] == "projection"] if len(model) else model
    if len(proj):
        proj = proj.assign(eff=proj["modelled_efficiency"].map(lambda v: f"{v:.3f}"),
                           step=proj["modelled_step_s"].map(lambda v: f"{v * 1e3:.1f}"))
        s += ["\nProjections past the host's devices (modelled, not measured):\n\n",
              md_table(proj, ["basis", "strategy", "model", "per_device_batch", "k", "interconnect", "eff", "step"],
                       ["basis", "strategy", "model", "b", "k", "interconnect", "modelled efficiency",
                        "modelled step (ms)"])]
    s += [f"\n- {n}" for n in model_notes]
    s.append("\n\n![model: measured vs modelled efficiency (modelled dashed)](model.png)\n")
    return s


def write_report(path, df, notes, status, pts, eff, mem, acc, extra=()):
    s = ["# Parallax analysis report\n\n"]
    synth = sorted(set(df.loc[df["data_source"] == "synthetic", "strategy"]))
    if synth:
        s.append("> **⚠️ WARNING: SYNTHETIC DATA.** Trials of " + ", ".join(synth) + " ran on "
                 "deterministic synthetic Fashion-MNIST-shaped data, not Fashion-MNIST: their "
                 "accuracies say nothing about the real task.\n\n")
    s += [f"{len(df)} trial rows, {int((df['state'] == 'complete').sum())} complete.\n\n"]
    s += _host_section(df) + host_capabilities_section(df)
    s += ["\n## Reading\n\n", "\n".join(f"- {line}" for line in _reading(pts, eff, mem, status)
                                         + _transports(df)) + "\n"]
    st = pd.DataFrame([{"strategy": k, **v} for k, v in status.items()])
    s += ["\n## Strategies\n\n", md_table(st, ["strategy", "status", "n_complete", "n_failed", "n_pruned",
                                               "n_skipped", "n_oversubscribed", "reason"])]
    s += _tables(df, pts, eff, mem, acc)
    s += ["\n## Figures\n\n"] + [f"![{n}]({n}.png)\n\n"
                                   for n in ("efficiency", "throughput", "memory", "accuracy")]
    s += list(extra)
    s += _problems(df, status)
    if notes:
        s += ["\n## Notes\n\n", "\n".join(f"- {n}" for n in notes) + "\n"]
    Path(path).write_text("".join(s))


