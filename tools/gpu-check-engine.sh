# shellcheck shell=bash disable=SC2154,SC2034  # sourced: $out, $t_start, ... are the caller's
# The engine steps of tools/gpu-check.sh (sourced; uses its $out, $py, $gpu and the
# step functions of tools/gpu-check-lib.sh): `baton train --device cuda[:N] --precision
# f32|tf32|bf16|fp16` and the plan fields "device" and "transport". Without a baton
# binary that has them (GPU_CHECK_BATON) they are listed as skipped with the reason,
# which the summary shows.
#
#   train-cpu, train-gpu       the same 20 steps of tiny-gpt in f32 on both; losses within 1e-4
#   train-llama-cpu, -gpu      the same for a tiny LLaMA (RMSNorm, rotary, SwiGLU, grouped-query
#                              attention 4/2, untied head), and its bf16 run within 2e-2
#   train-resnet-cpu, -gpu     the same for the tiny ResNet on the digits (cuDNN's convolutions,
#                              batch norm, pooling), f32 within 1e-4
#   train-gpt2-bf16            GPT-2 124M through baton train --precision bf16 (tokens/s, MFU
#                              from its --summary), beside the benchmark rows above
#   train-gpt2-bf16-colsum     the same with the bias gradients by the column-sum kernel
#                              (BATON_CUDA_BIAS_GRAD=colsum), against their GEMM epilogues
#   profile-gpt2-bf16          its ops timed on the GPU (baton profile --device cuda)
#   profile-gpt2-bf16-cudnn    the same with cuDNN's attention backward
#   trace-gpt2-bf16            its timeline as a one-rank plan (--trace); -blocking: with
#                              CUDA_LAUNCH_BLOCKING=1, so each action spans its kernels
#   launch-pp2-ucx             baton launch -n 2, PP=2 on one GPU over UCX (device tensors staged
#                              through host buffers, transport/staged.h) against one GPU, after
#                              staged-transport (test_transport_staged's CUDA half)
#   launch-dp2-zero2-ucx       DP=2 with ZeRO-2 on one GPU over UCX against one GPU (f32, 1e-4)
#   launch-dp2-ps-ucx          DP=2 with a parameter-server rank (staleness 0), the same
#   nccl-pp2, nccl-tp2, nccl-dp2   the NCCL plans on 2 GPUs against one GPU (f32, 1e-4)

