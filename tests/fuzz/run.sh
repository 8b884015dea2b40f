#!/usr/bin/env bash
# Runs one libFuzzer target of build-fuzz/ for a given time (docs/fuzz.md), one process (one core).
# Usage: tests/fuzz/run.sh NAME SECONDS [extra libFuzzer flags...]
# Seeds: the files of tests/fuzz/inputs/NAME.txt, copied (cut to 128 KiB, the -max_len) into
# build-fuzz/seeds/NAME; its folders (the regress folder among them) are read in place. The corpus
# grows in build-fuzz/corpus/NAME; crash-*/timeout-*/leak-* inputs land in build-fuzz/NAME-*. An input
# that runs over 10 s is a timeout (libFuzzer's default, 1200 s, would hide a slow reader).
set -euo pipefail
name=$1 secs=$2
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
b=$root/build-fuzz
seeds=$b/seeds/$name corpus=$b/corpus/$name
mkdir -p "$seeds" "$corpus"
dirs=()
while read -r line; do
  [[ -z $line || $line == \#* ]] && continue
  p=$root/tests/$line
  if [[ -d $p ]]; then dirs+=("$p")
  else head -c 131072 "$p" > "$seeds/$(echo "$line" | tr / _)"
  fi
done < "$root/tests/fuzz/inputs/$name.txt"
[[ $name == artifact ]] && "$b/tests/fuzz/fuzz_gen_seeds" "$seeds"
dict=()
[[ -f $root/tests/fuzz/$name.dict ]] && dict=(-dict="$root/tests/fuzz/$name.dict")
cd "$b"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  exec "tests/fuzz/fuzz_$name" -max_total_time="$secs" -max_len=131072 -print_final_stats=1 \
  -timeout=10 -artifact_prefix="$b/$name-" "${dict[@]}" "$@" "$corpus" "$seeds" "${dirs[@]}"
