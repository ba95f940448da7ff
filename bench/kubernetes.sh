#!/usr/bin/env bash
# bench/kubernetes.sh - order → active for a region on Kubernetes (a real
# single-node cluster of scripts/kube-cluster.sh; the pod's scheduling,
# sandbox, network and container start included), on pod IPs and on the
# node's network, beside a local region (a process), interleaved in one run
# of a release `vcdn up`: 10 orders each, every one deleted before the next.
#
# It runs the ignored test `kubernetes::order_to_active_on_kubernetes_beside_local`.
# Needs root and what scripts/test.sh installs (scripts/kubernetes.sh's
# binaries, etcd, containerd, runc, CNI plugins).
#
# Environment: OUT=bench/results/kubernetes-latest.md
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-$ROOT/bench/results/kubernetes-latest.md}
mkdir -p "$(dirname "$OUT")"
cd "$ROOT"
bash scripts/kubernetes.sh >/dev/null
echo "[kubernetes.sh $(date +%H:%M:%S)] building and running (release)" >&2
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
cargo test --release -q -p vcdn --test kubernetes -- --ignored --nocapture \
  order_to_active_on_kubernetes_beside_local | tee "$LOG" >&2
{
  echo "# Order → active, Kubernetes beside local, $(date -u +%Y-%m-%d) on $(nproc) vCPUs ($(uname -r))"
  echo
  grep -a '^|' "$LOG"
} > "$OUT"
cat "$OUT"
