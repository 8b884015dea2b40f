#!/usr/bin/env bash
# `ninfer synth` and `ninfer bench e2e` on the tiny geometries: the commands run end to end (run,
# eval, bench in every output format) and bad arguments exit 2 naming the flag. No timing is asserted.
set -u
bin=$1
dir=$(mktemp -d /tmp/nf_synth_cli.XXXXXX)
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

# synth: every recipe of tiny, one of tiny-qwen2; progress and summary on stderr
for r in bf16 q8q8 q4q6 q4q5 nvfp4; do
    check "synth tiny $r" 0 "synth: wrote .*25 tensors" synth --geometry tiny --recipe "$r" -o "$dir/tiny-$r.nf" --seed 5
done
check "synth tiny-qwen2" 0 "synth: wrote" synth -g tiny-qwen2 --recipe q4q5 -o "$dir/q2.nf"
"$bin" inspect "$dir/tiny-q4q6.nf" | grep -q 'provenance.source .*"synth:tiny seed=5' && ok || bad "inspect: provenance.source"

# run (byte-level toy tokenizer) and eval produce output; eval prints finite logits
out=$("$bin" run -m "$dir/tiny-q4q6.nf" -p "hello" -n 6 --temp 0 2>/dev/null); rc=$?
[ "$rc" -eq 0 ] && [ -n "$out" ] && ok || bad "run: rc $rc, output '$out'"
out=$("$bin" eval -m "$dir/q2.nf" --tokens 1,2,3,400 2>/dev/null); rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -l <<<"$out")" -eq 4 ] && ! grep -qiE "nan|inf" <<<"$out"; then ok; else bad "eval: rc $rc: $out"; fi

# bench e2e: table, csv, json
out=$("$bin" bench e2e -m "$dir/tiny-nvfp4.nf" -p 16 -n 4 -r 2 -t 1 2>&1); rc=$?
if [ "$rc" -eq 0 ] && grep -qE '^\| qwen3_moe 2L \(synth:tiny\) .*exps nvfp4/nvfp4.*\| 1 \| pp16 \| [0-9.]+ ± [0-9.]+ \|$' <<<"$out" &&
    grep -qE '\| tg4 \| [0-9.]+ ± [0-9.]+ \|$' <<<"$out" && grep -q '^device: cpu' <<<"$out" &&
    grep -q 'random routers spread tokens near-uniformly' <<<"$out"; then ok; else bad "bench table: rc $rc: $out"; fi
out=$("$bin" bench e2e -m "$dir/tiny-q4q6.nf" -p 8 -n 0 -r 3 --format csv --no-graphs 2>&1); rc=$?
if [ "$rc" -eq 0 ] && [ "$(wc -l <<<"$out")" -eq 2 ] && head -1 <<<"$out" | grep -q '^model,file_bytes,params' &&
    tail -1 <<<"$out" | grep -qE ',pp8,8,3,[0-9.]+,[0-9.]+,[0-9.]+,1,[0-9.]+;[0-9.]+;[0-9.]+$'; then ok; else bad "bench csv: rc $rc: $out"; fi
out=$("$bin" bench e2e -m "$dir/tiny-bf16.nf" -p 0 -n 3 -r 2 --format json 2>&1); rc=$?
if [ "$rc" -eq 0 ] && grep -q '"test": "tg3", "n_tokens": 3, "reps": 2' <<<"$out" && head -1 <<<"$out" | grep -q '^\[$' &&
    tail -1 <<<"$out" | grep -q '^\]$'; then ok; else bad "bench json: rc $rc: $out"; fi

# bad arguments: exit 2 naming the flag
check "synth unknown geometry" 2 "--geometry 'gpt' is not one of" synth --geometry gpt -o "$dir/x.nf"
check "synth unknown recipe" 2 "--recipe 'q9q9' is not one of" synth -g tiny --recipe q9q9 -o "$dir/x.nf"
check "synth import-only codec as recipe" 2 "q3_k is a codec ninfer imports from GGUF but cannot encode" synth -g tiny --recipe q3_k -o "$dir/x.nf"
check "synth no output" 2 "needs --geometry G and -o FILE" synth -g tiny
check "synth layers 0" 2 "--layers" synth -g tiny -o "$dir/x.nf" --layers 0
check "synth small vocab" 2 "--vocab 100" synth -g tiny -o "$dir/x.nf" --vocab 100
check "synth unknown flag" 2 "unknown option '--fast'" synth -g tiny -o "$dir/x.nf" --fast
[ ! -e "$dir/x.nf" ] && ok || bad "a refused synth left $dir/x.nf"
check "bench bad format" 2 "--format 'xml'" bench e2e -m "$dir/tiny-bf16.nf" --format xml
check "bench zero reps" 2 "--repetitions" bench e2e -m "$dir/tiny-bf16.nf" -r 0
check "bench nothing" 2 "nothing to measure" bench e2e -m "$dir/tiny-bf16.nf" -p 0 -n 0
check "bench no model" 2 "needs -m MODEL" bench e2e
check "bench unknown device" 1 "gpu9" bench e2e -m "$dir/tiny-bf16.nf" --device gpu9 -p 4 -n 0 -r 1
check "bench missing file" 1 "nonexistent" bench e2e -m "$dir/nonexistent.nf"
echo "synth cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
