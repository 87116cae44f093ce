#!/usr/bin/env bash
# Sets up, builds and runs the demo: trains the tiny GPT on the shipped corpus for a
# short while, the loss falling on screen.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
./build/release/baton version
./build/release/baton train --model examples/models/tiny-gpt.json \
  --data examples/data/licenses.txt --steps 400 --batch 16 --lr 3e-3 --log-every 25
