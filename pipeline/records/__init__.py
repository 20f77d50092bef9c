"""The result contract of trial -> sweep -> analysis: the trial record and the sweep table (torch-free)."""

from pipeline.records.labels import BOUNDED, is_bounded
from pipeline.records.table import read_table, trial_row, write_table
from pipeline.records.trial import TrialRecord, planned, summarize

__all__ = ["BOUNDED", "TrialRecord", "is_bounded", "planned", "read_table", "summarize", "trial_row", "write_table"]
