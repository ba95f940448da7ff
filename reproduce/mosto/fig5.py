#!/usr/bin/env python3
"""Summary, plot and table of reproduce/mosto/fig5.sh.

Usage: fig5.py RAW_CSV OUT_DIR [NAME]  (writes NAME.png and NAME.md; NAME
defaults to fig5)

Per setup and size: mean, median and 95th percentile of curl's time_total
(connect, request, whole answer) over the runs. "Faster than X" is as the
paper says it: T_X / T - 1 (60 % faster: X takes 1.6 times as long).
"""
import csv
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

raw, out = sys.argv[1], Path(sys.argv[2])
name = sys.argv[3] if len(sys.argv) > 3 else "fig5"
SETUPS = ["direct", "mosto-1", "mosto-3", "warm-proxy", "vcdn"]
LABEL = {
    "direct": "direct (180 ms)",
    "mosto-1": "MOSTO, 1 proxy",
    "mosto-3": "MOSTO, 3 proxies",
    "warm-proxy": "warm reverse proxy (HAProxy)",
    "vcdn": "vcdn chain, warm connections",
}

times = {}
for row in csv.DictReader(open(raw)):
    if int(row["bytes"]) != int(row["size"]):
        sys.exit(f"{row['setup']} {row['size']} run {row['run']}: got {row['bytes']} bytes")
    times.setdefault((row["setup"], int(row["size"])), []).append(float(row["total_s"]) * 1000)
sizes = sorted({s for _, s in times})


def p95(v):
    v = sorted(v)
    return v[min(len(v) - 1, int(0.95 * len(v)))]


mean = {k: statistics.mean(v) for k, v in times.items()}
lines = [
    "| size | " + " | ".join(LABEL[s] for s in SETUPS) + " | vcdn vs direct | vcdn vs warm proxy | MOSTO-1 vs direct |",
    "|---" * (len(SETUPS) + 4) + "|",
]
for size in sizes:
    cells = []
    for s in SETUPS:
        v = times[(s, size)]
        cells.append(f"{statistics.mean(v):.0f} / {statistics.median(v):.0f} / {p95(v):.0f}")
    d, w, v, m1 = (mean[(s, size)] for s in ("direct", "warm-proxy", "vcdn", "mosto-1"))
    lines.append(
        f"| {size // 1000} KB | " + " | ".join(cells)
        + f" | {100 * (d / v - 1):.0f} % faster | {100 * (w / v - 1):+.0f} % | {100 * (d / m1 - 1):.0f} % faster |"
    )
runs = min(len(v) for v in times.values())
md = [
    f"Time of one request (ms: mean / median / p95 over {runs} runs each, fresh client connection).",
    "",
    *lines,
    "",
]
(out / f"{name}.md").write_text("\n".join(md))
print("\n".join(md))

fig, ax = plt.subplots(figsize=(9, 4.5))
width = 0.8 / len(SETUPS)
for k, s in enumerate(SETUPS):
    xs = [i + (k - (len(SETUPS) - 1) / 2) * width for i in range(len(sizes))]
    ys = [mean[(s, size)] for size in sizes]
    err = [statistics.stdev(times[(s, size)]) if len(times[(s, size)]) > 1 else 0 for size in sizes]
    ax.bar(xs, ys, width, yerr=err, capsize=2, label=LABEL[s])
ax.set_xticks(range(len(sizes)))
ax.set_xticklabels([f"{s // 1000} KB" for s in sizes])
ax.set_ylabel("transfer time (ms), mean ± sd")
title = "Fig. 5 on vcdn's test bed: 180 ms RTT, 100 Mbit/s links"
if name != "fig5":
    title += "\n(origin keeps its window across idle: the warm proxy's best case)"
ax.set_title(title, fontsize=10)
ax.legend(fontsize=8)
ax.grid(axis="y", alpha=0.3)
fig.tight_layout()
fig.savefig(out / f"{name}.png", dpi=120)
