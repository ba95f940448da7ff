#!/usr/bin/env bash
# reproduce/cdnaas/elasticity.sh - QoE-driven elasticity, shown end to end:
# a demand ramp from vcdn's own players against a live elastic vCDN keeps the
# viewers' MOS above the customer's target while the vCPUs follow the load.
#
#  1. `vcdn calibrate` measures what one vCPU sustains, where one vCPU is
#     SHARE of a CPU (small, so that this 2-core machine can overload a few
#     of them; `vcdn up --vcpu-share` holds every instance to the same share).
#  2. `vcdn up --demo` with that capacity model; a customer orders an
#     elastic vCDN in paris with min_mos TARGET for the first step's viewers.
#  3. Demand steps (STEPS, concurrent HD sessions, STEP_S seconds each): each
#     step's viewers are spread over the caches the service has when the
#     step starts (as DNS would), play with `vcdn player` and report their
#     MOS to the control plane every 16 s.
#  4. Every 2 s the service's instances and MOS are sampled; the players'
#     JSON reports give every 16 s window's score.
#
# Output: OUT/elasticity.csv, OUT/elasticity.png and a markdown table on
# stdout (and OUT/elasticity.md). Traffic stays on loopback.
#
# Environment: SHARE=0.01 TARGET=4.0 STEPS="100 300 600 300 100" STEP_S=60
#              OUT=docs  SKIP_BUILD=1 (skip cargo build)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARE=${SHARE:-0.01}
TARGET=${TARGET:-4.0}
STEPS=${STEPS:-"100 300 600 300 100"}
STEP_S=${STEP_S:-60}
OUT=${OUT:-$ROOT/docs}
V=$ROOT/target/release/vcdn
log() { echo "[elasticity $(date +%H:%M:%S)] $*" >&2; }

command -v jq >/dev/null || apt-get install -y -q jq >/dev/null
python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib
[[ ${SKIP_BUILD:-0} == 1 ]] || (cd "$ROOT" && cargo build --release -q -p vcdn)

TMP=$(mktemp -d)
PORT=$((18900 + RANDOM % 50))
API=127.0.0.1:$PORT
IPORT=$((PORT + 60))
UP=
cleanup() {
  [[ -n $UP ]] && kill "$UP" 2>/dev/null
  pkill -f -- "--listen 127\\.1[0-2]\\.[0-9.]*:$IPORT" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

log "calibrating one vCPU = $SHARE CPU"
"$V" calibrate --cpus "$SHARE" --vcpu-share "$SHARE" --seconds 3 --out "$TMP/capacity.toml" >&2
"$V" up --demo --data-dir "$TMP/data" --api "$API" --dns "127.0.0.1:$((PORT + 1))" --http "127.0.0.1:$((PORT + 2))" \
  --router-admin "127.0.0.1:$((PORT + 3))" --demo-origin "127.0.0.1:$((PORT + 4))" --instance-port "$IPORT" \
  --instance-admin-port "$((PORT + 61))" --operator-token op --vcpu-share "$SHARE" \
  --capacity-model "$TMP/capacity.toml" >"$TMP/up.log" 2>&1 &
UP=$!
for _ in $(seq 200); do grep -q "Order a first vCDN" "$TMP/up.log" && break; sleep 0.05; done
KEY=$(cat "$TMP/data/demo-customer-key")
first=${STEPS%% *}
curl -sf -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' "http://$API/v1/services" \
  -d '{"name":"elastic","origin":"http://127.0.0.1:'$((PORT + 4))'","hostname":"live.demo.example","flavor":"elastic",
       "regions":[{"region":"paris","peak_users":'"$first"',"bitrate_kbps":2500}],"quality":{"min_mos":'"$TARGET"'},"lease":{"duration_s":3600}}' \
  >"$TMP/service.json"
log "service: $(jq -r '.graph.regions[0].instances | length' "$TMP/service.json") instance(s) for $first viewers"

T0=$(date +%s.%N)
echo "t_s,instances,vcpus,demand,estimated_mos,reported_mos" >"$TMP/samples.csv"
DEMAND=0
echo 0 >"$TMP/demand"
(
  while true; do
    v=$(curl -s -H "Authorization: Bearer $KEY" "http://$API/v1/services/elastic") || continue
    t=$(echo "$(date +%s.%N) - $T0" | bc)
    echo "$v" | jq -r --arg t "$t" --arg d "$(cat "$TMP/demand")" \
      '[$t, (.graph.regions[0].instances|length), ([.graph.regions[0].instances[].vcpus]|add),
        $d, (.qoe.paris.estimated_mos // ""), (.qoe.paris.reported_mos // "")] | @csv' >>"$TMP/samples.csv"
    sleep 2
  done
) &
SAMPLER=$!
i=0
for n in $STEPS; do
  echo "$n" >"$TMP/demand"
  urls=($(curl -s -H "Authorization: Bearer $KEY" "http://$API/v1/services/elastic" | jq -r '.graph.regions[0].instances[].address'))
  mirrors=()
  for a in "${urls[@]:1}"; do mirrors+=(--mirror "http://$a"); done
  log "step $i: $n viewers over ${#urls[@]} cache(s) for ${STEP_S}s"
  "$V" player --quiet --url "http://${urls[0]}/dash/vod/film/manifest.mpd" "${mirrors[@]}" \
    --sessions "$n" --duration "$STEP_S" --ramp 5 --quality highest --report "$TMP/step$i.json" \
    --qoe-to "http://$API/v1/services/elastic/qoe" --qoe-token "$KEY" --qoe-region paris >"$TMP/step$i.txt"
  i=$((i + 1))
done
kill $SAMPLER 2>/dev/null || true
curl -s -H "Authorization: Bearer $KEY" "http://$API/v1/services/elastic/events" >"$TMP/events.json"
mkdir -p "$OUT"
cp "$TMP/samples.csv" "$OUT/elasticity.csv"
python3 "$ROOT/reproduce/cdnaas/plot_elasticity.py" "$TMP" "$OUT" "$TARGET" "$SHARE" "$STEP_S" $STEPS
