#!/usr/bin/env bash
# The data-parallel benchmark (docs/benchmarks.md, "Data-parallel replicas on a slow
# link"): one DP=2 plan of the tiny GPT, one replica per host of scripts/two-hosts.sh
# (UCX over TCP through a shaped link), trained the same steps on the same data under
# every `dp_sync` mode and every `optimizer_sharding`, in one run. Per run it prints
# the final loss (and its difference from allreduce's), the median step, the training's
# wall time, the bytes the link carried per step (both directions, from the link devices'
# counters: TCP/IP headers and the rendezvous included), rank 0's measured peak memory,
# and the loss each run had reached at a quarter, a half and all of allreduce's wall time.
# The runs with extra parameter-server ranks (N=1, N=2) put a server on each host beside
# the replica (ranks "aba", "abab"), so half the servers' traffic crosses the link.
#   bench/run_dp_sync.sh [--steps N] [--rate RATE] [--delay MS] [--model FILE] [--out DIR]
#                        [--only REGEX]   (the runs whose names match, beside allreduce)
# Needs root (network namespaces) and build/release/baton (or $BATON, another build to
# compare). --out keeps each run's loss log, progress lines and summary; a failed run keeps
# the whole working folder and says where.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/common.sh
steps=200
rate=100mbit
delay=5
model=examples/models/tiny-gpt.json
out=""
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need_value "$1" $#; steps="$2"; shift 2 ;;
    --rate) need_value "$1" $#; rate="$2"; shift 2 ;;
    --delay) need_value "$1" $#; delay="$2"; shift 2 ;;
    --model) need_value "$1" $#; model="$2"; shift 2 ;;
    --out) need_value "$1" $#; out="$2"; shift 2 ;;
    --only) need_value "$1" $#; only="$2"; shift 2 ;;
    -h|--help) print_usage "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
need_int --steps "$steps" 1
# An invalid regex had made every [[ =~ ]] below false (status 2): all runs but allreduce
# skipped, and exit 0.
if [ -n "$only" ]; then
  rc=0
  [[ "" =~ $only ]] || rc=$?
  [ "$rc" != 2 ] || { echo "--only '$only': not a valid regular expression (bash's =~, POSIX ERE)" >&2; exit 2; }
