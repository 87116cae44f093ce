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
# The same model under a plan: PP=2 x TP=2 x DP=2, 8 processes over UCX, with the
# measured timeline of the last step.
./build/release/baton launch -n 8 -- ./build/release/baton train \
  --plan examples/plans/tiny-gpt-pp2-tp2-dp2.json --data examples/data/licenses.txt \
  --steps 200 --lr 3e-3 --log-every 20 --trace timeline.json
./build/release/baton trace svg timeline.json -o timeline.svg
echo "timeline: timeline.json (Perfetto) and timeline.svg"
