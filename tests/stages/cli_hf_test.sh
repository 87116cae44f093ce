#!/usr/bin/env bash
# Hugging Face both ways and generation from the command line: train a LLaMA from a
# transformers checkpoint (on one process, and under a PP2 x TP2 plan with the same
# losses), export it (sharded, bf16), sample from the checkpoint and from the export,
# greedy ids equal transformers' continuation and end at its end-of-sequence id; a Mistral
# is used within its window through --model; bad input exits 2 naming the file.
set -u
baton="$1"
root="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0
. "$(dirname "$0")/../cli_helpers.sh"
fx="$root/tests/fixtures"
data="$root/examples/data/licenses.txt"

# Greedy from the transformers checkpoint: the fixture's continuation.
want=$(/usr/bin/python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['greedy'])))" "$fx/llama_gqa/expected.json")
prompt=$(/usr/bin/python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'])))" "$fx/llama_gqa/expected.json")
expect 0 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids "$prompt" --max-new-tokens 10
# The prompt's pass apart from the rate of the tokens after it.
contains "new tokens in"
contains "first token after"
contains "tokens/s"
if [ "$(head -n 1 "$tmp/out")" != "$want" ] && ! grep -qxF "$want" "$tmp/out"; then
  echo "FAIL: greedy ids differ from transformers' ($want):"; cat "$tmp/out"; fails=$((fails + 1))
fi
# stdout holds the continuation alone: a warning (model.safetensors beside a shard index
# naming it: transformers reads model.safetensors, and so does baton, saying so) goes to stderr.
mkdir -p "$tmp/both"
cp "$fx/llama_gqa/config.json" "$fx/llama_gqa/model.safetensors" "$tmp/both/"
/usr/bin/python3 - "$tmp/both" <<'PY'
import json, struct, sys
d = sys.argv[1]
with open(d + "/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
names = [k for k in header if k != "__metadata__"]
json.dump({"metadata": {}, "weight_map": {k: "model.safetensors" for k in names}},
          open(d + "/model.safetensors.index.json", "w"))
PY
"$baton" generate --init-from "$tmp/both" --prompt-ids "$prompt" --max-new-tokens 10 \
  >"$tmp/stdout" 2>"$tmp/stderr"
if [ "$(cat "$tmp/stdout")" != "$want" ]; then
  echo "FAIL: stdout is not the continuation alone ($want):"; cat "$tmp/stdout"; fails=$((fails + 1))
fi
grep -q "model.safetensors" "$tmp/stderr" || { echo "FAIL: no warning on stderr:"; cat "$tmp/stderr"; fails=$((fails + 1)); }
# A byte-level model takes text.
expect 0 "$baton" generate --init-from "$fx/qwen2_sharded" --prompt "pipeline st" --max-new-tokens 5 \
  --temperature 0.8 --top-k 20 --top-p 0.9 --seed 4
contains "tokens/s"

# Train a few steps from it with checkpoints, export, sample.
expect 0 "$baton" train --init-from "$fx/llama_gqa" --data "$data" --steps 2 --batch 2 \
  --checkpoint-dir "$tmp/ckpt" --checkpoint-every 2
expect 0 "$baton" export --checkpoint "$tmp/ckpt" --out "$tmp/hf" --max-shard-size 40KB --dtype bf16
test -f "$tmp/hf/model.safetensors.index.json" || { echo "FAIL: no shard index"; fails=$((fails + 1)); }
test -f "$tmp/hf/config.json" || { echo "FAIL: no config.json"; fails=$((fails + 1)); }
expect 0 "$baton" generate --checkpoint "$tmp/ckpt" --prompt "baton " --max-new-tokens 4
contains "tokens/s"
expect 0 "$baton" generate --init-from "$tmp/hf" --prompt "baton " --max-new-tokens 4
contains "tokens/s"

# The same start under a PP2 x TP2 plan (four processes): the one-process losses.
cat > "$tmp/llama.json" <<'JSON'
{"type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 256,
 "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "context": 16}
JSON
expect 0 "$baton" plan --model "$tmp/llama.json" --devices 4 --tp 2 --pp 2 --dp 1 --batch 4 \
  --micro-batches 2 --schedule 1f1b --out "$tmp/plan.json"
expect 0 "$baton" train --model "$tmp/llama.json" --init-from "$fx/llama_gqa" --data "$data" \
  --steps 2 --batch 4 --micro-batches 2 --threads 1 --loss-log "$tmp/one.jsonl"
expect 0 "$baton" launch -n 4 -- "$baton" train --plan "$tmp/plan.json" --init-from "$fx/llama_gqa" \
  --data "$data" --steps 2 --threads 1 --loss-log "$tmp/plan.jsonl"
contains "initialised from $fx/llama_gqa"
if ! /usr/bin/python3 - "$tmp/one.jsonl" "$tmp/plan.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 2, (a, b)
for x, y in zip(a, b):
    for k in ("loss", "grad_norm"):
        assert abs(x[k] - y[k]) <= 1e-5 * abs(x[k]), (k, x, y)
PY
then
  echo "FAIL: the plan's losses from --init-from differ from one process's"; fails=$((fails + 1))
fi
# A plan whose model is not the directory's: exit 2 naming the field and config.json.
sed 's/"rope_theta": 10000.0/"rope_theta": 500000.0/' "$tmp/llama.json" > "$tmp/other.json"
sed "s|llama.json\"|other.json\"|" "$tmp/plan.json" > "$tmp/other-plan.json"
expect 2 "$baton" launch -n 4 -- "$baton" train --plan "$tmp/other-plan.json" \
  --init-from "$fx/llama_gqa" --data "$data" --steps 1 --threads 1
contains "rope_theta is 500000.0"
contains "$fx/llama_gqa/config.json has 10000.0"

# Bad input: exit 2 with the file named.
expect 2 "$baton" export --checkpoint "$tmp/none" --out "$tmp/x"
contains "$tmp/none"
expect 2 "$baton" export --checkpoint "$tmp/ckpt" --out "$tmp/x" --dtype f8
contains "--dtype"
cp -r "$fx/qwen2_sharded" "$tmp/bad"
sed -i 's/model-00002-of-00002.safetensors/model-00009-of-00009.safetensors/' "$tmp/bad/model.safetensors.index.json"
expect 2 "$baton" generate --init-from "$tmp/bad" --prompt-ids 1,2 --max-new-tokens 2
contains "model.safetensors.index.json"
contains "model-00009-of-00009.safetensors"
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,999 --max-new-tokens 2
contains "--prompt-ids"
contains "999"
# More new tokens than the context holds: refused before the first one, with the most it takes.
ctx=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['max_position_embeddings'])" "$fx/llama_gqa/config.json")
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --max-new-tokens "$ctx"
contains "need $((ctx + 1)) positions"
contains "at most $((ctx - 1)) new tokens"
expect 2 "$baton" train --init-from "$tmp/bad" --data "$data" --steps 1
contains "model-00009-of-00009.safetensors"
# Another model JSON for the weights: refused naming the field, from an export and a checkpoint.
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --model "$tmp/other.json" --prompt-ids 1,2 \
  --max-new-tokens 2
contains "rope_theta is 500000.0"
cp "$tmp/llama.json" "$tmp/wrong.json"
sed -i 's/"rms_norm_eps": 1e-5/"rms_norm_eps": 0.5/' "$tmp/wrong.json"
expect 2 "$baton" generate --checkpoint "$tmp/ckpt" --model "$tmp/wrong.json" --prompt-ids 1,2 \
  --max-new-tokens 2
contains "rms_norm_eps is 0.5"
contains "manifest.json"
# Sampling flags without sampling, an unknown --bos or --log-level: refused.
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --top-k 5
contains "--top-k only acts when sampling"
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --bos maybe
contains "--bos"
# --bos without --tokenizer: the message fits a --prompt (it had spoken of --prompt-ids).
expect 2 "$baton" generate --init-from "$fx/qwen2_sharded" --prompt "x" --bos no
contains "--bos no needs --tokenizer"
if grep -qF -- "--prompt-ids" "$tmp/out"; then
  echo "FAIL: the --bos message speaks of --prompt-ids:"; cat "$tmp/out"; fails=$((fails + 1))
fi
expect 2 "$baton" generate --init-from "$fx/qwen2_sharded" --prompt-ids 1,2 --bos yes
contains "ids given by --prompt-ids are taken as they are"
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --log-level Info
contains "--log-level: expected trace"
# An export never goes into a checkpoint, nor removes weights that are not an export's.
expect 2 "$baton" export --checkpoint "$tmp/ckpt" --out "$tmp/ckpt"
contains "holds baton checkpoints"
test -n "$(ls "$tmp"/ckpt/step-*/model-rank*.safetensors)" || { echo "FAIL: the checkpoint lost its shards"; fails=$((fails + 1)); }
echo x > "$tmp/hf/adapter_model.safetensors"
expect 0 "$baton" export --checkpoint "$tmp/ckpt" --out "$tmp/hf"
test -f "$tmp/hf/adapter_model.safetensors" || { echo "FAIL: the export removed another file"; fails=$((fails + 1)); }
test ! -e "$tmp/hf/model.safetensors.index.json" || { echo "FAIL: the old shard index stayed"; fails=$((fails + 1)); }

# The export keeps the token ids of the config.json the run started from.
grep -qF '"bos_token_id": 0' "$tmp/hf/config.json" || { echo "FAIL: the export lost bos_token_id"; cat "$tmp/hf/config.json"; fails=$((fails + 1)); }

# --temperature nan had drawn the least likely token; a --max-new-tokens that overflows
# the prompt's count had exited 1: both are bad input.
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --temperature nan
contains "--temperature: expected a value >= 0, found nan"
expect 2 "$baton" generate --init-from "$fx/llama_gqa" --prompt-ids 1,2 --max-new-tokens 9223372036854775807
contains "9223372036854775807 new tokens need"

# The output ends with the model's end-of-sequence token, as transformers' generate
# (config.json's eos_token_id, with no generation_config.json); --ignore-eos goes on.
cp -r "$fx/llama_gqa" "$tmp/eos"
rm "$tmp/eos/generation_config.json"
eos=$(echo "$want" | cut -d, -f3)
/usr/bin/python3 -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); c['eos_token_id']=int(sys.argv[2]); json.dump(c,open(p,'w'))" "$tmp/eos" "$eos"
expect 0 "$baton" generate --init-from "$tmp/eos" --prompt-ids "$prompt" --max-new-tokens 10
contains "stopped at the end-of-sequence token $eos"
if [ "$(head -n 1 "$tmp/out")" != "$(echo "$want" | cut -d, -f1-3)" ]; then
  echo "FAIL: not stopped after $eos:"; cat "$tmp/out"; fails=$((fails + 1))
fi
expect 0 "$baton" generate --init-from "$tmp/eos" --prompt-ids "$prompt" --max-new-tokens 10 --ignore-eos
if [ "$(head -n 1 "$tmp/out")" != "$want" ]; then
  echo "FAIL: --ignore-eos stopped:"; cat "$tmp/out"; fails=$((fails + 1))
fi

# A Mistral whose sliding window (16) is shorter than max_position_embeddings (512): its
# config.json alone is refused, naming the "context" way; a --model with a context within
# the window generates and trains from its weights.
cp -r "$fx/llama_gqa" "$tmp/mistral"
/usr/bin/python3 - "$tmp/mistral/config.json" "$tmp/mistral16.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(model_type="mistral", max_position_embeddings=512, sliding_window=16)
json.dump(c, open(sys.argv[1], "w"))
c["context"] = 16
json.dump(c, open(sys.argv[2], "w"))
PY
# config.json alone: the window is the context (Mistral 7B's own config had been refused),
# said in a warning; positions past it are refused.
expect 0 "$baton" generate --init-from "$tmp/mistral" --prompt-ids 1,2 --max-new-tokens 2
contains "max_position_embeddings 512 is beyond the sliding window of 16: the context is the window"
expect 2 "$baton" generate --init-from "$tmp/mistral" --prompt-ids 1,2 --max-new-tokens 16
expect 0 "$baton" generate --init-from "$tmp/mistral" --model "$tmp/mistral16.json" --prompt-ids 1,2 --max-new-tokens 2
expect 0 "$baton" train --init-from "$tmp/mistral" --model "$tmp/mistral16.json" --data "$data" \
  --steps 1 --batch 2 --threads 1

# A prompt the tokenizer encodes to no tokens (spaces, --bos no): said so, with the way out.
head -c 20000 "$data" > "$tmp/slice.txt"
if "$baton" data train-tokenizer --input "$tmp/slice.txt" --out "$tmp/sp" --vocab-size 200 >"$tmp/out" 2>&1; then
  expect 2 "$baton" generate --init-from "$fx/llama_gqa" --tokenizer "$tmp/sp.model" --prompt "   " \
    --bos no --max-new-tokens 2
  contains "$tmp/sp.model encodes it to no tokens"
  contains "--bos yes"
elif ! grep -qF "SentencePiece" "$tmp/out"; then
  echo "FAIL: train-tokenizer:"; cat "$tmp/out"; fails=$((fails + 1))
fi

if [ "$fails" -ne 0 ]; then echo "$fails failure(s)"; exit 1; fi
echo "all passed"
