"""How fast a trial runs: against the seeds' recipe, MFU, autocast's cost, ablations."""
