#!/usr/bin/env bash
# The core full matrix on cuda-inductor, prepared to run as one command on a lent GPU machine
# (issue 12; 15 minutes of device time in all, at most 10 per command): a compile pass into the
# warm compiler cache (--phase compile; each case's first compile, cold, label COMPILED), then
# the timed and judged run from that cache. Each phase is stopped after its limit (below;
# SIGTERM, which the suite turns into an orderly stop that keeps every finished record), so
# both phases' results come back even when the matrix takes longer than planned.
#
#   bash docs/results/cuda_full_matrix.sh OUT_DIR [more pytest options]
#
# OUT_DIR receives 8 files (what the device tool brings back at most): the two phases'
# results.json and pytest output, the run's summary.md and its HTML report (index.html), the
# figures of benchmarks/summarise_run.py, and a log of the machine and the phases.
# Environment: BACKEND (cuda-inductor), PROFILE (full), COMPILE_WORKERS (14: the compile pass
# times no run, so it may take the machine's 16 cores), WORKERS (8, the run), COMPILE_LIMIT_S
# (280) and RUN_LIMIT_S (220): both phases, each killed 20 s after its SIGTERM at worst, fit
# the device tool's 600 s per command.
# Rehearsed on the CPU with BACKEND=cpu-inductor PROFILE=smoke COMPILE_WORKERS=2 WORKERS=2
# (docs/results/README.md).
#
# The device machine has torch, pytest and pytest-xdist but no jsonschema, and nothing can be
# installed there from an index. Before the call, in the checkout (.whl is git-excluded):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl jsonschema==4.26.0 \
#     jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
# and name .whl in the call's carry; this script installs them when jsonschema is missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?give the folder for the results (on the device machine: \$OUT)}
shift
backend=${BACKEND:-cuda-inductor}
profile=${PROFILE:-full}
compile_workers=${COMPILE_WORKERS:-14}
workers=${WORKERS:-8}
compile_limit=${COMPILE_LIMIT_S:-280}
run_limit=${RUN_LIMIT_S:-220}
mkdir -p "$out" || exit 2
log=$out/log.txt
export PYTHONUNBUFFERED=1
if ! python3 -c "import jsonschema" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    || { echo "jsonschema is missing and .whl has no wheels for it: see this script's header"; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  git rev-parse --short HEAD 2>/dev/null || echo "(no git: a copied tree)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
              torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  python3 -c "import triton; print('triton', triton.__version__)"
} 2>&1 | tee "$log"

run_phase() {  # name, seconds, workers, then pytest options
  local name=$1 limit=$2 n=$3
  shift 3
  local start=$SECONDS
  timeout -k 20 "$limit" python3 -m pytest -n "$n" conformance/ --backend "$backend" \
    --profile "$profile" --report-dir "reports/cuda/$name" -q "$@" > "$out/pytest-$name.log" 2>&1
  local status=$?
  tail -n 15 "$out/pytest-$name.log" | tee -a "$log"
  echo "phase $name: exit $status after $((SECONDS - start)) s" | tee -a "$log"
}

run_phase compile "$compile_limit" "$compile_workers" --phase compile "$@"
run_phase run "$run_limit" "$workers" --compile-cache warm "$@"

cp reports/cuda/compile/results.json "$out/compile-results.json" 2>/dev/null
for f in results.json summary.md index.html; do
  cp "reports/cuda/run/$f" "$out/run-$f" 2>/dev/null || echo "no $f from the run phase" | tee -a "$log"
done
for phase in compile run; do
  [ -f "reports/cuda/$phase/results.json" ] || continue
  echo "== $phase: benchmarks/summarise_run.py" | tee -a "$out/figures.md"
  python3 benchmarks/summarise_run.py "reports/cuda/$phase/results.json" 2>&1 | tee -a "$out/figures.md"
done
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$log"
