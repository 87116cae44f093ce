# shellcheck shell=bash disable=SC2154,SC2034  # sourced: $out, $t_start, ... are the caller's
# The steps of tools/gpu-check.sh: each runs one command with a time limit, keeps its
# whole output in $out/<name>.log, appends one line to $out/steps.txt at once (so a
# time-out of the whole script loses nothing), and returns the command's status, so
# that every failing step fails the script. Sourced by gpu-check.sh and by
# tests/tools/gpu_check_lib_test.sh (which runs it without a GPU).
#
# Needs: $out (a folder), $t_start (seconds since the epoch at the start). Optional:
# $gc_budget (seconds the whole check may take: a step gets at most what is left, and
# one that cannot start in time fails as "not run"), $OUT (the device tool's folder:
# steps.txt and results.txt are copied there after every step).

gc_status=0  # 0 while every step passed; 1 once one failed

# Copies what is known so far to $OUT, so that a time-out of the whole run loses nothing.
publish() {
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] || return 0
  [ -f "$out/steps.txt" ] && cp "$out/steps.txt" "$OUT/gpu-check-steps.txt"
  [ -f "$out/results.txt" ] && cp "$out/results.txt" "$OUT/gpu-check-results.txt"
  return 0
}

log() { echo "== $* ($(($(date +%s) - t_start))s)"; }

# step NAME SECONDS CMD...: runs CMD, its output to $out/NAME.log; "NAME ok" or
# "NAME FAILED (exit N)" to $out/steps.txt. Returns CMD's status (124: timed out).
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${gc_budget:-}" ]; then
    local left=$((gc_budget - ($(date +%s) - t_start)))
    if [ "$left" -lt 2 ]; then
      echo "$name FAILED (not run: the ${gc_budget}s budget is spent)" >>"$out/steps.txt"
      log "$name not run: the ${gc_budget}s budget is spent"
      gc_status=1
      publish
      return 125
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  log "$name"
  local t0=$SECONDS rc=0
  timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "$name ok $((SECONDS - t0))s" >>"$out/steps.txt"
  else
    echo "$name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ", timed out after ${limit}s")) $((SECONDS - t0))s" >>"$out/steps.txt"
    echo "gpu-check: $name FAILED (exit $rc); the end of $out/$name.log:"
    tail -20 "$out/$name.log"
    gc_status=1
  fi
  publish
  return "$rc"
}

# skip NAME REASON: a step that cannot run here, said in $out/steps.txt (not a failure).
skip() {
  echo "$1 skipped: $2" >>"$out/steps.txt"
  log "$1 skipped: $2"
  publish
}

# device_test NAME SECONDS CMD...: a GoogleTest program run where a GPU is listed. Its
# tests skip when the CUDA runtime sees no device, and skips exit 0: a driver older than
# the runtime linked in (or a hidden device) would read "ok" with nothing run. Any
# "no CUDA device" skip is a failure here.
device_test() {
  local name=$1
  step "$@" || return $?
  local n
  n=$(grep -c "^no CUDA device" "$out/$name.log")
  [ "$n" -eq 0 ] && return 0
  sed -i "s/^$name ok \(.*\)/$name FAILED (tests skipped: no CUDA device) \1/" "$out/steps.txt"
  echo "gpu-check: $name FAILED: $n skipped with: $(grep -m1 "^no CUDA device" "$out/$name.log")"
  gc_status=1
  publish
  return 1
}

# bench NAME SECONDS CMD...: a step whose output must hold a line "RESULT ..."; the
# RESULT lines go to $out/results.txt, renamed NAME. No RESULT line is a failure too.
bench() {
  local name=$1
  step "$@" || return $?
  if ! grep -q "^RESULT" "$out/$name.log"; then
    echo "$name FAILED (no RESULT line)" >>"$out/steps.txt"
    echo "gpu-check: $name printed no RESULT line"
    gc_status=1
    publish
    return 1
  fi
  grep "^RESULT" "$out/$name.log" | sed "s/^RESULT/$name/" >>"$out/results.txt"
  publish
  grep -v "^RESULT" "$out/$name.log" | tail -5
}
