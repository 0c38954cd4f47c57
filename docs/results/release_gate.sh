#!/usr/bin/env bash
# Gate the torch 2.14.1 run against the torch 2.13.0 run (tox -e release-gate, or by hand:
# docs/results/README.md). Copies both results files here, then gates twice, compile times
# with the default rule and run times with a 10 ms slack, writing text and JSON beside them:
# once as the runs measured (gate-unconfirmed.*, --confirm 0), once as the gate does by
# default with a python for each release (gate-confirmed.*: every time finding measured again
# 3 times under both releases' pythons, side by side). Exits with the confirmed gate's status:
# 0 may ship, 1 may not, 2 bad input (then every file here is as it was before).
#   bash docs/results/release_gate.sh OLD_PYTHON NEW_PYTHON [more gate options]
# Options of the confirmation (--confirm, --confirm-max-cases, --confirm-dir, --baseline-python,
# --candidate-python) go to the confirming gate only; the others to both.
set -uo pipefail
cd "$(dirname "$0")/../.."
old_py=${1:?give the python that has torch 2.13.0, then the one that has torch 2.14.1}
new_py=${2:?give the python that has torch 2.14.1 after the one that has torch 2.13.0}
shift 2
both=() confirming=()
while (($#)); do
  case $1 in
    --json|--json=*|--markdown|--markdown=*|--junit|--junit=*)
      echo "release_gate.sh: $1: the script writes gate-unconfirmed.* and gate-confirmed.* in" \
           "docs/results itself; leave $1 out" >&2; exit 2 ;;
    --confirm=0|--confirm=0.0)
      echo "release_gate.sh: --confirm 0: the first gate is the unconfirmed one already;" \
           "leave --confirm 0 out" >&2; exit 2 ;;
    --confirm) [ "${2-}" = 0 ] && { echo "release_gate.sh: --confirm 0: the first gate is" \
           "the unconfirmed one already; leave --confirm 0 out" >&2; exit 2; }
      confirming+=("$1" "${2-}"); shift; (($#)) && shift ;;
    --confirm-max-cases|--confirm-dir|--baseline-python|--candidate-python)
      confirming+=("$1" "${2-}"); shift; (($#)) && shift ;;
    --confirm=*|--confirm-max-cases=*|--confirm-dir=*|--baseline-python=*|--candidate-python=*)
      confirming+=("$1"); shift ;;
    *) both+=("$1"); shift ;;
  esac
done
runs=reports/release
missing=() envs=()
for run in torch2.13.0:release-torch2.13 torch2.14.1:release-torch2.14; do
  if [ ! -f "$runs/${run%%:*}/results.json" ]; then
    missing+=("$runs/${run%%:*}/results.json"); envs+=("tox -e ${run#*:}")
  fi
done
if ((${#missing[@]})); then  # before anything here is touched
  echo "release_gate.sh: no results to gate: ${missing[*]} missing; run the release runs" \
       "first: $(printf '%s && ' "${envs[@]}")tox -e release-gate (docs/results/README.md)" >&2
  exit 2
fi
out=docs/results
old=$out/cpu-inductor-smoke-torch2.13.0.json
new=$out/cpu-inductor-smoke-torch2.14.1.json
written=("$old" "$new" "$out"/gate-unconfirmed.{json,txt} "$out"/gate-confirmed.{json,txt})
kept=$(mktemp -d) || exit 2
trap 'rm -rf "$kept"' EXIT
for f in "${written[@]}"; do  # a copy that fails stops the script before it changes a file
  if [ -e "$f" ]; then cp -p "$f" "$kept/" || exit 2; fi
done
refused() {  # bad input: every file here back as it was
  for f in "${written[@]}"; do
    if [ -e "$kept/${f##*/}" ]; then cp -p "$kept/${f##*/}" "$f"; else rm -f "$f"; fi
  done
  exit 2
}
cp "$runs/torch2.13.0/results.json" "$old" || refused
cp "$runs/torch2.14.1/results.json" "$new" || refused
gate=("$new_py" -m conformance.cli gate --baseline "$old" --candidate "$new"
      --run-time-slack 0.01 ${both[@]+"${both[@]}"})
"${gate[@]}" --confirm 0 --json "$kept/unconfirmed.json" > "$kept/unconfirmed.txt"
case $? in 0|1) ;; *) refused ;; esac
"${gate[@]}" --baseline-python "$old_py" --candidate-python "$new_py" \
  --confirm-dir reports/release/confirm ${confirming[@]+"${confirming[@]}"} \
  --json "$kept/confirmed.json" | tee "$kept/confirmed.txt"
status=${PIPESTATUS[0]}
case $status in 0|1) ;; *) refused ;; esac
for kind in unconfirmed confirmed; do
  mv "$kept/$kind.json" "$out/gate-$kind.json" && mv "$kept/$kind.txt" "$out/gate-$kind.txt"
done
exit "$status"
