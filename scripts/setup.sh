#!/usr/bin/env bash
# Installs the Debian packages baton builds and tests with, skipping those present.
# Idempotent; run as root or with sudo available.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libopenblas-openmp-dev
  libdnnl-dev ocl-icd-opencl-dev    # dnnl-config.cmake requires OpenCL (a Recommends of libdnnl-dev)
  nlohmann-json3-dev libspdlog-dev libfmt-dev zlib1g-dev
  libboost-dev libboost-program-options-dev libboost-system-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libucx-dev ucx-utils
  iproute2 procps python3 python3-dev python3-numpy pybind11-dev
  openmpi-bin libopenmpi-dev
  libsentencepiece-dev
  clang-14 libclang-rt-14-dev libomp-14-dev clang-format-14 clang-tidy-14 lld
  qemu-user                         # tests/tools/cpu_check_test.sh: older CPUs, emulated
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
