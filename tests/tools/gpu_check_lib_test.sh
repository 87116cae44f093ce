#!/usr/bin/env bash
# tools/gpu-check-lib.sh without a GPU: a failing, a timed-out and a silent step each fail
# the check (gc_status 1, a FAILED line in steps.txt), a passing one does not.
set -uo pipefail
src=${1:?usage: gpu_check_lib_test.sh SOURCE_DIR}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
t_start=$(date +%s)
. "$src/tools/gpu-check-lib.sh"
fail() { echo "FAIL: $*"; exit 1; }

step good 10 true >/dev/null || fail "a passing step returned non-zero"
[ $gc_status = 0 ] || fail "a passing step set gc_status"
grep -q "^good ok" "$out/steps.txt" || fail "no 'good ok' line"

bench good-bench 10 sh -c 'echo RESULT tokens 5; echo the log' >/dev/null || fail "a bench with a RESULT failed"
grep -q "^good-bench tokens 5" "$out/results.txt" || fail "the RESULT line was not kept"
[ $gc_status = 0 ] || fail "a passing bench set gc_status"

# The bug this replaces: a failing benchmark whose output was piped through grep | sed.
bench bad-bench 10 sh -c 'echo RESULT tokens 5; exit 3' >/dev/null && fail "a failing bench returned 0"
grep -q "^bad-bench FAILED (exit 3)" "$out/steps.txt" || fail "no FAILED line for the failing bench"
grep -q "^bad-bench" "$out/results.txt" && fail "a failing bench's RESULT was kept"
[ $gc_status = 1 ] || fail "a failing bench left gc_status 0"

gc_status=0
bench silent 10 true >/dev/null && fail "a bench without RESULT returned 0"
[ $gc_status = 1 ] || fail "a bench without RESULT left gc_status 0"

gc_status=0
step slow 1 sleep 5 >/dev/null
rc=$?
[ $rc = 124 ] || fail "a timed-out step returned $rc, expected 124"
grep -q "^slow FAILED (exit 124, timed out after 1s)" "$out/steps.txt" || fail "no time-out line"
[ $gc_status = 1 ] || fail "a timed-out step left gc_status 0"

gc_status=0
skip nccl "one GPU" >/dev/null
[ $gc_status = 0 ] || fail "a skipped step set gc_status"
grep -q "^nccl skipped: one GPU" "$out/steps.txt" || fail "no skip line"
echo "gpu-check-lib: all cases passed"
