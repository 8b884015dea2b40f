#!/usr/bin/env python3
"""Per-kernel table of one decode step from an ncu CSV (docs/perf/gpu_engine_history.md, "One decode step").

usage: ncu --metrics gpu__time_duration.sum --csv ninfer bench e2e -m m.nf -p 0 -n STEPS -r 1 --warmup 0 > ncu.csv
       tools/ncu_breakdown.py ncu.csv STEPS

Groups the launches by kernel name and grid, divides the summed times by STEPS, and leaves out the
DRAM read-peak probe that `bench e2e` runs after the timed steps (read_kernel).
"""
import collections
import csv
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, steps = sys.argv[1], int(sys.argv[2])
    rows, header = [], None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if r and r[0] == "ID":
                header = r
            elif header and len(r) == len(header):
                rows.append(dict(zip(header, r)))
    if not rows:
        sys.exit(f"{path}: no ncu CSV rows (was it written with --csv?)")
    agg = collections.defaultdict(lambda: [0, 0.0])
    # ncu writes a row per (launch, metric): other metrics of the same run are left out, and the
    # duration's unit (ns or us, as ncu chose) is honoured
    us_per = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    rows = [d for d in rows if d.get("Metric Name", "gpu__time_duration.sum") == "gpu__time_duration.sum"]
    for d in rows:
        name = re.sub(r"nf::|\(anonymous namespace\)::|<unnamed>::|dec::", "", d["Kernel Name"])
        if name.startswith("read_kernel"):
            continue
        us = float(d["Metric Value"].replace(",", "")) * us_per.get(d.get("Metric Unit", "ns"), 1e-3)
        key = (re.sub(r"\(.*", "", name)[:80], d["Grid Size"])
        agg[key][0] += 1
        agg[key][1] += us
    total = sum(v[1] for v in agg.values())
    print(f"{'us/step':>9} {'launches':>8} {'us/launch':>9} {'share':>6}  grid            kernel")
    for (name, grid), (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"{us / steps:9.1f} {n / steps:8.1f} {us / n:9.2f} {100 * us / total:5.1f}%  {grid:15} {name}")
    print(f"{total / steps:9.1f} us per step in all")


if __name__ == "__main__":
    main()
