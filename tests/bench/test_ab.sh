#!/usr/bin/env bash
# tools/ab.py on the CPU: one build as both arms (B with an extra environment variable) over `bench e2e`
# of a tiny synthetic model: every test row appears with A's and B's runs and a B/A column, the runs'
# CSVs land in --out, and a failing command or a bad option stops it with a message and a non-zero exit.
set -u
bin=$1 ab=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
"$bin" synth -g tiny --recipe q8q8 -o "$tmp/tiny.nf" -q || { echo "synth failed" >&2; exit 1; }
out=$(python3 "$ab" --a "$bin" --env-b NF_AB_TEST=1 --reps 2 --out "$tmp/runs" -- \
      bench e2e -m "$tmp/tiny.nf" -p 8 -n 4 -r 1 --device cpu -o csv 2>&1)
rc=$?
[ "$rc" -eq 0 ] && ok || bad "ab.py exited $rc: $out"
for t in pp8 tg4; do
    # | test | a1 / a2 | b1 / b2 | ratio |
    grep -qE "^\| $t \| [0-9.e+]+ / [0-9.e+]+ \| [0-9.e+]+ / [0-9.e+]+ \| [0-9]+\.[0-9]{3} \|$" <<<"$out" && ok ||
        bad "no row for $t with two runs an arm and B/A: $out"
done
grep -q "^B: .*NF_AB_TEST=1$" <<<"$out" && ok || bad "arm B's environment not named: $out"
[ "$(ls "$tmp/runs" | tr '\n' ' ')" = "a1.csv a2.csv b1.csv b2.csv " ] && ok || bad "runs kept: $(ls "$tmp/runs")"
err=$(python3 "$ab" --a "$bin" -- bench e2e --bogus 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -q "unknown option '--bogus'" <<<"$err" && ok || bad "failing command: rc $rc, $err"
err=$(python3 "$ab" --a "$bin" --env-b NOEQUALS -- version 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -q "'NOEQUALS' is not K=V" <<<"$err" && ok || bad "bad --env-b: rc $rc, $err"
err=$(python3 "$ab" --a "$bin" -- version 2>&1); rc=$?
[ "$rc" -ne 0 ] && grep -q "no known metric" <<<"$err" && ok || bad "non-CSV command: rc $rc, $err"
echo "ab.py: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
