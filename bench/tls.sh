#!/usr/bin/env bash
# bench/tls.sh - vcdn's edge over TLS and HTTP/2 against nginx (and HAProxy
# for handshakes), all in the same run on the same cores.
#
# Every server runs alone, pinned to CPU 0, sized for one core; the load
# tools run on CPU 1. All use the same ECDSA P-256 certificate; key exchange
# is each stack's default (X25519). Measured per server CPU-second (utime +
# stime of the server's processes from /proc):
#   handshakes-full     full TLS 1.3 handshakes (openssl s_time -new, P
#                       clients in parallel)
#   handshakes-resumed  resumed TLS 1.3 handshakes (openssl s_time -reuse)
#   handshakes-full12   full TLS 1.2 handshakes (ECDHE-ECDSA-AES128-GCM)
#   h1-43B              cached 43 B over HTTPS keep-alive, HTTP/1.1 (wrk)
#   h2-43B              cached 43 B over HTTP/2, many streams per
#                       connection (h2load -m STREAMS)
#   h1-1MiB             cached 1 MiB over HTTPS (wrk): Gbit per CPU-second
#   plain-1MiB          the same over vcdn's plain port (sendfile): what TLS
#                       costs per Gbit
#   idle                memory of idle TLS and HTTP/2 connections (RSS
#                       growth with N idle connections, per connection; each kind in a fresh server process)
# Varnish has no TLS: it is not in these runs.
#
# Environment knobs:
#   DURATION=10      seconds per measured run
#   ROUNDS=1         repeat, servers interleaved; the report keeps medians
#   SCENARIOS="handshakes-full handshakes-resumed handshakes-full12 h1-43B h2-43B h1-1MiB idle"
#   SERVERS="vcdn nginx haproxy"   (HAProxy only takes the handshake runs)
#   CLIENTS=4        parallel s_time processes
#   STREAMS=32       h2load -m; H2_CONNS=10 h2load -c
#   IDLE_CONNS=2000  idle connections for the memory run
#   BASE_PORT=18180  origin=BASE, vcdn=+1 (TLS +11), nginx=+2, haproxy=+3
#   VCDN_BIN=target/release/vcdn   SKIP_BUILD=1 skips `cargo build`
#   OUT=bench/results/tls-latest.md
# Needs root (apt-get). Only loopback traffic; every run bounded in time.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
PEERS_DIR=$BENCH_DIR/peers

DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-1}
SCENARIOS=${SCENARIOS:-handshakes-full handshakes-resumed handshakes-full12 h1-43B h2-43B h1-1MiB plain-1MiB idle}
SERVERS=${SERVERS:-vcdn nginx haproxy}
CLIENTS=${CLIENTS:-4}
STREAMS=${STREAMS:-32}
H2_CONNS=${H2_CONNS:-10}
IDLE_CONNS=${IDLE_CONNS:-2000}
BASE_PORT=${BASE_PORT:-18180}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-$ROOT/bench/results/tls-latest.md}

SERVER_CPU=0
CLIENT_CPU=1
CLK_TCK=$(getconf CLK_TCK)
MEMORY_BYTES=536870912
ORIGIN_PORT=$BASE_PORT
declare -A PORT=([vcdn]=$((BASE_PORT + 11)) [nginx]=$((BASE_PORT + 2)) [haproxy]=$((BASE_PORT + 3)))
declare -A LABEL=([vcdn]=vcdn [nginx]=nginx [haproxy]=HAProxy)
HOST=bench.example

log() { printf '[tls.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[tls.sh] ERROR: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (installs packages)"

install_packages() {
  local missing=()
  command -v nginx >/dev/null || missing+=(nginx-light)
  command -v haproxy >/dev/null || missing+=(haproxy)
  command -v wrk >/dev/null || missing+=(wrk)
  command -v h2load >/dev/null || missing+=(nghttp2-client)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  command -v python3 >/dev/null || missing+=(python3)
  if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    local policy_added=0
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; policy_added=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; } \
      || { ((policy_added)) && rm -f /usr/sbin/policy-rc.d; die "apt-get install failed"; }
    ((policy_added)) && rm -f /usr/sbin/policy-rc.d
  fi
  # Packages may start their own instances; ours use our own configs.
  service nginx stop >/dev/null 2>&1 || true
  service haproxy stop >/dev/null 2>&1 || true
}

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "n/a"; }

TMP="" SHM=""
declare -a STARTED=()
cleanup() {
  local rc=$? r
  trap - EXIT INT TERM
  set +e
  for r in "${STARTED[@]}"; do stop_tree "$r"; done
  [[ -n $TMP ]] && rm -rf "$TMP"
  [[ -n $SHM ]] && rm -rf "$SHM"
  exit "$rc"
}

