"""The `--set` arguments of a tiny synthetic `train` (128 training and 64 test images, one warm-up step), shared by
the two-node tests that start `python -m pipeline train` themselves."""

from __future__ import annotations


def tiny_synthetic_sets(synthetic_root) -> list[str]:
    sets = [
        f"data.dir={synthetic_root}",
        "data.source=synthetic",
        "profile=",
        "data.train_limit=128",
        "data.test_limit=64",
        "train.warmup_steps=1",
    ]
    return [word for s in sets for word in ("--set", s)]
