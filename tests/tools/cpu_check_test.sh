#!/usr/bin/env bash
# The start-up CPU check (tools/cpu_check.cpp) on CPUs QEMU emulates: one without the
# instruction sets the kernels were built for must stop with exit 1 naming them, before
# any kernel runs (it had died of SIGILL in the first GEMM); the build machine's own CPU
# runs. Usage: cpu_check_test.sh BATON "FEATURES" (BATON_ARCH_FEATURES from CMake).
set -euo pipefail
baton=$1
features=$2
qemu=$(command -v qemu-x86_64 || true)
[ -n "$qemu" ] || { echo "cpu_check_test: qemu-x86_64 missing (scripts/setup.sh installs qemu-user)" >&2; exit 1; }
fail() { echo "cpu_check_test: $*" >&2; exit 1; }

# Each emulated CPU and the build features it lacks (QEMU's models: qemu64 is x86-64
# without AVX; Haswell has AVX2 and FMA, no AVX-512).
for cpu in qemu64 Haswell; do
  case $cpu in
    qemu64) has="" ;;
    Haswell) has="avx avx2 fma bmi bmi2 popcnt sse4.2" ;;
  esac
  lacks=()
  for f in $features; do
    case " $has " in *" $f "*) ;; *)
      # Features the check does not know (tools/cpu_check.cpp's table) are not named.
      case $f in avx|avx2|fma|bmi|bmi2|popcnt|sse4.2|avx512*|gfni|vpclmulqdq) lacks+=("$f") ;; esac ;;
    esac
  done
  set +e
  out=$("$qemu" -cpu "$cpu" "$baton" simulate --schedule 1f1b --stages 2 --micro-batches 2 2>&1)
  rc=$?
  set -e
  if [ ${#lacks[@]} -eq 0 ]; then
    [ $rc -eq 0 ] || fail "$cpu has every build feature ($features) but baton exited $rc: $out"
    echo "$cpu: runs (has every build feature)"
    continue
  fi
  [ $rc -eq 1 ] || fail "$cpu lacks ${lacks[*]}: expected exit 1, found $rc: $out"
  case "$out" in *"this CPU lacks ${lacks[*]};"*) ;; *)
    fail "$cpu: expected 'this CPU lacks ${lacks[*]};' in: $out" ;;
  esac
  echo "$cpu: refused, lacks ${lacks[*]}"
done
# The machine's own CPU: the features were listed from its compiler for it.
"$baton" version >/dev/null || fail "baton version failed on the build machine"
echo "cpu_check_test: ok"
