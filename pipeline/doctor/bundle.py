"""Build what an air-gapped GPU node needs to run Parallax's checks: `make gpu-bundle` -> dist/gpu-bundle/.

    python -m pipeline.doctor.bundle [--out dist/gpu-bundle] [--node-freeze FREEZE.txt]

The node keeps its own PyTorch (and everything else it has): the bundle carries the project as a wheel, plus wheels
of only those core requirements the node lacks (from `pip freeze` of the node, or the documented GPU node below),
the benchmark scripts, params.yaml and the profiles (experiments/: the first-run check's steps read them from the
bundle, as from a checkout), the seeds' reference recipe, and run.sh, which installs all of it without a registry
into a folder beside the node's packages and runs the first-run check, `doctor` and the GPU benchmarks. The size is
printed; over 64 MiB fails.

The documented node has torch, pandas, matplotlib and pytest only (none of which pulls in pyyaml, tqdm or psutil),
so a default bundle carries pyyaml, tqdm and psutil: about 5 MiB, since pyyaml's and psutil's wheels are compiled and
one is carried per CPython in NODE_PYTHONS (run.sh's pip picks the node's). A richer image (most GPU images have
them) ignores them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 64 * 2**20
# the GPU node as documented (PyTorch 2.11.0+cu130 on Python 3.12, pandas, matplotlib, pytest; numpy comes with
# pandas, packaging with matplotlib and pytest): no pyyaml, tqdm, psutil, torchvision, nvidia-ml-py, MLflow, Optuna
# or DVC
DOCUMENTED_NODE = [
    "torch==2.11.0",
    "numpy==2.3.3",
    "pandas==2.3.3",
    "matplotlib==3.10.7",
    "pytest==8.4.2",
    "packaging==25.0",
]
# the CPythons a compiled wheel is carried for: the documented node's 3.12, and its neighbours (a wheel each, <1 MiB)
NODE_PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.14")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def node_packages(freeze_lines) -> dict[str, str]:
    """name (normalised) -> version, from `pip freeze` lines (`name==version`; other forms are skipped)."""
    from packaging.utils import canonicalize_name

    out = {}
    for line in freeze_lines:
        name, sep, version = line.strip().partition("==")
        if sep and not line.startswith(("#", "-")):
            out[canonicalize_name(name)] = version.split("+")[0]
    return out


def missing(requirements, have: dict[str, str]) -> list[str]:
    """The requirements (PEP 508 strings, no markers or extras) that the node's packages do not satisfy."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lacking = []
    for text in requirements:
        req = Requirement(text)
        version = have.get(canonicalize_name(req.name))
        if version is None or (req.specifier and not req.specifier.contains(version, prereleases=True)):
            lacking.append(text)
    return lacking


def core_requirements() -> list[str]:
    """pyproject.toml's [project] dependencies (the training core; no extras)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def verify() -> list[str]:
    """On the node, after the install: the installed project's core requirements that this Python does not meet
    (checked directly, so that unrelated conflicts in a cluster image's packages cannot fail the install)."""
    from importlib import metadata

    have = {}
    for dist in metadata.distributions():
        have.setdefault(dist.metadata["Name"], dist.version)
    reqs = [r for r in metadata.requires("parallax") or [] if "extra ==" not in r]
    return missing(reqs, node_packages(f"{k}=={v}" for k, v in have.items()))


def _pip(*args):
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def carry(out: Path, peer: Path | None) -> None:
    """Everything but the wheels: benchmarks/, the configuration, the reference recipe and run.sh."""
    shutil.copytree(
        REPO / "benchmarks", out / "benchmarks", ignore=shutil.ignore_patterns("out", "__pycache__", "RESULTS.md")
    )
    # the configuration the first-run check's steps read: beside benchmarks/, the bundle is their root as a checkout
    # would be (gpu_first_run.project_root), wherever run.sh is started from
    shutil.copy2(REPO / "params.yaml", out / "params.yaml")
    shutil.copytree(REPO / "experiments", out / "experiments", ignore=shutil.ignore_patterns("__pycache__"))
    if peer and peer.exists():
        (out / "peers").mkdir()
        shutil.copy2(peer, out / "peers" / peer.name)
    shutil.copy2(REPO / "benchmarks" / "gpu" / "gpu_node.sh", out / "run.sh")
    (out / "run.sh").chmod(0o755)


def build(out: Path, node: dict[str, str], peer: Path | None) -> Path:
    if out.exists():
        shutil.rmtree(out)
    wheels = out / "wheels"
    wheels.mkdir(parents=True)
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO))
    lacking = missing(core_requirements(), node)
    if any(r.lower().startswith("torch") for r in lacking):
        raise SystemExit(
            f"the node lacks a supported PyTorch ({[r for r in lacking if r.startswith('torch')]}): "
            "install the CUDA build matching its driver there first; a bundle does not carry one."
        )
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    for version in NODE_PYTHONS if lacking else ():  # a pure-Python wheel is downloaded once, the others per version
        _pip(
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            version,
            "--implementation",
            "cp",
            *plat,
            "-d",
            str(wheels),
            *lacking,
        )
    # what run.sh installs by name from wheels/ (pip picks each one's wheel for the node's Python)
    (wheels / "install.txt").write_text("\n".join(["parallax", *lacking]) + "\n")
    carry(out, peer)
    (out / "CONTENTS.txt").write_text(
        "Parallax GPU bundle. On the node: bash run.sh OUT_DIR (see the top of run.sh).\n"
        f"wheels: {', '.join(sorted(p.name for p in wheels.iterdir()))}\n"
        f"the node was assumed to have: {', '.join(f'{k}=={v}' for k, v in sorted(node.items()))}\n"
        f"carried for what it lacks: {', '.join(lacking) or 'nothing'}\n"
    )
    tar = out.with_suffix(".tar.gz")
    with tarfile.open(tar, "w:gz") as tf:
        tf.add(out, arcname=out.name)
    return tar


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.doctor.bundle",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    p.add_argument("--out", type=Path, default=REPO / "dist" / "gpu-bundle", help="default: dist/gpu-bundle")
    p.add_argument(
        "--node-freeze",
        type=Path,
        metavar="FILE",
        help="`pip freeze` of the node's Python (default: the documented node: " + ", ".join(DOCUMENTED_NODE) + ")",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="on the node, after installing: check that this Python meets the core requirements",
    )
    p.add_argument(
        "--peer",
        type=Path,
        default=REPO.parent / "shared" / "peers" / "d2l_reference.py",
        help="the seeds' reference recipe for the GPU benchmark (default: ../shared/peers/d2l_reference.py)",
    )
    args = p.parse_args(argv)
    if args.verify:
        lacking = verify()
        print("core requirements: " + (f"NOT MET: {', '.join(lacking)}" if lacking else "all met"))
        return 1 if lacking else 0
    lines = args.node_freeze.read_text().splitlines() if args.node_freeze else DOCUMENTED_NODE
    tar = build(args.out.resolve(), node_packages(lines), args.peer)
    d, t = size(args.out), size(tar)
    print(f"bundle: {args.out} ({d / 2**20:.2f} MiB), {tar} ({t / 2**20:.2f} MiB); limit 64 MiB")
    if not args.peer.exists():
        print(f"note: no reference recipe at {args.peer}: the GPU benchmark will run without the d2l comparison")
    if max(d, t) > LIMIT:
        print("error: the bundle is over 64 MiB; carry fewer wheels (give the node's --node-freeze)", file=sys.stderr)
        return 1
    print(f"on the node: copy {tar.name} over, then: tar xzf {tar.name} && bash {args.out.name}/run.sh RESULTS_DIR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
