#!/usr/bin/env bash
# Token-data throughput: does opening a large dataset stay cheap, and does input loading
# ever hold up a training step?
#   bench/run_data.sh [--gib N] [--steps S]
# Writes an N GiB (default 1) flat uint16 token file of random tokens below config B's
# vocabulary, then
#   1. times `baton data inspect` on it: the memory map and the full scan for the smallest
#      and largest token (the same pass as the vocabulary check `baton train` makes when
#      it opens a dataset), with the file in the page cache and, when run as root, with
#      the page cache dropped first;
#   2. trains GPT config B under a PP=2 plan on it for S steps (default 4), the last two
#      traced (`--trace-steps 2`), and counts the input loader's LOAD events and the
#      forwards that waited for their inputs (INPUT_WAIT) in the measured timeline.
set -euo pipefail
cd "$(dirname "$0")/.."
gib=1
steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --gib) gib="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
baton=build/release/baton
python=/usr/bin/python3  # Debian's, with numpy
[ -x "$baton" ] || { echo "build $baton first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"

"$python" - "$tmp/tokens.bin" "$gib" examples/models/gpt-config-b.json <<'PY'
import json, sys, numpy as np
path, gib = sys.argv[1], float(sys.argv[2])
vocab = json.load(open(sys.argv[3]))["vocab_size"]
n = int(gib * (1 << 30)) // 2
rng = np.random.default_rng(0)
with open(path, "wb") as f:
    for start in range(0, n, 1 << 26):
        rng.integers(0, vocab, size=min(1 << 26, n - start), dtype=np.uint16).tofile(f)
PY
echo "# dataset: $(du -h "$tmp/tokens.bin" | cut -f1), flat uint16"

seconds() { local t0 t1; t0=$(date +%s.%N); "$@" > "$tmp/inspect.out" 2>&1; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
"$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16 > /dev/null  # into the page cache
echo "open + scan, page cache warm: $(seconds "$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16) s"
echo "open + scan, page cache warm: $(seconds "$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16) s"
if [ "$(id -u)" -eq 0 ] && sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; then
  echo "open + scan, page cache dropped: $(seconds "$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16) s"
fi
grep -i 'tokens\|smallest\|largest' "$tmp/inspect.out" | head -3 | sed 's/^/  /'

cp examples/models/gpt-config-b.json "$tmp/model.json"
cat > "$tmp/pp2.json" <<JSON
{"version": 1, "model": "model.json", "devices": 2,
 "parallel": {"dp": 1, "pp": 2, "tp": 1},
 "batch": {"micro_batch_size": 1, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 8},
 "stages": [{"layers": [0, 5]}, {"layers": [5, 10]}]}
JSON
"$baton" launch -n 2 -- "$baton" train --plan "$tmp/pp2.json" --data "$tmp/tokens.bin" \
  --token-dtype uint16 --steps "$steps" --threads 1 --log-every 1 \
  --trace "$tmp/measured.json" --trace-steps 2 > "$tmp/train.out" 2>&1 ||
  { cat "$tmp/train.out"; exit 1; }
"$python" - "$tmp/measured.json" <<'PY'
import json, sys
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
loads = [e for e in ev if e["name"].startswith("LOAD")]
waits = [e for e in ev if e["name"].startswith("INPUT_WAIT")]
fwd = [e for e in ev if e.get("cat") == "F"]
for rank in sorted({e["pid"] for e in ev}):
    l = [e["dur"] for e in loads if e["pid"] == rank]
    w = [e["dur"] for e in waits if e["pid"] == rank]
    f = [e["dur"] for e in fwd if e["pid"] == rank]
    print(f"config B PP=2, last 2 steps, rank {rank}: {len(f)} forwards ({sum(f) / 1e3:.1f} ms), "
          f"{len(l)} LOADs ({sum(l) / 1e3:.2f} ms, longest {max(l, default=0) / 1e3:.3f} ms), "
          f"{len(w)} INPUT_WAITs ({sum(w) / 1e3:.3f} ms)")
PY
grep -o '[0-9.]* ms/step' "$tmp/train.out" | tail -n 2 | tr '\n' ' ' | sed 's/^/step times (last two): /'
echo
