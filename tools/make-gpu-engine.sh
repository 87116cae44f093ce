#!/usr/bin/env bash
# Makes .gpu-engine/ (engine.tar.xz, about 20 MiB; ENGINE, what it holds; SOURCES, the
# hashes of the files it was built from): baton itself, built here, for tools/gpu-check.sh to run on a GPU
# machine that has CUDA and PyTorch but none of the Debian packages the full build needs
# (Boost, UCX, nlohmann, oneDNN, SentencePiece, ...), so the engine steps (baton train on
# the GPU, baton launch over UCX) run there and the machine's time goes to the GPU, not to
# a build:
#   bin/   baton, the CUDA test programs, test_transport_staged and bench/cuda/gpt_step from
#          a portable release build (build/gpu: no -march=native, sm_90, CUDA and NCCL on);
#          lib/libbaton_kernel_trace.so, the CUPTI tracer (bench/cuda/kernel_trace.cpp)
#   lib/   every shared library they load that is not glibc's, the C++ runtime's or
#          CUDA's (those the GPU machine has, and a second copy would shadow PyTorch's),
#          with UCX's transport modules in lib/ucx (UCX looks for them beside libucs)
# The binaries' old-style RPATH ($ORIGIN/../lib) finds lib/ for them and for their own
# dependencies, so nothing is put on LD_LIBRARY_PATH and Python there is not disturbed.
# Packed with xz (114 MiB of files in 20 MiB) since the device tool carries at most 64 MiB
# with the tree; gpu-check.sh unpacks it into build/gpu-engine.
#   tools/make-gpu-engine.sh            # configures and builds build/gpu if needed
set -euo pipefail
# No arguments (settings are environment variables): --help had started the real work.
case "${1-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -/{/^set -/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "make-gpu-engine: takes no arguments, found '$1' (settings are environment variables: --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
[ "$(uname -m)" = x86_64 ] || { echo "make-gpu-engine: the GPU machines are x86-64" >&2; exit 1; }
command -v patchelf >/dev/null || { echo "make-gpu-engine: apt-get install patchelf" >&2; exit 1; }
build=${GPU_ENGINE_BUILD:-build/gpu}
out=build/gpu-engine  # staged here, then packed into .gpu-engine/
targets=(baton test_cuda_memory test_nccl_logic test_mixed_precision test_cuda_ops test_nccl
  test_transport_staged gpt_step)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_ARCH=x86-64-v3 -DBATON_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_ARCH:-90}" -DBATON_WERROR=ON >/dev/null
fi
grep -q "BATON_ARCH:STRING=x86-64-v3" "$build/CMakeCache.txt" ||
  { echo "make-gpu-engine: $build's kernels are not built with -march=x86-64-v3; the GPU machine's CPU may lack their instructions" >&2; exit 1; }
cmake --build "$build" --target "${targets[@]}" baton_kernel_trace

rm -rf "$out" .gpu-engine
mkdir -p "$out/bin" "$out/lib/ucx" .gpu-engine
for t in "${targets[@]}"; do
  f=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  [ -n "$f" ] || { echo "make-gpu-engine: no $t in $build" >&2; exit 1; }
  cp "$f" "$out/bin/"
  strip --strip-debug "$out/bin/$t"
done
# The CUPTI tracer (bench/cuda/kernel_trace.cpp), loaded with LD_PRELOAD: a library, in lib/.
cp "$build/bench/cuda/libbaton_kernel_trace.so" "$out/lib/"
# What the GPU machine has: glibc, the C++ and GCC runtimes, the CUDA libraries (cuBLAS
# from its toolkit, cuDNN, NCCL and CUPTI from PyTorch's wheels; gpu-check.sh finds them).
system='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|libcudart|libcublas|libcublasLt|libcudnn.*|libnccl|libcuda|libcupti)\.so'
copy_deps() {
  ldd "$1" | awk '/=> \// { print $1, $3 }' | while read -r name path; do
    [[ "$name" =~ $system ]] && continue
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done
}
for b in "$out"/bin/*; do copy_deps "$b"; done
ucx_modules=$(dirname "$(ldconfig -p | awk '/libucs.so.0 / { print $NF; exit }')")/ucx
for m in "$ucx_modules"/libuct_*.so.0; do
  name=$(basename "$m")
  # The InfiniBand and RDMA-CM transports need verbs libraries and devices the GPU
  # machine lacks; UCX skips a module that fails to load, but only shared memory and
  # TCP are wanted there.
  case $name in libuct_ib* | libuct_rdmacm*) continue ;; esac
  cp -L "$m" "$out/lib/ucx/$name"
  copy_deps "$m"
done
for b in "$out"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$b"; done
for l in "$out"/lib/*.so*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$l"; done
for l in "$out"/lib/ucx/*.so*; do patchelf --force-rpath --set-rpath '$ORIGIN/..' "$l"; done
{
  echo "made $(date -u +%FT%TZ) on $(uname -n) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo '+changes')"
  echo "build $build ($(grep -E '^CMAKE_CUDA_ARCHITECTURES' "$build/CMakeCache.txt"))"
  echo "libraries: $(cd "$out/lib" && ls | tr '\n' ' ')"
} >.gpu-engine/ENGINE
# The sources the binaries are built from, hashed file by file: gpu-check.sh refuses an
# engine older than the tree it runs in (the device machine gets the tree, not .git).
git ls-files -z -- CMakeLists.txt CMakePresets.json cmake memory kernels transport stages \
  schedule partitioner engine tools bench tests ':!*.md' ':!*.sh' ':!*.py' ':!tests/fixtures' |
  xargs -0 sha256sum >.gpu-engine/SOURCES
tar -C "$out" -cf - bin lib | xz -T0 -6 >.gpu-engine/engine.tar.xz
echo "make-gpu-engine: $(du -sh "$out" | cut -f1) in .gpu-engine/engine.tar.xz, $(du -sh .gpu-engine/engine.tar.xz | cut -f1)"
