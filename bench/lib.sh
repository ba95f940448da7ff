#!/usr/bin/env bash
# bench/lib.sh - helpers shared by the benchmarks: process trees, their CPU
# time from /proc, pinning, stopping, waiting for a port. Sourced, not run;
# the caller sets SERVER_CPU and CLK_TCK.

# Duration in whole seconds, for timeouts ("10s", "1m", "10").
dur_secs() {
  local d=$1
  case $d in *ms) echo 1;; *s) echo "${d%s}";; *m) echo $(( ${d%m} * 60 ));;
              *h) echo $(( ${d%h} * 3600 ));; *) echo "$d";; esac
}

# All descendants of a pid (inclusive), from `ps` pid/ppid pairs.
tree_pids() {
  [[ -d /proc/$1 ]] || return 0
  ps -e -o pid= -o ppid= | awk -v root="$1" '
    { parent[$1] = $2 }
    END {
      keep[root] = 1; n = 1
      while (n) { n = 0
        for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; n++ } }
      for (p in keep) print p
    }'
}

# CPU ticks of a process tree: utime+stime (fields 14,15) plus cutime+cstime
# (16,17) so that a child reaped during the run is not lost. Snapshot the
# tree fresh each time; the difference is the CPU burned in between.
cpu_ticks() {
  local p line total=0 f
  for p in $(tree_pids "$1"); do
    line=$(cat "/proc/$p/stat" 2>/dev/null) || continue
    line=${line##*) }                 # drop "pid (comm) ", comm may hold spaces
    read -ra f <<<"$line"             # f[0] is field 3 (state)
    total=$((total + f[11] + f[12] + f[13] + f[14]))
  done
  echo "$total"
}

# Busy ticks of a CPU (/proc/stat; default the server CPU). Minus the server's own ticks it
# is CPU-0 work not charged to the server (other processes, ksoftirqd): the
# disturbance indicator. Should be near 0.
core_busy_ticks() {
  awk -v c="cpu${1:-$SERVER_CPU}" '$1 == c { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# Re-pin every thread of a server to the server CPU. ATS resets its ET_NET
# threads' affinity to all CPUs at start-up, so a plain `taskset -c` exec is
# not enough; threads created later inherit the pinned mask.
pin_tree() {
  local p
  for p in $(tree_pids "$1"); do taskset -a -p -c "$SERVER_CPU" "$p" >/dev/null 2>&1 || true; done
}

stop_tree() {
  local root=$1 pids i
  pids=$(tree_pids "$root")
  [[ -n $pids ]] || return 0
  kill -TERM $pids 2>/dev/null || true
  for i in $(seq 50); do
    pids=$(for p in $pids; do if [[ -d /proc/$p ]]; then echo "$p"; fi; done)
    [[ -z $pids ]] && break
    sleep 0.1
  done
  [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
  wait "$root" 2>/dev/null || true
}

port_free() { ! ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# Wait until something answers HTTP on the port (any status), up to $2 s.
wait_http() {
  local url=$1 secs=$2 i
  for i in $(seq $((secs * 20))); do
    curl -s -o /dev/null --max-time 1 "$url" && return 0
    sleep 0.05
  done
  return 1
}

# Write $TMP/report.lua: wrk's done() hook prints exact totals; without request/response hooks the
# Lua script does not touch wrk's hot path.
write_wrk_lua() {
  cat >"$TMP/report.lua" <<'EOF'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d bytes=%d duration_us=%d sock_errors=%d non2xx=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.bytes, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
EOF
}


# Substitute @KEY@ placeholders of a peer's config template: render TEMPLATE
# OUT KEY=VALUE... (the caller defines die).
render() {
  local tmpl=$1 out=$2 kv args=()
  shift 2
  for kv in "$@"; do args+=(-e "s#@${kv%%=*}@#${kv#*=}#g"); done
  sed "${args[@]}" "$tmpl" >"$out"
  ! grep -q '@[A-Z_]*@' "$out" || die "unrendered placeholder in $out"
}
