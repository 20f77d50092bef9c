"""The pipeline's last stage (analyze) ends with the report's answer on screen and where to look next, not with a
file name alone."""

from __future__ import annotations

from pathlib import Path

from pipeline.analysis.report.answer import COMMAND_HEADING
from pipeline.cli.commands import answer_screen

UI = "mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db"  # the caller's (client.ui_command)
REPORT = f"""# Parallax report

## Answer

**Use ddp at k=2** (quiet host): 1,800 images/s, the fastest measured on this host.

- **Why:** from k=1 to k=2 it keeps a weak-scaling efficiency of 0.90.

{COMMAND_HEADING}

```
.venv/bin/python -m pipeline train --strategy ddp
```

## Scaling
| table |
"""


def test_the_last_stage_shows_the_answer_and_what_to_open_next():
    screen = answer_screen(REPORT, Path("results/analysis"), UI)
    assert "**Use ddp at k=2**" in screen and "weak-scaling efficiency of 0.90" in screen
    assert COMMAND_HEADING not in screen and "pipeline train" not in screen
    assert "## Scaling" not in screen and "| table |" not in screen
    assert "Next: head -n 40 results/analysis/report.md" in screen and f"make ui (every run in MLflow; {UI})" in screen


def test_a_report_without_an_answer_says_so():
    assert "(report.md has no answer section)" in answer_screen("# Parallax report\n", Path("out"), UI)
