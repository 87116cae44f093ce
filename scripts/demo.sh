#!/usr/bin/env bash
# Sets up, builds and runs the demo: trains the tiny GPT on the shipped corpus for a
# short while, the loss falling on screen.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
./build/release/baton version
# OpenBLAS 0.3.21 falls back to slow Prescott kernels on AVX-512 CPUs it does not
# recognise (VMs that mask CPUID); name the core type unless the caller did.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX
fi
./build/release/baton train --model examples/models/tiny-gpt.json \
  --data examples/data/licenses.txt --steps 400 --batch 16 --lr 3e-3 --log-every 25
