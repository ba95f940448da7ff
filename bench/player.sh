#!/usr/bin/env bash
# bench/player.sh - how many DASH sessions one core of `vcdn player` plays,
# in each mode (closed: a viewer's player; open: the load generator).
#
# `vcdn origin` and a `vcdn cache --threads 1` in front of it run on CPU 0;
# the cache is warmed with the whole title and verified as serving hits.
# `vcdn player --threads 1` runs alone on CPU 1 with N sessions of the
# synthetic title /dash/vod/film/manifest.mpd (2 s segments) at
# `--quality lowest` (250 kbit/s, ~73 KB segments): N sessions ask for N/2
# segments per second, so 10,000 sessions are 5,000 requests/s and
# ~3 Gbit/s, well within what the cache serves on one core: the player's
# CPU is what is measured.
#
# Per run: the player's CPU time (utime+stime from /proc, over a steady
# window after the ramp and the buffers' first fill, and over the whole
# run), its peak RSS (VmHWM), the cache's CPU over the same window, and the
# player's own report (failed sessions, stalls, mean MOS, start-up p95).
# A run passes when the player used under MAX_CPU of its core in the window
# and no session stalled or failed. Sessions per core = N / CPU fraction.
#
# Environment knobs:
#   CLOSED_SESSIONS="1000 5000 10000 15000 18000"   session counts per mode
#   OPEN_SESSIONS="1000 2500 5000 7500 10000"
#   SESSIONS=        one list for both modes (overrides the two above)
#   MODES="closed open"
#   DURATION=40      seconds per player run (--duration)
#   RAMP=10          seconds over which sessions start (--ramp)
#   SETTLE=6         seconds after the ramp before the measured window
#                    (the closed loop first fills its 12 s buffer)
#   MAX_CPU=0.9      the pass line, fraction of one core
#   QUALITY=lowest   --quality of the player
#   BASE_PORT=18180  origin=BASE, cache=BASE+1
#   OUT=bench/results/player-latest.md   markdown copy of the report
#   VCDN_BIN=target/release/vcdn   SKIP_BUILD=1 skips `cargo build`
#   PLAYER_ARGS=""   extra args for `vcdn player`
#   NEAR_NS=200 FAR_NS=250   cross-CPU round trip (bench/xcpu.c) below
#                    which the two vCPUs count as sharing a cache, above
#                    which as apart
#
# Each session holds a connection in the player and one in the cache, so
# both need more open files than sessions: the script raises the soft limit
# to the hard one, and the hard one too where it may (root with
# CAP_SYS_RESOURCE); otherwise the hard limit caps the sessions of a run.
# Only loopback traffic.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"

CLOSED_SESSIONS=${SESSIONS:-${CLOSED_SESSIONS:-1000 5000 10000 15000 18000}}
OPEN_SESSIONS=${SESSIONS:-${OPEN_SESSIONS:-1000 2500 5000 7500 10000}}
MODES=${MODES:-closed open}
DURATION=${DURATION:-40}
RAMP=${RAMP:-10}
SETTLE=${SETTLE:-6}
MAX_CPU=${MAX_CPU:-0.9}
QUALITY=${QUALITY:-lowest}
BASE_PORT=${BASE_PORT:-18180}
OUT=${OUT:-$ROOT/bench/results/player-latest.md}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
SKIP_BUILD=${SKIP_BUILD:-0}
PLAYER_ARGS=${PLAYER_ARGS:-}
NEAR_NS=${NEAR_NS:-200}
FAR_NS=${FAR_NS:-250}

SERVER_CPU=0        # origin and cache
PLAYER_CPU=1        # the player under test
CLK_TCK=$(getconf CLK_TCK)
ORIGIN_PORT=$BASE_PORT
CACHE_PORT=$((BASE_PORT + 1))
TITLE=/dash/vod/film
MPD=$TITLE/manifest.mpd
WIN0=$((RAMP + SETTLE))        # measured window, seconds after the start
WIN1=$((DURATION - 2))

