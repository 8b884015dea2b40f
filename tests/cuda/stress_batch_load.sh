# test_batch_cuda (three at once) beside three other CUDA tests, R rounds per bundle: the load under
# which the create-time stream race (a late legacy-stream memset wiping the LM head tables) showed.
# A manual device check, not a ctest (its failure needs other GPU work to delay the memset).
set -u
R=$1; shift
mkdir -p $OUT/stress
for a in "$@"; do
  arm=${a%%=*}; txz=${a#*=}
  mkdir -p /tmp/$arm && tar -xJf $txz -C /tmp/$arm
  B=/tmp/$arm/gpu-bundle/bin; fails=0; runs=0; t0=$SECONDS
  for r in $(seq $R); do
    ( $B/test_sparse_moe >/dev/null 2>&1 & $B/test_engine_cuda >/dev/null 2>&1 & $B/test_attention_cuda >/dev/null 2>&1 & wait ) &
    for i in 1 2 3; do ( $B/test_batch_cuda > $OUT/stress/${arm}_r${r}_$i.log 2>&1; echo $? > $OUT/stress/${arm}_r${r}_$i.rc ) & done
    wait
    for i in 1 2 3; do runs=$((runs+1)); [ "$(cat $OUT/stress/${arm}_r${r}_$i.rc)" = 0 ] || fails=$((fails+1)); done
  done
  echo "$arm: $fails of $runs test_batch_cuda runs failed under load ($((SECONDS - t0)) s)"
done
