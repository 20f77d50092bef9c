"""The pipeline's last stage (analyze) ends with the report's answer on screen and where to look next, not with a
file name alone."""

from __future__ import annotations

from pathlib import Path

from pipeline.cli.commands import answer_screen

REPORT = """# Parallax report

## Answer

**Use ddp at k=2** (quiet host): 1,800 images/s, the fastest measured on this host.

- **Why:** from k=1 to k=2 it keeps a weak-scaling efficiency of 0.90.

Run it (or take the sections of results/analysis/best.yaml into your params.yaml):

```
.venv/bin/python -m pipeline train --strategy ddp
```

## Scaling
| table |
"""


def test_the_last_stage_shows_the_answer_and_what_to_open_next():
    screen = answer_screen(REPORT, Path("results/analysis"))
    assert "**Use ddp at k=2**" in screen and "weak-scaling efficiency of 0.90" in screen
    assert "Run it" not in screen and "## Scaling" not in screen and "| table |" not in screen
    assert "Next: head -n 40 results/analysis/report.md" in screen and "make ui" in screen


def test_a_report_without_an_answer_says_so():
    assert "(report.md has no answer section)" in answer_screen("# Parallax report\n", Path("out"))
