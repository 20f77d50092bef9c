"""argparse types of the command line's options: each refuses, before anything runs, a value that would otherwise
run silently on something other than what the user meant."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from pipeline import zoo
from pipeline.paths import too_long


def model(text: str) -> str:
    """--model: any model pipeline/zoo.py can build (`python -m pipeline models` lists them), never a module path."""
    if why := zoo.refusal(text, "--model"):
        raise argparse.ArgumentTypeError(why)
    return text


def path(text: str) -> Path:
    """A path option (--out, --params, --sweeps): never empty. Path("") is ".", so `--out ""` (an unset shell
    variable) would write, and clear old outputs, in whatever directory the command runs in. Nor too long for the
    file system, which would end the command in an OSError from wherever the path is first used."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "the path is empty (an unset shell variable?), and an empty path would "
            "silently mean the current directory. Give the path (`.` for the current "
            "directory). Nothing was run."
        )
    if why := too_long(text):
        raise argparse.ArgumentTypeError(f"the path {why}. Give a shorter path. Nothing was run.")
    return Path(text)


def n_trials(text: str) -> int:
    """--n-trials: 0 is the study's set-up step (docs/scale-out.md); a negative count is refused."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None  # argparse's own words
    if n < 0:
        raise argparse.ArgumentTypeError(
            f"{n} is negative. Give N >= 1 to run at most N trials in this worker, 0 to "
            f"set up the study only (no trial is run), or leave --n-trials out to run "
            f"every trial the study still lacks. Nothing was run."
        )
    return n


def port(text: str) -> int:
    """argparse type of --port: a whole number from 1 to 65535, refused before anything runs (cli/ui.py: and free)"""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (1-65535)") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


_SIZE = re.compile(r"^\s*(-?[0-9.]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_POWER = {"B": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def parse_size(text: str) -> int:
    """A memory size in bytes: '80GiB', '79.6 GiB', '512MiB', '80G' (binary: KiB..TiB, and K..T alone, as `free`
    and `ls -h` mean them), '80GB' (decimal: KB..TB are powers of 1000, as a part's label means them), '1024'
    (bytes). A sign is read ('-5GiB' is -5 x 2^30), so a range check (device_memory) says what is wrong with it."""
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a memory size: {text!r} (e.g. 80GiB, 80GB = 80e9 bytes, 40G, 512MiB)")
    unit = (m.group(2) or "B").upper()
    decimal = len(unit) == 2 and unit.endswith("B") and unit != "B"  # KB, MB, GB, TB
    return int(float(m.group(1)) * (1000 if decimal else 1024) ** _POWER[unit[0]])


def memory_size(text: str) -> int:
    """--device-memory: bytes, units read as they are written (80GB = 80e9 bytes, 80GiB and 80G = 80 x 2^30), so a
    part's label and the memory torch reports are not taken for one another."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}. Nothing was run.") from None


def _whole(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what}). Nothing was run.") from None


def batch_size(text: str) -> int:
    """--batch-size: the global batch, 1 or more (0 or a negative batch would model a step that takes no image)."""
    n = _whole(text, "the global batch, 1 or more")
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a batch: give the global batch, 1 or more. Nothing was run.")
    return n


def device_counts(text: str) -> tuple[int, ...]:
    """--devices: comma-separated device counts k, each from 1 to DEVICES_MAX (with its reason)."""
    from pipeline.config.schema import DEVICES_MAX, DEVICES_WHY

    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError("no device count given: e.g. --devices 1,2,4,8. Nothing was run.")
    if not all(parts):
        raise argparse.ArgumentTypeError(f"an empty device count in {text!r}: e.g. --devices 1,2,4,8. Nothing was run.")
    ks = tuple(dict.fromkeys(_whole(p, "a device count k") for p in parts))  # each k once, in the order given
    for k in ks:
        if not 1 <= k <= DEVICES_MAX:
            raise argparse.ArgumentTypeError(
                f"{k} devices: a count k is from 1 to {DEVICES_MAX} ({DEVICES_WHY}), as train.devices is. "
                f"Nothing was run."
            )
    return ks


def strategy_names(text: str) -> list[str]:
    """--strategies: comma-separated names of the catalog's strategies; an unknown one is refused with the valid."""
    from pipeline.config.schema import STRATEGY_NAMES

    names = list(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))  # each once, in the order given
    unknown = [s for s in names if s not in STRATEGY_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"{'unknown strategy ' + ', '.join(map(repr, unknown)) if unknown else 'no strategy given'}; valid: "
            f"{', '.join(STRATEGY_NAMES)}. Nothing was run."
        )
    return names


# the smallest and largest memory of one device that fit models: below 1 MiB not even the CUDA context fits; the
# largest GPU has a few hundred GiB, and 16 TiB covers any part while catching a unit typed three places too high
DEVICE_MEMORY_MIN = 1 << 20
DEVICE_MEMORY_MAX = 16 << 40


def device_memory(text: str) -> int:
    """--device-memory: a memory_size from 1 MiB to 16 TiB."""
    n = memory_size(text)
    if not DEVICE_MEMORY_MIN <= n <= DEVICE_MEMORY_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r} is {n:,} bytes: one device's memory is from 1MiB (less holds not even the CUDA context) to "
            f"16TiB (more than any GPU: a unit typed too high?). Nothing was run."
        )
    return n


def count(what: str, lo: int = 1, hi: int | None = None):
    """argparse type of a benchmark's whole-number flag (rounds, images, a batch, steps): from `lo` (1: 0 rounds or a
    batch of 0 measures nothing and prints n/a or nan) up to `hi` where more only exhausts memory or time."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what}). Nothing was run.") from None
        if n < lo or (hi is not None and n > hi):
            rng = f"from {lo} to {hi:,}" if hi is not None else f"{lo} or more"
            raise argparse.ArgumentTypeError(f"{n} {what}: give {rng}. Nothing was run.")
        return n

    parse.__name__ = what  # argparse names the type in its own messages
    return parse


def counts(what: str, lo: int = 1, hi: int | None = None):
    """argparse type of a comma-separated list of `count`s (device counts, batches)."""
    one = count(what, lo, hi)

    def parse(text: str) -> list[int]:
        parts = [t.strip() for t in text.split(",") if t.strip()]
        if not parts:
            raise argparse.ArgumentTypeError(f"no {what} given (comma-separated, e.g. 1,2). Nothing was run.")
        return [one(t) for t in parts]

    parse.__name__ = what
    return parse


def positive(what: str, hi: float | None = None):
    """argparse type of a real-number flag (seconds, a tolerance): finite and above 0 (nan and inf compare false
    with every bound, so each would pass a plain `<= 0` check and print nan figures)."""

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what}). Nothing was run.") from None
        if not math.isfinite(x) or x <= 0 or (hi is not None and x > hi):
            rng = f"above 0, at most {hi:g}" if hi is not None else "finite and above 0"
            raise argparse.ArgumentTypeError(f"{text} {what}: give a number {rng}. Nothing was run.")
        return x

    parse.__name__ = what
    return parse


def busy_cores(text: str) -> float:
    """argparse type of --answer-load-cores: the cores other processes kept busy, finite and at least 0, or nan
    (under load, the cores not measured)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of busy cores. Nothing was run.") from None
    if math.isnan(x) and text.strip().lower() == "nan":
        return x
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(
            f"{text} busy cores: give a number at least 0, or nan for a load whose cores were not measured. Nothing "
            "was run."
        )
    return x
