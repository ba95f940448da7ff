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
#  3. A demand ramp: every JOIN_S seconds a batch of BATCH viewers joins
#     and watches for LIFE seconds (BATCHES batches), so the audience grows
#     to BATCHES x BATCH over BATCHES x JOIN_S seconds and then leaves in the
#     same way. Each batch is spread over the caches the service has when it
#     joins: the players resolve the service's name at the vCDN's DNS
#     (`vcdn player --dns`) and ask again when the 20 s TTL runs out, so
#     viewers move to caches that join and off caches that are drained.
#     Each batch plays with `vcdn player` and reports its MOS every 16 s.
#     The player runs in PLAYER_MODE: closed (default; a viewer's player,
#     the next segment when the previous one has arrived and the buffer has
#     room, so overload shows as start-up delay and stalls) or open (the old
#     schedule, segment i at (i - 3) x 2 s: overload shows as late responses
#     and failed sessions). `--quality highest`, as in the calibration: every
#     viewer watches the HD representation whose capacity the model gives.
#  4. Every 2 s the service's instances and MOS are sampled; the players'
#     JSON reports give every 16 s window's score.
#
# Output: OUT/NAME.csv, OUT/NAME.png, OUT/NAME-baseline.csv,
# OUT/NAME-capacity.toml, OUT/NAME-events.tsv and a markdown table on stdout
# (and OUT/NAME.md), where NAME is elasticity (closed loop) or
# elasticity-open. Traffic stays on loopback.
#
# Environment: SHARE=0.05 TARGET=4.0 BATCH=150 BATCHES=18 JOIN_S=10 LIFE=190
#              OUT=docs  SKIP_BUILD=1 (skip cargo build)
#              CAPACITY=FILE (a capacity model to use instead of calibrating)
#              KEEP=1 (keep the players' reports and logs in OUT/elasticity-run/)
#              BASELINE=0 (skip the second ramp against one fixed vCPU)
#              PLAYER_MODE=closed (or open)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARE=${SHARE:-0.05}
TARGET=${TARGET:-4.0}
BATCH=${BATCH:-150}
BATCHES=${BATCHES:-18}
JOIN_S=${JOIN_S:-10}
LIFE=${LIFE:-190}
OUT=${OUT:-$ROOT/docs}
PLAYER_MODE=${PLAYER_MODE:-closed}
case $PLAYER_MODE in
  closed) NAME=elasticity ;;
  open) NAME=elasticity-open ;;
  *) echo "PLAYER_MODE: give closed or open" >&2; exit 1 ;;
esac
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

if [[ -n ${CAPACITY:-} ]]; then
  cp "$CAPACITY" "$TMP/capacity.toml"
else
  log "calibrating one vCPU = $SHARE CPU"
  "$V" calibrate --cpus "$SHARE" --vcpu-share "$SHARE" --seconds 5 --video-seconds 32 --out "$TMP/capacity.toml" >&2
fi
DNS=127.0.0.1:$((PORT + 1))
# The API in plain HTTP (--plain-http, loopback only): the script talks to it with curl.
"$V" up --demo --data-dir "$TMP/data" --api "$API" --dns "$DNS" --http "127.0.0.1:$((PORT + 2))" \
  --router-admin "127.0.0.1:$((PORT + 3))" --demo-origin "127.0.0.1:$((PORT + 4))" --instance-port "$IPORT" \
  --instance-admin-port "$((PORT + 61))" --operator-token elasticity-operator-token-0123456789ab --vcpu-share "$SHARE" \
  --capacity-model "$TMP/capacity.toml" --plain-http >"$TMP/up.log" 2>&1 &
UP=$!
for _ in $(seq 200); do grep -q "Order a first vCDN" "$TMP/up.log" && break; sleep 0.05; done
KEY=$(cat "$TMP/data/demo-customer-key")
first=$((BATCH * 2))
AUTH=(-H "Authorization: Bearer $KEY" -H 'Content-Type: application/json')

