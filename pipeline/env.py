"""Parallax's own settings read from environment variables (`env_number`, `env_flag`): a bad value is a ConfigError
that names the variable."""

from __future__ import annotations

import os


def env_number(
    name: str, default: float, lo: float, hi: float, what: str, lo_open: bool = False, environ=os.environ
) -> float:
    """The number the environment variable `name` holds, `default` when it is unset. An empty, non-numeric,
    non-finite or out-of-range value is a ConfigError that names the variable: read at import, such a value would
    otherwise surface as an unexpected ValueError, or run with a wait nobody meant."""
    import math

    from pipeline.config.loader import ConfigError

    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = None
    low = value is not None and (value < lo or (lo_open and value == lo))
    if value is None or not math.isfinite(value) or low or value > hi:
        kind = (
            "empty"
            if not raw.strip()
            else "not a number"
            if value is None
            else "not a finite number"
            if not math.isfinite(value)
            else "out of range"
        )
        span = f"above {lo:.10g} and up to {hi:.10g}" if lo_open else f"from {lo:.10g} to {hi:.10g}"
        raise ConfigError(
            f"The environment variable {name}={raw!r} is {kind}: it sets {what}. Give a number "
            f"{span}, or unset it (`unset {name}`) for the default, {default:.10g}. Nothing was run."
        )
    return value


def env_flag(name: str, what: str, environ=os.environ) -> bool | None:
    """The switch the environment variable `name` holds, read as MLflow reads its own (true/1, false/0, any case);
    None when it is unset. Any other value is a ConfigError that names the variable."""
    from pipeline.config.loader import ConfigError

    raw = environ.get(name)
    if raw is None:
        return None
    if raw.lower() not in ("true", "false", "1", "0"):
        raise ConfigError(
            f"The environment variable {name}={raw!r} is neither true nor false (MLflow reads true, false, 1 or 0): "
            f"it turns {what}. Set it to true or false, or unset it (`unset {name}`). Nothing was run."
        )
    return raw.lower() in ("true", "1")
