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
# A test program whose tests skipped for want of a device exits 0: where a GPU is listed,
# that is a failure; other skips are not.
gc_status=0
device_test nodevice 10 sh -c 'echo "[  SKIPPED ] 3 tests"; echo "no CUDA device: cudaErrorInsufficientDriver"' >/dev/null &&
  fail "tests skipped for want of a device passed"
grep -q "^nodevice FAILED (tests skipped: no CUDA device)" "$out/steps.txt" || fail "no FAILED line for the skipped tests"
grep -q "^nodevice ok" "$out/steps.txt" && fail "the skipped tests kept their ok line"
[ $gc_status = 1 ] || fail "tests skipped for want of a device left gc_status 0"
gc_status=0
device_test twogpus 10 sh -c 'echo "needs 2 GPUs, 1 present"' >/dev/null || fail "a skip for two GPUs failed"
grep -q "^twogpus ok" "$out/steps.txt" || fail "no ok line for a program with other skips"
[ $gc_status = 0 ] || fail "a skip for two GPUs set gc_status"
# Results reach $OUT after every step.
OUT=$(mktemp -d)
trap 'rm -rf "$out" "$OUT"' EXIT
step published 10 true >/dev/null
grep -q "^published ok" "$OUT/gpu-check-steps.txt" || fail "steps.txt was not copied to \$OUT"
grep -q "^good-bench" "$OUT/gpu-check-results.txt" || fail "results.txt was not copied to \$OUT"

