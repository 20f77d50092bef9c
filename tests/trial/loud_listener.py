"""A module of this project whose top-level code has a side effect: it writes $PARALLAX_LOUD_FILE when imported.
tests/trial/test_listener_entries.py names it in entries that must be refused before it is imported."""

import os
from pathlib import Path

Path(os.environ.get("PARALLAX_LOUD_FILE") or os.devnull).write_text("imported")


class Store:
    def __init__(self, cfg):
        pass

    def ended(self, trial, outcome):
        pass


def store(cfg):  # a function, not a class
    return Store(cfg)
