#!/usr/bin/env bash
# reproduce/mosto/fig5.sh - the MOSTO paper's Fig. 5 on vcdn's test bed: the
# time of one HTTP request for 10-500 KB of dynamic content over a
# transatlantic path (180 ms RTT), by how it is delivered:
#
#   direct      client -> origin, one TCP connection over 180 ms
#   mosto-1     one proxy half way (90 + 90 ms), fresh connections per
#               request and hop: the paper's EC2 deployment (`vcdn proxy
#               --warm 0`, ingress and egress in one)
#   mosto-3     three proxies (4 x 45 ms), fresh connections: the paper's
#               testbed run with two more proxies
#   warm-proxy  a reverse proxy next to the client (2 ms) with a warm,
#               kept-alive connection to the origin (178 ms): the paper's
#               CloudFront baseline in its best case; HAProxy 2.6 from
#               Debian, http mode, `http-reuse always`
#   vcdn        vcdn's chain with warm, pre-opened connections: ingress
#               next to the client (2 ms), transports at 45/90/135 ms,
#               egress next to the origin (2 ms); the chain is the one
#               `vcdn_policy::chains` picks for the size (vcdn chains)
#
# Nodes sit on a line; the RTT between two is their distance (ms). Every
# link 100 Mbit/s with the default drop-tail queue; cubic,
# tcp_no_metrics_save=1; proxy nodes keep their congestion window across
# idle (tcp_slow_start_after_idle=0), as a CDN's front end does. Each run
# is a fresh client connection (curl); RUNS runs per size and setup,
# setups interleaved per run so drift hits all alike. Warm setups are
# given 5 warm-up requests first.
#
# ORIGIN_KEEP_WINDOW=1 also keeps the origin's window across idle (the
# warm reverse proxy's best case: its kept-alive connection stays warm only
# if the origin's kernel does not restart slow start after idle, which
# Linux does by default); outputs are then named fig5-origin-keeps-window.
#
# Output: raw/fig5.csv, fig5.png, fig5.md. Needs root, curl, haproxy,
# python3 with matplotlib. Takes ~10 minutes with RUNS=30.
#
# Environment (defaults): RUNS=30 SIZES="10000 50000 100000 200000 500000"
#   RATE_MBIT=100 SKIP_BUILD=1 (use target/release/vcdn as built)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RUNS=${RUNS:-30}
SIZES=${SIZES:-"10000 50000 100000 200000 500000"}
RATE_MBIT=${RATE_MBIT:-100}

need() { # tool package
  command -v "$1" >/dev/null 2>&1 && return 0
  local SUDO; SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2"; }
}
need curl curl; need ip iproute2; need haproxy haproxy
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib

[[ -n ${SKIP_BUILD:-} ]] || (cd "$ROOT" && cargo build -q --release -p vcdn)
VCDN="$ROOT/target/release/vcdn"

