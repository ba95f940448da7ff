#!/usr/bin/env python3
"""Summary, plot and table of reproduce/mosto/fig1a.sh.

Usage: fig1a.py RAW_CSV RTT_MS RATE_MBIT OUT_DIR  (writes fig1a.png, fig1a.md)

Times (ms), per transfer size S on a fresh connection:
- measured: curl's time_total (handshake, request, whole response) and the
  part after the handshake (total - connect);
- ideal: RTT + S x 8 / rate (the request's round trip, then the answer at
  the link rate: no slow start; the paper's "ideal achievable" time);
- slow-start model: the handshake's RTT, then r rounds of one RTT each for
  an initial window of 10 segments doubling per RTT (MSS 1448, the whole
  answer with its ~150 B of headers), plus the last round's serialisation.
"""
import csv
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

raw, rtt, rate_mbit, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
MSS, HEADERS, IW = 1448, 150, 10
rate = rate_mbit * 1e6


def model_ms(size):
    """Handshake + r rounds + the last round's bytes at the link rate."""
    segs = -(-(size + HEADERS) // MSS)
    sent, win, r = 0, IW, 0
    while sent < segs:
        last = min(win, segs - sent)
        sent += last
        win *= 2
        r += 1
    return rtt + r * rtt + last * 1500 * 8 / rate * 1000, r


rows = {}
with open(raw) as f:
    for row in csv.DictReader(f):
        rows.setdefault(int(row["size"]), []).append(row)

table = []
for size in sorted(rows):
    total = [float(r["total_s"]) * 1000 for r in rows[size]]
    after = [(float(r["total_s"]) - float(r["connect_s"])) * 1000 for r in rows[size]]
    ideal = rtt + size * 8 / rate * 1000
    model, r = model_ms(size)
    table.append(
        dict(
            size=size,
            n=len(total),
            total=statistics.median(total),
            tmin=min(total),
            tmax=max(total),
            after=statistics.median(after),
            ideal=ideal,
            model=model,
            rounds=r,
        )
    )

fig, ax = plt.subplots(figsize=(6.4, 4.2))
kb = [t["size"] / 1000 for t in table]
ax.fill_between(kb, [t["ideal"] for t in table], [t["total"] for t in table], color="tab:red", alpha=0.15,
                label="TCP's overhead")
ax.errorbar(kb, [t["total"] for t in table],
            yerr=[[t["total"] - t["tmin"] for t in table], [t["tmax"] - t["total"] for t in table]],
            fmt="o-", color="tab:red", label="measured (cubic, fresh connection; median, min-max)")
ax.plot(kb, [t["model"] for t in table], "k--", label="slow-start model (handshake + r RTTs)")
ax.plot(kb, [t["ideal"] for t in table], "-", color="tab:blue", label="ideal (RTT + size / rate)")
ax.set_xlabel("transfer size (KB)")
ax.set_ylabel("transfer time (ms)")
ax.set_title(f"Fig. 1a on vcdn's test bed: {rtt:.0f} ms RTT, {rate_mbit:.0f} Mbit/s")
ax.grid(alpha=0.3)
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(out / "fig1a.png", dpi=120)

lines = [
    "| size | runs | measured total (median, min–max) | after handshake | ideal RTT + S/rate | model | rounds r | measured / ideal |",
    "|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for t in table:
    lines.append(
        f"| {t['size'] / 1000:.0f} KB | {t['n']} | {t['total']:.1f} ms ({t['tmin']:.1f}–{t['tmax']:.1f}) | "
        f"{t['after']:.1f} ms | {t['ideal']:.1f} ms | {t['model']:.1f} ms | {t['rounds']} | "
        f"{t['total'] / t['ideal']:.2f}× |"
    )
(out / "fig1a.table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
