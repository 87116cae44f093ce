#!/usr/bin/env bash
# Token-data throughput: does opening a large dataset stay cheap, and does input loading
# ever hold up a training step?
#   bench/run_data.sh [--gib N] [--steps S]
# Writes an N GiB (default 1) flat uint16 token file of random tokens below config B's
# vocabulary, then
#   1. opens it in `baton train` (the tiny GPT, 3 steps), twice with the file in the page
#      cache and, when run as root, twice with the page cache dropped first: the open's
#      time as baton logs it (the memory map; the check of every token against the
#      vocabulary runs on a thread of its own, stages/data.h), that check's time, the
#      first step's time and the whole process's;
#   2. times `baton data inspect --vocab-size` on it, which scans the file in the foreground
#      (the check, then the smallest and largest token): the scan's own cost;
#   3. trains GPT config B under a PP=2 plan on it for S steps (default 4; the page cache
#      dropped first when root), the last two traced (`--trace-steps 2`), and counts the
#      input loader's LOAD events and the forwards that waited for their inputs
#      (INPUT_WAIT) in the measured timeline.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
gib=1
steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --gib) need_value "$1" $#; gib="$2"; shift 2 ;;
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
# Before the data is written: two steps at least, the last two traced.
need_int --steps "$steps" 2
if ! [[ "$gib" =~ ^[0-9]{1,6}(\.[0-9]{1,9})?$ ]] || [[ "$gib" =~ ^0+(\.0+)?$ ]]; then
  echo "--gib: expected a positive size in GiB like 1 or 0.05, found '$gib'" >&2
  exit 2
fi
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

seconds() {  # prints the command's seconds; its output goes to run.out; returns its status
  local t0 t1 rc=0
  t0=$(date +%s.%N)
  "$@" > "$tmp/run.out" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
  return $rc
}
drop_cache() { [ "$(id -u)" -eq 0 ] && sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
open_in_train() {  # $1: the page cache's state, for the line
  local total opened check first
  total=$(seconds "$baton" train --model examples/models/tiny-gpt.json --data "$tmp/tokens.bin" \
    --token-dtype uint16 --steps 3 --batch 8 --threads 1 --log-every 1) ||
    { cat "$tmp/run.out"; exit 1; }
  opened=$(grep -o 'opened the data in [0-9.]* s' "$tmp/run.out" | grep -o '[0-9.]* s')
  check=$(grep -o 'checked in [0-9.]* s' "$tmp/run.out" | grep -o '[0-9.]* s')
  first=$(grep -o '[0-9.]* ms/step' "$tmp/run.out" | head -n 1)
  echo "baton train, page cache $1: open $opened, vocabulary check $check (background)," \
    "first step $first, process $total s"
}
"$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16 > /dev/null  # into the page cache
open_in_train warm
open_in_train warm
if drop_cache; then
  open_in_train dropped
  drop_cache
  open_in_train dropped
fi
echo "data inspect --vocab-size (foreground scan), page cache warm: $(seconds "$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16 --vocab-size 256) s"
if drop_cache; then
  echo "data inspect --vocab-size (foreground scan), page cache dropped: $(seconds "$baton" data inspect "$tmp/tokens.bin" --token-dtype uint16 --vocab-size 256) s"
fi
grep -i 'opened\|tokens\|ids' "$tmp/run.out" | head -3 | sed 's/^/  /'

cp examples/models/gpt-config-b.json "$tmp/model.json"
cat > "$tmp/pp2.json" <<JSON
{"version": 1, "model": "model.json", "devices": 2,
 "parallel": {"dp": 1, "pp": 2, "tp": 1},
 "batch": {"micro_batch_size": 1, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 8},
 "stages": [{"layers": [0, 5]}, {"layers": [5, 10]}]}
JSON
drop_cache || true
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
