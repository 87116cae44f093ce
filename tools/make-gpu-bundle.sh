#!/usr/bin/env bash
# Makes .gpu-bundle/: what tools/gpu-check.sh needs on a GPU machine that has CUDA, CMake,
# a C++ compiler and PyTorch but no Debian packages and no network. Run it here (where
# scripts/setup.sh installed the packages); the device tool carries the folder (ignored
# by git) beside the source tree:
#   GoogleTest's sources (built there), OpenBLAS's OpenMP build with the Fortran runtime
#   it links (libgfortran, libquadmath) and its headers, spdlog's and fmt's headers (used
#   header-only there), and nccl.h (pip's NCCL may come without it). About 44 MiB.
set -euo pipefail
# No arguments: --help had deleted and remade the bundle.
case "${1-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -/{/^set -/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "make-gpu-bundle: takes no arguments, found '$1' (--help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
out=.gpu-bundle
arch=$(uname -m)
if [ "$arch" != x86_64 ]; then
  echo "make-gpu-bundle: the GPU machines are x86-64; this machine is $arch" >&2
  exit 1
fi
need() { [ -e "$1" ] || { echo "make-gpu-bundle: $1 is missing ($2)" >&2; exit 1; }; }
lib=/usr/lib/x86_64-linux-gnu
need /usr/src/googletest/CMakeLists.txt "apt-get install libgtest-dev"
need $lib/openblas-openmp/libopenblas.so.0 "apt-get install libopenblas-openmp-dev"
need /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h "apt-get install libopenblas-openmp-dev"
need /usr/include/spdlog/spdlog.h "apt-get install libspdlog-dev"
need /usr/include/fmt/format-inl.h "apt-get install libfmt-dev"
nccl_h=""
for d in /usr/local/cuda/include /usr/include; do [ -e $d/nccl.h ] && nccl_h=$d/nccl.h && break; done

rm -rf "$out"
mkdir -p "$out/openblas/lib" "$out/openblas/include" "$out/nccl/include" "$out/include"
cp -r /usr/src/googletest "$out/googletest"
cp -L $lib/openblas-openmp/libopenblas.so.0 "$out/openblas/lib/"
for l in libgfortran.so.5 libquadmath.so.0; do cp -L "$lib/$l" "$out/openblas/lib/"; done
cp /usr/include/x86_64-linux-gnu/openblas-openmp/*.h "$out/openblas/include/"
cp -r /usr/include/spdlog /usr/include/fmt "$out/include/"
[ -n "$nccl_h" ] && cp "$nccl_h" "$out/nccl/include/"
{
  echo "made $(date -u +%FT%TZ) on $(uname -n)"
  echo "googletest $(dpkg-query -W -f='${Version}' libgtest-dev 2>/dev/null || echo '?')"
  echo "openblas $(dpkg-query -W -f='${Version}' libopenblas0-openmp 2>/dev/null || echo '?')"
  echo "spdlog $(dpkg-query -W -f='${Version}' libspdlog-dev 2>/dev/null || echo '?') fmt $(dpkg-query -W -f='${Version}' libfmt-dev 2>/dev/null || echo '?')"
  echo "nccl.h ${nccl_h:-none}"
} > "$out/BUNDLE"
du -sh "$out" | awk '{print "make-gpu-bundle: " $2 " " $1}'
