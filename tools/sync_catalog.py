"""Rewrites what the strategy catalog (pipeline/catalog.py) generates: docs/strategies.md's table and dvc.yaml's
list of sweep stages (tests/architecture/test_catalog.py checks both). Run `python tools/sync_catalog.py` after
adding or changing a catalog row."""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from pipeline import catalog  # noqa: E402  (the checkout's pipeline, wherever this runs from)

DOC = REPO / "docs" / "strategies.md"
DVC = REPO / "dvc.yaml"
# dvc.yaml's one `foreach` of sweep stages: a fixed list, since DVC substitutes ${item} into a shell command
FOREACH = re.compile(r"^(    foreach: )\[[^\]]*\]$", re.M)


def regenerate(text: str) -> str:
    """`text` with the lines between catalog.DOC_BEGIN and catalog.DOC_END replaced by the catalog's table."""
    begin, end = text.index(catalog.DOC_BEGIN) + len(catalog.DOC_BEGIN) + 1, text.index(catalog.DOC_END)
    return text[:begin] + catalog.markdown_table() + text[end:]


def sweep_stages(text: str) -> list[str]:
    """The strategies dvc.yaml's sweep `foreach` lists."""
    found = FOREACH.findall(text)
    if len(found) != 1:
        raise ValueError(f"dvc.yaml has {len(found)} sweep foreach lines; expected one")
    m = FOREACH.search(text)
    return [s.strip() for s in m.group(0).split("[", 1)[1].rstrip("]").split(",") if s.strip()]


def with_sweep_stages(text: str) -> str:
    """`text` (dvc.yaml) whose sweep `foreach` lists every catalog strategy, in the catalog's order."""
    sweep_stages(text)  # exactly one
    return FOREACH.sub(lambda m: f"{m.group(1)}[{', '.join(catalog.NAMES)}]", text)


if __name__ == "__main__":
    DOC.write_text(regenerate(DOC.read_text()))
    DVC.write_text(with_sweep_stages(DVC.read_text()))
