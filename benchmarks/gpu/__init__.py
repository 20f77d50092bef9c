"""The GPU node's checks: the first run, the epoch benchmark, run.sh (gpu_node.sh)."""
