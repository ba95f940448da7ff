#!/usr/bin/env bash
# bench/footprint.sh - start-up time and memory footprint of `vcdn origin`
# and `vcdn cache` (nginx start-up as a reference).
#
#  (a) exec -> first successful `GET /size/43` (200, full body), polled every
#      0.5 ms by a small Python helper on CPU 1 while the server runs on
#      CPU 0; RUNS times (default 20), median and max.
#  (b) VmRSS from /proc/PID/status: after start + 1 s idle (readiness probed
#      by TCP connect only, so nothing is cached yet), and after warming 100
#      distinct objects (each fetched twice: miss, then hit).
#
# Environment knobs:
#   RUNS=20               start-up repetitions per server
#   VCDN_BIN=target/release/vcdn   SKIP_BUILD=1 skips `cargo build`
#   VCDN_CACHE_ARGS=""    extra args for `vcdn cache`, e.g. "--threads 1"
#   ADMIN=1               also pass --admin 127.0.0.1:PORT --admin-token T
#   NGINX=1               nginx start-up reference (0 to skip)
#   BASE_PORT=18180       ports BASE.. are used (origin, caches, start-up probes)
#   OUT=bench/results/footprint-latest.md
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)

RUNS=${RUNS:-20}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
SKIP_BUILD=${SKIP_BUILD:-0}
VCDN_CACHE_ARGS=${VCDN_CACHE_ARGS:-}
ADMIN=${ADMIN:-0}
NGINX=${NGINX:-1}
BASE_PORT=${BASE_PORT:-18180}
OUT=${OUT:-$ROOT/bench/results/footprint-latest.md}
MEMORY_BYTES=536870912

ORIGIN_PORT=$BASE_PORT            # long-lived origin for the cache runs
RSS_PORT=$((BASE_PORT + 1))       # RSS measurements
ADMIN_PORT=$((BASE_PORT + 2))
PROBE_BASE=$((BASE_PORT + 10))    # start-up runs use a fresh port each time,
                                  # so TIME_WAIT never blocks the next bind

