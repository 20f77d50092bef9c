"""Turn the package's user-facing exceptions into a one-paragraph message and an exit status (no traceback)."""
from __future__ import annotations

import contextlib
import sys
import textwrap


class _Status:
    code = 0


@contextlib.contextmanager
def user_errors():
    from .config import ConfigError
    from .data import DataError
    from .launch import Infeasible, TrialFailed
    status = _Status()
    try:
        yield status
    except (ConfigError, Infeasible, DataError) as e:
        _say(f"error: {e}")
        status.code = 2  # bad input: nothing was run
    except TrialFailed as e:
        _say(f"error: the trial failed ({e.kind}): {e}")
        status.code = 1
    except KeyboardInterrupt:
        _say("interrupted")
        status.code = 130


def _say(msg: str) -> None:
    print(textwrap.fill(msg, width=100, break_long_words=False, break_on_hyphens=False), file=sys.stderr)
