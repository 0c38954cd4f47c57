#!/usr/bin/env bash
# Gate the torch 2.14.1 run against the torch 2.13.0 run (tox -e release-gate, or by hand:
# docs/results/README.md). Copies both results files here, then gates twice, compile times
# with the default rule and run times with a 10 ms slack, writing text and JSON beside them:
# once as the runs measured (gate-unconfirmed.*, --confirm 0), once as the gate does by
# default with a python for each release (gate-confirmed.*: every time finding measured again
# 3 times under both releases' pythons, side by side). Exits with the confirmed gate's status:
# 0 may ship, 1 may not, 2 bad input.
#   bash docs/results/release_gate.sh OLD_PYTHON NEW_PYTHON [more gate options]
set -uo pipefail
cd "$(dirname "$0")/../.."
old_py=${1:?give the python that has torch 2.13.0, then the one that has torch 2.14.1}
new_py=${2:?give the python that has torch 2.14.1 after the one that has torch 2.13.0}
shift 2
out=docs/results
old=$out/cpu-inductor-smoke-torch2.13.0.json
new=$out/cpu-inductor-smoke-torch2.14.1.json
cp reports/release/torch2.13.0/results.json "$old" || exit 2
cp reports/release/torch2.14.1/results.json "$new" || exit 2
gate=("$new_py" -m conformance.cli gate --baseline "$old" --candidate "$new"
      --run-time-slack 0.01 "$@")
"${gate[@]}" --confirm 0 --json "$out/gate-unconfirmed.json" > "$out/gate-unconfirmed.txt"
case $? in 0|1) ;; *) cat "$out/gate-unconfirmed.txt"; exit 2 ;; esac
"${gate[@]}" --baseline-python "$old_py" --candidate-python "$new_py" \
  --confirm-dir reports/release/confirm --json "$out/gate-confirmed.json" \
  | tee "$out/gate-confirmed.txt"
exit "${PIPESTATUS[0]}"
