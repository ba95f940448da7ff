#!/usr/bin/env bash
# vcdn's test command (the README's, and CI's): formatting, lints, then every
# unit and integration test. Integration tests start real vcdn processes on
# loopback and query the router's DNS with `dig` (installed here if absent).
set -euo pipefail
cd "$(dirname "$0")/.."

# rustfmt and clippy ship with rustup's default profile; add them only if absent.
for c in rustfmt clippy; do
  if ! cargo "${c/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$c"
  fi
done

# The tests' own tools: Debian's packages, schemathesis, axe-core, h2spec,
# Kafka's jars. Installed beside the Rust build, which needs none of them
# (on a bare machine they took ~2.5 minutes before it); what they printed
# follows the build's output. (The body is not indented: it holds here-documents.)
install_test_tools() {
# The router's tests resolve with a real resolver tool: dig (bind9-dnsutils).
if ! command -v dig >/dev/null 2>&1; then
  echo "== installing dig (bind9-dnsutils)"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q bind9-dnsutils \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q bind9-dnsutils; }
fi

# The portal's test runs the curl line the service page shows.
if ! command -v curl >/dev/null 2>&1; then
  echo "== installing curl"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl; }
fi

# The control plane's store is also tested on a real PostgreSQL (Debian's
# package; the test starts its own throwaway cluster).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo "== installing PostgreSQL"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; }
fi

# The real-player test makes a decodable DASH title with ffmpeg and plays it
# with dash.js in headless Chromium (Debian's packages).
if ! command -v ffmpeg >/dev/null 2>&1 || [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
  echo "== installing ffmpeg, chromium and chromium-driver"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ffmpeg chromium chromium-driver \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ffmpeg chromium chromium-driver; }
fi

# The monitoring test scrapes a running vcdn up with a real Prometheus
# (Debian's), found through vcdn's HTTP service discovery.
# The package would start a Prometheus service on :9090; a policy-rc.d that
# refuses service starts keeps it from doing so during the install.
# install_without_starting PKG...: apt-get install, with no service started.
install_without_starting() {
  local SUDO made_policy=0
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@"; }
  if ((made_policy)); then $SUDO rm -f /usr/sbin/policy-rc.d; fi
}
if ! command -v prometheus >/dev/null 2>&1; then
  echo "== installing prometheus"
  install_without_starting prometheus
fi

# The API document is checked against a live vcdn up by schemathesis (PyPI),
# in a virtualenv kept outside the work tree.
ST_VENV="${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/schemathesis-4.32.5"
if [[ ! -x "$ST_VENV/bin/schemathesis" ]]; then
  echo "== installing schemathesis 4.32.5 in $ST_VENV"
  if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
    SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv \
      || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; }
  fi
  rm -rf "$ST_VENV"
  python3 -m venv "$ST_VENV"
  "$ST_VENV/bin/pip" install -q schemathesis==4.32.5
fi

# The portal's browser tests check accessibility with axe-core, fetched once
# from the npm registry (checked against the registry's sha512) and kept
# outside the work tree.
AXE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/vcdn/axe-core-4.11.0"
if [[ ! -f "$AXE_DIR/axe.min.js" ]]; then
  echo "== fetching axe-core 4.11.0 from the npm registry"
  mkdir -p "$AXE_DIR"
  python3 - "$AXE_DIR" <<'PY'
import base64, hashlib, io, sys, tarfile, urllib.request
url = "https://registry.npmjs.org/axe-core/-/axe-core-4.11.0.tgz"
want = "ilYanEU8vxxBexpJd8cWM4ElSQq4QctCLKih0TSfjIfCQTeyH/6zVrmIJfLPrKTKJRbiG+cfnZbQIjAlJmF1jQ=="
data = urllib.request.urlopen(url, timeout=60).read()
if base64.b64encode(hashlib.sha512(data).digest()).decode() != want:
    sys.exit(f"{url}: sha512 does not match the registry's")
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    for name in ("axe.min.js", "LICENSE"):
        open(f"{sys.argv[1]}/{name}", "wb").write(t.extractfile(f"package/{name}").read())
PY
fi

# The test bed's tests build namespaces with iproute2 and measure with
# iputils' ping.
if ! command -v ip >/dev/null 2>&1 || ! command -v ping >/dev/null 2>&1; then
  echo "== installing iproute2 and iputils-ping"
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 iputils-ping \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2 iputils-ping; }
fi

# The HTTP/2 tests check the cache's conformance with h2spec, a Go program
# built from the Go module proxy into $HOME/go/bin (where the test looks).
if [[ ! -x "$HOME/go/bin/h2spec" ]]; then
  echo "== installing h2spec"
  if ! command -v go >/dev/null 2>&1 && [[ ! -x /usr/local/go/bin/go ]]; then
    SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go \
      || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go; }
  fi
  GO=$(command -v go || echo /usr/local/go/bin/go)
  GOBIN="$HOME/go/bin" GOFLAGS=-mod=mod "$GO" install github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible
