#!/usr/bin/env bash
# reproduce/cdnaas/run.sh - the CDNaaS paper's measurements (§IV-C, IV-D, V-B:
# Table III, Figs 6, 10, 11, 13, 14) re-made on this machine with vcdn's cache
# in place of the paper's nginx, and with nginx itself for reference.
#
# One "vCPU" is VCPU of a CPU core: each server runs on core 0 inside a cgroup
# whose CFS quota is n x VCPU (n = 1 or 2 vCPUs; nginx gets n workers, vcdn n
# serving threads), and the load (wrk, vcdn player) runs on core 1. A share
# rather than a whole core keeps the load generators, which share this 2-core
# machine, from being the limit; results are scaled to one whole CPU (the paper
# found capacity linear in vCPUs, §IV-C1 footnote 3, and its 1-vCPU guests had
# a whole core). Both servers are in-memory caches of the same `vcdn origin`.
#
#   Fig. 6    43 B object, closed loop (wrk), 1 and 2 vCPUs, CONNS connections
#   Table III 73,262 B and 434,830 B objects, 1000 and 10000 connections, 1 vCPU
#   Figs 10, 11, 13: SESSIONS (per CPU) HD DASH viewers (`vcdn player`, the
#             paper's Table II chunk sizes, 2 s chunks) for VIDEO_S seconds:
#             mean MOS, stalls per minute, P(MOS > 3.6), start-up delay.
#             `--quality highest`: the paper's viewers watched one fixed HD
#             quality (no adaptation). `--mode PLAYER_MODE`: closed (a
#             viewer's player: the next segment when the previous one has
#             arrived and the buffer has room, so overload shows as stalls
#             and start-up delay) or open (the old schedule, segment i at
#             (i - 3) x 2 s whatever happened: a load generator, so overload
#             shows as late responses and failures). Results go to
#             raw/video-PLAYER_MODE*, so both modes' results sit side by side.
#   Fig. 14   73,262 B chunks, open loop (`vcdn player --http --rate`, 1000
#             connections) at the request rate of STREAMS (per CPU) viewers
#             (one chunk per 2 s each): the response-time CDF and its p90
#
# Output: OUT/raw/*.tsv and *.json, OUT/*.png and OUT/README.md (tables side by
# side with the paper's values). Traffic stays on loopback. Needs root.
#
# Environment (defaults): VCPU=0.1 POINT_S=8 TABLE3_S=30 VIDEO_S=48 OUT=reproduce/cdnaas
#   CONNS="10 100 1000 5000 10000"  SESSIONS="5000 10000 15000 20000 25000 30000 40000"
#   STREAMS="10000 25000 50000 75000 100000"  SERVERS="vcdn nginx"  SKIP_BUILD=1
#   PARTS="fig6 table3 fig14 video" (the parts to run; the others' results in
#   raw/ are kept and plotted)  PLAYER_MODE=closed (or open: the video part)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VCPU=${VCPU:-0.1}
POINT_S=${POINT_S:-8}
# Table III's runs are longer: 10,000 connections each fetching 435 KB take
# several seconds per round on one vCPU, and wrk counts finished requests.
TABLE3_S=${TABLE3_S:-30}
VIDEO_S=${VIDEO_S:-48}
OUT=${OUT:-$ROOT/reproduce/cdnaas}
CONNS=${CONNS:-10 100 1000 5000 10000}
SESSIONS=${SESSIONS:-5000 10000 15000 20000 25000 30000 40000}
STREAMS=${STREAMS:-10000 25000 50000 75000 100000}
SERVERS=${SERVERS:-vcdn nginx}
PARTS=${PARTS:-fig6 table3 fig14 video}
PLAYER_MODE=${PLAYER_MODE:-closed}
V=$ROOT/target/release/vcdn
SERVER_CPU=0 LOAD_CPU=1
CLK_TCK=$(getconf CLK_TCK)
source "$ROOT/bench/lib.sh"
log() { echo "[cdnaas $(date +%H:%M:%S)] $*" >&2; }
die() { log "error: $*"; exit 1; }
part() { [[ " $PARTS " == *" $1 "* ]]; }
for p in $PARTS; do [[ $p =~ ^(fig6|table3|fig14|video)$ ]] || die "PARTS: $p is not one of fig6 table3 fig14 video"; done
[[ $PLAYER_MODE =~ ^(closed|open)$ ]] || die "PLAYER_MODE: give closed or open"

