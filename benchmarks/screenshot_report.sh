#!/bin/sh
# Screenshot of a conformance report for the docs, with headless Chromium (Debian: chromium).
#   benchmarks/screenshot_report.sh reports/latest/index.html docs/report.png [WIDTH,HEIGHT]
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 REPORT.html OUT.png [WIDTH,HEIGHT]  (default size 1400,2000)" >&2
    exit 2
fi
report=$1 out=$2 size=${3:-1400,2000}
[ -f "$report" ] || { echo "$0: no such report '$report'; render one with flexconf report" >&2; exit 2; }
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "$0: no chromium found; install it (apt-get install chromium)" >&2; exit 2; }
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$profile" --window-size="$size" \
    --screenshot="$(realpath -m "$out")" "file://$(realpath "$report")" 2>/dev/null
[ -s "$out" ] || { echo "$0: chromium wrote no screenshot to '$out'" >&2; exit 1; }
echo "$out"
