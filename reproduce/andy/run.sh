#!/usr/bin/env bash
# Re-makes the ANDy thesis's chapter 5 with vcdn's telemetry agent on the
# layer-2 test bed (root: network namespaces, bridges, cgroups).
#
#   sudo reproduce/andy/run.sh                  # everything, 10 s per latency run (~25 min)
#   SECONDS_PER_RUN=60 sudo reproduce/andy/run.sh
#   MODES=direct,p2p CLOUDS=single sudo reproduce/andy/run.sh
#
# Writes reproduce/andy/last-run.md (the tables) and prints them.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/kafka.sh >/dev/null
cargo build --release -p vcdn -p vcdn-reproduce --bin vcdn --bin andy
target/release/andy --vcdn target/release/vcdn \
  --seconds "${SECONDS_PER_RUN:-10}" \
  --modes "${MODES:-direct,p2p,datasink-1,datasink-large,datasink-xlarge,datasink-2,datasink-3,datasink-4}" \
  --clouds "${CLOUDS:-single,multi}" \
  --rates "${RATES:-256,512,1024,2048}" \
  --out reproduce/andy