[[ $(id -u) -eq 0 ]] || die "run as root (installs packages, creates cgroups)"
missing=()
command -v nginx >/dev/null || missing+=(nginx-light)
command -v wrk >/dev/null || missing+=(wrk)
command -v jq >/dev/null || missing+=(jq)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib 2>/dev/null ||
  pip install -q --break-system-packages matplotlib
[[ ${SKIP_BUILD:-0} == 1 ]] || (cd "$ROOT" && cargo build --release -q -p vcdn)
ulimit -n "$(ulimit -Hn)"  # 10000 connections need more than 1024 files

TMP=$(mktemp -d)
RAW=$OUT/raw
mkdir -p "$RAW"
PORT=$((19100 + RANDOM % 400))
ORIGIN=127.0.0.1:$PORT
SERVER=127.0.0.1:$((PORT + 1))
CG=
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do [[ -n $p ]] && stop_tree "$p"; done
  [[ -n $CG && -d $CG ]] && rmdir "$CG" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

# A cgroup holding its processes to QUOTA_US per 100 ms: v2 cpu.max where the
# cpu controller is on cgroup2, else the v1 cpu controller.
make_cgroup() {
  local quota_us=$1 v2 v1
  v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  if [[ -n $v2 ]] && grep -qw cpu "$v2/cgroup.controllers" 2>/dev/null; then
    grep -qw cpu "$v2/cgroup.subtree_control" || echo +cpu >"$v2/cgroup.subtree_control"
    CG=$v2/vcdn-cdnaas-$$
    mkdir -p "$CG"
    echo "$quota_us 100000" >"$CG/cpu.max"
    return
  fi
  v1=$(awk '$3 == "cgroup" && ("," $4 ",") ~ /,cpu,/ { print $2; exit }' /proc/mounts)
  [[ -n $v1 ]] || die "no cgroup with the cpu controller"
  CG=$v1/vcdn-cdnaas-$$
  mkdir -p "$CG"
  echo 100000 >"$CG/cpu.cfs_period_us"
  echo "$quota_us" >"$CG/cpu.cfs_quota_us"
}

# Starts server $1 (vcdn | nginx) with $2 vCPUs; sets SRV_PID.
start_server() {
  local name=$1 n=$2 quota_us
  quota_us=$(awk -v v="$VCPU" -v n="$n" 'BEGIN { printf "%d", v * n * 100000 }')
  make_cgroup "$quota_us"
  case $name in
    vcdn)
      sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$CG" taskset -c $SERVER_CPU \
        "$V" cache --listen "$SERVER" --upstream "http://$ORIGIN" --memory 2G --threads "$n" \
        >"$TMP/vcdn.log" 2>&1 &
      ;;
    nginx)
      local d=$TMP/nginx
      rm -rf "$d" /dev/shm/vcdn-cdnaas-nginx
      mkdir -p "$d" /dev/shm/vcdn-cdnaas-nginx
      sed -e "s#@PORT@#${SERVER##*:}#; s#@ORIGIN_PORT@#$PORT#; s#@RUN_DIR@#$d#g" \
          -e "s#@CACHE_DIR@#/dev/shm/vcdn-cdnaas-nginx#; s#@USER@#$(id -un)#" \
          -e "s#^worker_processes 1;#worker_processes $n;#" \
          -e "s#worker_rlimit_nofile 16384;#worker_rlimit_nofile 20000;#" \
          -e "s#worker_connections 8192;#worker_connections 19000;#" \
          -e "s#max_size=512m#max_size=1g#" \
          "$ROOT/bench/peers/nginx.conf.tmpl" >"$d/nginx.conf"
      sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' _ "$CG" taskset -c $SERVER_CPU \
        nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" >"$d/stdout.log" 2>&1 &
      ;;
  esac
  SRV_PID=$!
  PIDS+=("$SRV_PID")
  wait_http "http://$SERVER/size/43" 10 || die "$name did not start"
}

stop_server() {
  stop_tree "$SRV_PID"
  PIDS=("${PIDS[@]/$SRV_PID}")
  rmdir "$CG" 2>/dev/null || true
  CG=
}

# Fills the server's cache: the test objects and the whole DASH title.
warm() {
  local base=http://$SERVER r i
  {
    for i in 43 73262 434830; do printf 'url = "%s/size/%s"\noutput = "/dev/null"\n' "$base" "$i"; done
    printf 'url = "%s/dash/vod/film/manifest.mpd"\noutput = "/dev/null"\n' "$base"
    for r in low high; do
      printf 'url = "%s/dash/vod/film/%s/init.mp4"\noutput = "/dev/null"\n' "$base" "$r"
      for i in $(seq 238); do printf 'url = "%s/dash/vod/film/%s/%s.m4s"\noutput = "/dev/null"\n' "$base" "$r" "$i"; done
    done
  } >"$TMP/warm.curl"
  curl -s -K "$TMP/warm.curl"
  curl -s -K "$TMP/warm.curl" # every object twice: now from the cache
}

