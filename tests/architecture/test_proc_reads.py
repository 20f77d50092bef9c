"""No module in pipeline/ reads a process's state from /proc by hand: psutil gives a process's start, status, parent,
CPU times and descendants, and the host's CPU times, on Linux and macOS alike. The paths under /proc that stay are
those psutil has no call for, each named here with why (read from the code with `ast`; docstrings and comments do
not count)."""

from __future__ import annotations

import ast

from ..conftest import REPO

# (file, the /proc path in its code): why psutil does not serve it
ALLOWED = {
    ("pipeline/scratch.py", "/proc/self/ns/pid"): "the PID namespace's id, which no psutil call gives",
    ("pipeline/sweep/slurm.py", "/proc/sys/kernel/random/boot_id"): "the kernel's boot id, which no psutil call gives",
    ("pipeline/host/devices.py", "/proc/cpuinfo"): "the CPU's model name, family and model (psutil has no cpuinfo)",
    ("pipeline/host/capabilities.py", "/proc/cpuinfo"): "the CPU's instruction-set flags (psutil has no cpuinfo)",
    ("pipeline/trial/rdzv_watch.py", "/proc/self/fd"): (
        "this process's own descriptors, each duplicated into a socket and shut down (/dev/fd elsewhere); "
        "psutil's net_connections lists them but shuts none"
    ),
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def proc_paths(root=REPO) -> set[tuple[str, str]]:
    """(file, string) for every string in pipeline/'s code that names a path under /proc (f-strings: their text)."""
    found = set()
    for path in sorted((root / "pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)  # and the pieces of an f-string, read whole below
        skip |= {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                text = node.value
            else:
                continue
            if "/proc/" in text or text.rstrip("/") == "/proc":
                found.add((str(path.relative_to(root)), text))
    return found


def test_no_module_reads_a_process_from_proc_by_hand():
    found = proc_paths()
    unexplained = sorted(found - ALLOWED.keys())
    assert not unexplained, (
        f"pipeline/ reads /proc by hand: {unexplained}. Use psutil (pipeline/processes.py: a process's start and "
        f"liveness; psutil.cpu_times, Process.cpu_times, Process.children), or name the path in ALLOWED with why."
    )
    assert not sorted(ALLOWED.keys() - found), "ALLOWED names a /proc path the code no longer reads: remove it"


def test_a_hand_read_is_found(tmp_path):
    """The check itself: an f-string path under /proc is found, the same path in a docstring is not."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "m.py").write_text(
        '"""Reads /proc/<pid>/stat."""\n\ndef f(pid):\n    return open(f"/proc/{pid}/stat").read()\n'
    )
    assert proc_paths(tmp_path) == {("pipeline/m.py", "/proc/{}/stat")}
