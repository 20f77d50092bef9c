"""The benchmark scripts, run as modules from the repository root: python -m benchmarks.speed.vs_d2l."""
