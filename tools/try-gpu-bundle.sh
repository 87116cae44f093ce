#!/usr/bin/env bash
# Tries tools/gpu-check.sh on this machine as a GPU machine would see it (its build path
# with .gpu-bundle, or .gpu-engine's prebuilt programs when that is there):
# in a private mount namespace (root), the Debian packages the bundle replaces are hidden
# (GoogleTest, OpenBLAS and its Fortran runtime, BLAS, Boost, spdlog, fmt, nlohmann/json,
# UCX, Google Benchmark), then gpu-check.sh runs; without a GPU it builds, the tests
# skip, and the benchmarks say there is no device.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .gpu-bundle/BUNDLE ] || [ -f .gpu-engine/ENGINE ] || tools/make-gpu-bundle.sh
exec unshare -m --propagation private bash -c '
  set -e
  empty=$(mktemp -d)
  lib=/usr/lib/x86_64-linux-gnu
  for d in /usr/include/gtest /usr/include/gmock /usr/src/googletest $lib/cmake/GTest \
           $lib/openblas-openmp $lib/openblas-pthread /usr/include/x86_64-linux-gnu/openblas-openmp \
           /usr/include/x86_64-linux-gnu/openblas-pthread /usr/include/boost /usr/include/spdlog \
           /usr/include/fmt /usr/include/nlohmann /usr/include/ucp /usr/include/benchmark \
           $lib/blas $lib/lapack; do
    [ -d "$d" ] && mount --bind "$empty" "$d"
  done
  for f in $lib/libgtest.a $lib/libgtest_main.a $lib/libopenblas.so $lib/libopenblas.so.0 \
           $lib/libspdlog.so $lib/libfmt.so $lib/libboost_program_options.so \
           $lib/libblas.so $lib/libblas.so.3 $lib/libgfortran.so.5 $lib/libquadmath.so.0 \
           /usr/include/x86_64-linux-gnu/cblas.h /usr/include/cblas.h; do
    [ -e "$f" ] && mount --bind /dev/null "$f"
  done
  # What .gpu-engine carries, hidden too, so its binaries must find their own copies.
  if [ -d build/gpu-engine/lib ]; then
    for l in build/gpu-engine/lib/*.so* build/gpu-engine/lib/ucx/*.so*; do
      n=$(basename "$l")
      for f in $lib/$n $lib/ucx/$n; do [ -e "$f" ] && mount --bind /dev/null "$f"; done
    done
  fi
  echo "try-gpu-bundle: system packages hidden; running tools/gpu-check.sh"
  tools/gpu-check.sh
'
