#!/usr/bin/env bash
# bench/dns.sh - vcdn's router (geo-DNS) vs Knot DNS, and HTTP routing.
#
# DNS: dnsperf (CPU 1) against `vcdn router` and against Knot DNS serving an
# equivalent static zone (CPU 0 each, one UDP worker each), same run. The
# query is the A record of a service hostname with 4 caches; vcdn locates
# every query through a coverage-zone table of 1,000 CIDRs (geolocation on),
# plain and with an EDNS Client Subnet option; Knot answers the same 4 A
# records statically. Reports max QPS (dnsperf, unbounded), the server's CPU
# time per query, and latency percentiles from a fixed-rate run.
#
# HTTP routing: wrk against the router's HTTP port (router pinned to CPU 0,
# LRU filter on), routed requests/s on one core.
#
# Environment: DURATION=10s (each max-QPS run), RATE=20000 (latency run
# q/s), LAT_DURATION=5 (s), ROUNDS=1, BASE_PORT=19500, SKIP_BUILD=1,
# OUT=bench/results/dns-latest.md. Needs root (apt-get). Loopback only.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

DURATION=${DURATION:-10s}
RATE=${RATE:-20000}
LAT_DURATION=${LAT_DURATION:-5}
ROUNDS=${ROUNDS:-1}
BASE_PORT=${BASE_PORT:-19500}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-$ROOT/bench/results/dns-latest.md}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
SERVER_CPU=0
CLIENT_CPU=1
CLK_TCK=$(getconf CLK_TCK)
DUR_S=$(dur_secs "$DURATION")

VCDN_DNS=$BASE_PORT KNOT_DNS=$((BASE_PORT + 1)) ROUTER_HTTP=$((BASE_PORT + 2))
ROUTER_ADMIN=$((BASE_PORT + 3)) CACHE_PORT=$((BASE_PORT + 4)) CACHE_ADMIN=$((BASE_PORT + 5))
ORIGIN_PORT=$((BASE_PORT + 6))

