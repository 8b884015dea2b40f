#!/usr/bin/env python3
"""Plot `ninfer bench sparse-moe --format csv` output: median microseconds and % of the measured DRAM
read peak against T, one line per profile, one column per routing distribution.

usage: python3 tools/plot_bench.py sweep.csv -o sweep.png [--title TEXT]
needs matplotlib (pip install matplotlib)."""
import argparse
import csv
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_bench.py: needs matplotlib (pip install matplotlib)")

    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        sys.exit(f"plot_bench.py: {a.csv}: no rows")
    series = defaultdict(list)  # (distribution, profile) -> [(T, us, %dram)]
    for r in rows:
        series[(r["distribution"], r["profile"])].append((int(r["T"]), float(r["median_us"]), float(r["pct_dram"])))
    dists = sorted({d for d, _ in series})
    fig, axes = plt.subplots(2, len(dists), figsize=(7 * len(dists), 9), squeeze=False)
    for col, d in enumerate(dists):
        for (dd, prof), pts in sorted(series.items()):
            if dd != d:
                continue
            pts.sort()
            T = [p[0] for p in pts]
            axes[0][col].plot(T, [p[1] for p in pts], marker=".", label=prof)
            axes[1][col].plot(T, [p[2] for p in pts], marker=".", label=prof)
        axes[0][col].set_title(f"{d}: median latency")
        axes[0][col].set_ylabel("microseconds")
        axes[1][col].set_title(f"{d}: unique weight bytes / time")
        axes[1][col].set_ylabel("% of measured DRAM read peak")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("tokens T")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][col].set_yscale("log")
        axes[0][col].legend(fontsize=8)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)


if __name__ == "__main__":
    main()
