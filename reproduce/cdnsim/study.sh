#!/usr/bin/env bash
# reproduce/cdnsim/study.sh - what vcdn's own policies do at country scale
# (issue 20): the paper's workload in Germany (1 M users, ~100K concurrent
# sessions) served by
#   - the paper's model: a VM per (access AS, channel) started on demand
#     (boot 0.1 s), for reference;
#   - vcdn's cache sites, one per access AS serving every channel, with
#     instances of 1 Gb/s (the paper's §5.5 VM) or 5 Gb/s (what `vcdn
#     calibrate` measured for a 0.05-CPU vCPU at the mix's mean bitrate,
#     docs/elasticity-capacity.toml), either sized ahead by vcdn-policy's
#     dimensioning for the forecast peak + 3σ ("fixed") or started on
#     demand and sized by vcdn-policy's autoscaler ("autoscaled", booting
#     in 6 ms like a vcdn process or 1.13 s like docker);
#   - and a VoD share (30 % of sessions, 100,000 titles, Zipf 0.9, a store
#     of 1,000 titles per site) with vcdn's LRU admission filter sized by
#     its own rule (auto) or without it.
#
#   bash reproduce/cdnsim/study.sh      # ~6 min on 2 cores
#
# Output: reproduce/cdnsim/raw/study-*/…json and a markdown table on
# standard output (also reproduce/cdnsim/study.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v jq >/dev/null || apt-get install -y jq >/dev/null
cargo build --release -p vcdn --bin vcdn
raw=reproduce/cdnsim/raw
base=(--country DE --preset paper)
target/release/vcdn sim "${base[@]}" --on-demand --quiet --json "$raw/study-vms.json" >/dev/null
target/release/vcdn sim sweep --vary sites=fixed,autoscaled --vary instance-mbps=1000,5000 \
  --vary boot-ms=6,1130 --out "$raw/study-sites" -- "${base[@]}" >/dev/null
target/release/vcdn sim sweep --vary vod-filter=auto,none --out "$raw/study-vod" -- "${base[@]}" \
  --sites autoscaled --instance-mbps 5000 --boot-ms 6 --vod-share 0.3 --vod-titles 100000 \
  --vod-cache-titles 1000 >/dev/null
row() {
  jq -r --arg n "$1" '"| \($n) | \(.qoe.start_s.mean*1000|round/1000) / \(.qoe.start_s.p90*1000|round/1000) | \(.qoe.buffering_ratio.mean*10000|round/10000) | \(.qoe.stalled_share*10000|round/100) % | \(.qoe.served_by_caches*1000|round/10) % | \(.vms.vm_seconds/3600|round) | \(.vms.peak_concurrent) | \(if .vod.sessions > 0 then "\(.vod.hit*1000|round/10) / \(.vod.miss*1000|round/10) / \(.vod.bypass*1000|round/10) %" else "–" end) |"' "$2"
}
{
  echo "| caches | start s mean / p90 | buffering ratio mean | sessions that stalled | served by caches | VM- or instance-hours | peak VMs or instances | VoD hit / miss / filtered % |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  row "paper: VM per (AS, channel) on demand, boot 0.1 s" "$raw/study-vms.json"
  for mbps in 1000 5000; do
    row "fixed sites, $mbps Mb/s instances (dimensioning)" "$raw/study-sites/sites=fixed,instance-mbps=$mbps,boot-ms=6.json"
    for boot in 6 1130; do
      row "autoscaled sites, $mbps Mb/s instances, boot $boot ms" "$raw/study-sites/sites=autoscaled,instance-mbps=$mbps,boot-ms=$boot.json"
    done
  done
  row "autoscaled 5 Gb/s + 30 % VoD, LRU filter (auto)" "$raw/study-vod/vod-filter=auto.json"
  row "autoscaled 5 Gb/s + 30 % VoD, no filter" "$raw/study-vod/vod-filter=none.json"
} | tee reproduce/cdnsim/study.md