die() { printf '[footprint.sh] ERROR: %s\n' "$*" >&2; exit 1; }
log() { printf '[footprint.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

command -v python3 >/dev/null || die "python3 is needed for the start-up probe"
command -v taskset >/dev/null || die "taskset (util-linux) is needed"

if [[ $SKIP_BUILD != 1 ]]; then
  log "building vcdn (cargo build --release -p vcdn)"
  (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "cargo build failed"
fi
[[ -x $VCDN_BIN ]] || die "vcdn binary not found at $VCDN_BIN"

TMP=$(mktemp -d /tmp/vcdn-footprint.XXXXXX)
declare -a STARTED=()
cleanup() {
  local rc=$? p
  set +e
  for p in "${STARTED[@]}"; do
    pkill -TERM -P "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null
  done
  sleep 0.2
  for p in "${STARTED[@]}"; do
    pkill -KILL -P "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null
  done
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The probe: exec the command (pinned to CPU 0), poll GET /size/43 every
# 0.5 ms from CPU 1, print elapsed ms from just before fork/exec to the first
# complete 200 answer. Then stop the server.
cat >"$TMP/startup.py" <<'EOF'
import os, signal, socket, subprocess, sys, time

port = int(sys.argv[1])
cmd = sys.argv[2:]
os.sched_setaffinity(0, {1})
REQ = b"GET /size/43 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

def answered():
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
    except OSError:
        return False
    try:
        s.sendall(REQ)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep and len(body) >= 43:
                break
        head, sep, body = data.partition(b"\r\n\r\n")
        return head.startswith(b"HTTP/1.1 200") and len(body) >= 43
    except OSError:
        return False
    finally:
        s.close()

log = open(os.environ.get("STARTUP_LOG", os.devnull), "ab")
t0 = time.perf_counter()
proc = subprocess.Popen(["taskset", "-c", "0"] + cmd, stdout=log, stderr=log)
ok = False
while time.perf_counter() - t0 < 10.0:
    if answered():
        ok = True
        break
    if proc.poll() is not None:
        break
    time.sleep(0.0005)
elapsed_ms = (time.perf_counter() - t0) * 1000.0
proc.send_signal(signal.SIGTERM)
try:
    proc.wait(timeout=5)
except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
if not ok:
    sys.exit("server did not answer within 10 s (exit code %s)" % proc.returncode)
print("%.3f" % elapsed_ms)
EOF

# startup_series NAME CMD... (CMD may contain the token PORT) -> "median max"
startup_series() {
  local name=$1 i port out
  shift
  : >"$TMP/$name.times"
  for ((i = 0; i < RUNS; i++)); do
    port=$((PROBE_BASE + i))
    local argv=("${@//PORT/$port}")
    out=$(STARTUP_LOG=$TMP/$name.log python3 "$TMP/startup.py" "$port" "${argv[@]}") \
      || { tail -n 20 "$TMP/$name.log" >&2; die "$name: start-up run $i failed"; }
    echo "$out" >>"$TMP/$name.times"
  done
  sort -n "$TMP/$name.times" | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.1f %.1f\n", m, v[NR] }'
}

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
# Sum over a process and its direct children (nginx master + workers).
rss_tree_kib() {
  local p total=0
  for p in "$1" $(pgrep -P "$1" || true); do total=$((total + $(rss_kib "$p"))); done
  echo "$total"
}

wait_port() {
  local i
  for i in $(seq 2000); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.005
  done
  return 1
}

# 100 distinct objects, 1 KiB .. 100 KiB (+43 B), about 5 MiB in total.
warm_100() {
  local base=$1 i
  for i in $(seq 100); do
    curl -sf -o /dev/null "$base/size/$((i * 1024 + 43))" || die "warm request $i to $base failed"
    curl -sf -o /dev/null "$base/size/$((i * 1024 + 43))" || die "warm request $i to $base failed"
  done
}

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

admin_args=()
[[ $ADMIN == 1 ]] && admin_args=(--admin "127.0.0.1:$ADMIN_PORT" --admin-token footprint-token-0123456789abcdef0123)

# Long-lived origin (CPU 1) for the cache measurements.
taskset -c 1 "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" >"$TMP/origin-bg.log" 2>&1 &
STARTED+=($!)
wait_port "$ORIGIN_PORT" || die "vcdn origin did not start"

cache_cmd=("$VCDN_BIN" cache --listen 127.0.0.1:PORT --upstream "http://127.0.0.1:$ORIGIN_PORT"
           --memory "$MEMORY_BYTES" $VCDN_CACHE_ARGS)

log "start-up: vcdn origin x$RUNS"
res=$(startup_series origin "$VCDN_BIN" origin --listen 127.0.0.1:PORT) || exit 1
read -r o_med o_max <<<"$res"
log "start-up: vcdn cache x$RUNS (first answer includes the origin fetch)"
res=$(startup_series cache "${cache_cmd[@]}" "${admin_args[@]}") || exit 1
read -r c_med c_max <<<"$res"

# RSS: origin
log "RSS: vcdn origin"
taskset -c 0 "$VCDN_BIN" origin --listen "127.0.0.1:$RSS_PORT" >"$TMP/origin-rss.log" 2>&1 &
pid=$!; STARTED+=("$pid")
wait_port "$RSS_PORT" || die "vcdn origin (RSS run) did not start"
sleep 1
o_rss0=$(rss_kib "$pid")
warm_100 "http://127.0.0.1:$RSS_PORT"
o_rss1=$(rss_kib "$pid")
kill "$pid"; wait "$pid" 2>/dev/null || true

# RSS: cache
log "RSS: vcdn cache"
taskset -c 0 "${cache_cmd[@]//PORT/$RSS_PORT}" "${admin_args[@]}" >"$TMP/cache-rss.log" 2>&1 &
pid=$!; STARTED+=("$pid")
wait_port "$RSS_PORT" || { cat "$TMP/cache-rss.log" >&2; die "vcdn cache (RSS run) did not start"; }
sleep 1
c_rss0=$(rss_kib "$pid")
warm_100 "http://127.0.0.1:$RSS_PORT"
hit=$(curl -s -o /dev/null -D - "http://127.0.0.1:$RSS_PORT/size/$((100 * 1024 + 43))" | tr -d '\r' | sed -n 's/^[Xx]-[Cc]ache: *//p')
c_rss1=$(rss_kib "$pid")
kill "$pid"; wait "$pid" 2>/dev/null || true

# nginx reference: same caching proxy config as bench/cache.sh.
n_line=""
if [[ $NGINX == 1 ]] && command -v nginx >/dev/null; then
  log "start-up: nginx x$RUNS (reference, caching proxy to the same origin)"
  mkdir -p "$TMP/nginx" "$TMP/nginx-cache"
  # One rendered config per probe port (PORT token substituted per run).
  sed -e "s#@PORT@#PORT#g; s#@ORIGIN_PORT@#$ORIGIN_PORT#g; s#@RUN_DIR@#$TMP/nginx#g" \
      -e "s#@CACHE_DIR@#$TMP/nginx-cache#g; s#@USER@#$(id -un)#g" \
      "$BENCH_DIR/peers/nginx.conf.tmpl" >"$TMP/nginx/nginx.conf.in"
  for ((i = 0; i < RUNS; i++)); do
    sed "s#127.0.0.1:PORT#127.0.0.1:$((PROBE_BASE + i))#" "$TMP/nginx/nginx.conf.in" \
      >"$TMP/nginx/nginx-$((PROBE_BASE + i)).conf"
  done
  res=$(startup_series nginx nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" \
          -c "$TMP/nginx/nginx-PORT.conf") || exit 1
  read -r n_med n_max <<<"$res"
  # RSS of master + worker + cache helper processes after 1 s idle, then warmed.
  sed "s#127.0.0.1:PORT#127.0.0.1:$RSS_PORT#" "$TMP/nginx/nginx.conf.in" >"$TMP/nginx/rss.conf"
  taskset -c 0 nginx -p "$TMP/nginx" -e "$TMP/nginx/error.log" -c "$TMP/nginx/rss.conf" &
  pid=$!; STARTED+=("$pid")
  wait_port "$RSS_PORT" || die "nginx (RSS run) did not start"
  sleep 1
  n_rss0=$(rss_tree_kib "$pid")
  warm_100 "http://127.0.0.1:$RSS_PORT"
  n_rss1=$(rss_tree_kib "$pid")
  kill "$pid"; wait "$pid" 2>/dev/null || true
  n_line="| nginx $(nginx -v 2>&1 | sed 's/.*nginx\///') (reference, all processes) | $n_med | $n_max | $n_rss0 | $n_rss1 |"
fi

{
  echo "# vcdn footprint"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), kernel $(uname -r), CPU $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  echo "- vcdn: $("$VCDN_BIN" --version 2>/dev/null || echo unknown) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-commit))"
  echo "- cache command: vcdn cache --listen ... --upstream ... --memory $MEMORY_BYTES $VCDN_CACHE_ARGS ${admin_args[*]}"
  echo "- start-up = exec to first complete \`GET /size/43\` 200 answer (server on CPU 0, 0.5 ms polling from CPU 1), $RUNS runs; for caches the first answer includes the fetch from the origin"
  echo "- RSS = VmRSS; idle = 1 s after the port accepts; warmed = after 100 objects of 1-100 KiB (~5 MiB) were each fetched twice${hit:+ (last response X-Cache: $hit)}"
  echo
  echo "| process | start-up median ms | start-up max ms | RSS idle KiB | RSS warmed KiB |"
  echo "|---|---:|---:|---:|---:|"
  echo "| vcdn origin | $o_med | $o_max | $o_rss0 | $o_rss1 |"
  echo "| vcdn cache | $c_med | $c_max | $c_rss0 | $c_rss1 |"
  [[ -n $n_line ]] && echo "$n_line"
  echo
} >"$TMP/report.md"
mkdir -p "$(dirname "$OUT")"
cp "$TMP/report.md" "$OUT"
cat "$TMP/report.md"
log "markdown written to $OUT"
