"""The analysis stage: sweep tables -> scaling, memory and accuracy tables, plots, report (torch-free).

The stage is `pipeline.analysis.stage.analyze`; the package imports nothing itself, so a command that reads one
table rule (train's verdict: tables/comparable.py) runs where matplotlib and pandas are absent (a GPU node)."""