LAST_PID=""
start_origin() {
  taskset -c "$CLIENT_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" >"$TMP/origin.log" 2>&1 &
  LAST_PID=$!
}
start_vcdn() {
  RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$VCDN_BIN" cache \
    --listen "127.0.0.1:$((BASE_PORT + 1))" --tls-listen "127.0.0.1:${PORT[vcdn]}" \
    --tls-cert-dir "$TMP/certs" --upstream "http://127.0.0.1:$ORIGIN_PORT" \
    --memory "$MEMORY_BYTES" --threads 1 ${VCDN_CACHE_ARGS:-} >"$TMP/vcdn.log" 2>&1 &
  LAST_PID=$!
}
start_nginx() {
  local d=$TMP/nginx
  mkdir -p "$d" "$SHM/nginx-cache"
  render "$PEERS_DIR/nginx-tls.conf.tmpl" "$d/nginx.conf" PORT="${PORT[nginx]}" ORIGIN_PORT="$ORIGIN_PORT" \
    RUN_DIR="$d" CACHE_DIR="$SHM/nginx-cache" USER="$(id -un)" CERT="$TMP/certs/$HOST.crt" KEY="$TMP/certs/$HOST.key"
  taskset -c "$SERVER_CPU" nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}
start_haproxy() {
  local d=$TMP/haproxy
  mkdir -p "$d"
  cat "$TMP/certs/$HOST.crt" "$TMP/certs/$HOST.key" >"$d/bench.pem"
  render "$PEERS_DIR/haproxy-tls.cfg.tmpl" "$d/haproxy.cfg" PORT="${PORT[haproxy]}" PEM="$d/bench.pem"
  taskset -c "$SERVER_CPU" haproxy -db -f "$d/haproxy.cfg" >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}

url() { echo "https://$HOST:${PORT[$1]}$2"; }
# curl_tls SERVER CURL-ARGS...
curl_tls() { local s=$1; shift; curl -s --max-time 10 --cacert "$TMP/certs/$HOST.crt" --resolve "$HOST:${PORT[$s]}:127.0.0.1" "$@"; }

# Every object must come back a hit over HTTPS (HTTP/1.1 and HTTP/2).
warm_and_verify() {
  local s=$1 obj i hdr proto
  [[ $s == haproxy ]] && return 0
  for obj in /size/43 /size/1048576; do
    for proto in --http1.1 --http2; do
      for i in 1 2 3; do hdr=$(curl_tls "$s" "$proto" -o /dev/null -D - "$(url "$s" "$obj")") || die "$s: $obj failed"; done
      grep -qiE '^(x-cache: *hit|x-cache-status: *hit)' <<<"$hdr" || { printf '%s\n' "$hdr" >&2; die "$s: $obj ($proto) is not a cache hit"; }
    done
  done
  log "${LABEL[$s]}: objects verified as hits over HTTP/1.1 and HTTP/2 on TLS"
}

# measure SERVER ROOT SCENARIO ROUND -> a row in results.tsv:
# scenario server round units seconds server_cpu_s errors note
measure() {
  local s=$1 root=$2 sc=$3 round=$4 t0 t1 units=0 errs=0 note="" secs=$DURATION out=$TMP/out-$sc-$s.txt i
  pin_tree "$root"
  t0=$(cpu_ticks "$root")
  case $sc in
    handshakes-resumed)
      # openssl s_time -reuse does not resume TLS 1.3 reliably (it reads no
      # ticket); this client does, and counts the handshakes resumed.
      : >"$out"
      local pids=()
      for i in $(seq "$CLIENTS"); do
        timeout $((DURATION + 20)) taskset -c "$CLIENT_CPU" python3 - "${PORT[$s]}" "$DURATION" \
          "$TMP/certs/$HOST.crt" "$HOST" >>"$out" 2>&1 <<'PY' &
import socket, ssl, sys, time
port, secs, ca, host = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_3
sess, total, resumed, end = None, 0, 0, time.time() + secs
while time.time() < end:
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with ctx.wrap_socket(raw, server_hostname=host, session=sess) as c:
            c.sendall(b"GET /size/43 HTTP/1.1\r\nHost: " + host.encode() + b"\r\nConnection: close\r\n\r\n")
            while c.recv(65536):
                pass
            total += 1
            resumed += c.session_reused
            sess = c.session
