#!/usr/bin/env bash
# bench/relay.sh - relay cost: Gbit relayed per proxy CPU-second, `vcdn
# proxy` (--relay splice, --relay sockmap) vs HAProxy in TCP mode (with
# `option splice-auto`, and plain), in the same run on the same core.
#
# On loopback: `vcdn origin` serves /size/N on CPU 1; every proxy runs alone
# on CPU 0 as one process (vcdn: no peers, so it is ingress and egress at
# once and speaks HTTP/1.1 to the client and to the origin; HAProxy:
# `mode tcp`, nbthread 1); curl on CPU 1 fetches through it. The proxies are
# started once and take turns, round after round, so each round sees the
# same machine state for all of them. Per run: bytes the clients received,
# wall time, the proxy's CPU time (utime+stime of its process tree, from
# /proc) and the busy time of CPU 0 not charged to the proxy (the
# disturbance: other processes, or softirq work the kernel did not charge
# to it; the sockmap's kernel work runs in softirq and kworkers, so check
# this column before believing a sockmap number).
#
# Scenarios:
#   large - LARGE_COUNT answers of LARGE_BYTES, LARGE_PARALLEL at once, on
#           kept-alive connections: the relay itself.
#   small - SMALL_COUNT answers of SMALL_BYTES, SMALL_PARALLEL at once, each
#           on a fresh client connection (Connection: close): per-request
#           work matters (vcdn parses HTTP and keeps its origin connections
#           warm; HAProxy in TCP mode opens an origin connection per client
#           connection and parses nothing).
#
# Environment knobs:
#   ROUNDS=3            rounds; the summary gives medians
#   PROXIES="vcdn-splice vcdn-sockmap haproxy-splice haproxy-plain"
#   LARGE_BYTES=67108864 LARGE_COUNT=24 LARGE_PARALLEL=4
#   SMALL_BYTES=500000   SMALL_COUNT=1500 SMALL_PARALLEL=8
#   RUN_TIMEOUT=60      seconds a run may take at most
#   BASE_PORT=18480     origin=BASE, proxies BASE+1..
#   VCDN_BIN=target/release/vcdn   SKIP_BUILD=1 skips `cargo build`
#   OUT=bench/results/relay-latest.md   markdown copy of the report
#
# Needs root (apt-get; the sockmap relay needs CAP_BPF). Only loopback.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

ROUNDS=${ROUNDS:-3}
PROXIES=${PROXIES:-vcdn-splice vcdn-sockmap haproxy-splice haproxy-plain}
LARGE_BYTES=${LARGE_BYTES:-67108864}
LARGE_COUNT=${LARGE_COUNT:-24}
LARGE_PARALLEL=${LARGE_PARALLEL:-4}
SMALL_BYTES=${SMALL_BYTES:-500000}
SMALL_COUNT=${SMALL_COUNT:-1500}
SMALL_PARALLEL=${SMALL_PARALLEL:-8}
RUN_TIMEOUT=${RUN_TIMEOUT:-60}
BASE_PORT=${BASE_PORT:-18480}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-$ROOT/bench/results/relay-latest.md}

SERVER_CPU=0
CLIENT_CPU=1
CLK_TCK=$(getconf CLK_TCK)
ORIGIN_PORT=$BASE_PORT
declare -A PORT=([vcdn-splice]=$((BASE_PORT + 1)) [vcdn-sockmap]=$((BASE_PORT + 2))
                 [haproxy-splice]=$((BASE_PORT + 3)) [haproxy-plain]=$((BASE_PORT + 4)))
declare -A PID=()

