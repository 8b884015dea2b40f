#!/usr/bin/env bash
# `ninfer bench sparse-moe` without a GPU: usage errors exit 2 naming the flag; a valid command exits
# 2 with a clear "needs a CUDA GPU" message (this test runs where no GPU is visible; skip otherwise).
set -u
bin=$1
pass=0 fail=0
check() { # DESC WANT_RC PATTERN ARGS...
    local desc=$1 want=$2 pat=$3
    shift 3
    local err rc
    err=$("$bin" bench sparse-moe "$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" -eq "$want" ] && grep -qE -- "$pat" <<<"$err"; then pass=$((pass + 1)); else
        fail=$((fail + 1)); echo "FAIL: $desc: rc $rc (want $want), stderr: $err" >&2; fi
}
if "$bin" --version | grep -q "^gpu 0:"; then echo "bench cli: a GPU is visible; skipped"; exit 77; fi
check "no GPU" 2 "needs a CUDA GPU" --tokens 1
check "bad geometry" 2 "unknown 'gpt'" --geometry gpt
check "bad codec" 2 "'q9_k' is not a profile" --codec q9_k
check "bad distribution" 2 "is not same\|uniform\|trace-like" --distribution zipf
check "bad sweep" 2 "expected 1 <= A <= B" --sweep 5:2
check "bad tokens" 2 "comma-separated list" --tokens 1,x
check "bad execution" 2 "is not graph or stream" --execution async
check "k > E" 2 "exceeds -E" -E 4 -k 8
# --shared-I 0 removes the geometry's shared expert (it was ignored: 0 read as not given)
check "shared-I 0" 2 "names shared-expert codecs but the geometry has none" --geometry qwen3.5-35b-a3b --shared-I 0 --codec q4_k+q6_k/q8_0+q8_0
check "shared-I kept" 2 "needs a CUDA GPU" --geometry qwen3.5-35b-a3b --codec q4_k+q6_k/q8_0+q8_0 --tokens 1
check "unknown flag" 2 "unknown option '--fast'" --fast
check "missing model" 1 "cannot open" -m /nonexistent/model.nf
echo "bench cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
