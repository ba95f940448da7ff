#!/usr/bin/env bash
# bench/cache.sh - vcdn's edge cache vs nginx, Varnish and Apache Traffic
# Server, each as a memory cache in front of the same `vcdn origin`.
#
# Every server under test runs alone, pinned to CPU 0, sized for one core;
# wrk runs on CPU 1. Objects are warmed and verified as cache hits first, so
# the runs measure the hit path only.
#
# Modes (env MODE):
#   cpu   - uncapped; report req/s, MiB/s and the server's own CPU time
#           (utime+stime of all its processes, from /proc) -> req and bytes
#           per server CPU-second.
#   quota - every server capped to half a core (CFS quota 50000/100000 us in
#           a cgroup); report raw req/s under the cap.
#   both  - (default) cpu, then quota, on the same server instances.
#
# Environment knobs:
#   DURATION=10s     wrk -d per measured run
#   ROUNDS=1         repeat everything, servers interleaved; report medians
#   MODE=both        cpu | quota | both
#   OUT=bench/results/cache-latest.md   markdown copy of the report
#   SERVERS="vcdn nginx varnish ats"    subset to run (ratios need vcdn);
#                    add "base" to run a second vcdn binary, BASELINE_BIN, in
#                    the same rounds (an A/B of two builds: "vcdn/baseline")
#   BASELINE_BIN=    the "base" server's vcdn binary, e.g. an older build
#   WRK_THREADS=2    wrk -t (all on CPU 1)
#   WARMUP=1s        unmeasured wrk run before each measured run (0 = none);
#                    lets Varnish grow its thread pool, fills keep-alive pools
#   BASE_PORT=18080  origin=BASE, vcdn=+1, nginx=+2, varnish=+3, ats=+4
#   VCDN_BIN=target/release/vcdn   SKIP_BUILD=1 skips `cargo build`
#   VCDN_CACHE_ARGS=""   extra args for `vcdn cache`
#   CGROUP_V1_FALLBACK=1 use the cgroup v1 cpu controller when v2 has no cpu
#   NEAR_NS=200 FAR_NS=250   cross-CPU round trip (bench/xcpu.c, measured
#                    before and after each run) below which the two CPUs
#                    count as sharing a cache, above which as apart; the
#                    report also gives the ratios per placement
#
# Needs root (apt-get, cgroups). Only loopback traffic.
set -euo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$BENCH_DIR/.." && pwd)
# shellcheck source=bench/lib.sh
source "$BENCH_DIR/lib.sh"
PEERS_DIR=$BENCH_DIR/peers

DURATION=${DURATION:-10s}
ROUNDS=${ROUNDS:-1}
MODE=${MODE:-both}
OUT=${OUT:-$ROOT/bench/results/cache-latest.md}
SERVERS=${SERVERS:-vcdn nginx varnish ats}
WRK_THREADS=${WRK_THREADS:-2}
WARMUP=${WARMUP:-1s}
BASE_PORT=${BASE_PORT:-18080}
VCDN_BIN=${VCDN_BIN:-$ROOT/target/release/vcdn}
BASELINE_BIN=${BASELINE_BIN:-}
SKIP_BUILD=${SKIP_BUILD:-0}
VCDN_CACHE_ARGS=${VCDN_CACHE_ARGS:-}
CGROUP_V1_FALLBACK=${CGROUP_V1_FALLBACK:-1}
NEAR_NS=${NEAR_NS:-200}
FAR_NS=${FAR_NS:-250}

SERVER_CPU=0        # server under test
CLIENT_CPU=1        # wrk (and the origin, which only serves warm-up misses)
MEMORY_BYTES=536870912          # 512 MiB memory tier for every cache
QUOTA_US=50000 PERIOD_US=100000 # half a core
CLK_TCK=$(getconf CLK_TCK)

ORIGIN_PORT=$BASE_PORT
declare -A PORT=([vcdn]=$((BASE_PORT + 1)) [nginx]=$((BASE_PORT + 2)) [base]=$((BASE_PORT + 5))
                 [varnish]=$((BASE_PORT + 3)) [ats]=$((BASE_PORT + 4)))
declare -A LABEL=([vcdn]="vcdn" [nginx]="nginx" [varnish]="Varnish" [ats]="ATS" [base]="baseline")

# Scenarios: "title|path|connections"
SCENARIOS=(
  "cached 43 B object, 50 connections|/size/43|50"
  "cached 43 B object, 1000 connections|/size/43|1000"
  "cached 435 KB object, 50 connections|/size/445440|50"
  "cached 1 MiB object, 50 connections|/size/1048576|50"
)
OBJECTS=(/size/43 /size/445440 /size/1048576)

