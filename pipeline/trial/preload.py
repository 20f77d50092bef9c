"""What a trial's forkserver imports before it serves its first fork (start.py), and nothing else: importing this
module is its effect, so only the server imports it.

The imports run with the garbage collector off (torch and torch._dynamo allocate hundreds of thousands of objects, and
collections during their import cost about a tenth of its time), then everything imported is frozen out of the
collector's reach (its pages are then never written by a collection in the forked ranks) and the collector is on
again, for the server and every rank it forks.
"""

import gc

gc.disable()
try:
    import importlib

    from pipeline.trial import start

    for module in (*start.IMPORTS, "pipeline.trial.ranks"):  # what every rank needs, and the rank entry
        importlib.import_module(module)
finally:
    gc.freeze()
    gc.enable()