WORK=$(mktemp -d)
TB_PID=""
cleanup() {
  # The test bed kills what runs in its namespaces and deletes them.
  [[ -n $TB_PID ]] && kill -TERM "$TB_PID" 2>/dev/null && wait "$TB_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

NODES=(client front q1 mid q3 back origin)
declare -A AT=([client]=0 [front]=2 [q1]=45 [mid]=90 [q3]=135 [back]=178 [origin]=180)
{
  echo "src,dst,rtt_ms"
  for ((i = 0; i < ${#NODES[@]}; i++)); do
    for ((j = i + 1; j < ${#NODES[@]}; j++)); do
      a=${NODES[i]} b=${NODES[j]}
      d=$(( AT[$b] - AT[$a] )); (( d < 1 )) && d=1
      echo "$a,$b,$d"
    done
  done
} >"$WORK/rtt.csv"
KEEP=(); for n in front q1 mid q3 back; do KEEP+=(--keep-window "$n"); done
NAME=fig5
if [[ -n ${ORIGIN_KEEP_WINDOW:-} ]]; then KEEP+=(--keep-window origin); NAME=fig5-origin-keeps-window; fi
"$VCDN" testbed --rtt-matrix "$WORK/rtt.csv" --rate-mbit "$RATE_MBIT" "${KEEP[@]}" \
  >"$WORK/tb.out" 2>"$WORK/tb.err" &
TB_PID=$!
for _ in $(seq 100); do grep -q "running" "$WORK/tb.out" 2>/dev/null && break; sleep 0.1; done
grep -q "running" "$WORK/tb.out" || { cat "$WORK/tb.err"; echo "the test bed did not start" >&2; exit 1; }
cat "$WORK/tb.out"
declare -A NS ADDR
for n in "${NODES[@]}"; do
  NS[$n]=$(awk -v n="$n" '$1 == "node" && $2 == n":" {print $6}' "$WORK/tb.out")
  ADDR[$n]=$(awk -v n="$n" '$1 == "node" && $2 == n":" {print $4}' "$WORK/tb.out")
done
in_ns() { local n=$1; shift; ip netns exec "${NS[$n]}" "$@"; }
wait_line() { # file text
  for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  cat "$1" >&2; echo "no '$2' in $1" >&2; exit 1
}

in_ns origin "$VCDN" origin --listen "${ADDR[origin]}:8000" >"$WORK/origin.out" 2>&1 &
wait_line "$WORK/origin.out" "listening on"
ORIGIN_URL="http://${ADDR[origin]}:8000"

KEY=hop-key-for-the-fig5-reproduction-0123456789
TOKEN=admin-token-for-the-fig5-reproduction-0123
# proxy NODE NAME PORT WARM EGRESS [PEER...]: a vcdn proxy in NODE.
proxy() {
  local node=$1 name=$2 port=$3 warm=$4 egress=$5; shift 5
  local peers=() p
  for p in "$@"; do peers+=(--peer "$p=${ADDR[${p%%-*}]}:${PORT[$p]}"); done
  in_ns "$node" env VCDN_LOG=warn VCDN_PROXY_ADMIN_TOKEN=$TOKEN VCDN_PROXY_HOP_KEY=$KEY \
    "$VCDN" proxy --name "$name" --listen "${ADDR[$node]}:$port" --admin "127.0.0.1:$((port + 1000))" \
    --service shop --origin "$ORIGIN_URL" --egress "$egress" --warm "$warm" "${peers[@]}" \
    >"$WORK/proxy-$name.out" 2>&1 &
  wait_line "$WORK/proxy-$name.out" "listening on"
}
# Ports: each setup's proxies on their own ports, so the setups never share
# a connection. A proxy's name is NODE-SETUP.
declare -A PORT=([mid-m1]=8101 [q1-m3]=8201 [mid-m3]=8202 [q3-m3]=8203
  [front-v]=8301 [q1-v]=8302 [mid-v]=8303 [q3-v]=8304 [back-v]=8305)
# mosto-1: one proxy, ingress and egress.
proxy mid mid-m1 8101 0 mid-m1
# mosto-3: q1 -> mid -> q3, fresh connections.
proxy q3 q3-m3 8203 0 q3-m3
proxy mid mid-m3 8202 0 q3-m3 q3-m3
proxy q1 q1-m3 8201 0 q3-m3 mid-m3 q3-m3
M3_TABLE='{"version":1,"egress":"q3-m3","chains":[{"max_rounds":20,"chain":["q1-m3","mid-m3","q3-m3"]}]}'
in_ns q1 curl -sf -X PUT -H "Authorization: Bearer $TOKEN" --data "$M3_TABLE" \
  "http://127.0.0.1:9201/chains" >/dev/null
# vcdn: warm pools, chains from vcdn_policy::chains over the proxies' RTTs.
proxy back back-v 8305 2 back-v
proxy q3 q3-v 8304 2 back-v back-v
proxy mid mid-v 8303 2 back-v q3-v back-v
proxy q1 q1-v 8302 2 back-v mid-v q3-v back-v
proxy front front-v 8301 2 back-v q1-v mid-v q3-v back-v
{
  echo "src,dst,rtt_ms"
  for a in front q1 mid q3 back; do for b in front q1 mid q3 back; do
    [[ $a == "$b" ]] && continue
    d=$(( AT[$b] - AT[$a] )); (( d < 0 )) && d=$(( -d )); (( d < 1 )) && d=1
    echo "$a-v,$b-v,$d"
  done; done
} >"$WORK/proxies.csv"
# The table the controller would push: per rounds class, the chain
# vcdn chains picks from front-v to back-v.
python3 - "$VCDN" "$WORK/proxies.csv" >"$WORK/v-table.json" <<'EOF'
import json, subprocess, sys
vcdn, csv = sys.argv[1], sys.argv[2]
classes = []
for r in range(1, 21):
    size = 1460 * 10 * (2 ** r - 1)  # the largest size of r rounds
    out = json.loads(subprocess.check_output(
        [vcdn, "chains", "--rtt-matrix", csv, "--from", "front-v", "--to", "back-v", "--size", str(size)]))
    chain = out["chain"]["chain"]
    if classes and classes[-1]["chain"] == chain:
        classes[-1]["max_rounds"] = r
    else:
        classes.append({"max_rounds": r, "chain": chain})
print(json.dumps({"version": 1, "egress": "back-v", "chains": classes}))
EOF
echo "vcdn chain table: $(cat "$WORK/v-table.json")"
in_ns front curl -sf -X PUT -H "Authorization: Bearer $TOKEN" --data @"$WORK/v-table.json" \
  "http://127.0.0.1:9301/chains" >/dev/null

# The warm single reverse proxy (CloudFront's place): HAProxy next to the
# client, keeping its connection to the origin (no purge within the run).
cat >"$WORK/haproxy.cfg" <<EOF
global
  maxconn 1000
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  http-reuse always
frontend front
  bind ${ADDR[front]}:8080
  default_backend origin
backend origin
  server o ${ADDR[origin]}:8000 pool-purge-delay 600s pool-low-conn 1
EOF
in_ns front haproxy -f "$WORK/haproxy.cfg" -db >"$WORK/haproxy.out" 2>&1 &
for _ in $(seq 100); do in_ns client curl -sf -o /dev/null "http://${ADDR[front]}:8080/size/1" && break; sleep 0.1; done

declare -A URL=(
  [direct]="http://${ADDR[origin]}:8000"
  [mosto-1]="http://${ADDR[mid]}:8101"
  [mosto-3]="http://${ADDR[q1]}:8201"
  [warm-proxy]="http://${ADDR[front]}:8080"
  [vcdn]="http://${ADDR[front]}:8301"
)
SETUPS=(direct mosto-1 mosto-3 warm-proxy vcdn)
for s in warm-proxy vcdn; do
  for _ in 1 2 3 4 5; do in_ns client curl -sf -o /dev/null "${URL[$s]}/dynamic?size=500000"; done
done

mkdir -p "$HERE/raw"
OUT="$HERE/raw/$NAME.csv"
echo "setup,size,run,connect_s,starttransfer_s,total_s,bytes" >"$OUT"
for size in $SIZES; do
  for run in $(seq "$RUNS"); do
    for s in "${SETUPS[@]}"; do
      line=$(in_ns client curl -s -o /dev/null --max-time 30 \
        -w '%{time_connect},%{time_starttransfer},%{time_total},%{size_download}' \
        "${URL[$s]}/dynamic?size=$size")
      echo "$s,$size,$run,$line" >>"$OUT"
      sleep 0.05
    done
  done
  echo "size $size done"
done
python3 "$HERE/fig5.py" "$OUT" "$HERE" "$NAME"