# Waits until the server is idle again (under 2 % of its quota for 0.5 s, at
# most 60 s): after wrk stops, a throttled server still works off what the
# closed connections had queued, which would load the next point.
settle() {
  local i a b
  for i in $(seq 120); do
    a=$(cpu_ticks "$SRV_PID"); sleep 0.5; b=$(cpu_ticks "$SRV_PID")
    awk -v d=$((b - a)) -v hz="$CLK_TCK" -v q="$VCPU" 'BEGIN { exit !(d / hz / 0.5 < 0.02 * q) }' && return
  done
  log "warning: the server is still busy after 60 s"
}

per_cpu() { awk -v r="$1" -v v="$VCPU" -v n="$2" 'BEGIN { printf "%.0f", r / (v * n) }'; }

# Closed-loop wrk on the load core: prints "req/s errors server-CPU-utilization".
wrk_run() {
  local url=$1 conns=$2 n=$3 secs=${4:-$POINT_S} t0 t1 out rps errs
  t0=$(cpu_ticks "$SRV_PID")
  out=$(taskset -c $LOAD_CPU wrk -t1 -c "$conns" -d "${secs}s" --timeout 10s "$url" 2>&1) || true
  t1=$(cpu_ticks "$SRV_PID")
  settle
  rps=$(awk '/^Requests\/sec/ { print $2 }' <<<"$out")
  errs=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10 } /Non-2xx/ { print $NF }' <<<"$out" | paste -sd+ | bc)
  echo "${rps:-0} ${errs:-0} $(awk -v t=$((t1 - t0)) -v hz="$CLK_TCK" -v s="$secs" -v q="$VCPU" -v n="$n" \
    'BEGIN { printf "%.2f", t / hz / s / (q * n) }')"
}

VIDEO=video-$PLAYER_MODE
part fig6 && echo -e "server\tvcpus\tconnections\trequests_per_s\tper_cpu\terrors\tquota_used" >"$RAW/fig6.tsv"
part table3 && echo -e "server\tbytes\tconnections\trequests_per_s\tper_cpu\terrors\tquota_used" >"$RAW/table3.tsv"
part video && echo -e "server\tsessions_per_cpu\tsessions\tmean_mos\tstalls_per_min\tp_mos_over_3_6\tfailed\tplayer_cpu\tmean_startup_s\tp95_startup_s\tstall_ratio" >"$RAW/$VIDEO.tsv"
part fig14 && echo -e "server\tstreams_per_cpu\trate\tp50_ms\tp90_ms\tp99_ms\terrors" >"$RAW/fig14.tsv"

taskset -c $LOAD_CPU "$V" origin --listen "$ORIGIN" >"$TMP/origin.log" 2>&1 &
PIDS+=($!)
wait_http "http://$ORIGIN/size/43" 10 || die "origin did not start"
log "origin on $ORIGIN; one vCPU = $VCPU CPU; $POINT_S s per throughput point, $VIDEO_S s per video point; parts: $PARTS; player: $PLAYER_MODE loop"
[[ -n $(nginx -v 2>&1) ]] && log "$(nginx -v 2>&1)"

for s in $SERVERS; do
  part fig6 || continue
  # Fig. 6: the 43 B object, 1 and 2 vCPUs.
  for n in 1 2; do
    start_server "$s" "$n"
    warm
    for c in $CONNS; do
      read -r rps errs used < <(wrk_run "http://$SERVER/size/43" "$c" "$n")
      log "fig6 $s ${n}vCPU $c conns: $rps req/s ($(per_cpu "$rps" "$n") per CPU), $errs errors, quota used $used"
      echo -e "$s\t$n\t$c\t$rps\t$(per_cpu "$rps" "$n")\t$errs\t$used" >>"$RAW/fig6.tsv"
    done
    stop_server
  done
done

