#!/usr/bin/env bash
# bench/stacks.sh - what does one cached 43-byte response cost per server
# CPU-second, for vcdn's hand-written HTTP/1.1 hit path versus
#   - hyper-static: the cheapest plain hyper 1.x + tokio server sending the
#     same response (bench/stacks/hyper-static), and
#   - uring-static: the same response from an io_uring loop (one
#     io_uring_enter per batch of completions instead of a recv and a send
#     system call per request; bench/stacks/uring-static), and
#   - nginx-static: nginx serving a 43-byte file (bench/stacks/nginx-static.conf.tmpl).
# It answers "would vcdn be as cheap on hyper?" and "what would batched
# submission with io_uring save?" on this machine.
#
# Measured the way bench/cache.sh measures: each server alone, pinned to
# CPU 0 and sized for one core; wrk on CPU 1; server CPU = utime+stime of all
# its processes from /proc/PID/stat before/after the run -> req per CPU-s.
# All servers are measured in the same invocation, one after the other.
#
# Environment knobs:
#   DURATION=10s     wrk -d per measured run
#   WARMUP=1s        unmeasured wrk run before each measured run (0 = none)
#   CONNS=50         wrk -c
#   WRK_THREADS=2    wrk -t (all on CPU 1)
#   BASE_PORT=18180  origin=BASE, vcdn=+1, hyper=+2, nginx=+3 (cache.sh uses 18080..)
#   SERVERS="hyper uring vcdn nginx"   subset / order to run (ratios need vcdn)
#   SKIP_BUILD=1     skip both cargo builds
#   OUT=             if set, also write the markdown report to this file
#
# Only loopback traffic. Needs wrk, taskset, curl, nginx (Debian: wrk,
# util-linux, curl, nginx-light or nginx).
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
STACKS_DIR=$BENCH_DIR/stacks

DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-50}
WRK_THREADS=${WRK_THREADS:-2}
BASE_PORT=${BASE_PORT:-18180}
SERVERS=${SERVERS:-hyper uring vcdn nginx}
SKIP_BUILD=${SKIP_BUILD:-0}
OUT=${OUT:-}

# hyper-static gets its own target dir so its build never touches (or
# invalidates) the workspace's target/.
HYPER_TARGET_DIR=$STACKS_DIR/target
HYPER_BIN=$HYPER_TARGET_DIR/release/hyper-static
URING_BIN=$HYPER_TARGET_DIR/release/uring-static
VCDN_BIN=$ROOT/target/release/vcdn
NGINX_BIN=${NGINX_BIN:-/usr/sbin/nginx}

SERVER_CPU=0    # server under test
CLIENT_CPU=1    # wrk, and vcdn's origin (idle once the object is cached)
CLK_TCK=$(getconf CLK_TCK)
PATH_43=/size/43
BODY_43=0123456789abcdefghijklmnopqrstuvwxyz0123456   # vcdn origin's /size/43

ORIGIN_PORT=$BASE_PORT
declare -A PORT=([vcdn]=$((BASE_PORT + 1)) [hyper]=$((BASE_PORT + 2)) [nginx]=$((BASE_PORT + 3)) [uring]=$((BASE_PORT + 4)))
declare -A LABEL=([vcdn]="vcdn (cache hit)" [hyper]="hyper-static" [nginx]="nginx-static" [uring]="uring-static")

log() { printf '[stacks.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[stacks.sh] ERROR: %s\n' "$*" >&2; exit 1; }

for s in $SERVERS; do [[ -n ${PORT[$s]:-} ]] || die "unknown server '$s' in SERVERS (hyper uring vcdn nginx)"; done
for t in wrk taskset curl ss; do command -v "$t" >/dev/null || die "$t not found"; done
[[ " $SERVERS " != *" nginx "* || -x $NGINX_BIN ]] || die "nginx not found at $NGINX_BIN (apt-get install nginx-light)"