log() { printf '[dns.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[dns.sh] ERROR: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (installs packages)"

install_tools() {
  local need=()
  command -v knotd >/dev/null || need+=(knot)
  command -v dnsperf >/dev/null || need+=(dnsperf)
  command -v dig >/dev/null || need+=(bind9-dnsutils)
  command -v wrk >/dev/null || need+=(wrk)
  if ((${#need[@]})); then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2 \
      || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >&2; }
  fi
  # Debian starts a system knot on install; it would share the CPU.
  systemctl stop knot >/dev/null 2>&1 || true
  systemctl disable knot >/dev/null 2>&1 || true
}

STARTED=()
cleanup() { local p; for p in "${STARTED[@]}"; do stop_tree "$p"; done; rm -rf "${TMP:-/nonexistent}"; }
trap cleanup EXIT

write_configs() {
  # 1,000 coverage zones, the client's (127.0.0.0/8) last among them.
  {
    echo 'default_region = "paris"'
    echo '[dns]'
    echo 'zone = "bench.example"'
    echo 'hostmaster = "hostmaster.bench.example"'
    echo 'ns = [{ name = "ns1.bench.example", address = "127.0.0.1" }]'
    echo 'threads = 1'
    local i
    for i in $(seq 0 998); do
      printf '[[coverage]]\ncidr = "10.%d.%d.0/24"\nregion = "r%d"\n' $((i / 256)) $((i % 256)) $((i % 10))
    done
    printf '[[coverage]]\ncidr = "127.0.0.0/8"\nregion = "paris"\n'
    echo '[[services]]'
    echo 'name = "video"'
    echo 'hostname = "video.bench.example"'
    echo "origin = \"http://127.0.0.1:$ORIGIN_PORT\""
    echo 'admission = { filter = "lru", size = 100000 }'
    echo '[[services.regions]]'
    echo 'region = "paris"'
    printf 'caches = ['
    for i in 1 2 3 4; do
      printf '{ address = "127.10.0.%d:%d", admin = "127.0.0.1:%d" }%s' "$i" "$CACHE_PORT" "$CACHE_ADMIN" "$([[ $i -lt 4 ]] && echo ', ')"
    done
    echo ']'
  } >"$TMP/router.toml"
  mkdir -p "$TMP/knot/db"
  sed -e "s|@RUN_DIR@|$TMP/knot|g" -e "s|@PORT@|$KNOT_DNS|g" "$BENCH_DIR/peers/knot.conf.tmpl" >"$TMP/knot/knot.conf"
  {
    echo '$ORIGIN bench.example.'
    echo '$TTL 20'
    echo '@ 3600 IN SOA ns1.bench.example. hostmaster.bench.example. 1 3600 600 86400 60'
    echo '@ 3600 IN NS ns1.bench.example.'
    echo 'ns1 3600 IN A 127.0.0.1'
    local i
    for i in 1 2 3 4; do echo "video IN A 127.10.0.$i"; done
  } >"$TMP/knot/bench.example.zone"
  for i in $(seq 1000); do echo "video.bench.example A"; done >"$TMP/queries.txt"
}

# dnsperf_run NAME PORT EXTRA... -> appends "name qps cpu_s" to results
dnsperf_max() {
  local name=$1 port=$2 root=$3; shift 3
  local t0 t1 out
  out=$TMP/dnsperf-$name.txt
  t0=$(cpu_ticks "$root")
  taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$TMP/queries.txt" -l "$DUR_S" \
    -c 1 -T 1 -q 500 -t 2 "$@" >"$out" 2>&1 || { cat "$out" >&2; die "dnsperf failed against $name"; }
  t1=$(cpu_ticks "$root")
  local qps lost
  qps=$(awk '/Queries per second:/ { print $4 }' "$out")
  lost=$(awk '/Queries lost:/ { print $3 }' "$out")
  local cpu; cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  log "$(printf '%-22s max %10.0f q/s  server cpu %5ss  lost %s' "$name" "$qps" "$cpu" "$lost")"
  printf '%s\t%s\t%s\t%s\n' "$name" "$qps" "$cpu" "$lost" >>"$TMP/max.tsv"
}

# Fixed-rate run with per-query latencies (-v): p50 / p99 / p99.9 in µs.
dnsperf_latency() {
  local name=$1 port=$2; shift 2
  local out=$TMP/lat-$name.txt
  taskset -c "$CLIENT_CPU" dnsperf -s 127.0.0.1 -p "$port" -d "$TMP/queries.txt" -l "$LAT_DURATION" \
    -Q "$RATE" -c 1 -T 1 -t 2 -v "$@" >"$out" 2>&1 || die "dnsperf latency run failed against $name"
  # Verbose lines: "> NOERROR video.bench.example A 0.000123"
  local p
  p=$(awk '$1 == ">" { print $NF * 1e6 }' "$out" | sort -n | awk '
      function at(q,   i) { i = int(NR * q) + 1; if (i > NR) i = NR; return v[i] }
      { v[NR] = $1 }
      END { if (NR == 0) print "- - -"; else printf "%.0f %.0f %.0f", at(0.5), at(0.99), at(0.999) }')
  log "$(printf '%-22s at %s q/s: p50 %s µs  p99 %s µs  p99.9 %s µs' "$name" "$RATE" $p)"
  printf '%s\t%s\n' "$name" "$p" >>"$TMP/lat.tsv"
}

main() {
  install_tools
  if [[ $SKIP_BUILD != 1 ]]; then
    log "building vcdn (cargo build --release -p vcdn)"
    (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "cargo build failed"
  fi
  mkdir -p "$(dirname "$OUT")"
  TMP=$(mktemp -d /tmp/vcdn-dns-bench.XXXXXX)
  write_configs

  taskset -c "$CLIENT_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" >"$TMP/origin.log" 2>&1 &
  STARTED+=($!)
  taskset -c "$CLIENT_CPU" "$VCDN_BIN" cache --listen "127.0.0.1:$CACHE_PORT" --admin "127.0.0.1:$CACHE_ADMIN" \
    --admin-token bench-admin-token-0123456789abcdef0123 --upstream "http://127.0.0.1:$ORIGIN_PORT" --threads 1 >"$TMP/cache.log" 2>&1 &
  STARTED+=($!)
  VCDN_LOG=warn taskset -c "$SERVER_CPU" "$VCDN_BIN" router --config "$TMP/router.toml" \
    --dns "127.0.0.1:$VCDN_DNS" --http "127.0.0.1:$ROUTER_HTTP" --admin "127.0.0.1:$ROUTER_ADMIN" \
    --admin-token bench-admin-token-0123456789abcdef0123 --dns-threads 1 >"$TMP/router.log" 2>&1 &
  local router=$!
  STARTED+=("$router")
  taskset -c "$SERVER_CPU" knotd -c "$TMP/knot/knot.conf" >"$TMP/knot.log" 2>&1 &
  local knot=$!
  STARTED+=("$knot")
  local i
  for i in $(seq 100); do
    dig +short +time=1 +tries=1 -p "$VCDN_DNS" @127.0.0.1 video.bench.example A 2>/dev/null | grep -q 127.10 \
      && dig +short +time=1 +tries=1 -p "$KNOT_DNS" @127.0.0.1 video.bench.example A 2>/dev/null | grep -q 127.10 \
      && break
    sleep 0.1
  done
  local a b
  a=$(dig +short -p "$VCDN_DNS" @127.0.0.1 video.bench.example A | sort | tr '\n' ' ')
  b=$(dig +short -p "$KNOT_DNS" @127.0.0.1 video.bench.example A | sort | tr '\n' ' ')
  [[ -n $a && $a == "$b" ]] || { cat "$TMP/router.log" "$TMP/knot.log" >&2; die "servers disagree or are down: vcdn '$a' knot '$b'"; }
  log "both answer video.bench.example A with: $a"
  pin_tree "$router"; pin_tree "$knot"

  # ECS option: family 1, source /24, scope 0, 127.1.2.0
  local ecs="-E 8:00011800${ECS_HEX:-7f0102}"
  local r
  for r in $(seq "$ROUNDS"); do
    ((ROUNDS > 1)) && log "round $r of $ROUNDS"
    dnsperf_max "vcdn" "$VCDN_DNS" "$router"
    dnsperf_max "knot" "$KNOT_DNS" "$knot"
    dnsperf_max "vcdn+ecs" "$VCDN_DNS" "$router" $ecs
    dnsperf_max "knot+ecs" "$KNOT_DNS" "$knot" $ecs
  done
  dnsperf_latency "vcdn" "$VCDN_DNS"
  dnsperf_latency "knot" "$KNOT_DNS"

  # HTTP routing on one core.
  log "HTTP routing: wrk -t2 -c50 -d$DURATION against the router"
  write_wrk_lua
  local t0 t1
  t0=$(cpu_ticks "$router")
  taskset -c "$CLIENT_CPU" wrk -t2 -c50 -d"$DURATION" -H 'Host: video.bench.example' -s "$TMP/report.lua" \
    "http://127.0.0.1:$ROUTER_HTTP/vod/title/seg-1.m4s" >"$TMP/wrk.txt" 2>&1 || true
  t1=$(cpu_ticks "$router")
  local line requests duration_us non2xx kv
  line=$(grep '^BENCH ' "$TMP/wrk.txt") || { cat "$TMP/wrk.txt" >&2; die "no wrk result"; }
  for kv in ${line#BENCH }; do printf -v "${kv%%=*}" '%s' "${kv#*=}"; done
  local http_rps http_cpu
  http_rps=$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { printf "%.0f", r / (d / 1e6) }')
  http_cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  log "HTTP routing: $http_rps redirects/s, router cpu ${http_cpu}s over $DURATION (non-3xx: $non2xx)"

  report "$http_rps" "$http_cpu" | tee "$OUT"
  log "report written to $OUT"
}

report() {
  echo "# vcdn router benchmark"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) CPUs, $(awk '/model name/ { $1=$2=$3=""; print; exit }' /proc/cpuinfo | sed 's/^ *//'), kernel $(uname -r)"
  echo "- vcdn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'); $(knotd --version 2>&1 | head -1); dnsperf $(dnsperf -h 2>&1 | awk '/Version/ { print $2 }')"
  echo "- servers pinned to CPU $SERVER_CPU with one UDP worker each, dnsperf (-c1 -T1 -q500) on CPU $CLIENT_CPU, $DURATION per run, median of $ROUNDS round(s)"
  echo
  echo "| run | vcdn q/s | Knot q/s | vcdn/Knot | vcdn CPU µs/query | Knot CPU µs/query |"
  echo "|---|---:|---:|---:|---:|---:|"
  awk -F'\t' '
    function med(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } return a[int((n + 1) / 2)] }
    { q[$1] = q[$1] " " $2; c[$1] = c[$1] " " ($3 / ($2 * '"$DUR_S"') * 1e6) }
    END {
      split("|+ecs", suf, "|")
      for (k = 1; k <= 2; k++) { v = "vcdn" suf[k]; n = "knot" suf[k]
        printf "| %s | %.0f | %.0f | **%.2f×** | %.2f | %.2f |\n", (k == 1 ? "plain query" : "with EDNS Client Subnet"), med(q[v]), med(q[n]), med(q[v]) / med(q[n]), med(c[v]), med(c[n]) }
    }' "$TMP/max.tsv"
  echo
  echo "Latency at a fixed $RATE q/s (dnsperf -Q, $LAT_DURATION s):"
  echo
  echo "| server | p50 µs | p99 µs | p99.9 µs |"
  echo "|---|---:|---:|---:|"
  awk -F'\t' '{ split($2, p, " "); printf "| %s | %s | %s | %s |\n", $1, p[1], p[2], p[3] }' "$TMP/lat.tsv"
  echo
  echo "HTTP routing (LRU filter on, wrk -t2 -c50 on CPU $CLIENT_CPU): **$1 redirects/s** on one core (router CPU ${2}s in $DURATION)."
}

main "$@"