fi

# The kubernetes VIM's tests run a real single-node Kubernetes: Debian's
# etcd, containerd, runc and CNI plugins (their services kept from starting
# by a policy-rc.d, as for prometheus), `strip` for the cache image, and
# kube-apiserver, controller-manager, scheduler, kubelet and kwok built once
# from the Go module proxy into ~/.cache/vcdn/kubernetes-VERSION
# (scripts/kubernetes.sh: ~12.5 CPU-minutes cold, at idle priority beside
# the tests; nothing later).
kube_pkgs=()
command -v etcd >/dev/null 2>&1 || kube_pkgs+=(etcd-server)
command -v containerd >/dev/null 2>&1 || kube_pkgs+=(containerd)
command -v runc >/dev/null 2>&1 || kube_pkgs+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || kube_pkgs+=(containernetworking-plugins)
command -v strip >/dev/null 2>&1 || kube_pkgs+=(binutils)
if ((${#kube_pkgs[@]})); then
  echo "== installing ${kube_pkgs[*]}"
  install_without_starting "${kube_pkgs[@]}"
fi
if ! bash scripts/kubernetes.sh --built && ! command -v go >/dev/null 2>&1 && [[ ! -x /usr/local/go/bin/go ]]; then
  SUDO=$([[ $(id -u) -eq 0 ]] && echo "" || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go \
    || { $SUDO apt-get update -q && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go; }
fi

# The telemetry datasink is tested on a real Apache Kafka (KRaft, from Maven
# Central's jars, run with the JDK).
scripts/kafka.sh
}

# Build prerequisites (rdkafka's librdkafka, the SRv6 BPF programs, libbpf).
bash scripts/deps.sh

# The idle-connection test opens 10,000 sockets.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
# Clippy's lints run inside the test build: clippy-driver compiles the
# workspace's own crates, as `cargo clippy` has it do for a check build
# (the same two variables), and the dependencies are compiled once instead
# of checked for clippy and then built again (clippy's own pass took
# 5 m 53 s on a fresh machine). `cargo test --no-run` builds every target `cargo clippy
# --all-targets` checks here (libraries, binaries, tests, the example; no
# benches). Exported for every cargo below: the wrapper is part of the
# build's fingerprint.
CLIPPY_DRIVER="$(rustc --print sysroot)/bin/clippy-driver"
[[ -x $CLIPPY_DRIVER ]] || { echo "no clippy-driver at $CLIPPY_DRIVER" >&2; exit 1; }
export RUSTC_WORKSPACE_WRAPPER="$CLIPPY_DRIVER" CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
TOOLS_LOG=$(mktemp -t vcdn-test-tools.XXXXXX.log)
echo "== installing the tests' tools beside the build (log: $TOOLS_LOG)"
install_test_tools >"$TOOLS_LOG" 2>&1 &
TOOLS_PID=$!
trap '[[ -n $TOOLS_PID ]] && kill "$TOOLS_PID" 2>/dev/null; true' EXIT
echo "== cargo test: building, with clippy's lints (-D warnings)"
cargo test --workspace --no-run
tools_rc=0
wait "$TOOLS_PID" || tools_rc=$?
TOOLS_PID=""
cat "$TOOLS_LOG"
rm -f "$TOOLS_LOG"
if ((tools_rc != 0)); then
  echo "== installing the tests' tools failed (exit $tools_rc): see above" >&2
  exit 1
fi

# A first build of the Kubernetes binaries (Go, ~12.5 CPU-minutes) starts
# here, once the Rust build is done, and goes on beside the tests, at idle
# priority: in a session of its own (to be stopped whole) whose autogroup
# gets the lowest weight (else the kernel would share the CPUs evenly
# between the two sessions, whatever the nice values), SCHED_IDLE and nice
# 19. Go's build cache and temporary files are in memory (/dev/shm, removed
# after), so it writes almost nothing to the disk the tests beside it use.
# It takes what the tests leave idle (~80% of the two CPUs). Not beside the
# Rust build: even at idle priority it stretched that from 9.8 to 11
# minutes, as the build often runs one compiler only and the two vCPUs
# share caches. The tests that need a quiet machine and those on a
# cluster wait for it.
KUBE_BUILD_PID=""
if ! bash scripts/kubernetes.sh --built; then
  KUBE_LOG=$(mktemp -t vcdn-kubernetes-build.XXXXXX.log)
  KUBE_GO_TMP=""
  if [[ -d /dev/shm ]] && (($(df --output=avail -B1G /dev/shm | tail -n 1) >= 8)); then
    KUBE_GO_TMP=$(mktemp -d /dev/shm/vcdn-kubernetes-build.XXXXXX)
  fi
  IDLE=(nice -n 19)
  if chrt --idle 0 true 2>/dev/null; then IDLE=(chrt --idle 0 nice -n 19); fi
  echo "== building the Kubernetes binaries beside the rest, at idle priority (log: $KUBE_LOG)"
  setsid bash -c '
    echo 19 > /proc/self/autogroup 2>/dev/null
    if [[ -n $1 ]]; then
      export GOCACHE=$1/cache GOTMPDIR=$1/tmp
      mkdir -p "$GOTMPDIR"
    fi
    rc=0
    "${@:2}" bash scripts/kubernetes.sh || rc=$?
    [[ -z $1 ]] || rm -rf "$1"
    exit $rc' _ "$KUBE_GO_TMP" "${IDLE[@]}" >"$KUBE_LOG" 2>&1 &
  KUBE_BUILD_PID=$!
  # Not left running (with its go processes), nor its files in memory, when
  # the suite stops early.
  trap '[[ -n $KUBE_BUILD_PID ]] && kill -- "-$KUBE_BUILD_PID" 2>/dev/null; [[ -n ${KUBE_GO_TMP:-} ]] && rm -rf "$KUBE_GO_TMP"; true' EXIT
fi

# The tests, in four steps:
# 1. the other test targets, one at a time, beside the build (two at a
#    time, as the CPUs are ~80% idle while one runs, cut 2.7 minutes but
#    made 3 of 5 runs fail: a sockmap relay stalled, a tracker's delivery
#    gap and an SRv6 SYN count were off under the load);
# 2. one at a time, those that play in real time, within tolerances of a
#    second or so: player, yardstick;
# 3. once the Kubernetes binaries are built, one at a time, those that the
#    build's load (even at idle priority: the two vCPUs share caches) made
#    fail: a LAN forwarder's thread woke 80 ms late, a Kafka data sink
#    never answered a slave's join within 180 s, a sockmap relay stalled,
#    a respawned tracker left a gap of 100.5 ms where 100 are allowed
#    (kafka, telemetry_datasink, telemetry_billing, proxy, discovery), and
#    those that time things to the millisecond (testbed, lan, path, rtt,
#    calibrate);
# 4. the tests on a cluster.
# Every target runs as `cargo test --workspace ...`: the same features as
# the build above, so nothing is built again.
PLAYERS=(player yardstick)
QUIET=(kafka telemetry_datasink telemetry_billing proxy discovery testbed lan path rtt calibrate)
ON_A_CLUSTER=(kubernetes kubernetes_scale)
mapfile -t TARGETS < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
names = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"]}
print("\n".join(sorted(names)))')
OTHERS=("--lib --bins" "--doc")
for t in "${TARGETS[@]}"; do
  [[ " ${PLAYERS[*]} ${QUIET[*]} ${ON_A_CLUSTER[*]} " == *" $t "* ]] || OTHERS+=("--test $t")
done

# run_tests SELECTION...: `cargo test --workspace SELECTION` for each, one
# at a time, with its time and result. All run even when one fails; then
# the failed ones are named and this fails.
run_tests() {
  local sel began failed=()
  for sel in "$@"; do
    echo "== cargo test --workspace $sel"
    began=$SECONDS
    # shellcheck disable=SC2086 # a selection is several words
    if cargo test --workspace $sel; then
      echo "== passed in $((SECONDS - began)) s: cargo test --workspace $sel"
    else
      echo "== FAILED in $((SECONDS - began)) s: cargo test --workspace $sel"
      failed+=("$sel")
    fi
  done
  if ((${#failed[@]})); then
    printf '== failed: cargo test --workspace %s\n' "${failed[@]}" >&2
    return 1
  fi
}
# run_targets NAME...: run_tests with `--test NAME` for each.
run_targets() {
  local t sel=()
  for t in "$@"; do sel+=("--test $t"); done
  run_tests "${sel[@]}"
}

# A step that fails does not stop the next ones; the suite fails at the end.
failed=0
echo "== cargo test: the targets that can run beside the build, one at a time"
run_tests "${OTHERS[@]}" || failed=1
echo "== cargo test: the targets that play in real time, one at a time"
run_targets "${PLAYERS[@]}" || failed=1
if [[ -n $KUBE_BUILD_PID ]]; then
  echo "== waiting for the Kubernetes binaries' build (log: $KUBE_LOG)"
  waited=$SECONDS
  if ! wait "$KUBE_BUILD_PID"; then
    KUBE_BUILD_PID=""
    tail -n 30 "$KUBE_LOG" >&2
    echo "scripts/kubernetes.sh failed; its log: $KUBE_LOG" >&2
    exit 1
  fi
  KUBE_BUILD_PID=""
  rm -f "$KUBE_LOG"
  echo "== the Kubernetes binaries are built (waited $((SECONDS - waited)) s)"
fi
echo "== cargo test: the targets that need a quiet machine, one at a time"
run_targets "${QUIET[@]}" || failed=1
echo "== cargo test: on a Kubernetes cluster"
run_targets "${ON_A_CLUSTER[@]}" || failed=1
exit "$failed"