DUR_S=$(dur_secs "$DURATION")

# ------------------------------------------------------------- processes --
TMP=""
ORIGIN_PID=""
declare -a STARTED=()   # root pids of everything we started






# Everything we started dies with the script, however it exits.
cleanup() {
  local rc=$? r
  trap - EXIT INT TERM
  set +e
  for r in "${STARTED[@]}"; do stop_tree "$r"; done
  [[ -n $TMP ]] && rm -rf "$TMP"
  exit "$rc"
}



# ---------------------------------------------------------------- servers --
# Each start_* runs its server in the foreground (so $! is the root of its
# process tree), pinned to CPU 0, and sets LAST_PID. Not called via $(...):
# the server must be this shell's child.
LAST_PID=""

start_origin() {
  taskset -c "$CLIENT_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" \
    >"$TMP/origin.log" 2>&1 &
  LAST_PID=$!
}

start_hyper() {
  taskset -c "$SERVER_CPU" "$HYPER_BIN" "127.0.0.1:${PORT[hyper]}" >"$TMP/hyper.log" 2>&1 &
  LAST_PID=$!
}

start_uring() {
  taskset -c "$SERVER_CPU" "$URING_BIN" "127.0.0.1:${PORT[uring]}" >"$TMP/uring.log" 2>&1 &
  LAST_PID=$!
}

start_vcdn() {
  RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$VCDN_BIN" cache \
    --listen "127.0.0.1:${PORT[vcdn]}" --upstream "http://127.0.0.1:$ORIGIN_PORT" \
    --threads 1 >"$TMP/vcdn.log" 2>&1 &
  LAST_PID=$!
}

start_nginx() {
  local d=$TMP/nginx
  mkdir -p "$d/www/size"
  printf '%s' "$BODY_43" >"$d/www$PATH_43"   # same 43 bytes as the origin's
  sed -e "s#@PORT@#${PORT[nginx]}#g" -e "s#@RUN_DIR@#$d#g" \
      -e "s#@DOC_ROOT@#$d/www#g" -e "s#@USER@#$(id -un)#g" \
      "$STACKS_DIR/nginx-static.conf.tmpl" >"$d/nginx.conf"
  # -e: error log for start-up, before the config is read (not /var/log/nginx)
  taskset -c "$SERVER_CPU" "$NGINX_BIN" -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" \
    >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}

server_logs() {
  case $1 in
    hyper) tail -n 20 "$TMP/hyper.log" ;;
    uring) tail -n 20 "$TMP/uring.log" ;;
    vcdn) tail -n 20 "$TMP/vcdn.log" "$TMP/origin.log" ;;
    nginx) tail -n 20 "$TMP/nginx/nginx-error.log" "$TMP/nginx/stdout.log" ;;
  esac 2>/dev/null || true
}

# Request /size/43 a few times (for vcdn: the first is a MISS that fills the
# cache). The last answer must be a 200 with the 43-byte body, and for vcdn
# X-Cache: HIT - otherwise we would be measuring the origin path.
warm_and_verify() {
  local s=$1 url=http://127.0.0.1:${PORT[$1]}$PATH_43 i hdr body
  for i in 1 2 3; do
    curl -s --max-time 10 -o /dev/null "$url" || die "${LABEL[$s]}: request to $url failed"
  done
  hdr=$(curl -s --max-time 10 -D - -o "$TMP/body" "$url") || die "${LABEL[$s]}: request to $url failed"
  body=$(cat "$TMP/body")
  if ! grep -qE '^HTTP/1\.1 200' <<<"$hdr" || [[ $body != "$BODY_43" ]] ||
     { [[ $s == vcdn ]] && ! grep -qiE '^x-cache: *HIT' <<<"$hdr"; }; then
    printf '%s\n' "$hdr" >&2
    server_logs "$s" >&2
    local want="a 200 with the 43-byte body"
    [[ $s == vcdn ]] && want+=" and X-Cache: HIT"
    die "${LABEL[$s]} does not answer $PATH_43 with $want (headers above)"
  fi
  printf '%s\n' "$hdr" | tr -d '\r' >"$TMP/headers-$s.txt"
}

