#!/usr/bin/env bash
# `ninfer run --stop` (nf_generate through engine/stopstream.h) and the presence/frequency flags on a tiny synthetic model: with a stop
# string taken from the middle of the greedy output (spanning a token boundary), the output is the
# greedy output up to the stop string's first occurrence, computed here by a plain search. --spec
# ngram:K gives the greedy text of the run without it (run and chat, and on a hybrid) and refuses bad forms.
set -u
bin=$1
dir=$(mktemp -d /tmp/nf_run_stop.XXXXXX)
trap 'rm -rf "$dir"' EXIT
"$bin" synth --geometry tiny --recipe q8q8 -o "$dir/t.nf" --seed 3 2>/dev/null || { echo "synth failed" >&2; exit 1; }
full=$("$bin" run -m "$dir/t.nf" -p "hello" -n 24 --temp 0 2>/dev/null) || { echo "run failed" >&2; exit 1; }
fail=0
for at in 7 20 33; do
    stop=${full:$at:6}
    want=$(python3 -c 'import sys; f, s = sys.argv[1], sys.argv[2]; print(f[:f.index(s)], end="")' "$full" "$stop")
    got=$("$bin" run -m "$dir/t.nf" -p "hello" -n 24 --temp 0 --stop "$stop" 2>/dev/null)
    if [ "$got" != "$want" ]; then fail=1; echo "FAIL: --stop '$stop': got '$got', want '$want'" >&2; fi
done
# a stop string that never completes: the held-back beginnings are printed at the end
got=$("$bin" run -m "$dir/t.nf" -p "hello" -n 24 --temp 0 --stop "<|synth_never" 2>/dev/null)
[ "$got" = "$full" ] || { fail=1; echo "FAIL: unfinished stop string: got '$got', want '$full'" >&2; }
# the OpenAI penalties reach the sampler: the greedy text repeats ids, which they push down
pen=$("$bin" run -m "$dir/t.nf" -p "hello" -n 24 --temp 0 --frequency-penalty 2 --presence-penalty 2 2>/dev/null)
[ -n "$pen" ] && [ "$pen" != "$full" ] || { fail=1; echo "FAIL: penalties changed nothing: '$pen'" >&2; }
# --spec ngram:K: the same greedy text, the statistics line, chat too; bad forms refused
for k in 1 4; do
    got=$("$bin" run -m "$dir/t.nf" -p "hello" -n 24 --temp 0 --spec ngram:$k 2>"$dir/err")
    [ "$got" = "$full" ] || { fail=1; echo "FAIL: --spec ngram:$k: got '$got', want '$full'" >&2; }
    grep -q "^speculation ngram:$k: .* drafted, .* accepted" "$dir/err" || { fail=1; echo "FAIL: no speculation stats" >&2; }
done
chat_in=$'hello\nhello again'
want=$(printf '%s\n' "$chat_in" | "$bin" chat -m "$dir/t.nf" -n 16 --temp 0 2>/dev/null)
got=$(printf '%s\n' "$chat_in" | "$bin" chat -m "$dir/t.nf" -n 16 --temp 0 --spec ngram:3 2>/dev/null)
[ -n "$want" ] && [ "$got" = "$want" ] || { fail=1; echo "FAIL: chat --spec: got '$got', want '$want'" >&2; }
for bad in ngram:0 ngram:9 ngram: mtp:2; do
    "$bin" run -m "$dir/t.nf" -p "hello" -n 4 --spec "$bad" >/dev/null 2>&1 && { fail=1; echo "FAIL: --spec $bad accepted" >&2; }
done
"$bin" synth --geometry tiny-hybrid --recipe bf16 -o "$dir/h.nf" --seed 3 2>/dev/null || { echo "synth hybrid failed" >&2; exit 1; }
hwant=$("$bin" run -m "$dir/h.nf" -p "hello hello hello" -n 16 --device cpu --temp 0 2>/dev/null)
hgot=$("$bin" run -m "$dir/h.nf" -p "hello hello hello" -n 16 --device cpu --temp 0 --spec ngram:3 2>"$dir/err")
[ -n "$hwant" ] && [ "$hgot" = "$hwant" ] || { fail=1; echo "FAIL: hybrid --spec: got '$hgot', want '$hwant'" >&2; }
grep -q "^speculation ngram:3: " "$dir/err" || { fail=1; echo "FAIL: hybrid: no speculation stats: $(cat "$dir/err")" >&2; }
echo "run --stop, --spec: $([ $fail -eq 0 ] && echo ok || echo failed)"
exit $fail
