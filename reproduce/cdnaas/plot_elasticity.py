"""Plot and tabulate an elasticity run (see elasticity.sh): MOS and vCPUs
over time, and the share of 16 s windows under the target."""
import csv
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

tmp, out, target, share, batches = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
W = 16.0

life = float(sys.argv[6]) if len(sys.argv) > 6 else 190.0
batch = int(sys.argv[7]) if len(sys.argv) > 7 else 30
name = sys.argv[8] if len(sys.argv) > 8 else "elasticity"
mode = sys.argv[9] if len(sys.argv) > 9 else "closed"


def samples(d):
    rows = list(csv.DictReader(open(f"{d}/samples.csv")))
    t = [float(r["t_s"]) for r in rows]
    vcpus = [int(r["vcpus"] or 0) for r in rows]
    demand = [int(r["demand"] or 0) for r in rows]
    est = [float(r["estimated_mos"]) if r["estimated_mos"] else float("nan") for r in rows]
    return t, vcpus, demand, est


def windows_of(d):
    """Every window of every session of a ramp, placed in time (a batch's
    sessions start at its join time + their start-up delay), the batches
    whose player could not start, and why sessions failed."""
    joined = {int(j): float(s) for j, s in csv.reader(open(f"{d}/batches.csv"))}
    windows, failed_batches, reasons = [], [], {}
    for j in range(batches):
        try:
            rep = json.load(open(f"{d}/batch{j}.json"))
        except FileNotFoundError:
            # The batch's player could not even start (its MPD fetch failed):
            # every window of its viewers counts as a failure (MOS 1).
            failed_batches.append(j)
            try:
                err = open(f"{d}/batch{j}.txt").read().strip().splitlines()[-1]
            except (FileNotFoundError, IndexError):
                err = "no output"
            key = re.sub(r"[0-9]+", "N", f"player could not start: {err}")
            reasons[key] = reasons.get(key, 0) + 1
            for _ in range(batch):
                for k in range(int(life // W)):
                    windows.append((joined[j] + (k + 0.5) * W, 1.0))
            continue
        for s in rep["per_session"]:
            if s.get("failed"):
                key = re.sub(r"[0-9]+", "N", s.get("error") or "unknown")
                reasons[key] = reasons.get(key, 0) + 1
            start = joined[j] + (s.get("startup_delay_s") or 0.0)
            for k, score in enumerate(s["windows"]):
                windows.append((start + (k + 0.5) * W, score))
    return windows, failed_batches, reasons


def players(d):
    """What the viewers saw beyond the MOS (start-up delay, stalls, failed
    sessions), and what the players cost: from the batches' reports."""
    startups, stalls, stall_s, play_s, sessions, failed, cpu_s = [], 0, 0.0, 0.0, 0, 0, 0.0
    for j in range(batches):
        try:
            rep = json.load(open(f"{d}/batch{j}.json"))
        except FileNotFoundError:
            continue
        for s in rep["per_session"]:
            sessions += 1
            failed += bool(s.get("failed"))
            if s.get("startup_delay_s") is not None:
                startups.append(s["startup_delay_s"])
            stalls += s.get("stalls", 0)
            stall_s += s.get("stall_s", 0.0)
        play_s += rep["summary"]["sessions"] * rep["duration_s"]
        try:
            cpu_s += int(open(f"{d}/batch{j}.cpu").read()) / os.sysconf("SC_CLK_TCK")
        except (FileNotFoundError, ValueError):
            pass
    startups.sort()
    p95 = startups[int(0.95 * (len(startups) - 1))] if startups else float("nan")
    mean = sum(startups) / len(startups) if startups else float("nan")
    return (
        f"{sessions} sessions, {failed} failed; start-up delay mean {mean:.2f} s, p95 {p95:.2f} s; "
        f"{stalls} stalls ({60.0 * stalls / max(play_s, 1e-9):.2f} per viewer-minute), "
        f"{stall_s:.0f} s stalled in {play_s:.0f} viewer-seconds ({100.0 * stall_s / max(play_s, 1e-9):.2f} %); "
        f"the players used {cpu_s:.0f} CPU-seconds ({1000.0 * cpu_s / max(play_s, 1e-9):.2f} ms per viewer-second)"
    )


def per_bin(windows, end):
    mos_t, mos_v = [], []
    for b in range(int(end // W) + 1):
        sc = [v for x, v in windows if b * W <= x < (b + 1) * W]
        if sc:
            mos_t.append((b + 0.5) * W)
            mos_v.append(sum(sc) / len(sc))
    return mos_t, mos_v


t, vcpus, demand, est = samples(tmp)
windows, failed_batches, reasons = windows_of(tmp)
base = None
if os.path.exists(f"{tmp}/baseline/batches.csv"):
    base = windows_of(f"{tmp}/baseline")
end = max([x for x, _ in windows] + t)
mos_t, mos_v = per_bin(windows, end)

fig, ax = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
ax[0].plot(mos_t, mos_v, "o-", label="viewers' mean MOS per 16 s window (elastic)")
if base:
    bt, bv = per_bin(base[0], end)
    ax[0].plot(bt, bv, "s-", color="gray", alpha=0.7, label="same ramp, one fixed vCPU")
ax[0].plot(t, est, alpha=0.6, label="MOS the capacity model expects at the load")
ax[0].axhline(target, color="red", linestyle="--", label=f"target {target}")
ax[0].set_ylim(1, 5.1)
ax[0].set_ylabel("MOS")
ax[0].legend(loc="lower left", fontsize=8)
ax[1].step(t, vcpus, where="post", label="vCPUs of the vCDN")
ax2 = ax[1].twinx()
ax2.plot(t, demand, color="gray", alpha=0.5, label="viewers")
ax[1].set_ylabel("vCPUs")
ax2.set_ylabel("viewers")
ax[1].set_xlabel("seconds")
ax[1].legend(loc="upper left", fontsize=8)
ax2.legend(loc="upper right", fontsize=8)
fig.suptitle(f"vcdn elasticity: HD viewers ({mode}-loop player) in one region, one vCPU = {share} CPU")
fig.tight_layout()
fig.savefig(f"{out}/{name}.png", dpi=110)

# A table by minute.
lines = [
    f"Player: `vcdn player --mode {mode} --quality highest`.\n",
    "| minute | viewers (max) | vCPUs (min-max) | mean MOS | 16 s windows | under target |",
    "|---:|---:|---:|---:|---:|---:|",
]
total = under_total = 0
for m in range(int(end // 60) + 1):
    lo, hi = m * 60, (m + 1) * 60
    sc = [v for x, v in windows if lo <= x < hi]
    vs = [v for x, v in zip(t, vcpus) if lo <= x < hi] or [0]
    ds = [d for x, d in zip(t, demand) if lo <= x < hi] or [0]
    under = sum(1 for v in sc if v < target)
    total += len(sc)
    under_total += under
    mean = f"{sum(sc) / len(sc):.2f}" if sc else "-"
    lines.append(f"| {m} | {max(ds)} | {min(vs)}-{max(vs)} | {mean} | {len(sc)} | {under} ({100.0 * under / max(len(sc), 1):.1f} %) |")
lines.append(f"| all | | | | {total} | {under_total} ({100.0 * under_total / max(total, 1):.1f} %) |")
# What the elasticity cost: vCPU-seconds used against a fixed size for the peak.
used = sum(v * (b - a) for a, b, v in zip(t, t[1:], vcpus))
peak = max(vcpus) * (t[-1] - t[0]) if t else 0.0
lines.append(
    f"\nvCPU-seconds used: {used:.0f}, against {peak:.0f} for {max(vcpus, default=0)} vCPUs "
    f"held for the whole run ({100.0 * used / max(peak, 1e-9):.0f} %)."
)
lines.append(f"\nElastic, the viewers: {players(tmp)}.")
if base:
    lines.append(f"\nOne fixed vCPU, the viewers: {players(f'{tmp}/baseline')}.")
if base:
    bw = base[0]
    bu = sum(1 for _, v in bw if v < target)
    bm = sum(v for _, v in bw) / max(len(bw), 1)
    lines.append(
        f"\nThe same ramp against one fixed vCPU (no elasticity): mean MOS {bm:.2f}, "
        f"{bu} of {len(bw)} windows under target ({100.0 * bu / max(len(bw), 1):.1f} %)."
    )
    for k, n in sorted(base[2].items(), key=lambda kv: -kv[1])[:4]:
        lines.append(f"- {n} of its sessions failed: {k}")
if failed_batches:
    lines.append(f"\nBatches whose player could not start (counted as MOS 1): {failed_batches}")
if reasons:
    lines.append("\nWhy sessions failed (count, error with numbers masked):")
    for k, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"- {n}: {k}")
md = "\n".join(lines)
open(f"{out}/{name}.md", "w").write(md + "\n")
print(md)
