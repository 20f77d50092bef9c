"""The command line: `python -m pipeline COMMAND` parses its arguments (parser.py), runs one command (commands.py)."""

from pipeline.cli.commands import exit_now, main
from pipeline.cli.parser import build_parser

__all__ = ["build_parser", "exit_now", "main"]
