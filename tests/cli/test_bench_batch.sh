#!/usr/bin/env bash
# `ninfer bench batch` on a tiny synthetic model on the CPU: every output format, the sweep's rows,
# the shared-prefix rows (with and without the prefix cache), and bad arguments exit 2 naming the
# flag. No timing is asserted; the prefix cache's page saving is (pages held with it < without it).
set -u
bin=$1
dir=$(mktemp -d /tmp/nf_bench_batch.XXXXXX)
trap 'rm -rf "$dir"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
check() { # DESC WANT_RC PATTERN ARGS... (pattern searched in stderr)
    local desc=$1 want=$2 pat=$3
    shift 3
    local err rc
    err=$("$bin" "$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" -eq "$want" ] && grep -qE -- "$pat" <<<"$err"; then ok; else bad "$desc: rc $rc (want $want), stderr: $err"; fi
}
"$bin" synth --geometry tiny --recipe q4q6 -o "$dir/t.nf" --seed 3 2>/dev/null || { echo "synth failed" >&2; exit 1; }
m="$dir/t.nf"

# table: one row for -N 3
out=$("$bin" bench batch -m "$m" -N 3 -p 12 -n 4 -t 1 --device cpu 2>&1); rc=$?
if [ "$rc" -eq 0 ] && grep -q '^| N | prefix cache | agg t/s' <<<"$out" && grep -qE '^\| 3 \| on \| [0-9.]+ ' <<<"$out"; then ok
else bad "table: rc $rc: $out"; fi

# csv sweep to 4 with a shared prefix: N = 1, 2, 4, each with the cache on and off
out=$("$bin" bench batch -m "$m" --sweep -N 4 -p 40 -n 3 -t 1 --device cpu --shared-prefix 32 --page-tokens 8 \
      --warmup 0 -o csv 2>/dev/null); rc=$?
rows=$(tail -n +2 <<<"$out" | wc -l)
if [ "$rc" -eq 0 ] && [ "$rows" -eq 6 ] && head -1 <<<"$out" | grep -q '^model,.*,n_seqs,.*ttft_ms,kv_pages_used,kv_pages,preempted,spec,verifications,drafts_per_verif,accepted_per_verif$'; then ok
else bad "csv sweep: rc $rc, $rows rows: $out"; fi

# at N = 4 the prompts share 4 full pages: with the cache they are held once
if python3 -c '
import csv, sys
r = {row["prefix_cache"]: int(row["kv_pages_used"]) for row in csv.DictReader(sys.stdin) if row["n_seqs"] == "4"}
assert r["1"] < r["0"], r' <<<"$out"; then ok; else bad "csv: KV pages with the cache not below without: $out"; fi

# json parses and holds the fields
out=$("$bin" bench batch -m "$m" -N 2 -p 8 -n 2 -t 1 --device cpu -r 2 -o json 2>/dev/null); rc=$?
if [ "$rc" -eq 0 ] && python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d)==1 and d[0]["n_seqs"]==2 and d[0]["reps"]==2 and d[0]["agg_tps"]>0' <<<"$out"; then ok
else bad "json: rc $rc: $out"; fi

# a pool too small for every sequence's growth: the scheduler preempts, the run still completes
out=$("$bin" bench batch -m "$m" -N 6 -p 30 -n 20 -t 1 --device cpu --page-tokens 8 --kv-pages 16 --warmup 0 -o json 2>/dev/null); rc=$?
if [ "$rc" -eq 0 ] && python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["preempted"]>0 and d[0]["kv_pages_used"]<=16, d' <<<"$out"; then ok
else bad "scarce pool: rc $rc: $out"; fi

# the same pool reserving at admission: no preemption
out=$("$bin" bench batch -m "$m" -N 6 -p 30 -n 20 -t 1 --device cpu --page-tokens 8 --kv-pages 16 --warmup 0 --admission reserve -o json 2>/dev/null); rc=$?
if [ "$rc" -eq 0 ] && python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[0]["preempted"]==0 and d[0]["admission"]=="reserve", d' <<<"$out"; then ok
else bad "reserve: rc $rc: $out"; fi

"$bin" bench batch --help | grep -q -- '--shared-prefix' && ok || bad "--help lacks --shared-prefix"
check "no model" 2 "needs -m MODEL" bench batch
check "bad format" 2 "--format 'xml'" bench batch -m "$m" --format xml
check "prefix too long" 2 "--shared-prefix 8 must be below -p 8" bench batch -m "$m" -p 8 --shared-prefix 8
check "zero seqs" 2 "--seqs" bench batch -m "$m" -N 0
check "bad admission" 2 "--admission 'lazy'" bench batch -m "$m" --admission lazy
check "missing file" 1 "cannot open" bench batch -m "$dir/none.nf"
# --spec: the table says so and has the acc/verif column; a bad form is refused
out=$("$bin" bench batch -m "$m" -N 2 -p 12 -n 8 -t 1 --device cpu --spec ngram:3 2>&1); rc=$?
if [ "$rc" -eq 0 ] && grep -q 'spec ngram:3' <<<"$out" && grep -q '| preempted | acc/verif |$' <<<"$out"; then ok
else bad "--spec: rc $rc: $out"; fi
out=$("$bin" bench batch -m "$m" -N 2 -p 12 -n 8 -t 1 --device cpu --spec ngram:0 2>&1); rc=$?
if [ "$rc" -eq 2 ] && grep -q 'ngram:K' <<<"$out"; then ok; else bad "--spec ngram:0: rc $rc: $out"; fi
echo "bench batch cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
