"""`python -m pipeline COMMAND`: the command line, whose parser and commands live in pipeline/cli/.

python -m pipeline --help                         # the commands: download, train, sweep, analyze, doctor, ...
"""

from pipeline.cli import exit_now, main

if __name__ == "__main__":
    exit_now(main())  # an unexpected exception propagates: traceback, normal exit