log() { printf '[cache.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { printf '[cache.sh] ERROR: %s\n' "$*" >&2; exit 1; }

case $MODE in cpu|quota|both) ;; *) die "MODE must be cpu, quota or both (got '$MODE')";; esac
for s in $SERVERS; do [[ -n ${PORT[$s]:-} ]] || die "unknown server '$s' in SERVERS"; done
[[ $(id -u) -eq 0 ]] || die "run as root (installs packages, creates cgroups)"

DUR_S=$(dur_secs "$DURATION")

# ---------------------------------------------------------------- install --
# Stop whatever the distro packages may have started: we run our own
# instances with our own configs. No systemd here, so try every way, quietly.
stop_system_services() {
  local svc pidf pid want
  for svc in nginx varnish varnishncsa trafficserver; do
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
      systemctl disable --now "$svc" >/dev/null 2>&1 || true
    fi
    if [[ -x /etc/init.d/$svc ]] && command -v service >/dev/null; then
      service "$svc" stop >/dev/null 2>&1 || true
    fi
  done
  # Leftovers from pidfiles; only kill if the pid really is that program.
  for pidf in /run/nginx.pid:nginx /run/varnishd.pid:varnishd \
              /run/trafficserver/server.lock:traffic_server \
              /run/trafficserver/manager.lock:traffic_manager; do
    want=${pidf##*:}; pidf=${pidf%:*}
    [[ -r $pidf ]] || continue
    pid=$(tr -dc '0-9' <"$pidf")
    [[ -n $pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == */"$want" ]] || continue
    log "stopping system $want (pid $pid from $pidf)"
    kill "$pid" 2>/dev/null || true
  done
}

install_packages() {
  local missing=()
  command -v nginx >/dev/null || missing+=(nginx)
  command -v varnishd >/dev/null || missing+=(varnish)
  command -v traffic_server >/dev/null || missing+=(trafficserver)
  command -v wrk >/dev/null || missing+=(wrk)
  command -v taskset >/dev/null || missing+=(util-linux)
  command -v curl >/dev/null || missing+=(curl)
  command -v cc >/dev/null || missing+=(gcc libc6-dev)
  if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    apt-get update -qq
    # nginx-light is enough (proxy_cache is core); fall back to nginx.
    local i
    for i in "${!missing[@]}"; do
      if [[ ${missing[$i]} == nginx ]] && apt-cache show nginx-light >/dev/null 2>&1; then
        missing[$i]=nginx-light
      fi
    done
    # policy-rc.d exit 101 keeps maintainer scripts from starting services.
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
  stop_system_services
}

# Package + binary versions of the peers, for the report.
pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo "n/a"; }
peer_versions() {
  local ngpkg=nginx-light
  dpkg -s nginx-light >/dev/null 2>&1 || ngpkg=nginx
  echo "- nginx: $(nginx -v 2>&1 | sed 's/^nginx version: //') (Debian package $ngpkg $(pkg_version $ngpkg))"
  echo "- Varnish: $(varnishd -V 2>&1 | head -1) (Debian package varnish $(pkg_version varnish))"
  echo "- Apache Traffic Server: $(traffic_server -V 2>/dev/null | grep -m1 -o 'traffic_server - [0-9.]*' | sed 's/traffic_server - /ATS /') (Debian package trafficserver $(pkg_version trafficserver))"
  echo "- wrk: $(wrk -v 2>&1 | head -1 | awk '{print $2}') (Debian package wrk $(pkg_version wrk))"
  if [[ -x $VCDN_BIN ]]; then
    echo "- vcdn: $("$VCDN_BIN" --version 2>/dev/null || echo unknown) ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-commit))"
    if [[ " $SERVERS " == *" base "* ]]; then
      echo "- baseline: $BASELINE_BIN ($("$BASELINE_BIN" --version 2>/dev/null || echo unknown))"
    fi
  fi
}

# ------------------------------------------------------------- processes --
TMP="" SHM="" QUOTA_CG=""
declare -a STARTED=()       # root pids of everything we started




# How the kernel charges interrupt time, for the report.
irq_accounting() {
  local cfg
  cfg=$(zcat /proc/config.gz 2>/dev/null || cat "/boot/config-$(uname -r)" 2>/dev/null || true)
  if grep -q '^CONFIG_IRQ_TIME_ACCOUNTING=y' <<<"$cfg"; then
    echo "CONFIG_IRQ_TIME_ACCOUNTING=y: irq/softirq time is NOT in server CPU-s (it shows in the 'not charged' column)"
  elif grep -q '^# CONFIG_IRQ_TIME_ACCOUNTING is not set' <<<"$cfg"; then
    echo "no CONFIG_IRQ_TIME_ACCOUNTING: softirq network work done while the server runs is charged to it (part of server CPU-s)"
  else
    echo "kernel config not readable: whether softirq time is in server CPU-s is unknown"
  fi
}