fi
[ -f "$model" ] || { echo "--model $model: no such file" >&2; exit 2; }
baton="${BATON:-$PWD/build/release/baton}"
[ -x "$baton" ] || { echo "build $baton first" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (scripts/two-hosts.sh)" >&2; exit 2; }
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  export OPENBLAS_CORETYPE=SkylakeX  # docs/kernels.md: OpenBLAS misdetects these VMs
fi
work=$(mktemp -d /tmp/baton-dp-sync.XXXXXX)
id=""
keep=""  # set when a run failed: its output stays for reading
cleanup() {
  [ -n "$id" ] && scripts/two-hosts.sh down --id "$id"
  if [ -n "$out" ]; then mkdir -p "$out" && cp -r "$work"/. "$out"/; fi
  [ -n "$keep" ] || rm -rf "$work"
}
trap cleanup EXIT
cp "$model" "$work/model.json"
data="$PWD/examples/data/licenses.txt"
# Every layer of the model in the one stage, as a range: the plan had named the layers of a
# 2-block GPT, so any other --model failed. The count from the plan baton makes for it.
run_logged "$work/layers.out" "$baton" plan --model "$work/model.json" --devices 1 --dp 1 --pp 1 \
  --tp 1 --schedule 1f1b --micro-batches 1 --batch 1 -o "$work/layers.json"
layers=$(/usr/bin/python3 -c 'import json, sys
l = json.load(open(sys.argv[1]))["stages"][0]["layers"]
print(l[1] if all(isinstance(x, int) for x in l) else len(l))' "$work/layers.json")

# name | plan fields beside the common ones [| each rank's host, scripts/two-hosts.sh
# --hosts: extra parameter-server ranks after the replicas'; default one replica per host]
runs=(
  'allreduce|"dp_sync": "allreduce"'
  'zero1|"optimizer_sharding": "zero1"'
  'zero2|"optimizer_sharding": "zero2"'
  'local-sgd H=8|"dp_sync": {"mode": "local-sgd", "sync_every": 8}'
  'DiLoCo H=8|"dp_sync": {"mode": "local-sgd", "sync_every": 8, "outer_optimizer": "nesterov", "outer_lr": 0.7, "outer_momentum": 0.9}'
  'parameter-server s=0|"dp_sync": {"mode": "parameter-server", "max_staleness": 0}'
  'parameter-server s=2|"dp_sync": {"mode": "parameter-server", "max_staleness": 2}'
  'gossip k=1|"dp_sync": {"mode": "gossip", "peers": 1, "seed": 7}'
  'parameter-server s=0 N=1|"dp_sync": {"mode": "parameter-server", "max_staleness": 0, "ps_ranks": 1}|aba'
  'parameter-server s=0 N=2|"dp_sync": {"mode": "parameter-server", "max_staleness": 0, "ps_ranks": 2}|abab'
  'parameter-server s=2 N=2|"dp_sync": {"mode": "parameter-server", "max_staleness": 2, "ps_ranks": 2}|abab'
)

echo "# machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); link: $rate, ${delay} ms each way"
# The context of a GPT-2 or a LLaMA-family config ("?" for another model: no grep's
# failure ending the script without a word).
ctx=$(grep -oE '"(n_positions|max_position_embeddings)": *[0-9]+' "$model" | grep -oE '[0-9]+$' || true)
echo "# $(basename "$model") ($layers layers), DP=2 (one replica per host), 4 micro-batches of 2 x ${ctx:-?} tokens, AdamW lr 1e-3, $steps steps"

id=$(scripts/two-hosts.sh up --rate "$rate" --delay "$delay")
link_bytes() {
  local total=0 b
  for side in a b; do
    b=$(ip -n "baton$id$side" -s -j link show dev "btv$id$side" |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])')
    total=$((total + b))
  done
  echo "$total"
}

k=0
for r in "${runs[@]}"; do
  name="${r%%|*}"
  fields="${r#*|}"
  hosts=ab
  if [[ "$fields" == *'|'* ]]; then
    hosts="${fields##*|}"
    fields="${fields%|*}"
  fi
  if [ -n "$only" ] && [ "$name" != allreduce ] && ! [[ "$name" =~ $only ]]; then continue; fi
  k=$((k + 1))
  dir="$work/run$k"
  mkdir -p "$dir"
  cat >"$dir/plan.json" <<JSON
{"version": 1, "model": "$work/model.json", "devices": 2,
 "parallel": {"dp": 2, "pp": 1, "tp": 1},
 "batch": {"micro_batch_size": 2},
 "schedule": {"name": "1f1b", "micro_batches": 4},
 "stages": [{"layers": [0, $layers]}],
 $fields}
JSON
  echo "$name" >"$dir/name"
  before=$(link_bytes)
  start=$(date +%s.%N)
  scripts/two-hosts.sh launch --id "$id" -n "${#hosts}" --hosts "$hosts" -- "$baton" train --plan "$dir/plan.json" \
    --data "$data" --steps "$steps" --lr 1e-3 --log-every 1 --loss-log "$dir/loss.jsonl" \
    --summary "$dir/summary.json" >"$dir/out.txt" 2>&1 ||
    { keep=1; echo "$name: failed (its output: $dir/out.txt, kept; the plan beside it)" >&2; tail -n 20 "$dir/out.txt" >&2; exit 1; }
  end=$(date +%s.%N)
  after=$(link_bytes)
  echo "$((after - before)) $start $end" >"$dir/link"
done

/usr/bin/python3 - "$work" "$steps" <<'PY'
import json, os, re, sys
work, steps = sys.argv[1], int(sys.argv[2])
runs = []
for d in sorted((e for e in os.listdir(work) if e.startswith("run")), key=lambda e: int(e[3:])):
    p = os.path.join(work, d)
    name = open(os.path.join(p, "name")).read().strip()
    s = json.load(open(os.path.join(p, "summary.json")))
    losses = [json.loads(l)["loss"] for l in open(os.path.join(p, "loss.jsonl"))]
    ms = [float(m) for m in re.findall(r"([0-9.]+) ms/step", open(os.path.join(p, "out.txt")).read())]
    nbytes, t0, t1 = open(os.path.join(p, "link")).read().split()
    wall = [0.0]
    for m in ms:
        wall.append(wall[-1] + m / 1e3)
    # The first step (warm-up) left out, unless it is the only one; an even count's median
    # is the mean of the middle two, as the other bench scripts take it.
    ms_sorted = sorted(ms[1:] or ms)
    n = len(ms_sorted)
    med = ms_sorted[n // 2] if n % 2 else (ms_sorted[n // 2 - 1] + ms_sorted[n // 2]) / 2
    last = losses[-10:]  # fewer than 10 when there are fewer steps
    runs.append(dict(name=name, losses=losses, final=sum(last) / len(last), med=med,
                     wall=wall[1:], bytes=int(nbytes) / steps,
                     peak=s["ranks"][0]["peak_bytes"] / 2**20))
base = runs[0]
T = base["wall"][-1]
def loss_at(r, t):
    # the loss of the last step finished by wall time t (None: not one yet)
    done = [l for l, w in zip(r["losses"], r["wall"]) if w <= t]
    return "%.4f" % done[-1] if done else "-"
print("| run | final loss (mean of last %d) | vs allreduce | median step (ms) | training wall (s) "
      "| link bytes / step | vs allreduce | rank 0 peak (MiB) | loss at T/4 | T/2 | T |" % min(10, steps))
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in runs:
    print("| %s | %.4f | %+.2f%% | %.1f | %.2f | %.0f KB | %.3f | %.2f | %s | %s | %s |" % (
        r["name"], r["final"], 100 * (r["final"] / base["final"] - 1), r["med"], r["wall"][-1],
        r["bytes"] / 1e3, r["bytes"] / base["bytes"], r["peak"],
        loss_at(r, T / 4), loss_at(r, T / 2), loss_at(r, T)))
print("# T = allreduce's training wall time, %.2f s (sum of its steps' times)" % T)
PY