log() { printf '[relay.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[relay.sh] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get, BPF)"
for p in $PROXIES; do [[ -n ${PORT[$p]:-} ]] || die "unknown proxy '$p' in PROXIES"; done

# ---------------------------------------------------------------- install --
install_packages() {
  local missing=()
  command -v haproxy >/dev/null || missing+=(haproxy)
  command -v curl >/dev/null || missing+=(curl)
  command -v taskset >/dev/null || missing+=(util-linux)
  command -v ss >/dev/null || missing+=(iproute2)
  if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    apt-get update -qq
    # policy-rc.d exit 101 keeps the package from starting its own service.
    local policy_added=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
      chmod +x /usr/sbin/policy-rc.d
      policy_added=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${missing[@]}" >&2 || { ((policy_added)) && rm -f /usr/sbin/policy-rc.d; die "apt-get install failed"; }
    ((policy_added)) && rm -f /usr/sbin/policy-rc.d
  fi
}

# ------------------------------------------------------------- processes --
TMP=""
cleanup() {
  local rc=$? p
  trap - EXIT INT TERM
  set +e
  for p in "${PID[@]}"; do stop_tree "$p"; done
  [[ -n $TMP ]] && rm -rf "$TMP"
  exit "$rc"
}

wait_port() {
  local port=$1 i
  for i in $(seq 200); do
    ! port_free "$port" && return 0
    sleep 0.05
  done
  return 1
}

start_origin() {
  taskset -c "$CLIENT_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" \
    >"$TMP/origin.log" 2>&1 &
  PID[origin]=$!
}

start_vcdn() { # NAME MODE
  RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$VCDN_BIN" proxy --name bench \
    --listen "127.0.0.1:${PORT[$1]}" --service bench --origin "http://127.0.0.1:$ORIGIN_PORT" \
    --keep-sysctl --relay "$2" >"$TMP/$1.log" 2>&1 &
  PID[$1]=$!
}

start_haproxy() { # NAME SPLICE(0|1)
  local cfg=$TMP/$1.cfg
  {
    echo "global"
    echo "  nbthread 1"
    echo "  maxconn 4096"
    echo "defaults"
    echo "  mode tcp"
    echo "  timeout connect 5s"
    echo "  timeout client 60s"
    echo "  timeout server 60s"
    [[ $2 == 1 ]] && echo "  option splice-auto"
    echo "frontend fe"
    echo "  bind 127.0.0.1:${PORT[$1]}"
    echo "  default_backend be"
    echo "backend be"
    echo "  server origin 127.0.0.1:$ORIGIN_PORT"
  } >"$cfg"
  taskset -c "$SERVER_CPU" haproxy -db -f "$cfg" >"$TMP/$1.log" 2>&1 &
  PID[$1]=$!
}

start_proxy() {
  case $1 in
    vcdn-splice) start_vcdn "$1" splice ;;
    vcdn-sockmap) start_vcdn "$1" sockmap ;;
    haproxy-splice) start_haproxy "$1" 1 ;;
    haproxy-plain) start_haproxy "$1" 0 ;;
  esac
  wait_port "${PORT[$1]}" || { tail -20 "$TMP/$1.log" >&2; die "$1 did not start"; }
  pin_tree "${PID[$1]}"
}

# ------------------------------------------------------------------- runs --
# CPU ticks of every kernel worker thread (kworker, ksoftirqd): the sockmap
# relay sends redirected data from a kworker, and its verdict runs in
# softirq wherever the packet arrives (often the sender's CPU), none of it
# charged to the proxy.
kworker_ticks() {
  local f total=0 line
  for f in /proc/[0-9]*/stat; do
    line=$(cat "$f" 2>/dev/null) || continue
    case $line in *"(kworker"* | *"(ksoftirqd"*) ;; *) continue ;; esac
    line=${line##*) }
    read -ra a <<<"$line"
    total=$((total + a[11] + a[12]))
  done
  echo "$total"
}

# curl config: COUNT transfers of PATH to /dev/null (HEADER added when set).
write_curl_config() { # FILE PORT PATH COUNT [HEADER]
  local i
  {
    [[ -n ${5:-} ]] && echo "header = \"$5\""
    for ((i = 0; i < $4; i++)); do
      echo "url = \"http://127.0.0.1:$2$3\""
      echo "output = \"/dev/null\""
    done
  } >"$1"
}