cleanup() {
  local rc=$? r i
  trap - EXIT INT TERM
  set +e   # best effort from here on
  for r in "${STARTED[@]}"; do stop_tree "$r"; done
  if [[ -n $QUOTA_CG && -d $QUOTA_CG ]]; then
    for i in $(seq 20); do rmdir "$QUOTA_CG" 2>/dev/null && break; sleep 0.1; done
  fi
  [[ -n $TMP ]] && rm -rf "$TMP"
  [[ -n $SHM ]] && rm -rf "$SHM"
  exit "$rc"
}



# ---------------------------------------------------------------- servers --
# Each start_* launches the server pinned to CPU 0 in the foreground (no
# daemonising, so $! is the root of its process tree) and sets LAST_PID.
# (Not via $(...): the server must be our child, not a subshell's.)
LAST_PID=""

start_origin() {
  taskset -c "$CLIENT_CPU" "$VCDN_BIN" origin --listen "127.0.0.1:$ORIGIN_PORT" \
    >"$TMP/origin.log" 2>&1 &
  LAST_PID=$!
}

# A vcdn build as server NAME: start_cache BIN NAME.
start_cache() {
  RUST_LOG=${RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$1" cache \
    --listen "127.0.0.1:${PORT[$2]}" --upstream "http://127.0.0.1:$ORIGIN_PORT" \
    --memory "$MEMORY_BYTES" --threads 1 $VCDN_CACHE_ARGS \
    >"$TMP/$2.log" 2>&1 &
  LAST_PID=$!
}

start_vcdn() { start_cache "$VCDN_BIN" vcdn; }
# The same cache from another build (SERVERS="... base", BASELINE_BIN).
start_base() { start_cache "$BASELINE_BIN" base; }

start_nginx() {
  local d=$TMP/nginx
  mkdir -p "$d" "$SHM/nginx-cache"
  render "$PEERS_DIR/nginx.conf.tmpl" "$d/nginx.conf" PORT="${PORT[nginx]}" \
    ORIGIN_PORT="$ORIGIN_PORT" RUN_DIR="$d" CACHE_DIR="$SHM/nginx-cache" USER="$(id -un)"
  # -e: startup error log before the config is read (instead of /var/log/nginx)
  taskset -c "$SERVER_CPU" nginx -p "$d" -c "$d/nginx.conf" -e "$d/nginx-error.log" \
    >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}

start_varnish() {
  local d=$TMP/varnish
  mkdir -p "$d/work"
  render "$PEERS_DIR/varnish.vcl.tmpl" "$d/bench.vcl" ORIGIN_PORT="$ORIGIN_PORT"
  # -F foreground manager (+ forked child), -j none: no privilege separation
  # (we are root; keeps all files in our temp dir). thread_pools=1: one core.
  taskset -c "$SERVER_CPU" varnishd -F -j none -n "$d/work" \
    -a "127.0.0.1:${PORT[varnish]}" -T 127.0.0.1:0 -f "$d/bench.vcl" \
    -s "malloc,512m" -p thread_pools=1 ${VARNISH_ARGS:-} \
    >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}

start_ats() {
  local d=$TMP/ats
  mkdir -p "$d/etc" "$d/var" "$d/run" "$d/log" "$d/cache" "$SHM/ats-cache"
  # Start from the packaged config set (body_factory etc.), then override.
  cp -r /etc/trafficserver/. "$d/etc/"
  local kv=(PORT="${PORT[ats]}" ORIGIN_PORT="$ORIGIN_PORT" ATS_DIR="$d"
            CACHE_DIR="$SHM/ats-cache" CONFIG_THROTTLE=8000)
  render "$PEERS_DIR/ats/records.config.tmpl" "$d/etc/records.config" "${kv[@]}"
  render "$PEERS_DIR/ats/remap.config.tmpl" "$d/etc/remap.config" "${kv[@]}"
  render "$PEERS_DIR/ats/storage.config.tmpl" "$d/etc/storage.config" "${kv[@]}"
  render "$PEERS_DIR/ats/runroot.yaml.tmpl" "$d/runroot.yaml" "${kv[@]}"
  cp "$PEERS_DIR/ats/ip_allow.yaml" "$d/etc/ip_allow.yaml"
  : >"$d/etc/plugin.config"
  : >"$d/etc/logging.yaml"
  # traffic_server alone (no traffic_manager): one process, same data path.
  taskset -c "$SERVER_CPU" traffic_server --run-root="$d/runroot.yaml" \
    >"$d/stdout.log" 2>&1 &
  LAST_PID=$!
}

server_logs() {
  case $1 in
    vcdn) tail -n 20 "$TMP/vcdn.log" ;;
    base) tail -n 20 "$TMP/base.log" ;;
    nginx) tail -n 20 "$TMP/nginx/nginx-error.log" "$TMP/nginx/stdout.log" ;;
    varnish) tail -n 20 "$TMP/varnish/stdout.log" ;;
    ats) tail -n 20 "$TMP/ats/stdout.log" "$TMP/ats/log/diags.log" ;;
  esac 2>/dev/null || true
}

