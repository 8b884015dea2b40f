#!/usr/bin/env python3
"""A/B two ninfer builds, or one build under two environments, on one bench command, interleaved.

usage: tools/ab.py --a BIN [--b BIN] [--env-a K=V ...] [--env-b K=V ...] [--reps N] [--out DIR]
                   [--metric COL] [--key COL,COL] -- ARGS...

ARGS is a ninfer command that prints CSV on stdout (`bench e2e ... -o csv`, `bench sparse-moe ...
--format csv`). The arms run A, B, A, B, ... (N times each, default 2), so a drift of clocks or
temperature during the call falls on both alike (docs/bench.md, "Method"). Each row's metric
(bench e2e: mean_tps, keyed by test; bench sparse-moe: median_us, keyed by profile, distribution, T
and route) is printed per run, with B/A of the arms' means. --out DIR keeps every run's CSV
(DIR/a1.csv, DIR/b1.csv, ...). Without --b, B is A's binary: the arms then differ by environment.
"""
import argparse
import csv
import io
import os
import subprocess
import sys

KNOWN = [("mean_tps", ["test"]), ("median_us", ["profile", "distribution", "T", "route"])]


def parse_env(pairs, what):
    env = {}
    for p in pairs:
        if "=" not in p:
            sys.exit(f"ab.py: {what} '{p}' is not K=V")
        k, v = p.split("=", 1)
        env[k] = v
    return env


def run_arm(binary, env, args):
    """One run of the command; its CSV text (a failed run stops the script, naming it)."""
    cmd = [binary] + args
    r = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ab.py: `{' '.join(cmd)}` exited {r.returncode}:\n{r.stderr.strip()}")
    return r.stdout


def rows_of(text, metric, key):
    """(key tuple, metric value) for every CSV row; picks the metric and key from the header."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    if metric is None:
        found = [(m, k) for m, k in KNOWN if m in header]
        if not found:
            sys.exit(f"ab.py: no known metric ({', '.join(m for m, _ in KNOWN)}) in the header {header}")
        metric, auto_key = found[0]
        key = key or auto_key
    missing = [c for c in [metric] + key if c not in header]
    if missing:
        sys.exit(f"ab.py: column(s) {', '.join(missing)} not in the header {header}")
    return metric, key, [(tuple(r[c] for c in key), float(r[metric])) for r in reader]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="ninfer binary of arm A")
    ap.add_argument("--b", help="ninfer binary of arm B (default: A's)")
    ap.add_argument("--env-a", action="append", default=[], metavar="K=V", help="environment of arm A")
    ap.add_argument("--env-b", action="append", default=[], metavar="K=V", help="environment of arm B")
    ap.add_argument("--reps", type=int, default=2, help="runs of each arm (default 2)")
    ap.add_argument("--out", help="folder for every run's CSV")
    ap.add_argument("--metric", help="the CSV column to compare (default: mean_tps or median_us)")
    ap.add_argument("--key", help="comma-separated columns naming a row (default: by metric)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- then the ninfer command")
    o = ap.parse_args()
    args = o.args[1:] if o.args[:1] == ["--"] else o.args
    if not args:
        sys.exit("ab.py: no ninfer command after --")
    if o.reps < 1:
        sys.exit("ab.py: --reps must be at least 1")
    arms = {"a": (o.a, parse_env(o.env_a, "--env-a")), "b": (o.b or o.a, parse_env(o.env_b, "--env-b"))}
    if o.out:
        os.makedirs(o.out, exist_ok=True)
    metric, key = o.metric, o.key.split(",") if o.key else None
    table = {}  # key -> {"a": [...], "b": [...]}, in first-seen order
    for rep in range(1, o.reps + 1):
        for name, (binary, env) in arms.items():
            text = run_arm(binary, env, args)
            if o.out:
                with open(os.path.join(o.out, f"{name}{rep}.csv"), "w") as f:
                    f.write(text)
            metric, key, rows = rows_of(text, metric, key)
            for k, v in rows:
                table.setdefault(k, {"a": [], "b": []})[name].append(v)
    print(f"A: {arms['a'][0]} {' '.join(o.env_a)}".rstrip())
    print(f"B: {arms['b'][0]} {' '.join(o.env_b)}".rstrip())
    print(f"command: ninfer {' '.join(args)}; {o.reps} runs each, interleaved; metric {metric}\n")
    print(f"| {' | '.join(key)} | A | B | B/A |")
    print("|" + "---|" * (len(key) + 3))
    for k, arm in table.items():
        fmt = lambda vs: " / ".join(f"{v:.5g}" for v in vs)
        ratio = (sum(arm["b"]) / len(arm["b"])) / (sum(arm["a"]) / len(arm["a"])) if arm["a"] and arm["b"] else float("nan")
        print(f"| {' | '.join(k)} | {fmt(arm['a'])} | {fmt(arm['b'])} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
