#!/bin/bash
# The hybrids (Gated DeltaNet + gated attention) on the device: the CUDA tests that touch them and the
# synthetic full-size benchmarks. Run from the root of a copy of the tree with the bundle unpacked
# there (`make gpu-bundle` here; on the device `tar xJf gpu-bundle.txz`), one part per call (each
# stays inside a 10-minute command):
#
#   bash tests/cuda/run_hybrid_cuda.sh LOGDIR tests     the GDN kernels, the attention, the hybrid engine tests
#   bash tests/cuda/run_hybrid_cuda.sh LOGDIR regress   test_engine_cuda and test_batch_cuda (the other models)
#   bash tests/cuda/run_hybrid_cuda.sh LOGDIR q4q6      synth qwen3.5-35b-a3b q4q6, `run`, bench e2e
#   bash tests/cuda/run_hybrid_cuda.sh LOGDIR nvfp4     the same in nvfp4
#   bash tests/cuda/run_hybrid_cuda.sh LOGDIR next      qwen3-next-80b-a3b (8 of its 48 layers: disk), run + bench
#
# LOGDIR gets one log per step and summary.txt (each step's exit status). BUNDLE (default gpu-bundle)
# and MODELS (default /tmp/nf_hybrid_models: ~20 GB per full 35B artifact) may be set.
set -u
LOG=${1:?usage: run_hybrid_cuda.sh LOGDIR tests|regress|q4q6|nvfp4|next}
PART=${2:-tests}
B=${BUNDLE:-gpu-bundle}
M=${MODELS:-/tmp/nf_hybrid_models}
N=$B/bin/ninfer
mkdir -p "$LOG" "$M"
export NF_TEST_DATA=$PWD/tests
step() { # name, command...: runs it with its log, records the exit status
  local name=$1; shift
  local t0=$SECONDS
  "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc ($((SECONDS - t0)) s)" | tee -a "$LOG/summary.txt"
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$LOG/gpu.txt" 2>&1
git log -1 --format='%H %s' > "$LOG/commit.txt" 2>/dev/null
# bench e2e, and where nsys exists the decode step's kernel times (the GDN kernels' share of tg)
bench() { # model file, tag
  step "run-$2" "$N" run -m "$1" -p "Hello" -n 16 --device cuda
  step "bench-$2" "$N" bench e2e -m "$1" -p 512 -n 128 -r 3 --device cuda
  if command -v nsys > /dev/null; then
    step "nsys-$2" nsys profile -o "$M/prof-$2" --force-overwrite true --stats=false "$N" bench e2e -m "$1" -p 0 -n 32 -r 1 --device cuda
    step "nsys-stats-$2" nsys stats --report cuda_gpu_kern_sum --format csv -o "$LOG/kern-$2" "$M/prof-$2.nsys-rep"
  fi
}
case $PART in
tests)
  for t in test_gdn_cuda test_attention_cuda test_hybrid_cuda; do step "$t" timeout 290 "$B/bin/$t"; done
  grep -h "FIRST MISMATCH\|FAIL\|checks," "$LOG"/test_*.log > "$LOG/failures.txt"
  ;;
regress)
  for t in test_engine_cuda test_batch_cuda; do step "$t" timeout 290 "$B/bin/$t"; done
  grep -h "FAIL\|checks," "$LOG"/test_*.log > "$LOG/failures.txt"
  ;;
q4q6 | nvfp4)
  f=$M/qwen35-hybrid-$PART.nf
  [ -f "$f" ] || step "synth-$PART" "$N" synth -g qwen3.5-35b-a3b --recipe "$PART" -o "$f" -q
  bench "$f" "qwen35-$PART"
  rm -f "$f"
  ;;
next)
  f=$M/qwen3next-8l-q4q6.nf
  step synth-next "$N" synth -g qwen3-next-80b-a3b --recipe q4q6 --layers 8 -o "$f" -q
  bench "$f" next-8l-q4q6
  rm -f "$f"
  ;;
*) echo "unknown part $PART (tests, regress, q4q6, nvfp4, next)"; exit 2 ;;
esac
