#!/usr/bin/env bash
# The gate on the same two releases with a planted compile-time regression: 8 cases of the
# core smoke matrix (-k "b1- and s128x") on tests.slow_backends:SlowInductorFirstCall, which is
# cpu-inductor with, on the causal case, a first call that sleeps half its own length longer
# when $FLEXCONF_TEST_FIRST_CALL_SLOWDOWN is 0.5. torch 2.13.0 runs without it (the
# baseline), torch 2.14.1 with it (the candidate); the gate (by default) measures the flagged
# cases again 3 times under both pythons, the candidate's with the slowdown. Writes
# docs/results/planted-*.json and gate-planted.{txt,json}; exits with the gate's status
# (1 expected: the planted slowdown blocks).
#   bash docs/results/planted_gate.sh OLD_PYTHON NEW_PYTHON
set -uo pipefail
cd "$(dirname "$0")/../.."
old_py=${1:?give the python that has torch 2.13.0, then the one that has torch 2.14.1}
new_py=${2:?give the python that has torch 2.14.1 after the one that has torch 2.13.0}
runs=reports/release
out=docs/results
matrix=(conformance/ --backend tests.slow_backends:SlowInductorFirstCall --profile smoke
        -k "b1- and s128x" -q)
mkdir -p "$runs"
"$old_py" -m pytest -n 2 "${matrix[@]}" --report-dir "$runs/planted-torch2.13.0" \
  || [ $? -eq 1 ] || exit 2
FLEXCONF_TEST_FIRST_CALL_SLOWDOWN=0.5 "$new_py" -m pytest -n 2 "${matrix[@]}" \
  --report-dir "$runs/planted-torch2.14.1" || [ $? -eq 1 ] || exit 2
slow_py="$PWD/$runs/python-torch2.14.1-planted"
printf '#!/bin/sh\nFLEXCONF_TEST_FIRST_CALL_SLOWDOWN=0.5 exec %s "$@"\n' "$new_py" > "$slow_py"
chmod +x "$slow_py"
cp "$runs/planted-torch2.13.0/results.json" "$out/planted-cpu-inductor-smoke-torch2.13.0.json"
cp "$runs/planted-torch2.14.1/results.json" "$out/planted-cpu-inductor-smoke-torch2.14.1.json"
"$new_py" -m conformance.cli gate --baseline "$out/planted-cpu-inductor-smoke-torch2.13.0.json" \
  --candidate "$out/planted-cpu-inductor-smoke-torch2.14.1.json" \
  --baseline-python "$old_py" --candidate-python "$slow_py" \
  --confirm-dir "$runs/planted-confirm" --json "$out/gate-planted.json" \
  | tee "$out/gate-planted.txt"
exit "${PIPESTATUS[0]}"
