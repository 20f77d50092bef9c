"""The result contract of trial -> sweep -> analysis: the trial record and the sweep table (torch-free)."""
from pipeline.records.trial import TrialRecord, summarize, planned
from pipeline.records.table import write_table, read_table, trial_row
from pipeline.records.labels import BOUNDED, is_bounded

__all__ = ['BOUNDED', 'TrialRecord', 'is_bounded', 'planned', 'read_table', 'summarize', 'trial_row', 'write_table']
