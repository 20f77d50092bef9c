"""Markdown tables for the report (GitHub flavour, no tabulate dependency): one cell format for every section."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


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