# The budget: a step gets at most what is left; none starts once it is spent.
gc_status=0
# Four seconds, not two: step() needs two left to start one, and a clock second or
# two may tick between here and its own reading of the clock on a loaded machine.
gc_budget=$(( $(date +%s) - t_start + 4 ))
step capped 30 sleep 20 >/dev/null
[ $? = 124 ] || fail "a step was not cut at the budget"
gc_status=0
gc_budget=1
step late 30 true >/dev/null && fail "a step ran after the budget was spent"
grep -q "^late FAILED (not run: the 1s budget is spent)" "$out/steps.txt" || fail "no 'not run' line"
[ $gc_status = 1 ] || fail "a step not run for the budget left gc_status 0"
# tools/compare-losses.py: equal within the tolerance, a step off, a step missing.
printf '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.5}\n' >"$out/a.jsonl"
printf '{"step": 1, "loss": 5.00001}\n{"step": 2, "loss": 4.50002}\n' >"$out/b.jsonl"
printf '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.6}\n' >"$out/c.jsonl"
printf '{"step": 1, "loss": 5.0}\n' >"$out/d.jsonl"
py=$(command -v /usr/bin/python3 || command -v python3)
cmp_losses() { "$py" "$src/tools/compare-losses.py" "$@" >/dev/null 2>&1; }
cmp_losses "$out/a.jsonl" "$out/b.jsonl" --tol 1e-4 || fail "losses within 1e-4 were called different"
cmp_losses "$out/a.jsonl" "$out/c.jsonl" --tol 1e-4 && fail "losses 0.1 apart were called equal"
cmp_losses "$out/a.jsonl" "$out/c.jsonl" --tol 3e-2 --relative || fail "a 2% difference failed a 3% relative tolerance"
cmp_losses "$out/a.jsonl" "$out/d.jsonl" --tol 1 && fail "a missing step was not noticed"
cmp_losses "$out/a.jsonl" "$out/a.jsonl" --tol 0 --steps 3 && fail "fewer steps than --steps passed"
cmp_losses "$out/nothing.jsonl" "$out/a.jsonl" --tol 1
[ $? = 2 ] || fail "an unreadable file did not exit 2"
# fp16's loss scaling: the steps skipped for overflow counted, the loss falling.
printf '{"step": 1, "loss": 5.0, "skipped": true}
{"step": 2, "loss": 4.7, "skipped": false}
' >"$out/e.jsonl"
cmp_losses "$out/a.jsonl" "$out/e.jsonl" --skipped-at-most 1 --falls || fail "one skipped step and a falling loss failed"
cmp_losses "$out/a.jsonl" "$out/e.jsonl" --skipped-at-most 0 && fail "a skipped step passed --skipped-at-most 0"
printf '{"step": 1, "loss": 5.0}
{"step": 2, "loss": 5.0}
' >"$out/f.jsonl"
cmp_losses "$out/a.jsonl" "$out/f.jsonl" --falls && fail "a loss that did not fall passed --falls"
# A non-finite loss, which baton writes as null: a difference named, not a traceback.
printf '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": null, "skipped": true}\n' >"$out/g.jsonl"
"$py" "$src/tools/compare-losses.py" "$out/a.jsonl" "$out/g.jsonl" --tol 1e-4 >"$out/g.out" 2>&1
[ $? = 1 ] || fail "a null loss did not fail the comparison with exit 1"
grep -q "step 2: 4.500000 vs nan" "$out/g.out" || fail "a null loss was not named by its step: $(cat "$out/g.out")"
cmp_losses "$out/a.jsonl" "$out/g.jsonl" --falls && fail "a last loss of null passed --falls"
cmp_losses "$out/a.jsonl" "$out/b.jsonl" && fail "no check asked for passed"
# A NaN in the reference, and steps only the other has, fail (both had passed).
cmp_losses "$out/g.jsonl" "$out/a.jsonl" --tol 1e-4 && fail "a null reference loss passed"
printf '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.5}\n{"step": 3, "loss": 99}\n' >"$out/h.jsonl"
cmp_losses "$out/a.jsonl" "$out/h.jsonl" --tol 1e-4 && fail "a step only the other has passed"
cmp_losses "$out/a.jsonl" "$out/h.jsonl" --tol 1e-4 --steps 2 || fail "--steps 2 did not compare the first two steps"
# The engine steps without a baton binary, and with one whose train has no --device:
# each listed as skipped with the reason, none failed.
steps=$(cd "$src" && grep -m1 'local names=' tools/gpu-check-engine.sh | sed 's/.*names="//; s/".*//' | wc -w)
[ "$steps" -ge 10 ] || fail "could not read the engine steps' names (found $steps)"
gc_status=0
gc_budget=
(cd "$src" && . tools/gpu-check-engine.sh && GPU_CHECK_BATON='' engine_steps >/dev/null)
[ "$(grep -c "skipped: no baton binary" "$out/steps.txt")" = "$steps" ] || fail "the engine steps were not all skipped without a binary"
printf '#!/bin/sh\necho "usage: baton train --model M --data D"\n' >"$out/old-baton"
chmod +x "$out/old-baton"
(cd "$src" && . tools/gpu-check-engine.sh && GPU_CHECK_BATON="$out/old-baton" engine_steps >/dev/null)
[ "$(grep -c "has no --device yet" "$out/steps.txt")" = "$steps" ] || fail "a baton without --device was not noticed"
grep -q FAILED <(grep -E "^(train|profile|trace|launch|nccl|staged)" "$out/steps.txt") && fail "a skipped engine step counted as failed"
# With the prebuilt engine a missing baton, or one that does not start, is a failure.
(cd "$src" && . tools/gpu-check-engine.sh && prebuilt=1 GPU_CHECK_BATON='' engine_steps >/dev/null)
[ "$(grep -c "^engine-baton FAILED" "$out/steps.txt")" = 1 ] || fail "a prebuilt engine without baton passed"
printf '#!/bin/sh
echo "error while loading shared libraries" >&2
exit 127
' >"$out/broken-baton"
chmod +x "$out/broken-baton"
(cd "$src" && . tools/gpu-check-engine.sh && GPU_CHECK_BATON="$out/broken-baton" engine_steps >/dev/null)
[ "$(grep -c "^engine-baton FAILED" "$out/steps.txt")" = 2 ] || fail "a baton that does not start passed"
echo "gpu-check-lib: all cases passed"
