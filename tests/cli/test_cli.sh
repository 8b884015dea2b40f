#!/usr/bin/env bash
# The CLI contract every command shares: --help exits 0 and prints usage; an unknown command or
# flag prints a short error plus the usage on stderr and exits 2; --version names version, git
# hash and the CUDA state.
set -u
bin=$1
data=${2:-}
pass=0 fail=0
expect() { # expect DESCRIPTION WANT_STATUS GREP_PATTERN STREAM -- ARGS...
    local desc=$1 want=$2 pat=$3 stream=$4
    shift 5
    local out err rc
    out=$("$bin" "$@" 2>/tmp/nf_cli_err.$$); rc=$?
    err=$(cat /tmp/nf_cli_err.$$)
    local text=$out
    [ "$stream" = err ] && text=$err
    if [ "$rc" -eq "$want" ] && grep -qE -- "$pat" <<<"$text"; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc: status $rc (want $want); $stream did not match /$pat/" >&2
        echo "  stdout: $out" >&2
        echo "  stderr: $err" >&2
    fi
}
expect "--help" 0 "^usage: ninfer <command>" out -- --help
expect "no arguments" 2 "no command given" err --
expect "unknown command" 2 "unknown command 'frobnicate'" err -- frobnicate
expect "unknown command prints usage" 2 "^usage: ninfer" err -- frobnicate
expect "unknown global flag" 2 "unknown option '--frob'" err -- --frob
expect "--version" 0 "^ninfer [0-9]+\.[0-9]+\.[0-9]+ \(git [0-9a-f]+|unknown" out -- --version
expect "--version names cuda state" 0 "^cuda: " out -- --version
expect "command --help" 0 "^usage: ninfer version" out -- version --help
expect "unknown command flag" 2 "unknown option '--bogus'" err -- version --bogus
expect "unexpected positional" 2 "unexpected argument 'x'" err -- version x
# every command in the table answers --help with its usage
for cmd in $("$bin" --help | awk '/^commands:/{on=1; next} on && /^  [a-z]/ {print $1}'); do
    expect "$cmd --help" 0 "^usage: ninfer $cmd" out -- "$cmd" --help
done
if [ -n "$data" ]; then # inspect on the committed reference artifact (tests/fixtures/format)
    ref=$data/fixtures/format/ref_v1.nf
    expect "inspect" 0 "tensors" out -- inspect "$ref"
    expect "inspect --json" 0 '^\{' out -- inspect --json "$ref"
    expect "inspect --verify" 0 "checksum" out -- inspect --verify "$ref"
    for c in q2_k q3_k iq4_xs iq4_nl; do # the import-only codecs are listed with their totals
        expect "inspect shows $c" 0 "^  $c +1 tensors" out -- inspect "$ref"
    done
    head -c 1000 "$ref" > /tmp/nf_cli_trunc.$$
    expect "inspect truncated" 1 "error" err -- inspect /tmp/nf_cli_trunc.$$
    expect "inspect missing" 1 "cannot open" err -- inspect /nonexistent.nf
    rm -f /tmp/nf_cli_trunc.$$
fi
# the engine's device choice on a tiny synthetic model: a name it does not know, the GPU when none is
# visible (refused with the reason), and the default (auto: the CPU here) with its speed line
if "$bin" synth -g tiny -o /tmp/nf_cli_tiny.$$ -q 2>/dev/null; then
    expect "run --device tpu" 1 "unknown device 'tpu'" err -- run -m /tmp/nf_cli_tiny.$$ -p hi -n 2 --device tpu
    expect "run default device" 0 "tokens/s.*GB/s" err -- run -m /tmp/nf_cli_tiny.$$ -p hi -n 2
    if "$bin" --version | grep -q "^gpu: none"; then
        expect "run --device cuda without a GPU" 1 "device 'cuda': no GPU is visible" err -- \
            run -m /tmp/nf_cli_tiny.$$ -p hi -n 2 --device cuda
    fi
    rm -f /tmp/nf_cli_tiny.$$
else
    fail=$((fail + 1))
    echo "FAIL: synth -g tiny" >&2
fi
rm -f /tmp/nf_cli_err.$$
echo "cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
