#!/usr/bin/env bash
# bench/reactive.sh - the first-connection penalty of reactive start
# (issue 17 point 6; goal < 15 ms, the MOSTO paper's unikernel booted in
# 10-12 ms): time from a client's connect to the first byte of the answer
# when the server has to be started for it, against a running server.
#
# Two holders on loopback, each measured RUNS times cold (the server exits
# after IDLE seconds without a connection, and the next request starts it
# again) and RUNS times warm (requests in a row):
#   origin  `vcdn reactive -- vcdn origin --listen-fd 3 --idle-exit IDLE`
#   proxy   `vcdn proxy --reactive --idle-exit 1` in front of an origin
#           (its cold start includes the proxy's own start-up: runtime,
#           RTT service, admin API)
# Prints median and p95 of curl's time_starttransfer per case.
#
# Environment (defaults): RUNS=25 IDLE=0.15 BASE_PORT=18580
#   VCDN_BIN=target/release/vcdn SKIP_BUILD=1 skips `cargo build`
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-25}
IDLE=${IDLE:-0.15}
BASE_PORT=${BASE_PORT:-18580}
command -v curl >/dev/null 2>&1 || {
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl
}
[[ -n ${SKIP_BUILD:-} ]] || (cd "$ROOT" && cargo build -q --release -p vcdn)
VCDN=${VCDN_BIN:-$ROOT/target/release/vcdn}

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_port() { for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$1/" && return 0; sleep 0.05; done; return 1; }
children() { cat "/proc/$1/task/$1/children" 2>/dev/null || true; }
# wait_cold HOLDER_PID: until the holder's server has exited (bounded).
wait_cold() { for _ in $(seq 200); do [[ -z $(children "$1") ]] && return 0; sleep 0.02; done; echo "server did not exit idle" >&2; return 1; }
ms() { curl -s -o /dev/null --max-time 5 -w '%{time_starttransfer}\n' "$1" | awk '{printf "%.3f\n", $1 * 1000}'; }
stats() { sort -n | awk '{v[NR]=$1} END {m=v[int((NR+1)/2)]; p=v[int(NR*0.95+0.5)]; printf "median %6.2f ms  p95 %6.2f ms", m, p}'; }

# measure NAME HOLDER_PID URL
measure() {
  local name=$1 holder=$2 url=$3 cold="" warm="" i
  for i in $(seq "$RUNS"); do wait_cold "$holder"; cold+="$(ms "$url")"$'\n'; done
  for i in $(seq "$RUNS"); do warm+="$(ms "$url")"$'\n'; done
  printf '%-7s cold: %s   warm: %s\n' "$name" "$(printf '%s' "$cold" | stats)" "$(printf '%s' "$warm" | stats)"
}

O=$BASE_PORT; P=$((BASE_PORT + 1)); R=$((BASE_PORT + 2))
"$VCDN" reactive --listen "127.0.0.1:$O" -- "$VCDN" origin --listen-fd 3 --idle-exit "$IDLE" >/dev/null 2>&1 &
PIDS+=($!); H1=$!
"$VCDN" origin --listen "127.0.0.1:$R" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$R"
VCDN_LOG=warn "$VCDN" proxy --reactive --name solo --listen "127.0.0.1:$P" --service bench \
  --origin "http://127.0.0.1:$R" --idle-exit 1 --keep-sysctl >/dev/null 2>&1 &
PIDS+=($!); H2=$!
sleep 0.3
echo "reactive start, $RUNS cold and $RUNS warm requests each ($(date -u +%FT%TZ), $(nproc) CPUs, $VCDN)"
measure origin "$H1" "http://127.0.0.1:$O/healthz"
measure proxy "$H2" "http://127.0.0.1:$P/size/1000"
