"""The analysis wing's numbers: the sweep tables read into one typed frame (rows.py), the per-point tables
(points.py), their bootstrap intervals (stats.py), the step-time breakdown (step_parts.py), the knobs' table
(knob_effects.py), the scaling model's table (projection.py), and summary.json / metrics.json (summary.py).

Pure: frames in, frames and plain dicts out; no files written, no figures, no markdown. The floor of the wing:
report/ and plots/ read these tables; nothing here imports either.
"""
