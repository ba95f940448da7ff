#!/usr/bin/env bash
# reproduce/mosto/fig1a.sh - the MOSTO paper's Fig. 1a on vcdn's test bed:
# the time of a direct HTTP transfer over a 100 ms RTT, 100 Mbit/s path, by
# size up to 1 MB, against the ideal time and the slow-start model.
#
# Two nodes in `vcdn testbed` (a namespace each, packets delayed 50 ms each
# way by the forwarder, every link capped at 100 Mbit/s with the default
# 100 ms drop-tail queue); `vcdn origin` in one serves /dynamic?size=N, curl
# in the other fetches it, RUNS times per size, each on a fresh connection.
# The nodes use cubic with tcp_no_metrics_save=1, as the paper's Linux hosts
# (this kernel defaults to bbr), MTU 1500.
#
# Output: raw/fig1a.csv (one line per transfer), fig1a.png and fig1a.md.
# Needs root (namespaces, TUN), curl and python3 with matplotlib.
#
# Environment (defaults): RUNS=10 SIZES="10000 20000 50000 100000 200000
#   300000 500000 750000 1000000" RTT_MS=100 RATE_MBIT=100 SKIP_BUILD=1
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
RUNS=${RUNS:-10}
SIZES=${SIZES:-"10000 20000 50000 100000 200000 300000 500000 750000 1000000"}
RTT_MS=${RTT_MS:-100}
RATE_MBIT=${RATE_MBIT:-100}

for tool in curl ip; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
    pkg=$([[ $tool == ip ]] && echo iproute2 || echo curl)
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg" \
      || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$pkg"; }
  fi
done
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install -q matplotlib

# The debug build keeps the forwarder optimised (Cargo.toml's profile); the
# origin's speed does not matter at 100 Mbit/s.
[[ -n ${SKIP_BUILD:-} ]] || (cd "$ROOT" && cargo build -q -p vcdn)
VCDN="$ROOT/target/debug/vcdn"

WORK=$(mktemp -d)
TB_PID=""
cleanup() {
  # The test bed kills what runs in its namespaces and deletes them.
  [[ -n $TB_PID ]] && kill -TERM "$TB_PID" 2>/dev/null && wait "$TB_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

printf 'src,dst,rtt_ms\nclient,origin,%s\n' "$RTT_MS" >"$WORK/rtt.csv"
"$VCDN" testbed --rtt-matrix "$WORK/rtt.csv" --rate-mbit "$RATE_MBIT" >"$WORK/tb.out" 2>"$WORK/tb.err" &
TB_PID=$!
for _ in $(seq 100); do grep -q "running" "$WORK/tb.out" 2>/dev/null && break; sleep 0.1; done
grep -q "running" "$WORK/tb.out" || { cat "$WORK/tb.err"; echo "the test bed did not start" >&2; exit 1; }
ns() { awk -v n="$1" '$1 == "node" && $2 == n":" {print $6}' "$WORK/tb.out"; }
NS_CLIENT=$(ns client)
NS_ORIGIN=$(ns origin)
ORIGIN_ADDR=$(awk '$1 == "node" && $2 == "origin:" {print $4}' "$WORK/tb.out")
cat "$WORK/tb.out"

ip netns exec "$NS_ORIGIN" "$VCDN" origin --listen "$ORIGIN_ADDR:8000" >"$WORK/origin.out" 2>&1 &
for _ in $(seq 100); do grep -q "listening on" "$WORK/origin.out" 2>/dev/null && break; sleep 0.1; done

mkdir -p "$HERE/raw"
OUT="$HERE/raw/fig1a.csv"
echo "size,run,connect_s,starttransfer_s,total_s,bytes" >"$OUT"
for size in $SIZES; do
  for run in $(seq "$RUNS"); do
    line=$(ip netns exec "$NS_CLIENT" curl -s -o /dev/null --max-time 30 \
      -w '%{time_connect},%{time_starttransfer},%{time_total},%{size_download}' \
      "http://$ORIGIN_ADDR:8000/dynamic?size=$size")
    echo "$size,$run,$line" >>"$OUT"
  done
  echo "size $size done"
done
python3 "$HERE/fig1a.py" "$OUT" "$RTT_MS" "$RATE_MBIT" "$HERE"