# run NAME SCENARIO ROUND -> a row in results.tsv; NAME "direct" = no proxy.
run() {
  local name=$1 scen=$2 round=$3 bytes count par header="" port
  if [[ $scen == large ]]; then
    bytes=$LARGE_BYTES count=$LARGE_COUNT par=$LARGE_PARALLEL
  else
    bytes=$SMALL_BYTES count=$SMALL_COUNT par=$SMALL_PARALLEL header="Connection: close"
  fi
  port=${PORT[$name]:-$ORIGIN_PORT}
  write_curl_config "$TMP/curl.cfg" "$port" "/size/$bytes" "$count" "$header"
  local root=${PID[$name]:-${PID[origin]}} t0 t1 c0 c1 o0 o1 k0 k1 w0 w1 out=$TMP/curl.out
  t0=$(cpu_ticks "$root"); o0=$(cpu_ticks "${PID[origin]}"); c0=$(core_busy_ticks); k0=$(kworker_ticks)
  w0=$(date +%s%N)
  timeout "$RUN_TIMEOUT" taskset -c "$CLIENT_CPU" curl -s -Z --parallel-max "$par" \
    -w '%{http_code} %{size_download}\n' -K "$TMP/curl.cfg" >"$out" 2>"$TMP/curl.err" || true
  w1=$(date +%s%N)
  t1=$(cpu_ticks "$root"); o1=$(cpu_ticks "${PID[origin]}"); c1=$(core_busy_ticks); k1=$(kworker_ticks)
  local got ok
  got=$(awk '$1 == 200 { s += $2 } END { printf "%d", s }' "$out")
  ok=$(awk -v b="$bytes" '$1 == 200 && $2 == b { n++ } END { print n + 0 }' "$out")
  ((ok == count)) || log "WARNING: $name $scen: $ok of $count answers complete (timeout ${RUN_TIMEOUT}s or errors: $(head -c 200 "$TMP/curl.err"))"
  local proxy_ticks=$((t1 - t0))
  [[ $name == direct ]] && proxy_ticks=0
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scen" "$name" "$round" "$got" \
    "$(((w1 - w0) / 1000))" "$proxy_ticks" "$((o1 - o0))" "$((c1 - c0 - proxy_ticks))" "$((count - ok))" \
    "$((k1 - k0))" >>"$TMP/results.tsv"
  awk -v n="$name" -v s="$scen" -v r="$round" -v b="$got" -v us="$(((w1 - w0) / 1000))" \
      -v t="$proxy_ticks" -v hz="$CLK_TCK" -v o="$((c1 - c0 - proxy_ticks))" 'BEGIN {
    g = b * 8 / 1e9; c = t / hz
    printf "[relay.sh] round %d %-6s %-15s %6.2f Gbit/s  proxy CPU %5.2f s  %7.1f Gbit/CPU-s  CPU0 not charged %5.2f s\n",
      r, s, n, g / (us / 1e6), c, (c > 0 ? g / c : 0), o / hz }' >&2
  sleep 0.5
}

