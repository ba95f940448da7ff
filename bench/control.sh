#!/usr/bin/env bash
# bench/control.sh - how long a vCDN takes to deploy: from POST /v1/services
# to every instance serving, for a vCDN of 3 regions with 2 caches each (the
# `static` flavor), RUNS times; and how long DELETE takes to stop it all.
#
# The API answers a POST only once every instance answers /healthz and the
# router has the service, so the POST's latency is the deployment time.
# After each POST this script also checks from outside that every cache
# serves a request, so a fast answer cannot hide a cache that is not up.
#
# Environment: RUNS=20  BASE_PORT=18700  VCDN_BIN=target/release/vcdn
#              SKIP_BUILD=1 skips `cargo build --release`
#              OUT=bench/results/control-latest.md
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-20}
BASE_PORT=${BASE_PORT:-18700}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
OUT=${OUT:-$ROOT/bench/results/control-latest.md}
TOKEN=bench-operator-0123456789abcdef012345
API=127.0.0.1:$BASE_PORT
INSTANCE_PORT=$((BASE_PORT + 10))

log() { echo "[control.sh $(date +%H:%M:%S)] $*" >&2; }
command -v jq >/dev/null || { apt-get install -y -q jq >/dev/null || { apt-get update -q && apt-get install -y -q jq; }; }
command -v curl >/dev/null || apt-get install -y -q curl >/dev/null
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  log "building vcdn (release)"
  (cd "$ROOT" && cargo build --release -q -p vcdn)
fi

TMP=$(mktemp -d)
UP_PID=
cleanup() {
  [[ -n $UP_PID ]] && kill "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null
  # Cache instances outlive the control plane by design: stop ours.
  pkill -f -- "--listen 127\\.1[0-2]\\.[0-9.]*:$INSTANCE_PORT" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

"$VCDN_BIN" up --data-dir "$TMP/data" --api "$API" --dns "127.0.0.1:$((BASE_PORT + 1))" \
  --http "127.0.0.1:$((BASE_PORT + 2))" --router-admin "127.0.0.1:$((BASE_PORT + 3))" \
  --operator-token "$TOKEN" --demo --demo-origin "127.0.0.1:$((BASE_PORT + 4))" \
  --instance-port "$INSTANCE_PORT" --instance-admin-port "$((BASE_PORT + 11))" >"$TMP/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 200); do grep -q "Order a first vCDN" "$TMP/up.log" 2>/dev/null && break; sleep 0.05; done
grep -q "Order a first vCDN" "$TMP/up.log" || { cat "$TMP/up.log" >&2; exit 1; }
KEY=$(cat "$TMP/data/demo-customer-key")
# The API is HTTPS with the self-signed certificate vcdn up made (each
# request below includes its TLS handshake, as a client's would).
TLS=(--cacert "$TMP/data/api.crt")
SPEC='{"name":"bench","origin":"http://127.0.0.1:'$((BASE_PORT + 4))'","hostname":"bench.example","flavor":"static",
       "regions":[{"region":"paris"},{"region":"lyon"},{"region":"marseille"}]}'

create_ms=() delete_ms=()
for i in $(seq "$RUNS"); do
  out=$(curl -s "${TLS[@]}" -o "$TMP/svc.json" -w '%{http_code} %{time_total}' -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -d "$SPEC" "https://$API/v1/services")
  code=${out% *}
  [[ $code == 201 ]] || { cat "$TMP/svc.json" >&2; exit 1; }
  create_ms+=("$(awk -v t="${out#* }" 'BEGIN { printf "%.2f", t * 1000 }')")
  id=$(jq -r .id "$TMP/svc.json")
  n=0
  for a in $(jq -r '.graph.regions[].instances[].address' "$TMP/svc.json"); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://$a/size/1") == 200 ]] || { echo "instance $a does not serve" >&2; exit 1; }
    n=$((n + 1))
  done
  [[ $n == 6 ]] || { echo "expected 6 instances, got $n" >&2; exit 1; }
  out=$(curl -s "${TLS[@]}" -o /dev/null -w '%{http_code} %{time_total}' -X DELETE -H "Authorization: Bearer $KEY" "https://$API/v1/services/$id")
  [[ ${out% *} == 200 ]] || { echo "delete failed: $out" >&2; exit 1; }
  delete_ms+=("$(awk -v t="${out#* }" 'BEGIN { printf "%.2f", t * 1000 }')")
  log "run $i: deployed 3 regions x 2 caches in ${create_ms[-1]} ms, deleted in ${delete_ms[-1]} ms"
done

stats() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
  printf "%.1f | %.1f | %.1f | %.1f", v[int((NR + 1) / 2)], v[int(NR * 0.9 + 0.5)], v[1], v[NR] }'; }
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
{
  echo "# vCDN deployment time ($(date -u +%Y-%m-%d), $(nproc) x $cpu)"
  echo
  echo "3 regions x 2 cache instances (flavor static), local VIM, SQLite store, $RUNS runs."
  echo "Deploy = POST /v1/services until the answer, which comes once every instance answers /healthz and the router has the service; every cache then served a request from outside."
  echo
  echo "| step | median ms | p90 ms | min ms | max ms |"
  echo "|---|---:|---:|---:|---:|"
  echo "| deploy (POST to all serving) | $(stats "${create_ms[@]}") |"
  echo "| delete (DELETE to all stopped) | $(stats "${delete_ms[@]}") |"
} | tee "$OUT"
