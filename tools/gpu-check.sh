#!/usr/bin/env bash
# The GPU check, in one go on a machine with one CUDA GPU (designed for one H200 inside
# 8 minutes, build included): builds the CUDA backend from the source tree and the
# bundle (tools/make-gpu-bundle.sh), runs every CUDA op against the CPU backend (f32
# within 1e-4, bf16 and f16 within 1e-2 of the largest reference value), the memory and
# NCCL tests, then trains GPT-2 124M for a fixed number of steps with baton and with
# PyTorch eager and torch.compile (same model, precision and batch) and prints tokens/s
# and MFU side by side; then the engine steps (baton train on the GPU against the CPU,
# GPT-2 124M through baton train, PP=2 on one GPU over UCX, the NCCL plans on 2+ GPUs)
# when a full baton binary with --device is at hand (GPU_CHECK_BATON), else they are
# listed as skipped with the reason. Every step's line goes to steps.txt as it ends
# (and to $OUT); the exit status is 0 only when every step that ran passed.
#
#   tools/gpu-check.sh            # everything
#   GPU_CHECK_COMPILE=0 ...       # without torch.compile (saves about a minute)
#   GPU_CHECK_BATON=build/release/baton  # the engine steps with this binary
#   GPU_CHECK_BUDGET=470          # seconds for the whole check (steps past it fail as not run)
#   GPU_CHECK_TRACES=baton        # the kernel traces of baton only (all: PyTorch's too, about 45 s)
#   GPU_CHECK_MODEL="--layers 12 --hidden 768 --heads 12 --ctx 1024 --batch 8 --vocab 50304"
# With .gpu-engine/ (tools/make-gpu-engine.sh: baton, the test programs and the benchmark
# built here, portable, with the libraries the GPU machine lacks) nothing is built there:
# the programs run from its unpacked bin/ and GPU_CHECK_BATON defaults to its baton, so
# the engine steps run too. Without it, .gpu-bundle/ builds the tests and the benchmark there.
# Logs and a summary go to build/gpu-check/out; with the device tool's $OUT set, the
# summary and a tarball of the logs are copied there too (it returns at most 8 files).
set -uo pipefail
# No arguments (settings are environment variables): --help had started the real work.
case "${1-}" in
  "") ;;
  -h|--help) sed -n '2,/^set -/{/^set -/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  *) echo "gpu-check: takes no arguments, found '$1' (settings are environment variables: --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.." || exit 1
t_start=$(date +%s)
build=build/gpu-check
out=$build/out
rm -rf "$out"
mkdir -p "$out"
. tools/gpu-check-lib.sh  # log, step, bench, skip, publish; gc_status
gc_budget=${GPU_CHECK_BUDGET:-470}
die() { echo "gpu-check: $*" >&2; exit 1; }

# ---- what the machine has ----
log "machine"
gpu=0  # how many GPUs
if nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c .)
else
  echo "gpu-check: NO GPU here: the build and the CPU-side tests run, the GPU tests skip, the benchmarks do not run"
fi
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || die "no nvcc (set CUDACXX)"
cuda_root=$(cd "$(dirname "$nvcc")/.." && pwd)
"$nvcc" --version | tail -1
cmake --version | head -1
c++ --version | head -1
prebuilt=0
if [ -f .gpu-engine/engine.tar.xz ]; then
  prebuilt=1
  cat .gpu-engine/ENGINE
  # An engine built from other sources than this tree's would prove old code.
  [ -f .gpu-engine/SOURCES ] || die ".gpu-engine has no SOURCES: remake it (tools/make-gpu-engine.sh)"
  if ! changed=$(sha256sum --quiet -c .gpu-engine/SOURCES 2>&1); then
    echo "$changed" | head -20
    die ".gpu-engine was built from other sources than these (above): remake it (tools/make-gpu-engine.sh)"
  fi
  rm -rf build/gpu-engine && mkdir -p build/gpu-engine
  tar -C build/gpu-engine -xJf .gpu-engine/engine.tar.xz 2>/dev/null ||
    "${PYTHON:-python3}" -c "import tarfile, sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
      .gpu-engine/engine.tar.xz build/gpu-engine || die "cannot unpack .gpu-engine/engine.tar.xz"