log() { printf '[player.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[player.sh] ERROR: %s\n' "$*" >&2; exit 1; }

((WIN1 - WIN0 >= 5)) || die "DURATION ($DURATION) must exceed RAMP + SETTLE + 7 ($((WIN0 + 7)))"
for m in $MODES; do [[ $m == closed || $m == open ]] || die "MODES: closed or open (got '$m')"; done

install_packages() {
  local missing=()
  command -v taskset >/dev/null || missing+=(util-linux)
  command -v curl >/dev/null || missing+=(curl)
  command -v jq >/dev/null || missing+=(jq)
  command -v cc >/dev/null || missing+=(gcc libc6-dev)
  if ((${#missing[@]})); then
    [[ $(id -u) -eq 0 ]] || die "install ${missing[*]} (or run as root)"
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
      || die "apt-get install failed"
  fi
}

TMP=""
declare -a STARTED=()
cleanup() {
  local rc=$? r
  trap - EXIT INT TERM
  set +e
  for r in "${STARTED[@]}"; do stop_tree "$r"; done
  [[ -n $TMP ]] && rm -rf "$TMP"
  exit "$rc"
}

# Open files: a session holds a connection in the player and one in the
# cache, each process has the limit. Raise the soft limit to the hard one,
# and the hard one where we may.
raise_nofile() {
  local want=$1 hard
  hard=$(ulimit -Hn)
  [[ $hard == unlimited ]] && hard=$want
  if ((hard < want)); then
    if ulimit -Hn "$want" 2>/dev/null; then
      log "raised the hard limit of open files from $hard to $want"
      hard=$want
    else
      log "WARNING: the hard limit of open files is $hard and cannot be raised here (needs CAP_SYS_RESOURCE): runs of more than ~$((hard - 1000)) sessions will fail to connect"
    fi
  fi
  ulimit -n "$hard"
}

# Every segment of the title through the cache, twice; the second answer of
# the MPD, the init segment and a sample of segments must be hits.
warm_cache() {
  local url=http://127.0.0.1:$CACHE_PORT n count hdr
  count=$(curl -sf "http://127.0.0.1:$ORIGIN_PORT$MPD" | grep -o 'mediaPresentationDuration="PT[0-9]*S"' | tr -dc 0-9)
  [[ -n $count ]] || die "origin gave no MPD at $MPD"
  count=$(((count + 1) / 2))
  SEGMENTS=$count
  local urls=("$url$MPD" "$url$TITLE/low/init.mp4")
  for n in $(seq 1 "$count"); do urls+=("$url$TITLE/low/$n.m4s"); done
  printf 'url = "%s"\noutput = /dev/null\n' "${urls[@]}" >"$TMP/warm.curl"
  curl -sf -K "$TMP/warm.curl" || die "warming the cache failed"
  curl -sf -K "$TMP/warm.curl" || die "warming the cache failed"
  for u in "$url$MPD" "$url$TITLE/low/init.mp4" "$url$TITLE/low/1.m4s" "$url$TITLE/low/$count.m4s"; do
    hdr=$(curl -s -o /dev/null -D - "$u")
    grep -qiE '^x-cache: *hit' <<<"$hdr" || { printf '%s\n' "$hdr" >&2; die "cache is not serving $u as a hit"; }
  done
  log "cache warmed: MPD, init and $count segments of $TITLE/low are hits"
}

xcpu_ns() { "$TMP/xcpu" "$SERVER_CPU" "$PLAYER_CPU"; }

# Machine-wide TCP counters (/proc/net/netstat): accept-queue overflows at
# a listener (the SYN is dropped and re-sent after 1 s, then 3 s) and SYN
# retransmits. Printed as "overflows syn_retransmits".
tcp_drops() {
  awk '$1 == "TcpExt:" { if (!n) { for (i = 2; i <= NF; i++) k[i] = $i; n = 1; next }
         for (i = 2; i <= NF; i++) v[k[i]] = $i }
       END { print v["ListenOverflows"] + 0, v["TCPSynRetrans"] + 0 }' /proc/net/netstat
}
vm_hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || true; }

# run_player MODE N -> a row in results.tsv
run_player() {
  local mode=$1 n=$2 pid out=$TMP/player-$1-$2
  local x0 x1 t0 s p0 p1 c0 c1 b0 b1 a0 a1 o0 o1 pend=0 hwm=0 h
  x0=$(xcpu_ns)
  local d0 d1
  d0=$(tcp_drops)
  # shellcheck disable=SC2086
  taskset -c "$PLAYER_CPU" "$VCDN_BIN" player --url "http://127.0.0.1:$CACHE_PORT$MPD" \
    --sessions "$n" --duration "$DURATION" --ramp "$RAMP" --quality "$QUALITY" --mode "$mode" \
    --threads 1 --report "$out.json" $PLAYER_ARGS >"$out.stdout" 2>"$out.stderr" &
  pid=$!
  STARTED+=("$pid")   # stopped on an interrupt too
  t0=$(date +%s.%N)
  # Sample at whole seconds after the start: the window's ends and the
  # peak RSS until the player exits (or the bound).
  p0="" p1=""
  for s in $(seq 1 $((DURATION + 60))); do
    sleep "$(awk -v t0="$t0" -v s="$s" -v now="$(date +%s.%N)" 'BEGIN { d = t0 + s - now; print (d > 0 ? d : 0) }')"
    [[ -d /proc/$pid ]] || break
    h=$(vm_hwm_kib "$pid"); [[ -n $h ]] && hwm=$h
    if ((s == WIN0)); then
      p0=$(cpu_ticks "$pid"); c0=$(cpu_ticks "$CACHE_PID"); o0=$(cpu_ticks "$ORIGIN_PID")
      b0=$(core_busy_ticks "$PLAYER_CPU"); a0=$(core_busy_ticks "$SERVER_CPU")
    elif ((s == WIN1)); then
      p1=$(cpu_ticks "$pid"); c1=$(cpu_ticks "$CACHE_PID"); o1=$(cpu_ticks "$ORIGIN_PID")
      b1=$(core_busy_ticks "$PLAYER_CPU"); a1=$(core_busy_ticks "$SERVER_CPU")
    fi
    # The player's CPU up to its last sample (0 once it has exited).
    if ((s >= WIN1)); then h=$(cpu_ticks "$pid"); ((h > 0)) && pend=$h; fi
  done
  if [[ -d /proc/$pid ]]; then
    log "player ($mode, $n) still running after $((DURATION + 60)) s: stopping it"
    stop_tree "$pid"
  fi
  wait "$pid" || log "player ($mode, $n) exited non-zero: $(tail -n 3 "$out.stderr")"
  x1=$(xcpu_ns)
  d1=$(tcp_drops)
  [[ -n $p0 && -n $p1 && -s $out.json ]] || { tail -n 20 "$out.stderr" >&2; die "player ($mode, $n) gave no report"; }
  local whole=$pend
  # Requests in the window, from the progress lines ("player 17.0s ... N req/s").
  local reqs
  reqs=$(awk -v a="$WIN0" -v b="$WIN1" '$1 == "player" { t = $2 + 0; for (i = 3; i < NF; i++) if ($(i+1) == "req/s") r = $i
           if (t > a && t <= b) sum += r } END { print sum + 0 }' "$out.stderr")
  jq -r --arg mode "$mode" --argjson n "$n" --argjson win "$((WIN1 - WIN0))" --argjson hz "$CLK_TCK" \
    --argjson pt "$((p1 - p0))" --argjson ct "$((c1 - c0 + o1 - o0))" --argjson whole "$whole" \
    --argjson other1 "$((b1 - b0 - (p1 - p0)))" --argjson other0 "$((a1 - a0 - (c1 - c0 + o1 - o0)))" \
    --argjson reqs "$reqs" --argjson hwm "$hwm" --arg x "$x0/$x1" --argjson dur "$DURATION" \
    --arg drops "$(awk -v a="$d0" -v b="$d1" 'BEGIN { split(a, x, " "); split(b, y, " "); print y[1] - x[1] "/" y[2] - x[2] }')" '
    .summary as $s | [$mode, $n, ($pt / $hz / $win), ($ct / $hz / $win), $reqs, ($whole / $hz / $dur),
      $hwm, $s.started, $s.failed, $s.stalls, $s.stall_ratio, $s.mean_mos, $s.p95_startup_delay_s,
      $s.latency_ms.p99, $s.errors, $s.requests_per_s, ($other1 / $hz / $win), ($other0 / $hz / $win), $x,
      (if $reqs > 0 then $pt / $hz / $reqs * 1e6 else 0 end), $drops] | @tsv' "$out.json" >>"$TMP/results.tsv"
  log "$(tail -n 1 "$TMP/results.tsv" | awk -F'\t' '{ printf "%-6s %6d sessions: player %.0f%% of a core, cache %.0f%%, %.1f us per segment, failed %d, stalls %d, MOS %.2f, start-up p95 %.2f s, listen overflows/SYN retransmits %s, cross-CPU %s ns", $1, $2, $3 * 100, $4 * 100, $20, $9, $10, $12, $13, $21, $19 }')"
  local why
  why=$(jq -r '[.per_session[] | select(.failed) | .error // "?" | sub("[0-9]+"; "N"; "g")]
               | group_by(.) | map("\(length) x \(.[0])") | .[:3] | join("; ")' "$out.json")
  if [[ -n $why ]]; then
    log "  failed sessions: $why"
    printf -- '- %s loop, %s sessions, why sessions failed: %s\n' "$mode" "$n" "$why" >>"$TMP/why.md"
  fi
  sleep 3   # connections drain before the next run
}

report() {
  {
    echo "# vcdn player: sessions per core"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- kernel: $(uname -r); CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
    echo "- vcdn: $("$VCDN_BIN" --version 2>/dev/null || echo unknown) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-commit))"
    echo "- setup: vcdn origin and vcdn cache --threads 1 on CPU $SERVER_CPU (cache warmed, every segment a hit); vcdn player --threads 1 --quality $QUALITY on CPU $PLAYER_CPU; $MPD ($SEGMENTS segments of 2 s); --duration $DURATION --ramp $RAMP; open files $(ulimit -n)"
    echo "- window: CPU and requests measured from ${WIN0} s to ${WIN1} s of each run (after the ramp and the first buffer fill); 'whole run' = player CPU over all of it, start-up and report included"
    echo "- pass: player under $MAX_CPU of its core in the window, no session failed or stalled; sessions per core = sessions / player core fraction"
    echo "- listen overflows / SYN retransmits: machine-wide TCP counters over the run (/proc/net/netstat); a connection whose SYN found the cache's accept queue full starts 1 s (then 3 s) late"
    echo "- not charged = busy time of that CPU (/proc/stat) not used by the processes under test, as a fraction of the window (other work on a shared machine; a rough indicator, the two counters are kept differently, and values below 0 mean nothing else ran)"
    echo
    echo "| mode | sessions | player core (window) | whole run | µs per segment | peak RSS MiB | cache core | started | failed | stalls | mean MOS | start-up p95 s | segment p99 ms | req/s | not charged CPU$PLAYER_CPU / CPU$SERVER_CPU | listen overflows / SYN retransmits | cross-CPU ns | pass | sessions per core |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|"
    awk -F'\t' -v max="$MAX_CPU" '{
      pass = ($3 < max && $9 == 0 && $10 == 0) ? "yes" : "no"
      printf "| %s | %d | %.0f%% | %.0f%% | %.1f | %.0f | %.0f%% | %d | %d | %d | %.2f | %.2f | %.0f | %.0f | %.0f%% / %.0f%% | %s | %s | %s | %s |\n",
        $1, $2, $3 * 100, $6 * 100, $20, $7 / 1024, $4 * 100, $8, $9, $10, $12, $13, $14, $16, $17 * 100, $18 * 100, $21, $19, pass,
        ($3 > 0 ? sprintf("%.0f", $2 / $3) : "n/a") }' "$TMP/results.tsv"
    echo
    cat "$TMP/why.md"
    awk -F'\t' -v max="$MAX_CPU" -v near="$NEAR_NS" -v far="$FAR_NS" '
      { split($19, x, "/"); pl = (x[1] < near && x[2] < near) ? "vCPUs sharing a cache" : (x[1] > far && x[2] > far) ? "vCPUs apart" : "placement changed"
        if ($3 < max && $9 == 0 && $10 == 0 && $2 > best[$1]) { best[$1] = $2; cpu[$1] = $3; us[$1] = $20; where[$1] = pl } }
      END { for (m in best) printf "- **%s loop: one core plays %d sessions at %.0f%% of the core (largest passing run, %s) -> %.0f sessions per core, %.1f µs of player CPU per segment**\n",
              m, best[m], cpu[m] * 100, where[m], best[m] / cpu[m], us[m] }' "$TMP/results.tsv"
  } >"$TMP/report.md"
  mkdir -p "$(dirname "$OUT")"
  cp "$TMP/report.md" "$OUT"
  echo
  cat "$TMP/report.md"
  log "markdown written to $OUT"
}

main() {
  install_packages
  if [[ $SKIP_BUILD != 1 ]]; then
    log "building vcdn (cargo build --release -p vcdn)"
    (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "cargo build failed"
  fi
  [[ -x $VCDN_BIN ]] || die "vcdn binary not found at $VCDN_BIN"

  local max=0 n
  for n in $CLOSED_SESSIONS $OPEN_SESSIONS; do ((n > max)) && max=$n; done
  raise_nofile $((max + 1000))
  local range
  range=$(awk '{ print $2 - $1 + 1 }' /proc/sys/net/ipv4/ip_local_port_range)
  ((range > max + 1000)) || log "WARNING: $range local ports for $max sessions' connections"

  TMP=$(mktemp -d /tmp/vcdn-player-bench.XXXXXX)
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : >"$TMP/results.tsv"
  : >"$TMP/why.md"
  cc -O2 -pthread "$ROOT/bench/xcpu.c" -o "$TMP/xcpu" || die "cannot build bench/xcpu.c"
  port_free "$ORIGIN_PORT" && port_free "$CACHE_PORT" || die "port $ORIGIN_PORT or $CACHE_PORT in use (set BASE_PORT)"

  taskset -c "$SERVER_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" >"$TMP/origin.log" 2>&1 &
  ORIGIN_PID=$!
  STARTED+=("$ORIGIN_PID")
  wait_http "http://127.0.0.1:$ORIGIN_PORT/" 10 || { cat "$TMP/origin.log" >&2; die "vcdn origin did not start"; }
  RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$VCDN_BIN" cache --listen "127.0.0.1:$CACHE_PORT" \
    --upstream "http://127.0.0.1:$ORIGIN_PORT" --memory 256M --threads 1 >"$TMP/cache.log" 2>&1 &
  CACHE_PID=$!
  STARTED+=("$CACHE_PID")
  wait_http "http://127.0.0.1:$CACHE_PORT$MPD" 30 || { cat "$TMP/cache.log" >&2; die "vcdn cache did not start"; }
  warm_cache

  local mode
  for mode in $MODES; do
    local list=$CLOSED_SESSIONS
    [[ $mode == open ]] && list=$OPEN_SESSIONS
    for n in $list; do
      log "$mode loop, $n sessions, ${DURATION}s (ramp ${RAMP}s)"
      run_player "$mode" "$n"
    done
  done
  report
}

main "$@"