# Is this response (headers on stdin) a cache hit, judged by the peer's own
# header?
is_hit() {
  case $1 in
    vcdn | base) grep -qiE '^x-cache: *hit' ;;
    nginx) grep -qiE '^x-cache-status: *hit' ;;
    # X-Varnish: "<this xid> <xid that inserted the object>" only on hits
    varnish) grep -qiE '^x-varnish: *[0-9]+ +[0-9]+' ;;
    # Via codes: cH = fresh hit, cR = fresh hit served from the RAM cache
    ats) grep -qiE '^via:.*\[c[HR]' ;;
  esac
}

# Request every object a few times; the last answer must be a hit with the
# full body. Abort otherwise: a peer that is not caching would measure the
# origin.
warm_and_verify() {
  local s=$1 url=http://127.0.0.1:${PORT[$1]} obj i hdr size want
  for obj in "${OBJECTS[@]}"; do
    want=${obj##*/}
    for i in 1 2 3 4; do
      hdr=$(curl -s --max-time 10 -o /dev/null -D - -w 'BODY_BYTES=%{size_download}\n' "$url$obj") \
        || die "${LABEL[$s]}: request to $url$obj failed"
    done
    size=$(sed -n 's/^BODY_BYTES=//p' <<<"$hdr")
    if ! is_hit "$s" <<<"$hdr" || [[ $size != "$want" ]] || ! grep -qE '^HTTP/[0-9.]+ 200' <<<"$hdr"; then
      printf '%s\n' "$hdr" >&2
      server_logs "$s" >&2
      die "${LABEL[$s]} is not serving $obj from cache (4th request is not a 200 hit of $want bytes; headers above)"
    fi
    if [[ $s == ats ]] && ! grep -qiE '^via:.*\[cR' <<<"$hdr"; then
      log "note: ATS hit for $obj is not from its RAM cache (Via: $(grep -i '^via' <<<"$hdr"))"
    fi
  done
  log "${LABEL[$s]}: all objects verified as cache hits"
}

# ------------------------------------------------------------------ quota --
# Prefer cgroup v2 (cpu.max). On hybrid hosts the cpu controller may be bound
# to a v1 hierarchy instead; then (if allowed) use v1 cpu.cfs_quota_us, which
# drives the very same CFS bandwidth controller. Sets QUOTA_CG/QUOTA_KIND, or
# QUOTA_WHY and returns 1.
QUOTA_KIND="" QUOTA_WHY=""
setup_quota_cgroup() {
  local why=() v2 ctrls rel parent cand cg err=$TMP/cg.err v1
  v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
  if [[ -z $v2 ]]; then
    why+=("no cgroup2 filesystem mounted")
  else
    ctrls=$(cat "$v2/cgroup.controllers" 2>/dev/null || true)
    if ! grep -qw cpu <<<"$ctrls"; then
      why+=("cgroup v2 at $v2 offers controllers [${ctrls:-none}] without 'cpu' (the cpu controller is attached to a cgroup v1 hierarchy)")
    else
      rel=$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)
      # Candidates: the v2 root (exempt from the no-internal-processes rule),
      # then our own cgroup.
      for parent in "$v2" "$v2${rel%/}"; do
        [[ -d $parent ]] || continue
        if ! grep -qw cpu "$parent/cgroup.controllers" 2>/dev/null && [[ $parent != "$v2" ]]; then
          why+=("$parent: cpu not in cgroup.controllers"); continue
        fi
        if ! grep -qw cpu "$parent/cgroup.subtree_control"; then
          if ! { echo +cpu >"$parent/cgroup.subtree_control"; } 2>"$err"; then
            why+=("enabling +cpu in $parent/cgroup.subtree_control failed: $(tr -d '\n' <"$err")"); continue
          fi
        fi
        cg=$parent/vcdn-bench-$$
        if ! mkdir "$cg" 2>"$err"; then why+=("mkdir $cg: $(tr -d '\n' <"$err")"); continue; fi
        if ! { echo "$QUOTA_US $PERIOD_US" >"$cg/cpu.max"; } 2>"$err"; then
          why+=("writing $cg/cpu.max: $(tr -d '\n' <"$err")"); rmdir "$cg"; continue
        fi
        QUOTA_CG=$cg QUOTA_KIND="cgroup v2 $cg/cpu.max = \"$QUOTA_US $PERIOD_US\""
        return 0
      done
    fi
  fi
  # cgroup v1 fallback: a hierarchy with the cpu controller (often cpu,cpuacct).
  v1=$(awk '$3 == "cgroup" && ("," $4 ",") ~ /,cpu,/ { print $2; exit }' /proc/mounts)
  if [[ $CGROUP_V1_FALLBACK == 1 && -n $v1 ]]; then
    cg=$v1/vcdn-bench-$$
    if mkdir "$cg" 2>"$err" &&
       { echo "$PERIOD_US" >"$cg/cpu.cfs_period_us" && echo "$QUOTA_US" >"$cg/cpu.cfs_quota_us"; } 2>>"$err"; then
      QUOTA_CG=$cg
      QUOTA_KIND="cgroup v1 $cg cpu.cfs_quota_us=$QUOTA_US cpu.cfs_period_us=$PERIOD_US (fallback: ${why[*]})"
      return 0
    fi
    why+=("cgroup v1 cpu at $v1: $(tr -d '\n' <"$err")")
    [[ -d $cg ]] && rmdir "$cg" 2>/dev/null || true
  elif [[ -n $v1 ]]; then
    why+=("cgroup v1 cpu hierarchy at $v1 not used (CGROUP_V1_FALLBACK=0)")
  fi
  QUOTA_WHY=$(IFS=';'; echo "${why[*]}")
  return 1
}

