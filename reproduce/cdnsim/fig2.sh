#!/usr/bin/env bash
# reproduce/cdnsim/fig2.sh - the MiniCache paper's Fig 2: viewers' QoE
# against the boot time of on-demand caches, in Germany (a synthetic graph of
# Table 2's size), under both boot semantics: requests wait for their cache
# (the original code) or go to the origin meanwhile (the paper's text).
#
# Boot times: 0; 6 ms (a vcdn cache process, docs/benchmarks.md); the
# paper's 100 ms, 500 ms; 1.13 s (docker) and 11.5 s (kvm) from the
# CDN-as-a-Service paper's Table I; 5 and 10 s.
#
#   bash reproduce/cdnsim/fig2.sh                # exact sharing, ~4 min on 2 cores
#   EPOCH_MS=10 bash reproduce/cdnsim/fig2.sh    # rates settled every 10 ms
#
# Output: reproduce/cdnsim/raw/fig2/boot=SEMANTICS,boot-ms=MS.json, the
# plots reproduce/cdnsim/plots/fig2-SEMANTICS-*.svg and a markdown table on
# standard output (also reproduce/cdnsim/fig2.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v jq >/dev/null || apt-get install -y jq >/dev/null
cargo build --release -p vcdn --bin vcdn -p vcdn-reproduce --bin cdnsim-plot
out=reproduce/cdnsim/raw/fig2
boots=(0 6 100 500 1130 5000 10000 11500)
target/release/vcdn sim sweep --vary boot=wait,origin --vary "boot-ms=$(IFS=,; echo "${boots[*]}")" \
  --out "$out" -- --country DE --preset original --on-demand --epoch-ms "${EPOCH_MS:-0}" >/dev/null
for sem in wait origin; do
  runs=()
  for b in "${boots[@]}"; do runs+=("$b ms=$out/boot=$sem,boot-ms=$b.json"); done
  target/release/cdnsim-plot fig2 "$sem" reproduce/cdnsim/plots "${runs[@]}"
done
{
  echo "| boot | semantics | start s mean / p90 | buffering ratio mean / p99 | buffering events mean / max | playback ratio mean / p50 | from caches | VM-s |"
  echo "|---|---|---|---|---|---|---:|---:|"
  for sem in wait origin; do
    for boot in "${boots[@]}"; do
      jq -r --arg b "$boot ms" --arg s "$sem" '"| \($b) | \($s) | \(.qoe.start_s.mean*1000|round/1000) / \(.qoe.start_s.p90*1000|round/1000) | \(.qoe.buffering_ratio.mean*10000|round/10000) / \(.qoe.buffering_ratio.p99*10000|round/10000) | \(.qoe.buffering_events.mean*1000|round/1000) / \(.qoe.buffering_events.max) | \(.qoe.playback_ratio.mean*1000|round/1000) / \(.qoe.playback_ratio.p50*1000|round/1000) | \(.qoe.served_by_caches*1000|round/10) % | \(.vms.vm_seconds|round) |"' "$out/boot=$sem,boot-ms=$boot.json"
    done
  done
} | tee reproduce/cdnsim/fig2.md
