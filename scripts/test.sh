#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the release build (every test), then
# the sanitizer builds on the tests labelled for them (asan: bad input and memory,
# tsan: the threaded backends).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for preset in release asan tsan; do
  echo "== $preset =="
  scripts/build.sh "$preset"
  ctest --preset "$preset"
done