# ----------------------------------------------------------------- report --
report() {
  {
    echo "# Relay cost: vcdn proxy vs HAProxy (TCP mode)"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, kernel $(uname -r)"
    echo "- load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- vcdn: $("$VCDN_BIN" --version 2>/dev/null || echo unknown) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-commit)); HAProxy: $(haproxy -v 2>/dev/null | head -1 | awk '{print $3}')"
    echo "- each proxy one process pinned to CPU $SERVER_CPU; origin (vcdn origin) and curl on CPU $CLIENT_CPU; loopback"
    echo "- large: $LARGE_COUNT × $LARGE_BYTES B, $LARGE_PARALLEL in parallel, keep-alive; small: $SMALL_COUNT × $SMALL_BYTES B, $SMALL_PARALLEL in parallel, a fresh client connection each"
    echo "- proxy CPU-s: utime+stime of its process tree (/proc); 'CPU0 other s': busy time of CPU $SERVER_CPU not charged to the proxy (softirq the kernel did not charge, other processes); medians of $ROUNDS round(s)"
    echo "- ratio: vcdn's Gbit per CPU-s over the better HAProxy variant's in the same scenario"
    echo "- origin CPU-s and kernel workers s (all kworker and ksoftirqd threads): work a proxy may push elsewhere. The sockmap relay's verdict runs in softirq where packets arrive (often the origin's CPU, charged to the origin) and its sends run in a kworker: none of that is in proxy CPU-s, so compare those columns with the splice rows before believing a sockmap ratio"
    echo
  } >"$TMP/report.md"
  local scen
  for scen in large small; do
    grep -q "^$scen	" "$TMP/results.tsv" || continue
    {
      echo "## $scen"
      echo
      echo "| proxy | Gbit/s | proxy CPU-s | Gbit per proxy CPU-s | CPU0 other s | origin CPU-s | kernel workers s | failed | vs HAProxy best |"
      echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
      awk -F'\t' -v scen="$scen" -v hz="$CLK_TCK" -v order="direct $PROXIES" '
        function med(a, n,   i, j, t) {
          for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
          return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
        }
        $1 == scen {
          p = $2; k = ++n[p]
          gbit = $4 * 8 / 1e9; cpu = $6 / hz
          rate[p, k] = gbit / ($5 / 1e6); cs[p, k] = cpu; eff[p, k] = (cpu > 0) ? gbit / cpu : 0
          oth[p, k] = $8 / hz; fail[p] += $9; org[p, k] = $7 / hz; kw[p, k] = $10 / hz
        }
        END {
          m = split(order, names, " ")
          for (i = 1; i <= m; i++) {
            p = names[i]; if (!n[p]) continue
            delete a; for (k = 1; k <= n[p]; k++) a[k] = rate[p, k]; R[p] = med(a, n[p])
            delete a; for (k = 1; k <= n[p]; k++) a[k] = cs[p, k]; C[p] = med(a, n[p])
            delete a; for (k = 1; k <= n[p]; k++) a[k] = eff[p, k]; E[p] = med(a, n[p])
            delete a; for (k = 1; k <= n[p]; k++) a[k] = oth[p, k]; O[p] = med(a, n[p])
            delete a; for (k = 1; k <= n[p]; k++) a[k] = org[p, k]; G[p] = med(a, n[p])
            delete a; for (k = 1; k <= n[p]; k++) a[k] = kw[p, k]; K[p] = med(a, n[p])
            if (p ~ /^haproxy/ && E[p] > best) best = E[p]
          }
          for (i = 1; i <= m; i++) {
            p = names[i]; if (!n[p]) continue
            if (p == "direct") {
              printf "| direct (no proxy: origin capacity) | %.2f | - | - | - | %.2f | %.2f | %d | - |\n", R[p], G[p], K[p], fail[p]
              continue
            }
            ratio = (p ~ /^vcdn/ && best > 0) ? sprintf("%.2fx", E[p] / best) : "-"
            printf "| %s | %.2f | %.2f | %.1f | %.2f | %.2f | %.2f | %d | %s |\n", p, R[p], C[p], E[p], O[p], G[p], K[p], fail[p], ratio
          }
        }' "$TMP/results.tsv"
      echo
    } >>"$TMP/report.md"
  done
  mkdir -p "$(dirname "$OUT")"
  cp "$TMP/report.md" "$OUT"
  cat "$TMP/report.md"
}

# ------------------------------------------------------------------- main --
install_packages
if [[ $SKIP_BUILD != 1 ]]; then
  log "building vcdn (release)"
  (cd "$ROOT" && cargo build --release -p vcdn >&2)
fi
[[ -x $VCDN_BIN ]] || die "no $VCDN_BIN"
TMP=$(mktemp -d /tmp/vcdn-relay-bench.XXXXXX)
trap cleanup EXIT INT TERM
for port in "$ORIGIN_PORT" "${PORT[@]}"; do port_free "$port" || die "port $port is in use (set BASE_PORT)"; done

start_origin
wait_port "$ORIGIN_PORT" || die "origin did not start"
for p in $PROXIES; do start_proxy "$p"; done
# Each answer must arrive whole through every proxy before anything is timed.
for p in $PROXIES; do
  n=$(curl -s --max-time 10 -o /dev/null -w '%{size_download}' "http://127.0.0.1:${PORT[$p]}/size/1000000" || true)
  [[ $n == 1000000 ]] || { tail -20 "$TMP/$p.log" >&2; die "$p: /size/1000000 gave ${n:-nothing}"; }
done
log "all proxies answer; $ROUNDS round(s)"
: >"$TMP/results.tsv"
for round in $(seq "$ROUNDS"); do
  for scen in large small; do
    run direct "$scen" "$round"
    for p in $PROXIES; do run "$p" "$scen" "$round"; done
  done
done
report