engine_steps() {
  local baton=${GPU_CHECK_BATON:-}
  local corpus=examples/data/licenses.txt cmp=tools/compare-losses.py
  local names="train-cpu train-gpu train-llama-cpu train-llama-gpu train-resnet-cpu train-resnet-gpu train-gpt2-bf16 train-gpt2-bf16-colsum profile-gpt2-bf16 profile-gpt2-bf16-cudnn trace-gpt2-bf16 trace-gpt2-bf16-blocking staged-transport launch-pp2-ucx launch-dp2-zero2-ucx launch-dp2-ps-ucx nccl-pp2 nccl-tp2 nccl-dp2"
  # With the prebuilt engine (.gpu-engine) a missing or broken baton is a failure, not a
  # reason to skip: every engine step would otherwise pass as "skipped".
  if [ -z "$baton" ] || [ ! -x "$baton" ]; then
    if [ "${prebuilt:-0}" = 1 ]; then
      step engine-baton 5 false  # "no baton binary in the prebuilt engine"
      echo "gpu-check: .gpu-engine has no runnable baton ($baton)"
      for n in $names; do skip "$n" "the prebuilt engine's baton is missing (engine-baton failed)"; done
      return 0
    fi
    for n in $names; do skip "$n" "no baton binary (set GPU_CHECK_BATON to a full build's baton; the GPU-check bundle cannot build one)"; done
    return 0
  fi
  # Not `| grep -q`: grep's early exit would fail the pipeline under pipefail.
  local help
  if ! help=$("$baton" train --help 2>&1); then
    step engine-baton 30 "$baton" train --help  # fails, its output in engine-baton.log
    for n in $names; do skip "$n" "$baton does not start (engine-baton failed)"; done
    return 0
  fi
  if [[ "$help" != *--device* ]]; then
    for n in $names; do skip "$n" "$baton train has no --device yet (issue 12, item 4)"; done
    return 0
  fi
  local e=$out/engine
  mkdir -p "$e"
  local tiny=examples/models/tiny-gpt.json
  local common=(--model "$tiny" --data "$corpus" --steps 20 --batch 8 --seed 3 --log-every 5)

  # One GPU against the CPU, f32, same seed: the losses of 20 steps within 1e-4.
  step train-cpu 120 "$baton" train "${common[@]}" --device cpu --precision f32 --loss-log "$e/cpu.jsonl"
  step train-gpu 120 "$baton" train "${common[@]}" --device cuda --precision f32 --loss-log "$e/gpu.jsonl" &&
    step train-gpu-vs-cpu 30 "$py" "$cmp" "$e/cpu.jsonl" "$e/gpu.jsonl" --tol 1e-4 --steps 20

  # The LLaMA family's ops on the GPU (head size 32: cuDNN's attention in bf16 where it
  # is built, else the flash kernels; cuBLAS in f32), the same 20 steps as on the CPU.
  cat >"$e/tiny-llama.json" <<'JSON'
{"type": "llama", "name": "tiny-llama", "hidden_size": 128, "intermediate_size": 344,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "max_position_embeddings": 128, "vocab_size": 256, "context": 64}
JSON
  local llama=(--model "$e/tiny-llama.json" --data "$corpus" --steps 20 --batch 8 --seed 3 --log-every 5)
  step train-llama-cpu 120 "$baton" train "${llama[@]}" --device cpu --precision f32 --loss-log "$e/llama-cpu.jsonl"
  step train-llama-gpu 120 "$baton" train "${llama[@]}" --device cuda --precision f32 --loss-log "$e/llama-gpu.jsonl" &&
    step train-llama-gpu-vs-cpu 30 "$py" "$cmp" "$e/llama-cpu.jsonl" "$e/llama-gpu.jsonl" --tol 1e-4 --steps 20
  step train-llama-bf16 120 "$baton" train "${llama[@]}" --device cuda --precision bf16 --loss-log "$e/llama-bf16.jsonl" &&
    step train-llama-bf16-vs-f32 30 "$py" "$cmp" "$e/llama-gpu.jsonl" "$e/llama-bf16.jsonl" --tol 2e-2 --relative --steps 20

  # A convolutional network: cuDNN's convolutions and our batch norm and pooling kernels.
  local resnet=(--model examples/models/resnet-tiny.json --data examples/data/digits --steps 20
    --batch 8 --seed 3 --log-every 5)
  step train-resnet-cpu 120 "$baton" train "${resnet[@]}" --device cpu --precision f32 --loss-log "$e/resnet-cpu.jsonl"
  step train-resnet-gpu 120 "$baton" train "${resnet[@]}" --device cuda --precision f32 --loss-log "$e/resnet-gpu.jsonl" &&
    step train-resnet-gpu-vs-cpu 30 "$py" "$cmp" "$e/resnet-cpu.jsonl" "$e/resnet-gpu.jsonl" --tol 1e-4 --steps 20

  # GPT-2 124M through the engine, bf16 mixed precision. --summary writes a JSON object
  # (docs/formats/summary.md); its tokens_per_second, with the step time and the MFU
  # computed from it as bench/cuda/gpt_step and bench/pytorch/gpt_step.py count them (6 N +
  # 12 L ctx d FLOPs per token, N the matrix weights only, the tied LM head once; 989
  # TFLOP/s), becomes a RESULT row like the benchmark's.
  cat >"$e/gpt2-124m.json" <<'JSON'
{"type": "gpt2", "name": "gpt2-124m", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50304}
JSON
  gpt2_train() {  # STEP ROW [VAR=VALUE...]: one bf16 run of 30 steps, its result as row ROW
    local name=$1 row=$2
    shift 2
    step "$name" 240 env "$@" "$baton" train --model "$e/gpt2-124m.json" --data "$corpus" --steps 30 \
      --batch 8 --device cuda --precision bf16 --log-every 10 --summary "$e/$name-summary.json" || return 0
    "$py" - "$e/$name-summary.json" "$row" >>"$out/results.txt" <<'PY' || { echo "$name FAILED (no tokens_per_s in --summary)" >>"$out/steps.txt"; gc_status=1; }
import json, sys
s = json.load(open(sys.argv[1]))
L, d, ctx, V = 12, 768, 1024, 50304
# The matrix weights (123,568,128), as the peers count them: all parameters (124,475,904,
# with biases, norms and position embeddings) had made the engine's rows 0.6% higher.
n = L * 12 * d * d + V * d  # tied output projection
tps = s["tokens_per_second"]
step_ms = 1e3 * s["tokens_per_step"] / tps
mfu = (6 * n + 12 * L * ctx * d) * tps / 989e12
print(f"{sys.argv[2]} baton bf16 tokens_per_s {tps:.0f} step_ms {step_ms:.3f} mfu {mfu:.4f}")
PY
    publish
  }
  gpt2_train train-gpt2-bf16 baton-train-bf16
  # The same with the bias gradients summed by their own kernel instead of the weight
  # GEMMs' epilogues (cuDNN's attention backward, forced here before, is automatic's
  # choice since the second GPU session).
  gpt2_train train-gpt2-bf16-colsum baton-train-bf16-colsum-bias-grad BATON_CUDA_BIAS_GRAD=colsum
  # Where its time goes: each op's F, B and W on the GPU (baton profile, synchronized
  # around every call), and the engine's timeline of the same model as a one-rank plan
  # (forward, backward and optimizer step as the executor runs them). Both land in the
  # logs' tarball; the profile's table is in its log.
  step profile-gpt2-bf16 60 "$baton" profile --model "$e/gpt2-124m.json" --batch 8 --device cuda \
    --precision bf16 --out "$e/gpt2-costs.json"
  step profile-gpt2-bf16-cudnn 60 env BATON_CUDA_ATTENTION=cudnn "$baton" profile --model "$e/gpt2-124m.json" \
    --batch 8 --device cuda --precision bf16 --out "$e/gpt2-costs-cudnn.json"
  local layers
  layers=$(for i in $(seq 0 11); do printf '"h.%d", ' "$i"; done)
  cat >"$e/gpt2-one-rank.json" <<JSON
{"version": 1, "model": "$PWD/$e/gpt2-124m.json", "devices": 1, "device": "cuda",
 "parallel": {"dp": 1, "pp": 1, "tp": 1}, "batch": {"micro_batch_size": 8, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 1}, "optimizer": "adamw",
 "stages": [{"layers": ["embed", $layers "head"], "pipeline_ranks": [0]}]}
JSON
  step trace-gpt2-bf16 60 "$baton" train --plan "$e/gpt2-one-rank.json" --data "$corpus" --steps 12 \
    --precision bf16 --log-every 4 --trace "$e/gpt2-trace.json" --trace-steps 3
  # The same timeline with every launch waited for: each action's span is then its
  # kernels' time, where the one above is the host's.
  step trace-gpt2-bf16-blocking 60 env CUDA_LAUNCH_BLOCKING=1 "$baton" train --plan "$e/gpt2-one-rank.json" \
    --data "$corpus" --steps 6 --precision bf16 --log-every 3 --trace "$e/gpt2-trace-blocking.json" --trace-steps 2

  # PP=2 on one GPU, both ranks on cuda:0, UCX between them: bf16 losses as one GPU's.
  cat >"$e/pp2-ucx.json" <<JSON
{"version": 1, "model": "$PWD/$tiny", "devices": 2, "device": "cuda", "transport": "ucx",
 "parallel": {"dp": 1, "pp": 2, "tp": 1}, "batch": {"micro_batch_size": 2, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 4}, "optimizer": "adamw",
 "stages": [{"layers": ["embed", "h.0"], "pipeline_ranks": [0]}, {"layers": ["h.1", "head"], "pipeline_ranks": [1]}]}
JSON
  step train-gpu-bf16 120 "$baton" train "${common[@]}" --device cuda --precision bf16 --loss-log "$e/gpu-bf16.jsonl"
  # fp16 with dynamic loss scaling: the run must finish with finite losses (the loss log
  # says which steps were skipped for overflow and the scale of each).
  step train-gpu-fp16 120 "$baton" train "${common[@]}" --device cuda --precision fp16 --loss-log "$e/gpu-fp16.jsonl" &&
    step train-gpu-fp16-scaling 30 "$py" "$cmp" "$e/gpu-bf16.jsonl" "$e/gpu-fp16.jsonl" --skipped-at-most 5 \
      --falls
  # Two ranks on one GPU: "transport": "ucx" stages the device tensors through host memory.
  # First the staged communicator's own test (its CUDA half), from the same build.
  local staged_test
  staged_test=$(dirname "$baton")/test_transport_staged  # .gpu-engine/bin
  [ -x "$staged_test" ] || staged_test=$(dirname "$baton")/tests/transport/test_transport_staged
  if [ -x "$staged_test" ]; then
    step staged-transport 60 "$staged_test" --gtest_brief=1
  else
    skip staged-transport "no $staged_test beside $baton"
  fi
  step launch-pp2-ucx 180 "$baton" launch -n 2 -- "$baton" train --plan "$e/pp2-ucx.json" --data "$corpus" \
      --steps 20 --seed 3 --precision bf16 --loss-log "$e/pp2.jsonl" &&
    step launch-pp2-vs-one-gpu 30 "$py" "$cmp" "$e/gpu-bf16.jsonl" "$e/pp2.jsonl" --tol 2e-2 --relative --steps 20

  # Data-parallel replicas sharing the GPU, f32 against one GPU: ZeRO-2 (optimizer state
  # and reduced gradients sharded, masters and state on the device) and a parameter server
  # whose servers are the replicas' own ranks (staleness 0: allreduce's numbers; extra
  # server ranks, ps_ranks, run on the CPU only).
  dp2_plan() {  # FILE EXTRA-FIELDS
    cat >"$1" <<JSON
{"version": 1, "model": "$PWD/$tiny", "devices": 2, "device": "cuda", "transport": "ucx",
 "parallel": {"dp": 2, "pp": 1, "tp": 1}, "batch": {"micro_batch_size": 2, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 2}, "optimizer": "adamw", $2
 "stages": [{"layers": ["embed", "h.0", "h.1", "head"], "pipeline_ranks": [0]}]}
JSON
  }
  dp2_plan "$e/dp2-zero2.json" '"optimizer_sharding": "zero2",'
  dp2_plan "$e/dp2-ps.json" '"dp_sync": {"mode": "parameter-server", "max_staleness": 0},'
  step launch-dp2-zero2-ucx 180 "$baton" launch -n 2 -- "$baton" train --plan "$e/dp2-zero2.json" \
      --data "$corpus" --steps 20 --seed 3 --loss-log "$e/dp2-zero2.jsonl" &&
    step launch-dp2-zero2-vs-one-gpu 30 "$py" "$cmp" "$e/gpu.jsonl" "$e/dp2-zero2.jsonl" --tol 1e-4 --steps 20
  step launch-dp2-ps-ucx 180 "$baton" launch -n 2 -- "$baton" train --plan "$e/dp2-ps.json" \
      --data "$corpus" --steps 20 --seed 3 --loss-log "$e/dp2-ps.jsonl" &&
    step launch-dp2-ps-vs-one-gpu 30 "$py" "$cmp" "$e/gpu.jsonl" "$e/dp2-ps.jsonl" --tol 1e-4 --steps 20

  # The NCCL plans on two GPUs against one GPU, f32.
  if [ "$gpu" -lt 2 ]; then
    for n in nccl-pp2 nccl-tp2 nccl-dp2; do skip "$n" "needs 2 GPUs, this machine has $gpu"; done
    return 0
  fi
  local kind
  for kind in pp tp dp; do
    local par='"dp": 1, "pp": 1, "tp": 1' stages='[{"layers": ["embed", "h.0", "h.1", "head"], "pipeline_ranks": [0]}]'
    case $kind in
      pp) par='"dp": 1, "pp": 2, "tp": 1'
          stages='[{"layers": ["embed", "h.0"], "pipeline_ranks": [0]}, {"layers": ["h.1", "head"], "pipeline_ranks": [1]}]' ;;
      tp) par='"dp": 1, "pp": 1, "tp": 2' ;;
      dp) par='"dp": 2, "pp": 1, "tp": 1' ;;
    esac
    cat >"$e/nccl-$kind.json" <<JSON
{"version": 1, "model": "$PWD/$tiny", "devices": 2, "device": "cuda", "transport": "nccl",
 "parallel": {$par}, "batch": {"micro_batch_size": 2, "global": 8},
 "schedule": {"name": "1f1b", "micro_batches": 4}, "optimizer": "adamw", "stages": $stages}
JSON
    step "nccl-${kind}2" 180 "$baton" launch -n 2 -- "$baton" train --plan "$e/nccl-$kind.json" --data "$corpus" \
        --steps 20 --seed 3 --precision f32 --loss-log "$e/nccl-$kind.jsonl" &&
      step "nccl-${kind}2-vs-one-gpu" 30 "$py" "$cmp" "$e/gpu.jsonl" "$e/nccl-$kind.jsonl" --tol 1e-4 --steps 20
  done
}
