#!/usr/bin/env bash
# Sets up, builds and runs the demo: trains the tiny GPT on the shipped corpus (bytes) for
# a short while, the loss falling on screen; then tokenizes the corpus and trains under a
# plan with a learning-rate schedule and held-out evaluation.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release
./build/release/baton version
./build/release/baton train --model examples/models/tiny-gpt.json \
  --data examples/data/licenses.txt --steps 400 --batch 16 --lr 3e-3 --log-every 25
# A real pre-training path on the same corpus: a SentencePiece tokenizer trained here,
# the corpus prepared into Megatron-LM's indexed format (one document per line), and a
# GPT over its 512 pieces trained under a plan (PP=2 x TP=2 x DP=2, 8 processes over UCX)
# with warm-up, cosine decay and the held-out loss of 5% of the documents every 25 steps
# ("val loss" falling), and the measured timeline of the last step.
mkdir -p build/demo
./build/release/baton data train-tokenizer --input examples/data/licenses.txt \
  --out build/demo/sp --vocab-size 512
./build/release/baton data prepare --tokenizer build/demo/sp.model \
  --input examples/data/licenses.txt --out build/demo/corpus --append-eod
./build/release/baton launch -n 8 -- ./build/release/baton train \
  --plan examples/plans/tiny-gpt-sp-pp2-tp2-dp2.json --data build/demo/corpus \
  --eval-fraction 0.05 --eval-every 25 --eval-batches 4 \
  --steps 200 --lr 3e-3 --lr-schedule cosine --warmup-steps 20 --min-lr 3e-4 \
  --log-every 25 --trace timeline.json
./build/release/baton trace svg timeline.json -o timeline.svg
echo "timeline: timeline.json (Perfetto) and timeline.svg"
