"""The analysis stage: sweep tables -> scaling, memory and accuracy tables, plots, report (torch-free)."""

from pipeline.analysis.stage import analyze

__all__ = ["analyze"]
