"""Hostile params and profile files: an alias bomb, a cycle of aliases, an oversized file and a special file are
refused with a ConfigError in bounded time and memory (each case runs in a child with a memory and time limit)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# nine levels of nine aliased mappings: 1.1 KB that expands to 9**9 (387 million) values; the first as a value
# that is checked (its error message shows it), the second as sections that are copied before any key is checked
KEYS = "abcdefghi"
LEVELS = ["&a0 {" + ", ".join(f"{k}: x" for k in KEYS) + "}"] + [
    f"&a{i} {{" + ", ".join(f"{k}: *a{i - 1}" for k in KEYS) + "}" for i in range(1, 10)
]
BOMB = "train: {lr: [" + ", ".join(LEVELS) + "]}\n"
SECTIONS = "".join(f"a{i}: {level}\n" for i, level in enumerate(LEVELS))


def _limits():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: the unbounded reader dies, not the host


def _load(root: Path, params: str | None = None, call: str = "load") -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        from pipeline.config import loader
        try:
            if {call!r} == "load":
                loader.load({params!r}, root=sys.argv[1])
            else:
                print(loader.describe_profiles(sys.argv[1]))
        except loader.ConfigError as e:
            print("ConfigError:", e)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        return subprocess.run(
            [sys.executable, "-c", code, str(root)],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
            preexec_fn=_limits,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the file was read for 30 s without an answer")


@pytest.fixture
def root(tmp_path):
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "cpu.yaml").write_text("description: the profile\ntrain: {epochs: 1}\n")
    return tmp_path


def test_an_alias_bomb_is_refused_before_it_expands(root):
    """A 1.1 KB params.yaml of nested aliases is refused with a message naming aliases, not expanded."""
    assert len(BOMB) < 1200 and len(SECTIONS) < 1200
    (root / "params.yaml").write_text(BOMB)
    p = _load(root)
    assert "ConfigError" in p.stdout and "alias" in p.stdout, p.stdout + p.stderr[-2000:]
    (root / "params.yaml").write_text(SECTIONS)
    p = _load(root)
    assert p.returncode == 0 and "ConfigError" in p.stdout and "alias" in p.stdout, p.stdout + p.stderr[-2000:]


def test_a_profile_alias_bomb_and_a_cycle_are_refused(root):
    """The same bound holds for a profile file, and a self-referencing alias is refused, not recursed into."""
    (root / "experiments" / "cpu.yaml").write_text(BOMB)
    p = _load(root)
    assert "ConfigError" in p.stdout and "alias" in p.stdout, p.stdout + p.stderr[-2000:]
    (root / "experiments" / "cpu.yaml").write_text("train: &t {lr: *t}\n")
    p = _load(root)
    assert "ConfigError" in p.stdout and "itself" in p.stdout, p.stdout + p.stderr[-2000:]


def test_the_shipped_profiles_and_their_aliases_still_load():
    """The profiles' own anchors (one space shared by several strategies) stay well inside the bound."""
    from pipeline.config import loader

    for name, text in loader.describe_profiles(REPO):
        assert not text.startswith("UNREADABLE"), (name, text)
    cfg = loader.load(REPO / "params.yaml", ["profile=cpu"], root=REPO)
    assert cfg.space("zero1") == cfg.space("fsdp") == cfg.space("ddp")  # one space, an anchor and its aliases


def test_special_and_oversized_files_are_refused(root):
    """A params file or profile that is /dev/zero, a FIFO or larger than the size bound is refused at once."""
    p = _load(root, "/dev/zero")
    assert "ConfigError" in p.stdout and "not a regular file" in p.stdout, p.stdout + p.stderr[-2000:]
    fifo = root / "fifo.yaml"
    os.mkfifo(fifo)
    p = _load(root, str(fifo))
    assert "ConfigError" in p.stdout and "not a regular file" in p.stdout, p.stdout + p.stderr[-2000:]
    big = root / "big.yaml"
    big.write_text("# " + "x" * (2 << 20) + "\ntrain: {epochs: 1}\n")
    p = _load(root, str(big))
    assert "ConfigError" in p.stdout and "larger than" in p.stdout, p.stdout + p.stderr[-2000:]
    (root / "experiments" / "zero.yaml").symlink_to("/dev/zero")
    p = _load(root, call="describe")
    assert "'zero', 'UNREADABLE" in p.stdout and "not a regular file" in p.stdout, p.stdout + p.stderr[-2000:]
    (root / "params.yaml").write_text("profile: zero\n")
    p = _load(root)
    assert (
        "ConfigError" in p.stdout
        and "zero.yaml is not a regular file (a character device, through a symbolic link)" in p.stdout
    ), p.stdout + p.stderr[-2000:]


def test_a_set_value_and_deep_nesting_are_bounded_too():
    """A --set value is read with the same alias bound, and nesting too deep to read is a ConfigError."""
    from pipeline.config import loader

    with pytest.raises(loader.ConfigError, match="--set option .* through its aliases"):
        loader.parse_set(["train.lr=[" + ", ".join(LEVELS) + "]"])
    with pytest.raises(loader.ConfigError, match="nests its values too deeply"):
        loader.parse_set(["train.lr=" + "[" * 5000 + "]" * 5000])