# -------------------------------------------------------------------- wrk --

# run_wrk SERVER ROOTPID -> appends a row to results.tsv:
# server requests bytes duration_us cpu_s errors p99_us other_s origin_ticks client_cpu_ticks
run_wrk() {
  local s=$1 root=$2 url=http://127.0.0.1:${PORT[$1]}$PATH_43 out=$TMP/wrk-$1.txt
  pin_tree "$root"
  # Warm-up: fills connection state and lets the server settle; unmeasured.
  if [[ $WARMUP != 0 ]]; then
    timeout $(($(dur_secs "$WARMUP") + 30)) taskset -c "$CLIENT_CPU" \
      wrk -t"$WRK_THREADS" -c"$CONNS" -d"$WARMUP" --timeout 5s "$url" >/dev/null 2>&1 || true
    sleep 0.5
  fi
  local t0 t1 c0 c1 w0 w1 o0=0 o1=0
  # The origin (if running) is watched too: it must stay idle. The client
  # CPU's busy time tells whether wrk, not the server, set the pace.
  t0=$(cpu_ticks "$root"); c0=$(core_busy_ticks); w0=$(core_busy_ticks "$CLIENT_CPU")
  if [[ -n $ORIGIN_PID ]]; then o0=$(cpu_ticks "$ORIGIN_PID"); fi
  timeout $((DUR_S + 30)) taskset -c "$CLIENT_CPU" \
    wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" --timeout 5s -s "$TMP/report.lua" "$url" >"$out" 2>&1 \
    || { log "wrk exited non-zero for ${LABEL[$s]}:"; cat "$out" >&2; }
  t1=$(cpu_ticks "$root"); c1=$(core_busy_ticks); w1=$(core_busy_ticks "$CLIENT_CPU")
  if [[ -n $ORIGIN_PID ]]; then o1=$(cpu_ticks "$ORIGIN_PID"); fi

  local line requests bytes duration_us sock_errors non2xx p50_us p99_us kv cpu_s other_s
  line=$(grep '^BENCH ' "$out" || true)
  [[ -n $line ]] || { cat "$out" >&2; die "no wrk result for ${LABEL[$s]}"; }
  for kv in ${line#BENCH }; do printf -v "${kv%%=*}" '%s' "${kv#*=}"; done
  cpu_s=$(awk -v a="$t0" -v b="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  other_s=$(awk -v a="$c0" -v b="$c1" -v s="$((t1 - t0))" -v hz="$CLK_TCK" 'BEGIN {
    o = (b - a - s) / hz; if (o < 0) o = 0; printf "%.2f", o }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$requests" "$bytes" "$duration_us" "$cpu_s" \
    "$((sock_errors + non2xx))" "$p99_us" "$other_s" "$((o1 - o0))" "$((w1 - w0))" >>"$TMP/results.tsv"
  log "$(printf '%-18s %9.0f req/s  server cpu %5ss  errors %s' "${LABEL[$s]}" \
    "$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { print r / (d / 1e6) }')" "$cpu_s" "$((sock_errors + non2xx))")"
  if awk -v o="$other_s" -v d="$DUR_S" 'BEGIN { exit !(o > 0.10 * d) }'; then
    log "WARNING: ${other_s}s of CPU $SERVER_CPU busy time was not charged to ${LABEL[$s]}: other work ran there; numbers may be disturbed"
  fi
  # A cache hit run must not reach the origin; 10 ticks of noise allowed.
  if (( o1 - o0 > 10 )); then
    log "WARNING: the origin used $((o1 - o0)) ticks during the ${LABEL[$s]} run: not all hits"
  fi
  sleep 1   # let closed connections drain before the next server
}

# ----------------------------------------------------------------- report --
# Version of a crate as locked in hyper-static's Cargo.lock.
locked() {
  awk -v n="$1" '$0 == "name = \"" n "\"" { getline; gsub(/[^0-9.]/, ""); print; exit }' \
    "$STACKS_DIR/hyper-static/Cargo.lock" 2>/dev/null || true
}

versions() {
  local ngpkg=nginx-light
  dpkg -s nginx-light >/dev/null 2>&1 || ngpkg=nginx
  echo "- hyper-static: hyper $(locked hyper), hyper-util $(locked hyper-util), http-body-util $(locked http-body-util), tokio $(locked tokio); current_thread runtime, http1 only, lto=fat, codegen-units=1"
  echo "- nginx-static: $("$NGINX_BIN" -v 2>&1 | sed 's/^nginx version: //') (Debian package $ngpkg $(dpkg-query -W -f='${Version}' "$ngpkg" 2>/dev/null || echo n/a)); worker_processes 1, sendfile, open_file_cache"
  echo "- vcdn: $("$VCDN_BIN" --version 2>/dev/null || echo unknown) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-commit)$(git -C "$ROOT" diff --quiet HEAD -- crates 2>/dev/null || echo ", uncommitted changes in crates/")), \`cache --threads 1\`, hits from memory"
  echo "- wrk: $(wrk -v 2>&1 | head -1 | awk '{print $2}')"
}

report() {
  {
    echo "# vcdn hit path vs plain hyper vs nginx static"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), kernel $(uname -r)"
    echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
    versions
    echo "- setup: GET $PATH_43 (43-byte body, ~260-byte head), $CONNS keep-alive connections, wrk -t$WRK_THREADS on CPU $CLIENT_CPU, server alone on CPU $SERVER_CPU, $DURATION per server after $WARMUP unmeasured warm-up"
    echo "- server CPU-s = utime+stime of the server's processes (/proc/PID/stat) over the run; CPU-us/req = 1e6 / (req per CPU-s)"
    echo "- 'CPU$SERVER_CPU not charged' = busy time of CPU $SERVER_CPU minus server CPU-s: other processes or uncharged softirq; near 0 on a quiet machine"
    echo "- 'CPU$CLIENT_CPU busy' = busy share of wrk's CPU; near 100% with the server under 100% means wrk set the pace, and the server's req per CPU-s is at that load, not at saturation"
    echo
    echo "| server | req/s | server CPU-s | server CPU util | req per CPU-s | CPU-us/req | bytes/resp | p99 ms | errors | CPU$SERVER_CPU not charged (s) | CPU$CLIENT_CPU busy |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    awk -F'\t' -v order="$SERVERS" -v hz="$CLK_TCK" '
      BEGIN { lbl["hyper"] = "hyper-static"; lbl["uring"] = "uring-static"; lbl["vcdn"] = "vcdn (cache hit)"; lbl["nginx"] = "nginx-static" }
      function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "n/a" }
      {
        s = $1; d = $4 / 1e6
        rps[s] = $2 / d; cpu[s] = $5; rpc[s] = ($5 > 0) ? $2 / $5 : 0
        bpr[s] = ($2 > 0) ? $3 / $2 : 0; err[s] = $6; p99[s] = $7 / 1000; other[s] = $8
        util[s] = $5 / d * 100; cutil[s] = $10 / hz / d * 100
      }
      END {
        n = split(order, o, " ")
        for (i = 1; i <= n; i++) { s = o[i]; if (!(s in rps)) continue
          printf "| %s | %.0f | %.2f | %.0f%% | %.0f | %.2f | %.0f | %.2f | %d | %.2f | %.0f%% |\n",
            lbl[s], rps[s], cpu[s], util[s], rpc[s], (rpc[s] > 0 ? 1e6 / rpc[s] : 0), bpr[s], p99[s], err[s], other[s], cutil[s]
        }
        if (!("vcdn" in rps)) exit
        print ""
        print "| ratio | req per CPU-s | req/s |"
        print "|---|---:|---:|"
        if ("hyper" in rps) printf "| vcdn/hyper-static | %s | %s |\n", ratio(rpc["vcdn"], rpc["hyper"]), ratio(rps["vcdn"], rps["hyper"])
        if ("uring" in rps) printf "| vcdn/uring-static | %s | %s |\n", ratio(rpc["vcdn"], rpc["uring"]), ratio(rps["vcdn"], rps["uring"])
        if ("nginx" in rps) printf "| vcdn/nginx-static | %s | %s |\n", ratio(rpc["vcdn"], rpc["nginx"]), ratio(rps["vcdn"], rps["nginx"])
      }' "$TMP/results.tsv"
    echo
    echo "Response heads as sent (from curl):"
    local s
    for s in $SERVERS; do
      echo
      echo "${LABEL[$s]}:"
      echo '```'
      cat "$TMP/headers-$s.txt"
      echo '```'
    done
  } >"$TMP/report.md"
  echo
  cat "$TMP/report.md"
  if [[ -n $OUT ]]; then
    mkdir -p "$(dirname "$OUT")"
    cp "$TMP/report.md" "$OUT"
    log "markdown written to $OUT"
  fi
}