for s in $SERVERS; do
  part table3 || part fig14 || part video || continue
  start_server "$s" 1
  warm
  # Table III.
  part table3 && for b in 73262 434830; do
    for c in 1000 10000; do
      read -r rps errs used < <(wrk_run "http://$SERVER/size/$b" "$c" 1 "$TABLE3_S")
      log "table3 $s $b B $c conns: $rps req/s ($(per_cpu "$rps" 1) per CPU), $errs errors, quota used $used"
      echo -e "$s\t$b\t$c\t$rps\t$(per_cpu "$rps" 1)\t$errs\t$used" >>"$RAW/table3.tsv"
    done
  done
  # Fig. 14: open-loop low-quality chunks at the rate of N viewers.
  part fig14 && for p in $STREAMS; do
    rate=$(awk -v p="$p" -v v="$VCPU" 'BEGIN { printf "%.1f", p / 2 * v }')
    taskset -c $LOAD_CPU "$V" player --http --quiet --url "http://$SERVER/size/73262" --connections 1000 \
      --rate "$rate" --duration "$POINT_S" --report "$RAW/fig14-$s-$p.json" >/dev/null 2>&1 || true
    settle
    read -r p50 p90 p99 errs < <(jq -r '[.latency_ms.p50, .latency_ms.p90, .latency_ms.p99, .errors] | @tsv' "$RAW/fig14-$s-$p.json")
    log "fig14 $s $p streams per CPU ($rate req/s): p50 $p50 ms, p90 $p90 ms, p99 $p99 ms, $errs errors"
    echo -e "$s\t$p\t$rate\t$p50\t$p90\t$p99\t$errs" >>"$RAW/fig14.tsv"
  done
  # Figs 10, 11, 13: HD viewers.
  part video && for p in $SESSIONS; do
    n=$(awk -v p="$p" -v v="$VCPU" 'BEGIN { printf "%d", p * v }')
    cpu=$(bash -c 'taskset -c '$LOAD_CPU' "$@" >/dev/null 2>&1; read -ra f < <(sed "s/^.*) //" /proc/$$/stat); echo $(( f[13] + f[14] ))' _ \
      "$V" player --quiet --url "http://$SERVER/dash/vod/film/manifest.mpd" --sessions "$n" \
      --duration "$VIDEO_S" --ramp 4 --quality highest --mode "$PLAYER_MODE" --report "$RAW/$VIDEO-$s-$p.json")
    settle
    cpu=$(awk -v t="$cpu" -v hz="$CLK_TCK" -v s="$VIDEO_S" 'BEGIN { printf "%.2f", t / hz / s }')
    read -r mos spm ok failed su su95 sr < <(jq -r '[.summary.mean_mos, .summary.stalls_per_minute,
        ([.per_session[].windows[]] | if length == 0 then 0 else (map(select(. > 3.6)) | length) / length end),
        .summary.failed, .summary.mean_startup_delay_s, .summary.p95_startup_delay_s, .summary.stall_ratio] | @tsv' "$RAW/$VIDEO-$s-$p.json")
    log "video ($PLAYER_MODE loop) $s $p per CPU ($n sessions): mean MOS $mos, $spm stalls/min, P(MOS>3.6) $ok, $failed failed, start-up $su s (p95 $su95 s), player used $cpu of a core"
    echo -e "$s\t$p\t$n\t$mos\t$spm\t$ok\t$failed\t$cpu\t$su\t$su95\t$sr" >>"$RAW/$VIDEO.tsv"
    # The per-session detail is large; keep the summary, the windows, the
    # start-up delays and why sessions failed.
    jq -c '{summary, windows: [.per_session[].windows[]], startup_delay_s: [.per_session[].startup_delay_s],
        errors: ([.per_session[].error // empty | gsub("[0-9]+"; "N")] | group_by(.) | map({(.[0]): length}) | add // {})}' \
      "$RAW/$VIDEO-$s-$p.json" >"$TMP/v.json" && mv "$TMP/v.json" "$RAW/$VIDEO-$s-$p.json"
  done
  stop_server
done

# raw/run.txt: one line per part, when and how it was last run.
touch "$RAW/run.txt"
for p in $PARTS; do
  [[ $p == video ]] && p=$VIDEO
  grep -v "^$p " "$RAW/run.txt" >"$TMP/run.txt" || true
  echo "$p date=$(date -u +%FT%TZ) vcpu=$VCPU point_s=$POINT_S table3_s=$TABLE3_S video_s=$VIDEO_S commit=$(git -C "$ROOT" rev-parse --short HEAD) cpu=$(awk -F': ' '/model name/ { gsub(" ", "_", $2); print $2; exit }' /proc/cpuinfo) nginx=$(nginx -v 2>&1 | sed 's/.*nginx\///')" >>"$TMP/run.txt"
  sort "$TMP/run.txt" >"$RAW/run.txt"
done
python3 "$ROOT/reproduce/cdnaas/plot.py" "$OUT"
log "done: $OUT/results.md"