else
  [ -f .gpu-bundle/BUNDLE ] || die "neither .gpu-engine/ (tools/make-gpu-engine.sh) nor .gpu-bundle/ (tools/make-gpu-bundle.sh): make one where the Debian packages are, and carry it"
  cat .gpu-bundle/BUNDLE
fi
ls "$cuda_root"/lib64/libcublasLt.so* >/dev/null 2>&1 || ls "$cuda_root"/lib/libcublasLt.so* >/dev/null 2>&1 ||
  die "no cuBLAS under $cuda_root (the CUDA toolkit's cuBLAS is needed)"
py=${PYTHON:-python3}
if torch_info=$("$py" -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())" 2>/dev/null); then
  echo "torch $torch_info (version, CUDA, GPU available)"
else
  torch_info=none
  echo "gpu-check: $py cannot import torch; the PyTorch comparison will be skipped"
fi
# NCCL: the toolkit's, else the one pip installed beside PyTorch.
if [ -z "${NCCL_HOME:-}" ] && ! ls "$cuda_root"/lib64/libnccl.so* >/dev/null 2>&1; then
  nccl_pip=$("$py" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])" 2>/dev/null)
  [ -n "$nccl_pip" ] && export NCCL_HOME=$nccl_pip && echo "NCCL from $NCCL_HOME"
fi
# cuDNN (its fused attention is one of the implementations compared): the toolkit's,
# else pip's nvidia.cudnn beside PyTorch; without it the cudnn rows say "not built".
if [ -z "${CUDNN_HOME:-}" ] && ! ls "$cuda_root"/include/cudnn_graph.h >/dev/null 2>&1; then
  cudnn_pip=$("$py" -c "import nvidia.cudnn, os; print(list(nvidia.cudnn.__path__)[0])" 2>/dev/null)
  [ -n "$cudnn_pip" ] && export CUDNN_HOME=$cudnn_pip && echo "cuDNN from $CUDNN_HOME"
fi
# The libraries the binaries load from the machine: cuBLAS from the toolkit, NCCL and
# cuDNN from wherever they were found (PyTorch uses the same ones; cuBLAS and cuDNN are
# opened at run time, from these folders too).
for d in "${CUDNN_HOME:-}" "${NCCL_HOME:-}"; do
  [ -n "$d" ] && [ -d "$d/lib" ] && export LD_LIBRARY_PATH="$d/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
for d in "$cuda_root/lib64" "$cuda_root/lib"; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done