print(f"RESUME total={total} resumed={resumed}")
PY
        pids+=($!)
      done
      wait "${pids[@]}" || true
      units=$(awk '/^RESUME/ { split($3, r, "="); n += r[2] } END { print n + 0 }' "$out")
      note="$(awk '/^RESUME/ { split($2, t, "="); n += t[2] } END { print n + 0 }' "$out") handshakes, $units resumed"
      ;;
    handshakes-full | handshakes-full12)
      local mode=-new ver=-tls1_3
      [[ $sc == handshakes-full12 ]] && ver="-tls1_2 -cipher ECDHE-ECDSA-AES128-GCM-SHA256"
      : >"$out"
      local pids=()
      for i in $(seq "$CLIENTS"); do
        # shellcheck disable=SC2086
        timeout $((DURATION + 20)) taskset -c "$CLIENT_CPU" openssl s_time -connect "127.0.0.1:${PORT[$s]}" \
          $mode $ver -time "$DURATION" >>"$out" 2>&1 &
        pids+=($!)
      done
      wait "${pids[@]}" || true
      units=$(awk '/connections in [0-9.]+ real seconds/ { n += $1 } END { print n + 0 }' "$out")
      ;;
    h1-43B | h1-1MiB | plain-1MiB)
      local path=/size/43 conns=50 target="https://127.0.0.1:${PORT[$s]}"
      [[ $sc == *1MiB ]] && path=/size/1048576
      # vcdn's plain port: the same body sent with sendfile(2), the yardstick
      # for what TLS costs per Gbit.
      [[ $sc == plain-1MiB ]] && target="http://127.0.0.1:$((BASE_PORT + 1))"
      timeout $((DURATION + 30)) taskset -c "$CLIENT_CPU" wrk -t2 -c"$conns" -d"${DURATION}s" --timeout 5s \
        -H "Host: $HOST" -s "$TMP/report.lua" "$target$path" >"$out" 2>&1 || true
      local line kv requests=0 bytes=0 duration_us=1 sock_errors=0 non2xx=0 p50_us=0 p99_us=0
      line=$(grep '^BENCH ' "$out" || true)
      [[ -n $line ]] || { cat "$out" >&2; die "no wrk result for $s $sc"; }
      for kv in ${line#BENCH }; do printf -v "${kv%%=*}" '%s' "${kv#*=}"; done
      errs=$((sock_errors + non2xx))
      secs=$(awk -v d="$duration_us" 'BEGIN { printf "%.3f", d / 1e6 }')
      if [[ $sc == *1MiB ]]; then units=$bytes; else units=$requests; fi
      note="p99 $((p99_us / 1000)) ms"
      ;;
    h2-43B)
      timeout $((DURATION + 30)) taskset -c "$CLIENT_CPU" h2load -c"$H2_CONNS" -m"$STREAMS" -t1 -D"$DURATION" \
        --connect-to="127.0.0.1:${PORT[$s]}" "https://$HOST:${PORT[$s]}/size/43" >"$out" 2>&1 || true
      units=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^succeeded/) print $i }' "$out" | tr -d ,)
      errs=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i+1) ~ /^(failed|errored)/) n += $i } END { print n + 0 }' "$out")
      secs=$(awk '/^finished in/ { s = $3; sub(/s,?$/, "", s); print s }' "$out")
      grep -q 'h2' "$out" || note="(protocol not h2?)"
      [[ -n $units ]] || { cat "$out" >&2; die "no h2load result for $s"; }
      ;;
  esac
  t1=$(cpu_ticks "$root")
  local cpu
  cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$sc" "$s" "$round" "$units" "$secs" "$cpu" "$errs" "$note" >>"$TMP/results.tsv"
  log "$(printf '%-8s %-20s units %-12s in %ss, server CPU %ss, errors %s %s' "${LABEL[$s]}" "$sc" "$units" "$secs" "$cpu" "$errs" "$note")"
  sleep 1
}

# Resident memory (KiB) of a server's process tree.
rss_kib() {
  local p total=0 v
  for p in $(tree_pids "$1"); do
    v=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}