# ------------------------------------------------------------------- main --
main() {
  if [[ $SKIP_BUILD != 1 ]]; then
    log "building hyper-static (target dir $HYPER_TARGET_DIR)"
    (cd "$STACKS_DIR/hyper-static" && CARGO_TARGET_DIR=$HYPER_TARGET_DIR cargo build --release) >&2 \
      || die "hyper-static build failed"
    log "building uring-static (target dir $HYPER_TARGET_DIR)"
    (cd "$STACKS_DIR/uring-static" && CARGO_TARGET_DIR=$HYPER_TARGET_DIR cargo build --release) >&2 \
      || die "uring-static build failed"
    log "building vcdn (cargo build --release -p vcdn)"
    (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "vcdn build failed"
  fi
  [[ -x $HYPER_BIN ]] || die "hyper-static binary not found at $HYPER_BIN"
  [[ -x $URING_BIN ]] || die "uring-static binary not found at $URING_BIN"
  [[ -x $VCDN_BIN ]] || die "vcdn binary not found at $VCDN_BIN"

  TMP=$(mktemp -d /tmp/vcdn-stacks-bench.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : >"$TMP/results.tsv"
  write_wrk_lua

  local p
  for p in "$ORIGIN_PORT" "${PORT[@]}"; do port_free "$p" || die "port $p is already in use (set BASE_PORT)"; done

  local s root
  for s in $SERVERS; do
    # vcdn needs its origin to fill the cache; it runs on the client CPU and
    # is idle during the measured run (every request is a hit).
    if [[ $s == vcdn && -z $ORIGIN_PID ]]; then
      start_origin
      ORIGIN_PID=$LAST_PID
      STARTED+=("$ORIGIN_PID")
      wait_http "http://127.0.0.1:$ORIGIN_PORT$PATH_43" 10 \
        || { cat "$TMP/origin.log" >&2; die "vcdn origin did not start"; }
    fi
    log "starting ${LABEL[$s]} on 127.0.0.1:${PORT[$s]}"
    "start_$s"
    root=$LAST_PID
    STARTED+=("$root")
    if ! wait_http "http://127.0.0.1:${PORT[$s]}$PATH_43" 30; then
      server_logs "$s" >&2
      die "${LABEL[$s]} did not answer on port ${PORT[$s]}"
    fi
    warm_and_verify "$s"
    run_wrk "$s" "$root"
    warm_and_verify "$s"   # still a 200 (and for vcdn still a HIT) after the run
    stop_tree "$root"
  done

  report
}

main "$@"
