"""Like against like: when two figures measured on a shared host may be compared (ranked, divided, said to be clear
of one another), the largest set of figures that may all be compared, and the words for a pair that may not.

The rule (docs/metrics.md, "Like against like"). Each figure carries the background load it was measured beside
(points.point_table: `under_load`, and `load_cores`, the median cores other processes kept busy during its trials,
interference.py's `foreign_cores`). Two figures are comparable when
- both were measured quietly (every trial behind each within interference.py's threshold), or
- both were measured under load, each with its busy cores measured, and those differ by at most LOAD_TOLERANCE.
A quiet figure and a loaded one never are, however close their loads: the load is what would decide between them.
A loaded figure whose busy cores were not measured (flagged for steal or a GPU reason) is comparable with none.

Pure: rows (mappings with `under_load` and `load_cores`) in, booleans, rows and sentences out. Built on nothing but
the standard library, so every table and the report use the one rule.
"""

from __future__ import annotations

import math
from typing import TypeGuard

# Two loaded figures this close in busy cores are compared: interference.py flags a trial beyond 0.25 cores busy
# elsewhere (train.interference_threshold's default), so two loads within it differ by no more than what a trial
# counted as quiet may carry. (Not imported: the analysis wing does not import pipeline/measure.)
LOAD_TOLERANCE = 0.25
REPEATS_AGAIN = 2  # sweep.repeats in the rerun command: every point measured once more (profiles measure once)


def _nan(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def load(r) -> float | None:
    """The busy cores a figure was measured beside, the one reading of a row's `under_load` and `load_cores`: None
    quietly, its median busy cores under load, NaN under load with the cores not measured (never None, which would
    read as quiet)."""
    if not r.get("under_load"):
        return None
    v = r.get("load_cores")
    return math.nan if _nan(v) else float(v)


def _measured(v: float | None) -> TypeGuard[float]:
    """Whether a load (`load`) is a number of busy cores: neither quiet nor unmeasured."""
    return v is not None and not math.isnan(v)


def comparable(a, b) -> bool:
    """The rule: both quiet, or both under load with measured busy cores at most LOAD_TOLERANCE apart."""
    la, lb = load(a), load(b)
    if la is None or lb is None:
        return la is None and lb is None  # a quiet figure and a loaded one never are
    if not (_measured(la) and _measured(lb)):
        return False
    return abs(la - lb) <= LOAD_TOLERANCE + 1e-9  # loads are rounded to 3 decimals: 1.45 and 1.70 are 0.25 apart


def condition(r) -> str:
    """How a figure was measured, in words, the one phrasing of its load: "quietly", "beside 1.31 busy cores",
    "under load (busy cores not measured)"."""
    v = load(r)
    if v is None:
        return "quietly"
    return f"beside {v:.2f} busy cores" if _measured(v) else "under load (busy cores not measured)"


def largest_group(rows: list, who: str = "strategy") -> list:
    """The largest set of rows that are all comparable with one another: the one covering the most distinct `who`
    values, then a quiet one, then the most rows, then the least load. Every row when all are quiet; [] for none.
    Loaded rows form a group when their busy cores lie within LOAD_TOLERANCE of its least loaded one's."""
    if not rows:
        return []
    quiet = [r for r in rows if load(r) is None]
    known = sorted(((v, r) for r in rows if _measured(v := load(r))), key=lambda x: x[0])
    groups = [quiet] if quiet else []
    groups += [[r for v, r in known if 0 <= v - low <= LOAD_TOLERANCE + 1e-9] for low, _ in known]
    groups += [[r] for r in rows if (v := load(r)) is not None and not _measured(v)]

    def rank(g):
        v = load(g[0])
        return (len({r[who] for r in g}), v is None, len(g), -(v if _measured(v) else 0.0))

    return max(groups, key=rank)


def load_range(rows: list) -> str:
    """The conditions of a comparable group in words: "quietly", "beside 1.16-1.31 busy cores"."""
    loads = [v for r in rows if _measured(v := load(r))]
    if not rows or load(rows[0]) is None:
        return "quietly"
    if len(loads) < len(rows):
        return "under load (busy cores not measured)"
    lo, hi = min(loads), max(loads)
    return f"beside {lo:.2f} busy cores" if f"{lo:.2f}" == f"{hi:.2f}" else f"beside {lo:.2f}-{hi:.2f} busy cores"


def rerun(data_source: str = "", interpreter: str = "") -> str:
    """The command that measures every point once more (a study's trials are kept: a higher sweep.repeats adds a
    round), on the data the figures were measured on; a point with quiet trials then takes its figures from those.
    `interpreter`: ".venv/bin/python" where the checkout's venv runs this (dvc beside it), else plain `dvc`."""
    dvc = interpreter.removesuffix("python") + "dvc" if interpreter.endswith("/python") else "dvc"
    synthetic = " -S data.source=synthetic" if data_source == "synthetic" else ""
    return f"{dvc} exp run -S sweep.repeats={REPEATS_AGAIN}{synthetic}"


def not_comparable(named, command: str = "") -> str:
    """The plain sentence for figures that may not be compared: `named`, (name, row or its condition in words) for
    each: "not comparable on this host: X was measured quietly, Y beside 1.31 busy cores; rerun on a quiet host
    (`command`)", the command left out where none is given (the reader holds it: `train`'s own)."""
    said = [(name, how if isinstance(how, str) else condition(how)) for name, how in named]
    (first, how), rest = said[0], said[1:]
    return (
        f"not comparable on this host: {first} was measured {how}"
        + "".join(f", {name} {h}" for name, h in rest)
        + "; rerun on a quiet host"
        + (f" (`{command}`)" if command else "")
    )
