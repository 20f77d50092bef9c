"""The project speaks in the present tense: no file tells how it was built.

Every tracked text file (`git ls-files`: *.md, *.py, *.yaml, *.yml, *.toml, Makefile, .ci/run) is read line by line
for two kinds of phrase:
- build history, forbidden everywhere: issue numbers, work sessions, numbered build steps, "the review", "the issue's";
- narration of a change ("as before", "changed since", "was: ", "used to fail"), forbidden everywhere except in
  CHANGELOG.md (whose job it is) and the dated logs under benchmarks/log/ (each says what held on its date).
A failure names every file:line and the phrase; say what holds now, or move the change to CHANGELOG.md.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SELF = "tests/architecture/test_present_tense.py"

SUFFIXES = (".md", ".py", ".yaml", ".yml", ".toml")
NAMES = ("Makefile", ".ci/run")

# Each pattern is narrow on purpose: "session" alone is a pytest fixture scope, an MLflow or profiler session, a
# process session (start_new_session); "step 5" is a training step. Only the history forms are caught.
HISTORY = [
    re.compile(r"\bissues?\s*#\s*\d*", re.I),  # issue #24, issues #3
    re.compile(r"\bissues?\s+\d+\b", re.I),  # issue 24, issues 15, 16
    re.compile(r"\bthe issue'?s\b", re.I),  # the user
    re.compile(r"\b(PR|pull request)\s*#\d+", re.I),
    re.compile(r"\bsessions?[\s-]+\d+\b", re.I),  # session 2, session-2
    re.compile(r"\b(this|that|earlier|previous|same|build|work) session\b", re.I),
    re.compile(r"\b(build|work|plan) steps?\b", re.I),  # build step 12
    re.compile(r"\bstep\s*#\d+", re.I),
    re.compile(r"\bthe review\b", re.I),  # a reviewer's document
    re.compile(r"\breview commit\b", re.I),
]
NARRATION = [
    re.compile(r"(?<!afterwards )(?<!reads )\bas before\b(?! (the|it|any|each|a)\b)", re.I),
    re.compile(r"\bchanged since\b", re.I),
    re.compile(r"(?<!it )\bwas: ", re.I),  # not "the page as it was: PATH"
    re.compile(r"\bused to (run|fail|read|be|hang|print|exit|call|crash|show|say|go|take)\b", re.I),
    re.compile(r"\bpredate", re.I),
    re.compile(r"\bsince renamed\b", re.I),
    re.compile(r"\b(before|after) this change\b", re.I),
    re.compile(r"\bthe old code\b", re.I),
]
NARRATION_ALLOWED = ("CHANGELOG.md", "benchmarks/log/")


def tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    files = [p for p in out.split("\0") if p]
    return sorted(
        p
        for p in files
        if p != SELF and (p.endswith(SUFFIXES) or p in NAMES or p.endswith("/Makefile")) and (REPO / p).is_file()
    )


def hits(path: str, text: str) -> list[str]:
    patterns = HISTORY if path.startswith(NARRATION_ALLOWED) else HISTORY + NARRATION
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for pat in patterns:
            m = pat.search(line)
            if m:
                found.append(f"{path}:{n}: {m.group(0)!r}: {line.strip()[:140]}")
                break
    return found


def test_the_scan_sees_the_project():
    files = tracked_text_files()
    assert "README.md" in files and "Makefile" in files and any(f.startswith("pipeline/") for f in files), files


def test_the_patterns_catch_history_and_spare_ordinary_words():
    caught = [
        "fixed in issue 24",
        "see issue #7",
        "(issues 15, 16, 17)",
        "the issue's user measured",
        "session 2",
        "not resolved this session",
        "build step 12",
        "exactly as before",
        "changed since the split",
        "default was: auto",
        "the session-2 figures",
        "a negative count used to run nothing",
        "the tests predate the split",
    ]
    spared = [
        "a synthetic data directory made once per session",
        "one profiler session per trial process",
        "start_new_session=True",
        "loss became nan at step 5",
        "steps 1 and 2 run on svc01",
        "is as empty afterwards as before",
        "as before the first step",
        "the MLflow session",
        "the last session's event records",
        "the page as it was: /tmp/x.png",
    ]
    for line in caught:
        assert hits("x.md", line), line
    for line in spared:
        assert not hits("x.md", line), line
    assert hits("CHANGELOG.md", "issue 24") and not hits("CHANGELOG.md", "as before")


def test_no_tracked_file_tells_how_it_was_built():
    found = [h for p in tracked_text_files() for h in hits(p, (REPO / p).read_text(errors="replace"))]
    assert not found, (
        "say what holds now (history goes to CHANGELOG.md, dated figures to benchmarks/log/):\n" + "\n".join(found)
    )
