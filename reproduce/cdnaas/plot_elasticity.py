"""Plot and tabulate an elasticity run (see elasticity.sh)."""
import csv
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

tmp, out, target, share, step_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
steps = [int(x) for x in sys.argv[6:]]

rows = list(csv.DictReader(open(f"{tmp}/samples.csv")))
t = [float(r["t_s"]) for r in rows]
vcpus = [int(r["vcpus"] or 0) for r in rows]
demand = [int(r["demand"] or 0) for r in rows]
est = [float(r["estimated_mos"]) if r["estimated_mos"] else None for r in rows]
rep = [float(r["reported_mos"]) if r["reported_mos"] else None for r in rows]

table = []
windows_all, under_all = 0, 0
for i, n in enumerate(steps):
    rep_i = json.load(open(f"{tmp}/step{i}.json"))
    ws = [w for s in rep_i["per_session"] for w in s["windows"]]
    under = sum(1 for w in ws if w < target)
    windows_all += len(ws)
    under_all += under
    lo, hi = i * step_s, (i + 1) * step_s
    v_in = [v for (tt, v) in zip(t, vcpus) if lo <= tt < hi] or [0]
    s = rep_i["summary"]
    table.append((i, n, min(v_in), max(v_in), s["mean_mos"], s["stalls"], len(ws), under))

fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
ax[0].plot(t, [e if e is not None else float("nan") for e in est], label="MOS estimated from load (capacity model)")
ax[0].plot(t, [r if r is not None else float("nan") for r in rep], "o-", label="MOS reported by players (16 s)")
ax[0].axhline(target, color="red", linestyle="--", label=f"target {target}")
ax[0].set_ylim(1, 5.1)
ax[0].set_ylabel("MOS")
ax[0].legend(loc="lower left", fontsize=8)
ax[1].step(t, vcpus, where="post", label="vCPUs of the vCDN (paris)")
ax2 = ax[1].twinx()
ax2.step(t, demand, where="post", color="gray", alpha=0.5, label="viewers")
ax[1].set_ylabel("vCPUs")
ax2.set_ylabel("viewers")
ax[1].set_xlabel("seconds")
ax[1].legend(loc="upper left", fontsize=8)
ax2.legend(loc="upper right", fontsize=8)
fig.suptitle(f"vcdn elasticity: HD viewers, one vCPU = {share} CPU")
fig.tight_layout()
fig.savefig(f"{out}/elasticity.png", dpi=110)

lines = [
    "| step | viewers | vCPUs (min-max) | mean MOS | stalls | 16 s windows | under target |",
    "|---:|---:|---:|---:|---:|---:|---:|",
]
for i, n, vmin, vmax, mos, stalls, nw, under in table:
    lines.append(f"| {i} | {n} | {vmin}-{vmax} | {mos:.2f} | {stalls} | {nw} | {under} ({100.0 * under / max(nw, 1):.1f} %) |")
lines.append(f"| all | | | | | {windows_all} | {under_all} ({100.0 * under_all / max(windows_all, 1):.1f} %) |")
md = "\n".join(lines)
open(f"{out}/elasticity.md", "w").write(md + "\n")
print(md)