# Idle connections of kind $4 (tls: HTTP/1.1 by ALPN; h2): open N after a
# completed handshake (and, for h2, the preface and SETTINGS), hold them,
# and read the RSS growth per connection.
measure_idle() {
  local s=$1 root=$2 round=$3 kind=$4 before after
  {
    before=$(rss_kib "$root")
    timeout 120 taskset -c "$CLIENT_CPU" python3 - "$kind" "${PORT[$s]}" "$IDLE_CONNS" "$TMP/certs/$HOST.crt" "$HOST" \
      "$TMP/idle-ready" <<'EOF' &
import socket, ssl, sys, time, os
kind, port, n, ca, host, ready = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["h2"] if kind == "h2" else ["http/1.1"])
conns = []
for i in range(n):
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    c = ctx.wrap_socket(raw, server_hostname=host)
    if kind == "h2":
        # Connection preface, an empty SETTINGS frame; then read the server's SETTINGS.
        c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        c.recv(4096)
    conns.append(c)
open(ready, "w").write(str(len(conns)))
time.sleep(8)
EOF
    local client=$! i
    for i in $(seq 600); do [[ -s $TMP/idle-ready ]] && break; sleep 0.1; done
    sleep 2
    after=$(rss_kib "$root")
    local opened
    opened=$(cat "$TMP/idle-ready" 2>/dev/null || echo 0)
    rm -f "$TMP/idle-ready"
    wait "$client" 2>/dev/null || true
    printf 'idle-%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kind" "$s" "$round" "$opened" "$before" "$after" 0 "" >>"$TMP/results.tsv"
    log "$(printf '%-8s idle-%-4s %s connections: RSS %s -> %s KiB (%.1f KiB each)' "${LABEL[$s]}" "$kind" "$opened" "$before" "$after" \
      "$(awk -v a="$before" -v b="$after" -v n="$opened" 'BEGIN { print (n > 0) ? (b - a) / n : 0 }')")"
  }
}