# ramp NAME FLAVOR DIR: orders service NAME of FLAVOR for the first step's
# viewers, plays the demand ramp against it, samples it into DIR, deletes it.
ramp() {
  local name=$1 flavor=$2 dir=$3
  mkdir -p "$dir"
  curl -sf "${AUTH[@]}" "http://$API/v1/services" \
    -d '{"name":"'"$name"'","origin":"http://127.0.0.1:'$((PORT + 4))'","hostname":"'"$name"'.demo.example","flavor":"'"$flavor"'",
         "regions":[{"region":"paris","peak_users":'"$first"',"bitrate_kbps":2500}],"quality":{"min_mos":'"$TARGET"'},"lease":{"duration_s":3600}}' \
    >"$dir/service.json"
  log "$name ($flavor): $(jq -r '.graph.regions[0].instances | length' "$dir/service.json") instance(s) for $first viewers"
  local t0
  t0=$(date +%s.%N)
  echo "t_s,instances,vcpus,demand,estimated_mos,reported_mos" >"$dir/samples.csv"
  echo 0 >"$dir/demand"
  : >"$dir/batches.csv"
  (
    while true; do
      v=$(curl -s -H "Authorization: Bearer $KEY" "http://$API/v1/services/$name") || continue
      t=$(echo "$(date +%s.%N) - $t0" | bc)
      echo "$v" | jq -r --arg t "$t" --arg d "$(cat "$dir/demand")" \
        '[$t, (.graph.regions[0].instances|length), ([.graph.regions[0].instances[].vcpus]|add),
          $d, (.qoe.paris.estimated_mos // ""), (.qoe.paris.reported_mos // "")] | @csv' >>"$dir/samples.csv"
      sleep 2
    done
  ) &
  local sampler=$! players=() j
  for j in $(seq 0 $((BATCHES - 1))); do
    local sleep_until
    sleep_until=$(echo "$t0 + $j * $JOIN_S" | bc)
    while (( $(echo "$(date +%s.%N) < $sleep_until" | bc) )); do sleep 0.1; done
    echo $(( (j + 1) * BATCH )) >"$dir/demand"
    log "$name batch $j: $BATCH viewers join for ${LIFE}s"
    echo "$j,$(echo "$(date +%s.%N) - $t0" | bc)" >>"$dir/batches.csv"
    # The player's CPU seconds (its children's utime + stime, as seen by
    # the shell that waited for it) go to batchJ.cpu.
    bash -c 'txt=$1 cpu=$2; shift 2; "$@" >"$txt" 2>&1; read -ra f < <(sed "s/^.*) //" /proc/$$/stat); echo $(( f[13] + f[14] )) >"$cpu"' _ \
      "$dir/batch$j.txt" "$dir/batch$j.cpu" "$V" player --quiet --url "http://$name.demo.example:$IPORT/dash/vod/film/manifest.mpd" --dns "$DNS" \
      --sessions "$BATCH" --duration "$LIFE" --ramp 2 --quality highest --mode "$PLAYER_MODE" --report "$dir/batch$j.json" \
      --qoe-to "http://$API/v1/services/$name/qoe" --qoe-token "$KEY" --qoe-region paris &
    players+=($!)
  done
  # The audience leaves as it came: the demand column follows.
  for j in $(seq 0 $((BATCHES - 1))); do
    wait "${players[$j]}" || true
    echo $(( (BATCHES - j - 1) * BATCH )) >"$dir/demand"
  done
  sleep 20
  kill "$sampler" 2>/dev/null || true
  curl -s -H "Authorization: Bearer $KEY" "http://$API/v1/services/$name/events" >"$dir/events.json"
  curl -s -X DELETE -H "Authorization: Bearer $KEY" "http://$API/v1/services/$name" >/dev/null
}

ramp elastic elastic "$TMP"
if [[ ${BASELINE:-1} == 1 ]]; then
  # The same ramp without elasticity: one fixed instance of one vCPU, the
  # size the planner gave the elastic service for the first step.
  curl -sf -X PUT -H "Authorization: Bearer elasticity-operator-token-0123456789ab" -H 'Content-Type: application/json' "http://$API/v1/flavors/fixed" \
    -d '{"name":"fixed","kind":"static","description":"one fixed 1-vCPU cache per region (elasticity baseline)",
         "template":{"min_instances":1,"max_instances":1,"vcpus_per_instance":1,"memory_mib_per_instance":256},
         "pricing":{"scheme":"flat_rate","currency":"EUR","per_vcpu_hour":0.05}}' >/dev/null
  ramp fixed fixed "$TMP/baseline"
fi
mkdir -p "$OUT"
cp "$TMP/samples.csv" "$OUT/$NAME.csv"
[[ -f $TMP/baseline/samples.csv ]] && cp "$TMP/baseline/samples.csv" "$OUT/$NAME-baseline.csv"
cp "$TMP/capacity.toml" "$OUT/$NAME-capacity.toml"
if [[ ${KEEP:-0} == 1 ]]; then
  rm -rf "$OUT/$NAME-run" && mkdir -p "$OUT/$NAME-run"
  cp -r "$TMP"/batch* "$TMP/up.log" "$OUT/$NAME-run/"
  [[ -d $TMP/baseline ]] && cp -r "$TMP/baseline" "$OUT/$NAME-run/"
  cp -r "$TMP/data/logs" "$OUT/$NAME-run/instance-logs" 2>/dev/null || true
fi
jq -r '.events[] | [.at_ms, .kind, .detail] | @tsv' "$TMP/events.json" >"$OUT/$NAME-events.tsv"
python3 "$ROOT/reproduce/cdnaas/plot_elasticity.py" "$TMP" "$OUT" "$TARGET" "$SHARE" "$BATCHES" "$LIFE" "$BATCH" "$NAME" "$PLAYER_MODE"
