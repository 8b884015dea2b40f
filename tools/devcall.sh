# Resumable steps for a script that runs on the GPU machine under the device tool's per-command limit
# (docs/architecture.md, "Running on the GPU machine"). Source it from the call's script:
#
#   . tools/devcall.sh NAME LIMIT_S      markers in /tmp/devcall-NAME, the step log in $OUT/steps.txt
#   if step ctest 120; then (cd gpu-bundle && ctest -L cuda -j8 > $OUT/ctest.txt 2>&1); done_ ctest; fi
#
# `step NAME EST` is true when NAME has not finished in an earlier command on this (warm) machine and
# at least EST seconds of LIMIT_S remain; otherwise it logs why it skipped. `done_ NAME` marks it
# finished. Rerunning the same script in the next command resumes after the finished steps, so one
# script serves a call that a cold start, a slow step or the limit cut short. `left` prints the
# seconds that remain.
DEVCALL_NAME=${1:?devcall.sh: NAME}
DEVCALL_LIMIT=${2:?devcall.sh: LIMIT_S}
DEVCALL_T0=$(date +%s)
DEVCALL_DIR=/tmp/devcall-$DEVCALL_NAME
DEVCALL_LOG=${OUT:-/tmp}/steps.txt
mkdir -p "$DEVCALL_DIR"
left() { echo $(( DEVCALL_LIMIT - ($(date +%s) - DEVCALL_T0) )); }
step() {
    [[ -f $DEVCALL_DIR/$1 ]] && return 1
    if [[ $(left) -lt $2 ]]; then
        echo "$(date -u +%T) skip $1 (left $(left) s < $2)" >> "$DEVCALL_LOG"
        return 1
    fi
    echo "$(date -u +%T) start $1 (left $(left) s)" >> "$DEVCALL_LOG"
}
done_() {
    touch "$DEVCALL_DIR/$1"
    echo "$(date -u +%T) done $1" >> "$DEVCALL_LOG"
}
