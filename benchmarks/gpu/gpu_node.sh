#!/usr/bin/env bash
# Parallax on an air-gapped GPU node, from the bundle `make gpu-bundle` builds (this file is its run.sh):
# installs the project without a registry into a folder of its own on PYTHONPATH, beside the node's Python and its
# own PyTorch (neither is touched), then runs the first-run check (on a CUDA host: benchmarks/gpu/gpu_first_run.py,
# under 10 minutes, one row per review finding in first-run.md; its steps read this folder's params.yaml and
# experiments/, and size their limits on one timed trial), `doctor` and the GPU benchmark, all under OUT_DIR.
# (A folder, not a venv: a venv made from a venv's Python does not see that venv's packages, as on images whose
# PyTorch lives in a venv.)
#
#   bash run.sh [OUT_DIR]           (default ./parallax-gpu-results)
#   PYTHON=python3.12 bash run.sh   the node's Python, the one that has its PyTorch (default: python3)
#   PARALLAX_SITE=DIR               where the project is installed (default: $TMPDIR/parallax-site)
#   FIRST_RUN=only                  the first hour on a GPU node: install, then only the first-run check (<= 10 min,
#                                   OUT_DIR/first-run/first-run.md: one row per review finding G1-G22)
#   FIRST_RUN=skip                  doctor and the benchmark only
#   QUICK=1                         a two-minute smoke run (a few strategies, a small epoch) instead of the full check
#   DOCTOR_ARGS="..." BENCH_ARGS="..."  doctor's and the benchmark's own arguments instead of QUICK's or the full
#                                   check's, e.g. DOCTOR_ARGS="--strategies single,ddp --steps 3"
#   FIRST_RUN_ARGS="..."            the first-run check's own arguments; under a limit shorter than its 580 s default
#                                   (a GPU booked ten minutes at a time, the install included), give it the seconds
#                                   it may use: FIRST_RUN_ARGS="--budget-s 420". first-run.md is rewritten after
#                                   each step, so a run stopped early still leaves the steps it finished. Without a
#                                   CUDA device the check is skipped (FIRST_RUN=only then exits 1, saying so) unless
#                                   FIRST_RUN_ARGS=--allow-cpu: then it rehearses on the CPU, smaller
# The last line names the results files this run wrote (none: it says so).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="$(mkdir -p "${1:-parallax-gpu-results}" && cd "${1:-parallax-gpu-results}" && pwd)"
PY="${PYTHON:-python3}"
SITE="${PARALLAX_SITE:-${TMPDIR:-/tmp}/parallax-site}"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

before="$("$PY" -c 'import torch; print(torch.__version__)')"
# nothing is fetched (--no-index) and nothing the node has is touched (--no-deps, a folder of its own): the project
# and only the wheels of what the node lacked when the bundle was built; then the core requirements are checked
# (wheels/install.txt names the project and what the node lacked; a compiled wheel is there once per CPython)
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --find-links "$HERE/wheels" --target "$SITE" -r "$HERE/wheels/install.txt"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pipeline.doctor.bundle --verify
after="$("$PY" -c 'import torch; print(torch.__version__)')"
echo "torch before install: $before, after: $after" | tee "$OUT/install.txt"
[ "$before" = "$after" ] || { echo "error: installing Parallax changed the node's PyTorch" >&2; exit 1; }

cd "$OUT"  # doctor and the benchmark write here; the synthetic data, too
if [ "${QUICK:-0}" = 1 ]; then
  doctor_args=(--strategies single,dp,ddp,ddp_amp --steps 3)
  bench_args=(--models lenet --images 2048 --rounds 1 --rungs single,ddp,ddp_amp)
else
  doctor_args=()
  bench_args=()
fi
if [ -n "${DOCTOR_ARGS+set}" ]; then read -r -a doctor_args <<< "$DOCTOR_ARGS"; fi
if [ -n "${BENCH_ARGS+set}" ]; then read -r -a bench_args <<< "$BENCH_ARGS"; fi
first_run_args=()
if [ -n "${FIRST_RUN_ARGS+set}" ]; then read -r -a first_run_args <<< "$FIRST_RUN_ARGS"; fi
# the results files under OUT that this run wrote (a file an earlier run left there is older than the stamp)
stamp="$(mktemp)"
trap 'rm -f "$stamp"' EXIT
written() { local f; for f in "$@"; do [ -f "$OUT/$f" ] && [ "$OUT/$f" -nt "$stamp" ] && echo "$f"; done; return 0; }
status=0
if [ "${FIRST_RUN:-}" != skip ]; then
  skipped=""
  if [[ " ${first_run_args[*]-} " == *" --allow-cpu "* ]] || "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m benchmarks.gpu.gpu_first_run --out "$OUT/first-run" \
      "${first_run_args[@]}" 2>&1 | tee "$OUT/first-run.log" || status=1
  else
    skipped="no CUDA device here (it needs one; FIRST_RUN_ARGS=--allow-cpu rehearses it on this CPU)"
    echo "first-run check skipped: $skipped" | tee "$OUT/first-run.log"
  fi
  if [ "${FIRST_RUN:-}" = only ]; then
    if [ -n "$(written first-run/first-run.md)" ]; then
      echo "results in $OUT/first-run/first-run.md"
    elif [ -n "$skipped" ]; then
      echo "error: FIRST_RUN=only and the first-run check did not run: $skipped" >&2
      status=1
    else
      echo "no first-run.md written: the first-run check's output is in $OUT/first-run.log" >&2
    fi
    exit $status
  fi
fi
"$PY" -m pipeline doctor --out "$OUT/doctor" "${doctor_args[@]}" 2>&1 | tee "$OUT/doctor.log" || status=1
# the seeds' recipe needs torchvision, which the documented node lacks: then the benchmark measures Parallax alone
peer=(--no-peer "no d2l_reference.py in the bundle")
if [ -f "$HERE/peers/d2l_reference.py" ]; then
  if why="$("$PY" -c 'import torchvision' 2>&1)"; then
    peer=(--peer "$HERE/peers/d2l_reference.py")
  else
    why="torchvision is not importable here (${why##*$'\n'})"
    echo "d2l peer skipped: $why"
    peer=(--no-peer "$why")
  fi
fi
PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m benchmarks.gpu.gpu_epoch --data "$OUT/data" "${peer[@]}" --json "$OUT/gpu_epoch.json" \
  "${bench_args[@]}" 2>&1 | tee "$OUT/gpu_epoch.log" || status=1
results="$(written first-run/first-run.md doctor/doctor.md doctor/doctor.json gpu_epoch.log gpu_epoch.json | paste -sd, - | sed 's/,/, /g')"
if [ -n "$results" ]; then echo "results in $OUT ($results)"; else echo "no results files written in $OUT" >&2; fi
exit $status
