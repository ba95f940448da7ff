#!/usr/bin/env bash
# reproduce/mosto/fig4.sh - the point of the MOSTO paper's Fig. 4 on vcdn's
# test bed: what happens to a running transfer when a proxy leaves its
# chain.
#
# The paper removes a proxy by joining the two TCP connections in a switch
# (sequence-number translation): the end points' RTT jumps from 50 to
# 100 ms, TCP takes the late packets for losses and the goodput collapses,
# which the paper softens by raising the delay in 10 ms steps. vcdn never
# joins connections: a proxy that leaves (scale-in, a new chain table, a
# stop) is sent SIGTERM, stops accepting, and carries the exchanges in
# flight to their end on their own connections (drain, up to 10 s); new
# requests take chains without it. Only a proxy that dies cuts its
# transfers (the client sees a truncated answer; the next request falls
# back within a second).
#
# Chain: client -2 ms- ingress -50 ms- transport -50 ms- egress -2 ms-
# origin, every link 20 Mbit/s. A 20 MB answer (~8 s) is fetched through
# the chain; at 3 s the transport is sent SIGTERM ("drain"), SIGKILL
# ("kill"), or nothing ("none"). The client logs its goodput every 100 ms;
# right after the event a second client fetches 500 KB through the same
# ingress and logs how long it took.
#
# Output: raw/fig4-*.csv, fig4.png, fig4.md. Needs root, python3 with
# matplotlib. Takes ~1 minute.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIZE=${SIZE:-20000000}
RATE_MBIT=${RATE_MBIT:-20}
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib
[[ -n ${SKIP_BUILD:-} ]] || (cd "$ROOT" && cargo build -q --release -p vcdn)
VCDN="$ROOT/target/release/vcdn"

WORK=$(mktemp -d)
TB_PID=""
cleanup() {
  [[ -n $TB_PID ]] && kill -TERM "$TB_PID" 2>/dev/null && wait "$TB_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/rtt.csv" <<'EOF'
src,dst,rtt_ms
client,ingress,2
client,transport,52
client,egress,102
client,origin,104
ingress,transport,50
ingress,egress,100
ingress,origin,102
transport,egress,50
transport,origin,52
egress,origin,2
EOF
"$VCDN" testbed --rtt-matrix "$WORK/rtt.csv" --rate-mbit "$RATE_MBIT" \
  --keep-window ingress --keep-window transport --keep-window egress >"$WORK/tb.out" 2>"$WORK/tb.err" &
TB_PID=$!
for _ in $(seq 100); do grep -q "running" "$WORK/tb.out" 2>/dev/null && break; sleep 0.1; done
grep -q "running" "$WORK/tb.out" || { cat "$WORK/tb.err"; exit 1; }
declare -A NS ADDR
for n in client ingress transport egress origin; do
  NS[$n]=$(awk -v n="$n" '$1 == "node" && $2 == n":" {print $6}' "$WORK/tb.out")
  ADDR[$n]=$(awk -v n="$n" '$1 == "node" && $2 == n":" {print $4}' "$WORK/tb.out")
done
in_ns() { local n=$1; shift; ip netns exec "${NS[$n]}" "$@"; }
wait_line() {
  for _ in $(seq 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  cat "$1" >&2; exit 1
}
in_ns origin "$VCDN" origin --listen "${ADDR[origin]}:8000" >"$WORK/origin.out" 2>&1 &
wait_line "$WORK/origin.out" "listening on"

KEY=hop-key-for-the-fig4-reproduction-0123456789
TABLE='{"version":1,"egress":"egress","chains":[{"max_rounds":20,"chain":["ingress","transport","egress"]}]}'
echo "$TABLE" >"$WORK/table.json"
start_proxy() { # node peers...
  local node=$1; shift
  local args=() p
  for p in "$@"; do args+=(--peer "$p=${ADDR[$p]}:8080"); done
  [[ $node == ingress ]] && args+=(--chains "$WORK/table.json")
  # Not through in_ns (a function runs in a subshell): $! must be the
  # proxy itself, which ip netns exec and env become.
  ip netns exec "${NS[$node]}" env VCDN_LOG=info VCDN_PROXY_HOP_KEY=$KEY "$VCDN" proxy --name "$node" \
    --listen "${ADDR[$node]}:8080" --service shop --origin "http://${ADDR[origin]}:8000" \
    --egress egress "${args[@]}" >"$WORK/proxy-$node.out" 2>&1 &
  PID[$node]=$!
  wait_line "$WORK/proxy-$node.out" "listening on"
}
declare -A PID

# goodput CSV of one transfer: t_s,bytes (every 100 ms), then a last line
# "end,<total bytes>,<status line>".
cat >"$WORK/client.py" <<'EOF'
import socket, sys, time
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.create_connection((host, port), timeout=20)
s.sendall(f"GET {path} HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n".encode())
t0 = time.monotonic(); tick = 0.1; got = 0; last = 0; total = 0; head = b""
while True:
    try:
        b = s.recv(1 << 16)
    except OSError:
        break
    if not b:
        break
    total += len(b)
    if len(head) < 200:
        head += b[:200]
    now = time.monotonic() - t0
    while now >= tick:
        print(f"{tick:.1f},{total - last}"); last = total; tick += 0.1
print(f"{tick:.1f},{total - last}")
status = head.split(b"\r\n")[0].decode(errors="replace")
print(f"end,{total},{status}")
EOF

for event in none drain kill; do
  start_proxy egress
  start_proxy transport egress
  start_proxy ingress transport egress
  sleep 1 # pools warm
  in_ns client python3 "$WORK/client.py" "${ADDR[ingress]}" 8080 "/size/$SIZE" >"$WORK/flow-$event.csv" &
  FLOW=$!
  sleep 3
  case $event in
    drain) kill -TERM "${PID[transport]}" ;;
    kill) kill -KILL "${PID[transport]}" ;;
  esac
  t0=$(date +%s.%N)
  second=$(in_ns client curl -s -o /dev/null --max-time 10 -w '%{http_code},%{time_total}' \
    "http://${ADDR[ingress]}:8080/size/500000" || echo "fail,")
  wait "$FLOW" || true
  mkdir -p "$HERE/raw"
  { echo "t_s,bytes"; cat "$WORK/flow-$event.csv"; echo "second,$second"; } >"$HERE/raw/fig4-$event.csv"
  for n in ingress transport egress; do kill -TERM "${PID[$n]}" 2>/dev/null || true; done
  for n in ingress transport egress; do wait "${PID[$n]}" 2>/dev/null || true; done
  for n in ingress transport egress; do while kill -0 "${PID[$n]}" 2>/dev/null; do sleep 0.1; done; done
  echo "event $event: $(grep '^end' "$WORK/flow-$event.csv"), second request $second"
done
python3 "$HERE/fig4.py" "$HERE" "$SIZE"