# Move a whole server (every process; threads follow) into the quota group.
enter_quota() {
  local p
  for p in $(tree_pids "$1"); do echo "$p" >"$QUOTA_CG/cgroup.procs"; done
}

# -------------------------------------------------------------------- wrk --

# The cross-CPU round trip between the server's and the client's CPU, in ns.
# Below NEAR_NS before and after a run the two CPUs shared a cache, above
# FAR_NS they did not (this VM shows ~80-100 ns or ~370-400 ns).
xcpu_ns() { "$TMP/xcpu" "$SERVER_CPU" "$CLIENT_CPU"; }

# run_wrk SERVER ROOTPID MODE SCENARIO_INDEX -> appends a row to results.tsv
run_wrk() {
  local s=$1 root=$2 mode=$3 idx=$4 title path conns url out
  IFS='|' read -r title path conns <<<"${SCENARIOS[$idx]}"
  url=http://127.0.0.1:${PORT[$s]}$path
  out=$TMP/wrk-$mode-$s-$idx.txt
  local threads=$WRK_THREADS
  ((threads > conns)) && threads=$conns
  pin_tree "$root"
  if [[ $WARMUP != 0 ]]; then
    timeout $(($(dur_secs "$WARMUP") + 30)) taskset -c "$CLIENT_CPU" \
      wrk -t"$threads" -c"$conns" -d"$WARMUP" --timeout 5s "$url" >/dev/null 2>&1 || true
    sleep 0.5
  fi
  local t0 t1 o0 o1 c0 c1 x0 x1
  x0=$(xcpu_ns)
  t0=$(cpu_ticks "$root"); o0=$(cpu_ticks "$ORIGIN_PID"); c0=$(core_busy_ticks)
  timeout $((DUR_S + 30)) taskset -c "$CLIENT_CPU" \
    wrk -t"$threads" -c"$conns" -d"$DURATION" --timeout 5s -s "$TMP/report.lua" "$url" >"$out" 2>&1 \
    || { log "wrk exited non-zero for ${LABEL[$s]} ($mode, $title):"; cat "$out" >&2; }
  t1=$(cpu_ticks "$root"); o1=$(cpu_ticks "$ORIGIN_PID"); c1=$(core_busy_ticks)
  x1=$(xcpu_ns)
  local line
  line=$(grep '^BENCH ' "$out" || true)
  if [[ -z $line ]]; then
    cat "$out" >&2
    die "no wrk result for ${LABEL[$s]} ($mode, $title)"
  fi
  # key=value -> variables
  local requests bytes duration_us sock_errors non2xx p50_us p99_us kv
  for kv in ${line#BENCH }; do printf -v "${kv%%=*}" '%s' "${kv#*=}"; done
  local cpu_s origin_cpu_s other_s
  other_s=$(awk -v a="$c0" -v b="$c1" -v s="$((t1 - t0))" -v hz="$CLK_TCK" 'BEGIN {
    o = (b - a - s) / hz; if (o < 0) o = 0; printf "%.2f", o }')
  cpu_s=$(awk -v a="$t0" -v b="$t1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  origin_cpu_s=$(awk -v a="$o0" -v b="$o1" -v hz="$CLK_TCK" 'BEGIN { printf "%.2f", (b - a) / hz }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$idx" "$s" "$requests" "$bytes" \
    "$duration_us" "$cpu_s" "$origin_cpu_s" "$((sock_errors + non2xx))" "$p99_us" "$conns" "$other_s" "$x0/$x1" >>"$TMP/results.tsv"
  log "$(printf '%-8s %-5s %-40s %10.0f req/s  cpu %5ss  errors %s  cross-CPU %s ns' "${LABEL[$s]}" "$mode" "$title" \
    "$(awk -v r="$requests" -v d="$duration_us" 'BEGIN { print r / (d / 1e6) }')" "$cpu_s" "$((sock_errors + non2xx))" "$x0/$x1")"
  if awk -v o="$other_s" -v d="$DUR_S" 'BEGIN { exit !(o > 0.10 * d) }'; then
    log "WARNING: ${other_s}s of CPU $SERVER_CPU busy time was not charged to the server (other processes or ksoftirqd): numbers may be disturbed"
  fi
  # The origin must stay idle during hit-only runs; 10 ticks of noise allowed.
  if (( o1 - o0 > 10 )); then
    log "WARNING: origin used ${origin_cpu_s}s CPU during ${LABEL[$s]} run: it is not serving everything from cache"
  fi
  sleep 1   # let closed connections drain before the next run
}

# ----------------------------------------------------------------- report --
# Markdown tables from results.tsv:
# mode idx server requests bytes duration_us cpu_s origin_cpu_s errors p99_us conns other_s xcpu
report() {
  local idx title path conns
  {
    echo "# vcdn cache benchmark"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "- kernel: $(uname -r)"
    echo "- CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs"
    peer_versions
    echo "- setup: each server alone, pinned to CPU $SERVER_CPU and sized for one core (vcdn --threads 1, nginx worker_processes 1, Varnish thread_pools=1, ATS exec_thread.limit 1); wrk -t$WRK_THREADS on CPU $CLIENT_CPU; duration $DURATION per run (+ $WARMUP unmeasured warm-up), median of $ROUNDS round(s) with the servers interleaved; objects warmed and verified as hits; memory cache 512 MiB each (nginx: proxy_cache on tmpfs + open_file_cache, Varnish: -s malloc,512m, ATS: 512 MiB RAM cache, tmpfs span)"
    echo "- server CPU = utime+stime (+cutime+cstime) of all the server's processes from /proc/PID/stat, before/after each run"
    echo "- CPU$SERVER_CPU busy-s not charged to server = busy time of the server's core (/proc/stat) minus server CPU-s: foreign processes, ksoftirqd, or uncharged softirq; should be near 0 on a quiet machine"
    echo "- interrupt accounting: $(irq_accounting)"
    echo "- MiB = 2^20 bytes of response (headers + body) as counted by wrk"
    echo "- cross-CPU ns = round trip of one cache line between CPU $SERVER_CPU and CPU $CLIENT_CPU (bench/xcpu.c) just before / just after the run. On a VM it follows where the host placed the two vCPUs (here ~80-100 ns or ~380 ns, changing every few tens of seconds), and every request and answer crosses between those CPUs; the placement table under each scenario compares the servers on runs with like values (medians of those runs)"
    [[ -n $QUOTA_KIND ]] && echo "- quota: $QUOTA_KIND"
    [[ -n $QUOTA_WHY ]] && echo "- quota mode skipped: $QUOTA_WHY"
    local disturbed
    disturbed=$(awk -F'\t' -v d="$DUR_S" '$12 > 0.10 * d { n++ } END { print n + 0 }' "$TMP/results.tsv")
    if ((disturbed > 0)); then
      echo
      echo "**WARNING: in $disturbed of $(wc -l <"$TMP/results.tsv") runs more than 10% of CPU $SERVER_CPU went to work not charged to the server (other processes on the machine). Those numbers are disturbed; rerun on a quiet machine before quoting them.**"
    fi
    echo
  } >"$TMP/report.md"

  local mode
  for mode in cpu quota; do
    grep -q "^$mode	" "$TMP/results.tsv" 2>/dev/null || continue
    for idx in "${!SCENARIOS[@]}"; do
      IFS='|' read -r title path conns <<<"${SCENARIOS[$idx]}"
      if [[ $mode == cpu ]]; then
        echo "## $title - uncapped, per server CPU-second"
      else
        echo "## $title - capped to half a core ($((QUOTA_US / 1000)) ms per $((PERIOD_US / 1000)) ms)"
      fi
      echo
      awk -F'\t' -v mode="$mode" -v idx="$idx" -v servers="$SERVERS" -v cpuid="$SERVER_CPU" \
        -v NEAR_NS="$NEAR_NS" -v FAR_NS="$FAR_NS" '
        function lbl(s) { return s == "vcdn" ? "vcdn" : s == "nginx" ? "nginx" : s == "varnish" ? "Varnish" : s == "base" ? "baseline" : "ATS" }
        function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "n/a" }
        # Median of the per-CPU-second figures of one placement class.
        function med(s, c,   m, i, j, t, v) {
          m = pcnt[s, c]; if (!m) return 0
          for (i = 1; i <= m; i++) v[i] = pval[s, c, i]
          for (i = 2; i <= m; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
          return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
        }
        # With ROUNDS > 1 a server has several rows: keep the median one (by
        # requests per CPU-second, or per second under the quota).
        $1 == mode && $2 == idx {
          s = $3; k = ++cnt[s]; row[s, k] = $0
          key[s, k] = (mode == "cpu") ? (($7 > 0) ? $4 / $7 : 0) : $4 / ($6 / 1e6)
          # The vCPU placement during the run, when the probe read the same
          # before and after: "near" (the CPUs share a cache) or "far".
          split($13, xs, "/"); c = ""
          if (xs[1] != "" && xs[1] < NEAR_NS && xs[2] < NEAR_NS) c = "near"
          if (xs[1] > FAR_NS && xs[2] > FAR_NS) c = "far"
          if (c != "") pval[s, c, ++pcnt[s, c]] = key[s, k]
        }
        END {
          for (s in cnt) {
            m = cnt[s]
            for (i = 1; i <= m; i++) ord[i] = i
            for (i = 2; i <= m; i++) for (j = i; j > 1 && key[s, ord[j - 1]] > key[s, ord[j]]; j--) {
              t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t }
            split(row[s, ord[int((m + 1) / 2)]], f, "\t")
            d = f[6] / 1e6
            rps[s] = f[4] / d; mibs[s] = f[5] / d / 1048576; cpu[s] = f[7]; err[s] = f[9]; p99[s] = f[10] / 1000
            rpc[s] = (f[7] > 0) ? f[4] / f[7] : 0; mpc[s] = (f[7] > 0) ? f[5] / 1048576 / f[7] : 0
            util[s] = f[7] / d * 100; ocpu[s] = f[8]; other[s] = f[12]; xcpu[s] = f[13]
          }
          n = split(servers, order, " ")
          if (mode == "cpu") {
            print "| server | req/s | MiB/s | server CPU-s | CPU util | req per CPU-s | MiB per CPU-s | p99 ms | errors | CPU" cpuid " busy-s not charged to server | cross-CPU ns |"
            print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          } else {
            print "| server | req/s | MiB/s | server CPU-s | p99 ms | errors | cross-CPU ns |"
            print "|---|---:|---:|---:|---:|---:|---:|"
          }
          for (i = 1; i <= n; i++) { s = order[i]; if (!(s in rps)) continue
            if (mode == "cpu")
              printf "| %s | %.0f | %.1f | %.2f | %.0f%% | %.0f | %.1f | %.2f | %d | %.2f | %s |\n", lbl(s), rps[s], mibs[s], cpu[s], util[s], rpc[s], mpc[s], p99[s], err[s], other[s], xcpu[s]
            else
              printf "| %s | %.0f | %.1f | %.2f | %.2f | %d | %s |\n", lbl(s), rps[s], mibs[s], cpu[s], p99[s], err[s], xcpu[s]
          }
          if (!("vcdn" in rps)) { print ""; next_ok = 0; exit }
          # best of the two dedicated caches
          brpc = rpc["varnish"] > rpc["ats"] ? rpc["varnish"] : rpc["ats"]
          bmpc = mpc["varnish"] > mpc["ats"] ? mpc["varnish"] : mpc["ats"]
          brps = rps["varnish"] > rps["ats"] ? rps["varnish"] : rps["ats"]
          print ""
          if (mode == "cpu") {
            print "| ratio | req per CPU-s | MiB per CPU-s |"
            print "|---|---:|---:|"
            split("nginx varnish ats base", peers, " ")
            for (i = 1; i <= 4; i++) { p = peers[i]; if (!(p in rps)) continue
              printf "| vcdn/%s | %s | %s |\n", lbl(p), ratio(rpc["vcdn"], rpc[p]), ratio(mpc["vcdn"], mpc[p]) }
            if (("varnish" in rps) || ("ats" in rps))
              printf "| vcdn/best(Varnish, ATS) | %s | %s |\n", ratio(rpc["vcdn"], brpc), ratio(mpc["vcdn"], bmpc)
          } else {
            print "| ratio | req/s under quota |"
            print "|---|---:|"
            split("nginx varnish ats base", peers, " ")
            for (i = 1; i <= 4; i++) { p = peers[i]; if (!(p in rps)) continue
              printf "| vcdn/%s | %s |\n", lbl(p), ratio(rps["vcdn"], rps[p]) }
            if (("varnish" in rps) || ("ats" in rps))
              printf "| vcdn/best(Varnish, ATS) | %s |\n", ratio(rps["vcdn"], brps)
          }
          # The same runs grouped by vCPU placement: ratios of servers
          # measured in like conditions.
          print ""
          print "| placement | runs | vcdn/nginx | vcdn/best(Varnish, ATS) | vcdn " (mode == "cpu" ? "req per CPU-s" : "req/s") " |"
          print "|---|---|---:|---:|---:|"
          split("near far", cls, " ")
          for (i = 1; i <= 2; i++) { c = cls[i]; runs = ""
            for (j = 1; j <= n; j++) runs = runs (j > 1 ? ", " : "") lbl(order[j]) " " pcnt[order[j], c] + 0
            b = med("varnish", c) > med("ats", c) ? med("varnish", c) : med("ats", c)
            v = med("vcdn", c) ? sprintf("%.0f", med("vcdn", c)) : "n/a"
            printf "| %s | %s | %s | %s | %s |\n", (c == "near" ? "CPUs share a cache (< " NEAR_NS " ns)" : "CPUs apart (> " FAR_NS " ns)"), runs, ratio(med("vcdn", c), med("nginx", c)), ratio(med("vcdn", c), b), v }
          print ""
        }' "$TMP/results.tsv"
    done >>"$TMP/report.md"
  done
  mkdir -p "$(dirname "$OUT")"
  cp "$TMP/report.md" "$OUT"
  echo
  cat "$TMP/report.md"
  log "markdown written to $OUT"
}

# ------------------------------------------------------------------- main --
main() {
  install_packages

  if [[ $SKIP_BUILD != 1 ]]; then
    log "building vcdn (cargo build --release -p vcdn)"
    (cd "$ROOT" && cargo build --release -p vcdn) >&2 || die "cargo build failed"
  fi
  [[ -x $VCDN_BIN ]] || die "vcdn binary not found at $VCDN_BIN"
  if [[ " $SERVERS " == *" base "* ]]; then
    [[ -x $BASELINE_BIN ]] || die "SERVERS has 'base': set BASELINE_BIN to the baseline vcdn binary"
  fi

  # 1000 connections need >1000 fds in wrk and in every server.
  local hard
  hard=$(ulimit -Hn)
  [[ $hard == unlimited ]] && hard=65536
  ((hard > 65536)) && hard=65536
  ulimit -n "$hard"
  (( $(ulimit -n) >= 4096 )) || log "WARNING: ulimit -n is $(ulimit -n); 1000 connections may fail"

  TMP=$(mktemp -d /tmp/vcdn-cache-bench.XXXXXX)
  SHM=$(mktemp -d /dev/shm/vcdn-cache-bench.XXXXXX)   # tmpfs for nginx/ATS caches
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  : >"$TMP/results.tsv"
  write_wrk_lua

  local modes=()
  [[ $MODE == cpu || $MODE == both ]] && modes+=(cpu)
  if [[ $MODE == quota || $MODE == both ]]; then
    if setup_quota_cgroup; then
      modes+=(quota)
      log "quota mode: $QUOTA_KIND"
    else
      log "quota mode SKIPPED: $QUOTA_WHY"
    fi
  fi
  ((${#modes[@]})) || die "nothing to run"

  local p
  for p in "$ORIGIN_PORT" "${PORT[@]}"; do port_free "$p" || die "port $p is already in use (set BASE_PORT)"; done

  cc -O2 -pthread "$ROOT/bench/xcpu.c" -o "$TMP/xcpu" || die "cannot build bench/xcpu.c"
  start_origin
  ORIGIN_PID=$LAST_PID
  STARTED+=("$ORIGIN_PID")
  wait_http "http://127.0.0.1:$ORIGIN_PORT/size/43" 10 || { cat "$TMP/origin.log" >&2; die "vcdn origin did not start"; }
  local hdr
  hdr=$(curl -s -D - -o /dev/null "http://127.0.0.1:$ORIGIN_PORT/size/43")
  grep -qi '^cache-control:.*max-age' <<<"$hdr" \
    || die "origin does not send Cache-Control max-age; caches would not store its objects"

  local s root mode idx round
  # Rounds go through every server in turn, so slow drifts of a shared
  # machine hit all of them alike; the report keeps each one's median.
  for round in $(seq "$ROUNDS"); do
  ((ROUNDS > 1)) && log "round $round of $ROUNDS"
  for s in $SERVERS; do
    log "starting ${LABEL[$s]} on 127.0.0.1:${PORT[$s]}"
    "start_$s"
    root=$LAST_PID
    STARTED+=("$root")
    if ! wait_http "http://127.0.0.1:${PORT[$s]}/size/43" 60; then
      server_logs "$s" >&2
      die "${LABEL[$s]} did not answer on port ${PORT[$s]}"
    fi
    pin_tree "$root"
    warm_and_verify "$s"
    for mode in "${modes[@]}"; do
      [[ $mode == quota ]] && enter_quota "$root"
      for idx in "${!SCENARIOS[@]}"; do run_wrk "$s" "$root" "$mode" "$idx"; done
    done
    # Re-check after the runs: still hits (nothing was evicted or expired).
    warm_and_verify "$s"
    stop_tree "$root"
  done
  done

  report
}

main "$@"
