#!/usr/bin/env bash
# reproduce/cdnsim/fig1.sh - the MiniCache paper's Fig 1 (a–e): peak
# throughput and connections per VM, and peak throughput, connections and
# concurrent VMs per access AS, for synthetic countries of Table 2's sizes
# (US, DE, RU, FR, ES, KR) under the paper's workload (§3.2: 1 M users,
# ~100K concurrent sessions, 200 channels, 3,000 s of arrivals) with a VM
# started per (AS, channel) on demand (boot 0.1 s, requests wait).
#
#   bash reproduce/cdnsim/fig1.sh              # exact sharing, ~2 min on 2 cores
#   EPOCH_MS=10 bash reproduce/cdnsim/fig1.sh  # rates settled every 10 ms
#
# Output: reproduce/cdnsim/raw/fig1/country=XX.json, the plots
# reproduce/cdnsim/plots/fig1[a-e].svg and a markdown table on standard
# output (also reproduce/cdnsim/fig1.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v jq >/dev/null || apt-get install -y jq >/dev/null
cargo build --release -p vcdn --bin vcdn -p vcdn-reproduce --bin cdnsim-plot
out=reproduce/cdnsim/raw/fig1
countries=(US DE RU FR ES KR)
target/release/vcdn sim sweep --vary "country=$(IFS=,; echo "${countries[*]}")" --out "$out" \
  -- --preset paper --on-demand --epoch-ms "${EPOCH_MS:-0}" >/dev/null
runs=()
for c in "${countries[@]}"; do runs+=("$c=$out/country=$c.json"); done
target/release/cdnsim-plot fig1 reproduce/cdnsim/plots "${runs[@]}"
{
  echo "| country | access ASes with VMs | VMs | VMs < 100 Mb/s | VMs < 10 conns | busiest VM Mb/s / conns | ASes < 10 Gb/s | busiest AS Gb/s / conns | concurrent VMs per AS p50 / max | ASes > 50 VMs | start s mean / p90 | wall s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  for c in "${countries[@]}"; do
    jq -r --arg c "$c" '"| \($c) | \(.ases.count) | \(.vms.count) | \(.vms.under_100_mbps*1000|round/10) % | \(.vms.under_10_connections*1000|round/10) % | \(.vms.peak_mbps.max|round) / \(.vms.peak_connections.max) | \(.ases.under_10_gbps*1000|round/10) % | \(.ases.peak_gbps.max*10|round/10) / \(.ases.peak_connections.max) | \(.ases.peak_vms.p50) / \(.ases.peak_vms.max) | \(.ases.over_50_vms*1000|round/10) % | \(.qoe.start_s.mean*1000|round/1000) / \(.qoe.start_s.p90*1000|round/1000) | \(.wall_s*10|round/10) |"' "$out/country=$c.json"
  done
} | tee reproduce/cdnsim/fig1.md
