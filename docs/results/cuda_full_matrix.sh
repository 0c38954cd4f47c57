#!/usr/bin/env bash
# The core full matrix on cuda-inductor, prepared to run as one command on a lent GPU machine
# (issue 12; 15 minutes of device time in all, at most 10 per command): a compile pass into a
# warm compiler cache of this call's own, empty at the start (--phase compile: each case's
# first compile, label COMPILED), then the timed and judged run from that cache. Each phase is
# stopped after its limit (below; SIGTERM, which the suite turns into an orderly stop that
# keeps every finished record), and its files are copied out as soon as it ends, so what
# finished comes back even when the matrix takes longer than planned.
#
#   bash docs/results/cuda_full_matrix.sh OUT_DIR [more pytest options]
#
# OUT_DIR receives 8 files (what the device tool brings back at most): the two phases'
# results.json and pytest output, the run's summary.md and its HTML report (index.html), the
# figures of benchmarks/summarise_run.py, and a log of the machine and the phases. Exit status:
# the judged run's (pytest's 0 conforms, 1 does not; timeout's 124 when its limit stopped it),
# 3 when it left no results at all.
# Environment: BACKEND (cuda-inductor), PROFILE (full), COMPILE_WORKERS (14: the compile pass
# times no run, so it may take the machine's 16 cores), WORKERS (8, the run), COMPILE_LIMIT_S
# (250) and RUN_LIMIT_S (190): both phases, each killed 20 s after its SIGTERM at worst, take
# at most 480 s of the device tool's 600 s per command.
# Rehearsed on the CPU with BACKEND=cpu-inductor PROFILE=smoke COMPILE_WORKERS=2 WORKERS=2
# (docs/results/README.md).
# On one GPU the run's 8 workers share it: their run times and GFLOP/s are measured with
# neighbours' kernels on the same GPU (contended), the labels and compile stages are not
# disturbed; say so beside any figure taken from it.
#
# The device machine has torch, pytest and pytest-xdist but no jsonschema, and nothing can be
# installed there from an index. Before the call, in the checkout (.whl is git-excluded):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_17_x86_64 -d .whl jsonschema==4.26.0 \
#     jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
# and name .whl in the call's carry; this script installs them when jsonschema is missing.
set -uo pipefail
out=${1:?give the folder for the results (on the device machine: \$OUT)}
shift
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 2
cd "$(dirname "$0")/../.."
backend=${BACKEND:-cuda-inductor}
profile=${PROFILE:-full}
compile_workers=${COMPILE_WORKERS:-14}
workers=${WORKERS:-8}
compile_limit=${COMPILE_LIMIT_S:-250}
run_limit=${RUN_LIMIT_S:-190}
log=$out/log.txt
: > "$log"
export PYTHONUNBUFFERED=1
# A machine kept warm between calls keeps files too: this call's reports and caches start empty.
rm -rf reports/cuda
# the suite's compiler caches live under it (conformance/options.py)
export XDG_CACHE_HOME=$PWD/reports/cuda/cache

if ! python3 -c "import jsonschema" 2>/dev/null; then
  if ! ls .whl/*.whl > /dev/null 2>&1; then
    echo "jsonschema is missing and .whl holds no wheels: see this script's header" | tee -a "$log"
    exit 2
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl 2>&1 | tee -a "$log"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import jsonschema" 2>> "$log" \
    || { echo "the wheels in .whl did not install for $(python3 -V): see the log" \
           | tee -a "$log"; exit 2; }
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{
  date -u +"start %Y-%m-%dT%H:%M:%SZ"
  git rev-parse --short HEAD 2>/dev/null || echo "(no git: a copied tree)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
              torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
  python3 -c "import triton; print('triton', triton.__version__)"
  # what would change the float32 baseline's products (TF32) or the compile's threads
  env | grep -i -e tf32 -e OMP_NUM_THREADS -e TORCHINDUCTOR || echo "no TF32/OMP/Inductor env"
  python3 -c "import torch; m = torch.backends.cuda.matmul; print('matmul', 'fp32_precision',
              getattr(m, 'fp32_precision', '-'), 'allow_tf32', m.allow_tf32)"
} 2>&1 | tee -a "$log"

# One phase: name, seconds, workers, then pytest options. Sets $status to pytest's exit status.
run_phase() {
  local name=$1 limit=$2 n=$3
  shift 3
  local dir=reports/cuda/$name start=$SECONDS
  timeout -k 20 "$limit" python3 -m pytest -n "$n" conformance/ --backend "$backend" \
    --profile "$profile" --report-dir "$dir" -q "$@" > "$out/pytest-$name.log" 2>&1
  status=$?
  tail -n 15 "$out/pytest-$name.log" | tee -a "$log"
  echo "phase $name: exit $status after $((SECONDS - start)) s" | tee -a "$log"
  if [ ! -f "$dir/results.json" ] && [ -d "$dir/records" ]; then
    # stopped before it could write its results (killed 20 s after the SIGTERM): recover them
    python3 -m conformance.cli recover "$dir" 2>&1 | tee -a "$log"
  fi
  if [ ! -f "$dir/results.json" ]; then
    echo "phase $name left no results.json" | tee -a "$log"
    return
  fi
  echo "== $name: benchmarks/summarise_run.py" >> "$out/figures.md"
  python3 benchmarks/summarise_run.py "$dir/results.json" >> "$out/figures.md" 2>&1
}

run_phase compile "$compile_limit" "$compile_workers" --phase compile "$@"
cp reports/cuda/compile/results.json "$out/compile-results.json" 2>/dev/null
run_phase run "$run_limit" "$workers" --compile-cache warm "$@"
for f in results.json summary.md index.html; do
  cp "reports/cuda/run/$f" "$out/run-$f" 2>/dev/null \
    || echo "no $f from the run phase" | tee -a "$log"
done
cat "$out/figures.md" 2>/dev/null
date -u +"end %Y-%m-%dT%H:%M:%SZ" | tee -a "$log"
[ -f "$out/run-results.json" ] || exit 3
exit "$status"