if [ $prebuilt = 1 ]; then
  # Built here with its libraries (their RPATH finds them): nothing to build.
  bin=$PWD/build/gpu-engine/bin
  export GPU_CHECK_BATON=${GPU_CHECK_BATON:-$bin/baton}
  # A CUDA library still missing (pip's wheels differ in layout): look for it beside Python.
  # The tracer's CUPTI is looked for too, but a tracer that cannot load only skips its steps.
  # cuBLAS and cuDNN are opened at run time (dlopen), so ldd does not list them: their names
  # are read from the program and each tried as the program will open it.
  dlopened() { grep -aoE 'lib(cudnn|cublasLt|cublas)\.so\.[0-9]+' "$bin/gpt_step" | sort -u; }
  unloadable() {
    for n in $(dlopened); do
      "$py" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$n" 2>/dev/null || echo "$n"
    done
  }
  missing() { { for b in "$bin"/* "$@"; do ldd "$b" | awk '/not found/ { print $1 }'; done; unloadable; } | sort -u; }
  site=$("$py" -c "import site; print(' '.join(site.getsitepackages()))" 2>/dev/null)
  for name in $(missing "$bin/../lib/libbaton_kernel_trace.so"); do
    found=$(find $site "$cuda_root" -name "$name" 2>/dev/null | head -n 1)
    [ -n "$found" ] && echo "$name from $(dirname "$found")" && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}:$(dirname "$found")"
  done
  [ -z "$(missing)" ] || die "libraries not found for .gpu-engine's programs: $(missing | tr '\n' ' ')"
  dlopened | grep -q "libcudnn" && cudnn_built=1 || cudnn_built=0
  test_bin() { echo "$bin/$1"; }
else
  # The bundled OpenBLAS and its Fortran runtime (the binaries' RPATH names them too).
  export LD_LIBRARY_PATH="$PWD/.gpu-bundle/openblas/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # ---- build: only the GPU check's targets, sm_90 only ----
  log "configure"
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$build" "${gen[@]}" -DBATON_GPU_CHECK=ON -DBATON_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_ARCH:-90}" -DBATON_WERROR=OFF \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 \
    >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; die "configure failed ($out/configure.log)"; }
  grep -E "baton:" "$out/configure.log"
  grep -q "cuDNN /" "$out/configure.log" && cudnn_built=1 || cudnn_built=0
  log "build"
  cmake --build "$build" -j "$(nproc)" --target test_cuda_memory test_nccl_logic test_mixed_precision test_cuda_ops test_nccl gpt_step \
    >"$out/build.log" 2>&1 || { grep -E "error" -A3 "$out/build.log" | head -40; die "build failed ($out/build.log)"; }
  bin=$PWD/$build/bench/cuda
  test_bin() { echo "$build/tests/cuda/$1"; }
fi

# ---- correctness ----
: >"$out/steps.txt"
for t in test_cuda_memory test_nccl_logic test_mixed_precision test_cuda_ops test_nccl; do
  if [ "$gpu" = 0 ]; then step "$t" 180 "$(test_bin "$t")" --gtest_brief=1
  else device_test "$t" 180 "$(test_bin "$t")" --gtest_brief=1; fi
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^op \(dtype\)|\((f16|f32|bf16)\) +[0-9]|Failure|expected|Which is" "$out/$t.log" | head -120
done

if [ $gpu = 0 ]; then
  cat "$out/steps.txt"
  log "done without a GPU: status $gc_status (1: a step failed; 3: all passed, nothing ran on a GPU)"
  [ $gc_status = 0 ] && exit 3
  exit 1
fi

# ---- the engine on the GPU: baton train, baton launch ----
# Needs a full baton binary (.gpu-engine's, or GPU_CHECK_BATON; the bundle's build makes
# only the CUDA tests and the benchmark). Before the benchmarks: they matter less.
: >"$out/results.txt"
. tools/gpu-check-engine.sh
engine_steps

# ---- GPT-2 124M, one training step: baton and PyTorch, same model, precision and batch ----
# The most important rows first: the budget cuts from the end.
model=${GPU_CHECK_MODEL:-"--layers 12 --hidden 768 --heads 12 --ctx 1024 --batch 8 --vocab 50304"}
small="--layers 8 --hidden 512 --heads 8 --ctx 256 --batch 8 --vocab 256"
have_torch=0
[[ "$torch_info" == *True ]] && have_torch=1
# Each bench's status counts (gc_status): a failing benchmark fails the check.
bench baton-bf16 240 "$bin/gpt_step" $model --dtype bf16 --steps 20 --warmup 5
if [ $have_torch = 1 ]; then
  bench pytorch-bf16 240 "$py" bench/pytorch/gpt_step.py $model --dtype bf16 --steps 20 --warmup 5
  if [ "${GPU_CHECK_COMPILE:-1}" = 1 ]; then
    bench pytorch-compile-bf16 300 "$py" bench/pytorch/gpt_step.py $model --dtype bf16 --compile 1 --steps 20 --warmup 10
  else
    skip pytorch-compile-bf16 "GPU_CHECK_COMPILE=0"
  fi
else
  skip pytorch "torch cannot be imported or sees no GPU: $torch_info"
fi
bench baton-bf16-cublas-attn 240 "$bin/gpt_step" $model --dtype bf16 --steps 10 --warmup 3 --attention cublas
# cuDNN's fused attention forward and backward forced, against automatic (baton-bf16,
# which takes both where they apply since the second H200 session; docs/cuda.md).
if [ $cudnn_built = 1 ]; then
  bench baton-bf16-cudnn-attn 240 "$bin/gpt_step" $model --dtype bf16 --steps 10 --warmup 3 --attention cudnn
else
  skip baton-bf16-cudnn-attn "built without cuDNN (set CUDNN_HOME)"
fi
bench baton-f32 240 "$bin/gpt_step" $small --dtype f32 --steps 20 --warmup 5
[ $have_torch = 1 ] && bench pytorch-f32 240 "$py" bench/pytorch/gpt_step.py $small --dtype f32 --steps 20 --warmup 5

# ---- the GPU's own timeline of a step: baton train, gpt_step, PyTorch ----
# CUPTI's records (bench/cuda/kernel_trace.cpp, through LD_PRELOAD) of a few steps of each,
# summarised per step (bench/cuda/kernel_trace_summary.py): busy and idle time, the host's
# waits, the kernels by time. The CSVs go to the logs' tarball.
tracer=$PWD/build/gpu-engine/lib/libbaton_kernel_trace.so
if [ $prebuilt = 1 ] && [ -f "$tracer" ] && ! ldd "$tracer" | grep -q "not found"; then
  ktrace() {  # NAME CMD...: CMD under the tracer, then the summary in NAME-summary.log
    local name=$1
    shift
    step "$name" 150 env BATON_KERNEL_TRACE="$out/$name.csv" LD_PRELOAD="$tracer" "$@" &&
      step "$name-summary" 30 "$py" bench/cuda/kernel_trace_summary.py "$out/$name.csv" --skip 4 &&
      head -40 "$out/$name-summary.log"
  }
  ktrace ktrace-baton-train "${GPU_CHECK_BATON}" train --model "$out/engine/gpt2-124m.json" \
    --data examples/data/licenses.txt --steps 12 --batch 8 --device cuda --precision bf16 --log-every 6
  ktrace ktrace-gpt-step "$bin/gpt_step" $model --dtype bf16 --steps 8 --warmup 4
  if [ $have_torch = 1 ] && [ "${GPU_CHECK_TRACES:-all}" = all ]; then
    ktrace ktrace-pytorch "$py" bench/pytorch/gpt_step.py $model --dtype bf16 --steps 8 --warmup 4
    [ "${GPU_CHECK_COMPILE:-1}" = 1 ] &&
      ktrace ktrace-pytorch-compile "$py" bench/pytorch/gpt_step.py $model --dtype bf16 --compile 1 --steps 8 --warmup 6
  fi
else
  skip kernel-traces "no CUPTI tracer (build/gpu-engine/lib/libbaton_kernel_trace.so, or its libcupti)"
fi

log "summary (MFU: model FLOPs / 989 TFLOP/s, the H200's dense bf16 peak, for every row)"
# Every baton row (gpt_step, the engine) against PyTorch in its precision, eager and compiled.
awk '{ r[$1] = $5; ms[$1] = $7; mfu[$1] = $9; order[n++] = $1 }
  function ratio(k, peer) { return (k ~ /^baton/ && (peer in r) && r[peer] > 0) ? sprintf("%.2fx", r[k] / r[peer]) : "" }
  END {
    printf "%-24s %14s %10s %8s %16s %16s\n", "run", "tokens/s", "step ms", "MFU", "baton / eager", "baton / compile"
    for (i = 0; i < n; i++) {
      k = order[i]; prec = (k ~ /f32/) ? "f32" : "bf16"; eager = "pytorch-" prec; comp = "pytorch-compile-" prec
      printf "%-24s %14.0f %10.3f %7.1f%% %16s %16s\n", k, r[k], ms[k], 100 * mfu[k], ratio(k, eager), ratio(k, comp)
    }
  }' "$out/results.txt" | tee "$out/summary.txt"
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  cp "$out/summary.txt" "$OUT/gpu-check-summary.txt"
  cp "$out/steps.txt" "$OUT/gpu-check-steps.txt"
  tar -C "$build" -czf "$OUT/gpu-check-logs.tar.gz" out
fi
cat "$out/steps.txt"
log "done: status $gc_status"
exit $gc_status