# Start server $1, wait until it answers over TLS, pin it, warm the
# objects; its root pid in LAST_ROOT.
launch() {
  local s=$1 ok=0 i
  log "starting ${LABEL[$s]} on 127.0.0.1:${PORT[$s]}"
  "start_$s"; LAST_ROOT=$LAST_PID; STARTED+=("$LAST_ROOT")
  for i in $(seq 200); do curl_tls "$s" -o /dev/null "$(url "$s" /size/43)" && { ok=1; break; }; sleep 0.1; done
  ((ok)) || { tail -20 "$TMP/$s.log" "$TMP/$s"/*.log 2>/dev/null >&2; die "${LABEL[$s]} does not answer over TLS"; }
  pin_tree "$LAST_ROOT"
  warm_and_verify "$s"
}

report() {
  {
    echo "# vcdn TLS and HTTP/2 benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); kernel $(uname -r); $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
    echo "- vcdn $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) (rustls $(grep -A1 'name = "rustls"' "$ROOT/Cargo.lock" | sed -n 's/version = "\(.*\)"/\1/p' | head -1), aws-lc-rs); nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') and HAProxy $(haproxy -v | head -1 | awk '{print $3}') with OpenSSL $(openssl version | awk '{print $2}') (Debian $(pkg_version libssl3)); wrk $(pkg_version wrk), h2load $(pkg_version nghttp2-client)"
    echo "- each server alone on CPU $SERVER_CPU, one worker/thread; load tools on CPU $CLIENT_CPU; ${DURATION}s per run, median of $ROUNDS round(s), servers interleaved; ECDSA P-256 certificate; X25519"
    echo "- handshakes: $CLIENTS parallel \`openssl s_time\` clients; h1: wrk -t2 -c50 keep-alive; h2: h2load -c$H2_CONNS -m$STREAMS; idle: $IDLE_CONNS connections held by a Python client"
    echo "- Varnish has no TLS, so it has no row here"
    echo
    awk -F'\t' '
      function med(sc, s,   m, i, j, t, v) { m = cnt[sc, s]; if (!m) return -1
        for (i = 1; i <= m; i++) v[i] = val[sc, s, i]
        for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
        return (m % 2) ? v[(m+1)/2] : (v[m/2] + v[m/2+1]) / 2 }
      $1 ~ /^idle-/ { per = ($4 > 0) ? ($6 - $5) / $4 : 0; val[$1, $2, ++cnt[$1, $2]] = per; seen[$1] = 1; srv[$2] = 1; next }
      { per = ($6 > 0) ? $4 / $6 : 0; if ($1 ~ /1MiB$/) per = per * 8 / 1e9
        val[$1, $2, ++cnt[$1, $2]] = per; rate[$1, $2] = ($5 > 0) ? $4 / $5 : 0; err[$1, $2] += $7; seen[$1] = 1; srv[$2] = 1 }
      END {
        split("handshakes-full handshakes-resumed handshakes-full12 h1-43B h2-43B h1-1MiB plain-1MiB", order, " ")
        unit["handshakes-full"] = "full TLS 1.3 handshakes per CPU-s"; unit["handshakes-resumed"] = "resumed TLS 1.3 handshakes per CPU-s"
        unit["handshakes-full12"] = "full TLS 1.2 handshakes per CPU-s"; unit["h1-43B"] = "cached 43 B, HTTPS/1.1 keep-alive: requests per CPU-s"
        unit["h2-43B"] = "cached 43 B, HTTP/2: requests per CPU-s"; unit["h1-1MiB"] = "cached 1 MiB, HTTPS/1.1: Gbit per CPU-s"; unit["plain-1MiB"] = "cached 1 MiB, plain HTTP (sendfile): Gbit per CPU-s"
        print "| run | vcdn | nginx | HAProxy | vcdn/nginx | vcdn/HAProxy | errors (v/n/h) |"
        print "|---|---:|---:|---:|---:|---:|---|"
        for (i = 1; i <= 7; i++) { sc = order[i]; if (!(sc in seen)) continue
          v = med(sc, "vcdn"); n = med(sc, "nginx"); h = med(sc, "haproxy")
          f = (sc ~ /1MiB$/) ? "%.2f" : "%.0f"
          printf "| %s | %s | %s | %s | %s | %s | %d/%d/%d |\n", unit[sc], (v >= 0 ? sprintf(f, v) : "-"), (n >= 0 ? sprintf(f, n) : "-"), (h >= 0 ? sprintf(f, h) : "-"),
            ((v > 0 && n > 0) ? sprintf("%.2fx", v / n) : "-"), ((v > 0 && h > 0) ? sprintf("%.2fx", v / h) : "-"), err[sc, "vcdn"], err[sc, "nginx"], err[sc, "haproxy"] }
        if (("idle-tls" in seen) || ("idle-h2" in seen)) {
          print ""; print "| idle connection | vcdn KiB | nginx KiB |"; print "|---|---:|---:|"
          split("idle-tls idle-h2", io, " ")
          for (i = 1; i <= 2; i++) { sc = io[i]; if (!(sc in seen)) continue
            printf "| %s | %.1f | %.1f |\n", (sc == "idle-tls" ? "TLS, HTTP/1.1" : "TLS, HTTP/2"), med(sc, "vcdn"), med(sc, "nginx") }
        }
      }' "$TMP/results.tsv"
  } >"$TMP/report.md"
  mkdir -p "$(dirname "$OUT")"
  cp "$TMP/report.md" "$OUT"
  echo; cat "$TMP/report.md"
  log "markdown written to $OUT"
}

main() {
  install_packages
  if [[ $SKIP_BUILD != 1 ]]; then
    log "building vcdn (cargo build --release -p vcdn)"
    (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "cargo build failed"
  fi
  [[ -x $VCDN_BIN ]] || die "vcdn binary not found at $VCDN_BIN"
  ulimit -n 65536 2>/dev/null || true
  TMP=$(mktemp -d /tmp/vcdn-tls-bench.XXXXXX)
  SHM=$(mktemp -d /dev/shm/vcdn-tls-bench.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : >"$TMP/results.tsv"
  write_wrk_lua
  mkdir -p "$TMP/certs"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=$HOST" \
    -addext "subjectAltName=DNS:$HOST,IP:127.0.0.1" -keyout "$TMP/certs/$HOST.key" -out "$TMP/certs/$HOST.crt" 2>/dev/null \
    || die "openssl cannot make the certificate"
  local p
  for p in "$ORIGIN_PORT" "$((BASE_PORT + 1))" "${PORT[@]}"; do port_free "$p" || die "port $p is in use (set BASE_PORT)"; done
  start_origin; STARTED+=("$LAST_PID")
  wait_http "http://127.0.0.1:$ORIGIN_PORT/size/43" 10 || die "vcdn origin did not start"

  local round s root sc
  for round in $(seq "$ROUNDS"); do
    ((ROUNDS > 1)) && log "round $round of $ROUNDS"
    for s in $SERVERS; do
      launch "$s"; root=$LAST_ROOT
      for sc in $SCENARIOS; do
        if [[ $s == haproxy && $sc != handshakes-* ]]; then continue; fi
        if [[ $s != vcdn && $sc == plain-* ]]; then continue; fi
        if [[ $sc == idle ]]; then
          # Each kind in a fresh server process: memory that earlier runs
          # freed would otherwise be reused and hide what connections cost.
          local kind
          for kind in tls h2; do
            stop_tree "$root"; launch "$s"; root=$LAST_ROOT
            measure_idle "$s" "$root" "$round" "$kind"
          done
        else
          measure "$s" "$root" "$sc" "$round"
        fi
      done
      stop_tree "$root"
    done
  done
  report
}

main "$@"
