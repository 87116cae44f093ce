#!/usr/bin/env bash
# `baton plan` and `baton profile` end to end: exit codes (0 fine, 2 bad input or a plan
# that does not fit), the example plans, a searched plan that --check accepts, measured
# costs, and the message when nothing fits.
# Profiles time at one thread: the suite runs two tests at once, and a profile at every
# core beside another test can fail its load check ("the machine's load changed").
set -u
baton="$1"
root="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$(dirname "$0")/../cli_helpers.sh"

for f in "$root"/examples/plans/*.json; do
  expect 0 "$baton" plan --check "$f"
  contains "valid plan"
  contains "predicted step time"
done

# A search writes a plan; --check reads it back.
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 4 --device-memory 64MiB \
  --batch 8 --out "$tmp/plan.json"
contains "best plan:"
contains "wrote $tmp/plan.json"
expect 0 "$baton" plan --check "$tmp/plan.json"
contains "valid plan"
# Without a cost file the times are analytic, and each command says at what rate.
contains "times from FLOPs at a nominal 50 GFLOP/s per device (--flops); \`baton profile\` measures"
expect 0 "$baton" trace predict --plan "$tmp/plan.json" --flops 2e11
contains "times from FLOPs at a nominal 200 GFLOP/s per device"

# A billion parameters read as such (TinyLlama 1.1B's Hugging Face config).
cat > "$tmp/tinyllama.json" <<'JSON'
{"model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 32,
 "num_hidden_layers": 22, "num_key_value_heads": 4, "max_position_embeddings": 2048,
 "vocab_size": 32000, "tie_word_embeddings": false, "hidden_act": "silu"}
JSON
expect 0 "$baton" plan --model "$tmp/tinyllama.json" --devices 8 --batch 16 --device-memory 8GiB
contains "(24 layers, 1.10 B parameters) on 8 devices"

# Fixed degrees and schedule.
expect 0 "$baton" plan --model "$root/examples/models/gpt-config-a.json" --devices 8 --tp 2 --pp 2 --dp 2 \
  --schedule zb-h1 --micro-batches 4 --batch 16 --recompute off
contains "dp 2 x pp 2 x tp 2; schedule zb-h1, 4 micro-batches of 2 samples"

# dp_sync: the search writes the mode into its plan, --check prints its traffic; a bad
# value names the flag and what was expected.
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --pp 1 --tp 1 \
  --batch 8 --dp-sync '{"mode": "local-sgd", "sync_every": 8}' --out "$tmp/local.json"
expect 0 "$baton" plan --check "$tmp/local.json"
contains "data-parallel sync local-sgd every 8 steps, outer optimizer average"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --batch 8 \
  --dp-sync ring
contains "--dp-sync: \$: expected \"allreduce\", \"local-sgd\", \"gossip\" or \"parameter-server\", found \"ring\""
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --pp 1 --tp 1 \
  --batch 8 --dp-sync '{"mode": "parameter-server", "max_staleness": 1}' --out "$tmp/ps.json"
expect 0 "$baton" plan --check "$tmp/ps.json"
contains "data-parallel sync parameter-server with staleness 1"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --batch 8 \
  --dp-sync '{"mode": "parameter-server", "max_staleness": 1}' --optimizer-sharding zero1
contains "--dp-sync: \"parameter-server\" shards the optimizer state over its servers itself"

# Options that rule every plan out say which and why, before any search or after it.
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 4 --tp 3
contains "--tp: expected a divisor of the 4 devices, found 3"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --layers-per-stage 6
contains "--layers-per-stage: expected counts that add up to the model's 4 layers, found 6"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --layers-per-stage 2,,2
contains "--layers-per-stage '2,,2': an empty item"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --schedule 1f1b,
contains "--schedule '1f1b,': an empty item"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --micro-batches 3
contains "no plan matches the options (dp 2: 3 micro-batches do not divide a replica's batch of 8; 1 more reason with --log-level debug)"
# Batches past 2^31 and up to 2^63 - 1 are searched in moments (the divisors had been
# found by a loop to the batch, and 2^32 micro-batches narrowed to 0 divided by zero);
# plans stay within the plan format (at most 2^24 samples a micro-batch), or say why not.
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --batch 4294967296 -o "$tmp/huge.json"
expect 0 "$baton" plan --check "$tmp/huge.json"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --batch 9223372036854775807
contains "no plan matches the options (dp 1: a replica's batch of 9223372036854775807 samples: more than 1048576 (the schedules' limit) micro-batches of at most 16777216 samples (the plan format's limit) cannot hold it"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --batch 33554432 --micro-batches 1 -o "$tmp/big.json"
contains "in 1 micro-batches: expected micro-batches of at most 16777216 samples (the plan format's limit), found 33554432"
[ ! -e "$tmp/big.json" ] || { echo "FAIL: a plan the format refuses was written"; fails=$((fails + 1)); }

# Nothing fits: which rank is short and by how much; exit 2.
expect 2 "$baton" plan --model "$root/examples/models/gpt-config-a.json" --devices 2 --device-memory 4MiB --batch 8
contains "no plan fits in 4.00 MiB per device; the closest is"
contains "over its capacity"

# One extra parameter-server rank holds every replica rank's state: over the capacity the
# replicas fit in, the closest names the servers; two servers fit.
ps1='{"mode": "parameter-server", "max_staleness": 0, "ps_ranks": 1}'
expect 2 "$baton" plan --model "$root/examples/models/gpt-config-a.json" --devices 4 --pp 2 --dp 2 \
  --tp 1 --schedule 1f1b --micro-batches 2 --batch 4 --recompute off --dp-sync "$ps1" \
  --device-memory 44MiB
contains "+ 1 parameter-server ranks: each parameter-server rank needs"
expect 0 "$baton" plan --model "$root/examples/models/gpt-config-a.json" --devices 4 --pp 2 --dp 2 \
  --tp 1 --schedule 1f1b --micro-batches 2 --batch 4 --recompute off \
  --dp-sync "${ps1/\"ps_ranks\": 1/\"ps_ranks\": 2}" --device-memory 44MiB
contains "+ 2 parameter-server ranks"

# A plan over its capacity: the table, then the error; exit 2.
sed 's/"64MiB"/"1MiB"/' "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" > "$tmp/small.json"
sed -i "s#\"../models/tiny-gpt.json\"#\"$root/examples/models/tiny-gpt.json\"#" "$tmp/small.json"
expect 2 "$baton" plan --check "$tmp/small.json"
contains "OVER CAPACITY"
contains "over its capacity of 1.00 MiB by"

# --check takes --device-memory as an override of the plan's, and refuses the search's
# options (they had been ignored, unparsed).
expect 2 "$baton" plan --check "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --device-memory 1MiB
contains "over its capacity of 1.00 MiB by"
expect 0 "$baton" plan --check "$tmp/small.json" --device-memory 0
expect 2 "$baton" plan --check "$tmp/small.json" --device-memory banana
contains "--device-memory: invalid size 'banana'"
expect 2 "$baton" plan --check "$tmp/small.json" --schedule nonsense --tp 7
contains "--check: --tp, --schedule are for the search and the plan file says its own"
# --optimizer: the one a plan naming none trains with (baton train --plan estimates the
# run's); a plan naming another refuses it.
expect 2 "$baton" plan --check "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --optimizer sgd
contains "--optimizer sgd: the plan trains with \"adamw\""
expect 2 "$baton" plan --check "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --optimizer lion
contains "--optimizer: expected \"adamw\", \"sgd\" or \"sgd-momentum\", found \"lion\""
# A batch-norm model's plan that normalises over fewer samples than the batch is said.
expect 0 "$baton" plan --model "$root/examples/models/resnet-tiny.json" --devices 2 --batch 16 --micro-batches 8
contains "the model has batch norm"
contains "its statistics are over 1 sample(s), not the batch of 16"
sed '/"optimizer"/d' "$tmp/small.json" | sed 's/"1MiB"/"64MiB"/' > "$tmp/noopt.json"
expect 0 "$baton" plan --check "$tmp/noopt.json" --optimizer sgd
contains "valid plan"
# An empty value (an unset shell variable) had read as the flag's absence: --check ""
# searched, --device-memory "" planned uncapped, -o "" wrote nothing.
for flag in check out costs; do
  expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 1 --$flag ""
  contains "--$flag: expected a path, found an empty value (an unset shell variable?)"
done
expect 2 "$baton" plan --model "" --devices 1
contains "--model: expected a path, found an empty value"
for flag in device-memory schedule dp-sync; do
  expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 1 --$flag ""
  contains "--$flag: expected a value, found an empty value (an unset shell variable?)"
done
expect 2 "$baton" plan --check "$tmp/small.json" --device-memory ""
contains "--device-memory: expected a value, found an empty value"
for flag in out svg costs schedule; do
  expect 2 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --$flag ""
  contains "--$flag: expected a path, found an empty value"
done
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" -o ""
contains "--out: expected a path, found an empty value"
lacks "timing"
# --dp-sync's JSON is read as strictly as the plan file's field: a repeated key had been
# taken (the last), and invalid JSON reported as an unknown mode.
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --batch 8 \
  --dp-sync '{"mode": "local-sgd", "sync_every": 8, "sync_every": 3}'
contains "--dp-sync: \$.sync_every: the field 'sync_every' appears twice in one object"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --batch 8 \
  --dp-sync '{"mode": "local-sgd", "sync_every": 1e400}'
contains "--dp-sync: not valid JSON: "
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp 2 --batch 8 \
  --dp-sync '{"mode": "local-sgd", "sync_every": 8'
contains "--dp-sync: not valid JSON: "
lacks "found \"{"
# Negative counts had read as defaults without a word.
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --threads 5000 --out "$tmp/neg.json"
contains "or a count in [1, 4096], found 5000"
# -o /dev/stdout: the plan alone on standard output (the report had followed it there).
"$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 -o /dev/stdout >"$tmp/stdout-plan.json" 2>/dev/null
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$tmp/stdout-plan.json" || { echo "FAIL: plan -o /dev/stdout is no JSON"; fails=$((fails + 1)); }
# A --tp the model cannot split is said before the op timings (it had come after them).
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --tp 3 -o "$tmp/tp3.json"
contains "tensor-parallel degree 3 does not divide"
lacks "timing"
# -o over an input (the model, the cost file) had replaced it, exit 0.
cp "$root/examples/models/tiny-gpt.json" "$tmp/own.json"
expect 2 "$baton" profile --model "$tmp/own.json" -o "$tmp/own.json"
contains "--out $tmp/own.json is the same file as --model $tmp/own.json: writing it would replace that input"
expect 2 "$baton" plan --model "$tmp/own.json" --devices 2 -o "$tmp/own.json"
contains "--out $tmp/own.json is the same file as --model $tmp/own.json"
cmp -s "$tmp/own.json" "$root/examples/models/tiny-gpt.json" || { echo "FAIL: the model was replaced"; fails=$((fails + 1)); }
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --threads -1 --out "$tmp/neg.json"
contains "--threads: expected 0 (the cores divided among local ranks, or OMP_NUM_THREADS up to that) or a count in [1, 4096], found -1"
# Its --threads 0 is baton train's default (the cores divided among local ranks, or
# OMP_NUM_THREADS up to that), and says so.
expect 0 "$baton" profile --help
contains "kernel threads to time the ops with (0:"
contains "divided among local ranks, or OMP_NUM_THREADS up to"
contains "as baton train's default"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --warmup -1 --out "$tmp/neg.json"
contains "--warmup: expected 0 or more untimed runs, found -1"
lacks "timing"  # refused before it announces the timings
expect 2 "$baton" train --plan "$tmp/small.json" --data "$tmp/small.json" --trace "$tmp/neg-trace.json" --trace-steps 0
contains "--trace-steps: expected at least 1 step, found 0"
# Options that rule out every plan say why.
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 4 --pp 4 --schedule zb-v --batch 8
contains "no plan matches the options (zb-v on 4 ranks: 8 stages, but the model has"

# Bad input: exit 2 with the file and JSON path.
echo '{"version": 1, "model": "x.json", "devices": 1, "schedule": {"name": "1f1b", "micro_batches": 1}, "stages": [], "foo": 1}' > "$tmp/bad.json"
expect 2 "$baton" plan --check "$tmp/bad.json"
contains "$tmp/bad.json: \$.foo: unknown field 'foo'"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 3 --tp 3
contains "tp 3"
expect 2 "$baton" plan --check "$tmp/missing.json"
contains "cannot open file"

# Measured costs.
expect 0 "$baton" profile --threads 1 --model "$root/examples/models/tiny-gpt.json" --batch 2 --repeats 1 --out "$tmp/costs.json"
contains "total (one micro-batch)"
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 --costs "$tmp/costs.json"
contains "best plan:"
contains "times from the measured op costs in $tmp/costs.json"
# A plan made from a cost file and checked without it says so (its own prediction had gone
# unmentioned beside the FLOPs one); checked with the file, nothing is said.
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 \
  --costs "$tmp/costs.json" --out "$tmp/measured-plan.json"
expect 0 "$baton" plan --check "$tmp/measured-plan.json"
contains "note: the plan's predicted step is"
contains "(measured op times), this check's"
contains "give that file as --costs to check it as it was made"
expect 0 "$baton" plan --check "$tmp/measured-plan.json" --costs "$tmp/costs.json"
lacks "note: the plan's predicted step"
# At several micro-batch sizes: each in the file, and the commands say which.
expect 0 "$baton" profile --threads 1 --model "$root/examples/models/tiny-gpt.json" --batch 2 1 --repeats 1 --warmup 0 \
  --out "$tmp/costs-b.json"
contains "timing the ops again at batch 1"
contains "total at batch 1"
expect 0 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 --costs "$tmp/costs-b.json"
contains "times from the measured op costs in $tmp/costs-b.json (timed at micro-batches of 1 and 2 samples)"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --batch 2 2 --out "$tmp/c.json"
contains "--batch: 2 is listed twice"
# A count given twice had been timed twice; an output that cannot be written had been
# found only once every timing had run.
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --colocated 2 2 --out "$tmp/c.json"
contains "--colocated: 2 is listed twice"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --tp 2 2 --out "$tmp/c.json"
contains "--tp: 2 is listed twice"
expect 2 "$baton" profile --model "$root/examples/models/resnet-tiny.json" --spatial 2 2 --colocated 2 --out "$tmp/c.json"
contains "--spatial: 2 is listed twice"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --out "$tmp/no-such-dir/c.json"
contains "--out $tmp/no-such-dir/c.json: no directory $tmp/no-such-dir to write it in"
lacks "timing"
# A cost file's count keys as baton writes them: "02" had been read as 2.
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["colocated"] = {"02": 1.5}
json.dump(c, open(sys.argv[2], "w"))' "$tmp/costs.json" "$tmp/costs-02.json"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 --costs "$tmp/costs-02.json"
contains "$tmp/costs-02.json: \$.colocated.02: expected ranks per host as a key: an integer from 2 to 65536 in decimal digits (no sign, spaces or leading zeros), found the key \"02\""
# An op's flops under 1 FLOP had scaled its times into 300-digit step times (1e-300, a
# different plan, exit 0) or inf (5e-324: "costs: forward[0]: ...", naming neither the
# file nor the op); a count far below the op's own scales it past 1e9 s an op.
for f in 1e-300 5e-324; do
  op=$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); n = max(c["ops"], key=lambda k: c["ops"][k]["flops"])
c["ops"][n]["flops"] = float(sys.argv[3]); json.dump(c, open(sys.argv[2], "w")); print(n)' "$tmp/costs.json" "$tmp/costs-f.json" "$f")
  expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 --costs "$tmp/costs-f.json"
  contains "$tmp/costs-f.json: \$.ops.$op.flops: expected 0 (not counted) or a FLOP count from 1 to 1e30, found"
done
op=$(python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); n = max(c["ops"], key=lambda k: c["ops"][k]["flops"])
c["ops"][n].update(flops=1, forward=1e6); json.dump(c, open(sys.argv[2], "w")); print(n)' "$tmp/costs.json" "$tmp/costs-f.json")
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --batch 4 --costs "$tmp/costs-f.json"
contains "$tmp/costs-f.json: \$.ops.$op.flops: 1 FLOPs at micro-batch 2 scale the op's times to"
contains "beyond 1e+09 s an op; expected the op's FLOP count as baton profile writes it"
# Beside a copy of itself (two ranks on the host): the slowdown in the file, applied.
# With --tp 2, a job of two ranks times the shard's collectives between them.
expect 0 "$baton" profile --threads 1 --model "$root/examples/models/tiny-gpt.json" --batch 2 --repeats 1 --warmup 1 \
  --colocated 2 --tp 2 --out "$tmp/costs2.json"
# Each phase says it has begun, then what it measured.
contains "timing 25 ops of tiny-gpt one by one (1 warm-up and 1 timed calls each), then whole training passes"
contains "timing whole passes alone and beside 1 copy, twice"
contains "2 ranks on the host: the ops take"
contains "timing 2 ranks' passes in tensor-parallel groups of 2, twice"
contains "2 ranks on the host in tensor-parallel groups of 2: a collective takes"
grep -q '"colocated": {' "$tmp/costs2.json" || { echo "FAIL: no colocated field"; fails=$((fails + 1)); }
python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["tp_collective"]["2"]["2"]; assert 0 <= t < 1, t' \
  "$tmp/costs2.json" || { echo "FAIL: no tp_collective for 2 ranks in groups of 2"; fails=$((fails + 1)); }
[ ! -e "$tmp/costs2.json.tp-probe" ] || { echo "FAIL: the probe's file was left"; fails=$((fails + 1)); }
# The commands say what the collectives were charged (a known figure: 50 us among 2 ranks).
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["tp_collective"] = {"2": {"2": 5e-5}}
json.dump(c, open(sys.argv[2], "w"))' "$tmp/costs2.json" "$tmp/costs3.json"
for cmd in "trace predict --plan" "plan --check"; do
  # shellcheck disable=SC2086
  expect 0 "$baton" $cmd "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs3.json" --ranks-per-host 2
  contains "each tensor-parallel collective (degree 2) costs 50.0 us beyond the link model among 2 ranks per host"
done
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs2.json" \
  --ranks-per-host 2
contains "predicted step time"
# A CSV schedule's error names its row and cell, as baton train --schedule says it.
printf '0F0,0F1,0B0,0F2,0B1,0F3,0B2,0B3\n1B0,1F0,1F1,1B1,1F2,1B2,1F3,1B3\n' > "$tmp/bad.csv"
expect 2 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" \
  --schedule "$tmp/bad.csv"
contains "bad.csv: invalid schedule (CSV row 2, cell 1)"
# More ranks than the cores the file says (or --cores-per-host): simulated time-sliced.
grep -q '"cores": ' "$tmp/costs2.json" || { echo "FAIL: no cores field"; fails=$((fails + 1)); }
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs2.json" \
  --cores-per-host 2
contains "its 8 ranks time-sliced on 2 cores, each bound to one"
expect 0 "$baton" plan --check "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs2.json" \
  --cores-per-host 2
contains "its 8 ranks time-sliced on 2 cores, each bound to one"
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs2.json" \
  --cores-per-host 8
grep -q "time-sliced" "$tmp/out" && { echo "FAIL: a core per rank, time-sliced"; fails=$((fails + 1)); }
expect 2 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --cores-per-host -1
contains "--cores-per-host: expected 0 (the cost file's) or more, found -1"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --colocated 1 --out "$tmp/c.json"
contains "--colocated: expected ranks per host from 2 to 256, found 1"
# A tensor-parallel rank's shard timed too: the file has it, and predictions read it.
expect 0 "$baton" profile --threads 1 --model "$root/examples/models/tiny-gpt.json" --batch 2 --repeats 1 --warmup 0 \
  --tp 2 --out "$tmp/costs-tp.json"
contains "tensor-parallel degree 2:"
grep -q '"tp_ops": {' "$tmp/costs-tp.json" || { echo "FAIL: no tp_ops field"; fails=$((fails + 1)); }
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --costs "$tmp/costs-tp.json"
contains "predicted step time"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --tp 1 --out "$tmp/c.json"
contains "--tp: expected tensor-parallel degrees from 2 to 65536, found 1"
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --tp 3 --out "$tmp/c.json"
contains "--tp 3"
test ! -e "$tmp/c.json" || { echo "FAIL: a refused profile wrote its file"; fails=$((fails + 1)); }
# A spatial split's exchanges among 2 co-located ranks in groups of 2: in the file, and
# what the spatial plan's stages were charged for them.
expect 0 "$baton" profile --threads 1 --model "$root/examples/models/resnet-tiny.json" --batch 2 --repeats 1 --warmup 1 \
  --colocated 2 --spatial 2 --out "$tmp/costs-sp.json"
contains "timing 2 ranks' passes in spatial groups of 2, twice"
contains "2 ranks on the host in spatial groups of 2: an exchange takes"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); t = c["spatial_exchange"]["2"]["2"]; assert 0 <= t < 1, t
c["spatial_exchange"] = {"2": {"8": 5e-5}}; json.dump(c, open(sys.argv[2], "w"))' \
  "$tmp/costs-sp.json" "$tmp/costs-sp2.json" || { echo "FAIL: no spatial_exchange for 2 ranks"; fails=$((fails + 1)); }
[ ! -e "$tmp/costs-sp.json.spatial-probe" ] || { echo "FAIL: the probe's file was left"; fails=$((fails + 1)); }
expect 0 "$baton" plan --check "$root/examples/plans/resnet-pp2-spatial2-dp2.json" --costs "$tmp/costs-sp2.json"
contains "each spatial exchange (degree 2) costs 50.0 us beyond the link model among 8 ranks per host"
expect 2 "$baton" profile --model "$root/examples/models/resnet-tiny.json" --spatial 2 --out "$tmp/c.json"
contains "--spatial 2: give --colocated K with K a multiple of 2"
expect 2 "$baton" profile --model "$root/examples/models/resnet-tiny.json" --spatial 16 --colocated 16 --out "$tmp/c.json"
contains "--spatial 16: spatial degree 16 does not divide the height 8"
# A model without images: nothing a spatial split exchanges (it had written 0 for it).
expect 2 "$baton" profile --model "$root/examples/models/tiny-gpt.json" --spatial 2 --colocated 2 --out "$tmp/c.json"
contains "--spatial 2: model tiny-gpt has no spatially splittable op"
test ! -e "$tmp/c.json" || { echo "FAIL: a refused profile wrote its file"; fails=$((fails + 1)); }
# The machine's link figures, the same flags as baton plan's: a slower TP link, a slower step.
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json"
fast=$(grep -o 'step time [0-9.]*' "$tmp/out" | awk '{print $3}')
expect 0 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --tp-latency 1e-3
slow=$(grep -o 'step time [0-9.]*' "$tmp/out" | awk '{print $3}')
awk -v a="$fast" -v b="$slow" 'BEGIN { exit !(b > a) }' ||
  { echo "FAIL: --tp-latency 1e-3 predicted $slow ms, not above $fast"; fails=$((fails + 1)); }
expect 2 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --p2p-bandwidth 0
contains "--p2p-bandwidth: expected a positive rate, found 0"
expect 2 "$baton" plan --model "$root/examples/models/tiny-gpt.json" --devices 2 --dp-latency -1
contains "--dp-latency: expected seconds (0 or more)"
expect 2 "$baton" trace predict --plan "$root/examples/plans/tiny-gpt-pp2-tp2-dp2.json" --ranks-per-host -1
contains "--ranks-per-host: expected 0"

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all baton plan / profile command-line checks passed"
