#!/usr/bin/env python3
"""Plot and table of reproduce/mosto/fig4.sh.

Usage: fig4.py DIR SIZE  (reads DIR/raw/fig4-{none,drain,kill}.csv, writes
DIR/fig4.png and DIR/fig4.md)
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out, size = Path(sys.argv[1]), int(sys.argv[2])
LABEL = {
    "none": "no change",
    "drain": "transport leaves at 3 s (SIGTERM: drain)",
    "kill": "transport dies at 3 s (SIGKILL)",
}
fig, ax = plt.subplots(figsize=(8, 4))
rows = []
for event in LABEL:
    t, mbit, total, status, second = [], [], 0, "", ""
    for line in (out / "raw" / f"fig4-{event}.csv").read_text().splitlines()[1:]:
        k, v = line.split(",", 1)
        if k == "end":
            total, status = v.split(",", 1)
        elif k == "second":
            second = v
        else:
            t.append(float(k))
            mbit.append(int(v) * 8 / 0.1 / 1e6)
    ax.plot(t, mbit, label=LABEL[event])
    code, took = (second.split(",") + [""])[:2]
    complete = int(total) >= size
    duration = t[-1] if t else 0
    rows.append(
        f"| {LABEL[event]} | {'complete' if complete else 'cut'} ({int(total) / 1e6:.1f} of {size / 1e6:.0f} MB)"
        f" | {duration:.1f} s | {code} in {float(took) * 1000:.0f} ms |" if took else
        f"| {LABEL[event]} | {'complete' if complete else 'cut'} ({int(total) / 1e6:.1f} of {size / 1e6:.0f} MB)"
        f" | {duration:.1f} s | {code} |"
    )
ax.axvline(3.0, color="grey", linestyle=":", linewidth=1)
ax.set_xlabel("time (s)")
ax.set_ylabel("goodput at the client (Mbit/s, per 100 ms)")
ax.set_title("A proxy leaving a running chain (Fig. 4's point on vcdn's test bed)", fontsize=10)
ax.legend(fontsize=8)
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out / "fig4.png", dpi=120)
md = [
    "| event | running transfer | its duration | next request (500 KB) right after the event |",
    "|---|---|---|---|",
    *rows,
    "",
]
(out / "fig4.md").write_text("\n".join(md))
print("\n".join(md))
