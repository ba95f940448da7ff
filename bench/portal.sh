#!/usr/bin/env bash
# bench/portal.sh - how fast the web portal's pages paint, with 1,000
# services on the platform: headless Chromium (Debian's, over WebDriver)
# loads every customer and operator page of a release `vcdn up` and reports
# each page's first contentful paint and when it showed what it is for (the
# services list: all 1,000 rows), in ms after its navigation started.
#
# It runs the ignored test `portal::first_paint_of_every_page_with_a_thousand_services`
# (the services are ordered to start tomorrow, so no cache runs). The test
# fails if a page's first contentful paint reaches 500 ms. Needs what
# scripts/test.sh installs (chromium, chromium-driver, axe-core).
#
# Environment: OUT=bench/results/portal-latest.md
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/portal-latest.md}
mkdir -p "$(dirname "$OUT")"
cd "$ROOT"
echo "[portal.sh $(date +%H:%M:%S)] building and running (release)" >&2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cargo test --release -q -p vcdn --test portal -- --ignored --nocapture \
  first_paint_of_every_page_with_a_thousand_services | tee "$LOG" >&2
{
  echo "# Portal first paint, $(date -u +%Y-%m-%d) on $(nproc) vCPUs ($(uname -r))"
  echo
  grep -a '^|' "$LOG"
} > "$OUT"
cat "$OUT"
