"""Rewrites docs/strategies.md's generated table from pipeline/catalog.py (tests/architecture/test_catalog.py checks
that they agree): `python tools/make_strategies_doc.py` after adding or changing a catalog row."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pipeline import catalog  # noqa: E402  (the checkout's pipeline, wherever this runs from)

DOC = REPO / "docs" / "strategies.md"


def regenerate(text: str) -> str:
    """`text` with the lines between catalog.DOC_BEGIN and catalog.DOC_END replaced by the catalog's table."""
    begin, end = text.index(catalog.DOC_BEGIN) + len(catalog.DOC_BEGIN) + 1, text.index(catalog.DOC_END)
    return text[:begin] + catalog.markdown_table() + text[end:]


if __name__ == "__main__":
    DOC.write_text(regenerate(DOC.read_text()))
