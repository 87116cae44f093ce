#!/usr/bin/env python3
"""The peer of bench_gpt_step: one training step (forward, backward, AdamW) of the same
GPT configs in PyTorch on CPU, at the same thread counts, in PyTorch's best CPU settings
we found: a nanoGPT-style model (fused qkv Linear, scaled_dot_product_attention with
is_causal, tanh GELU, tied LM head), float32, AdamW with fused=True where the build has
it (else foreach), optionally torch.compile. With --family llama: transformers' LlamaForCausalLM with
bench_gpt_step --family llama's configs (intermediate 8/3 d rounded up to 32, half the
heads for keys and values, untied head, sdpa attention). Run it with the tuned malloc of
docs/benchmarks.md (bench/run_gpt_step.sh does).

    python3 bench/pytorch_gpt_step.py [--config A|B|all] [--family gpt|llama]
                                      [--threads 1,2] [--steps 10] [--compile] [--warmup 3]
Prints one line per (config, threads): "torch <config> <threads> <median ms> <min ms>
<max ms> <tokens/s> <GFLOP/s> <variant>".
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt import CONFIGS, Block, adamw


class GPT(nn.Module):
    def __init__(self, layers, heads, embd, ctx, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, embd)
        self.wpe = nn.Embedding(ctx, embd)
        self.h = nn.ModuleList(Block(embd, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embd)
        for p in self.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
        self.register_buffer("pos", torch.arange(ctx), persistent=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def llama_ffn(cfg):
    return (8 * cfg["embd"] // 3 + 31) // 32 * 32


class Llama(nn.Module):
    """transformers' LlamaForCausalLM, loss on the given targets (no label shift), as baton."""

    def __init__(self, cfg):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        lc = LlamaConfig(hidden_size=cfg["embd"], intermediate_size=llama_ffn(cfg),
                         num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                         num_key_value_heads=cfg["heads"] // 2,
                         max_position_embeddings=cfg["ctx"], vocab_size=cfg["vocab"],
                         tie_word_embeddings=False, attn_implementation="sdpa")
        self.m = LlamaForCausalLM(lc)

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx, use_cache=False).logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def flops(cfg, family="gpt"):
    d = cfg["embd"]
    if family == "llama":
        block = 2 * d * d + 2 * d * (cfg["heads"] // 2) * (d // cfg["heads"]) + 3 * d * llama_ffn(cfg)
    else:
        block = 12 * d * d
    n = cfg["layers"] * block + cfg["vocab"] * d
    t = cfg["batch"] * cfg["ctx"]
    return 6 * n * t + 12 * cfg["layers"] * cfg["ctx"] * cfg["embd"] * t


def bench(name, threads, steps, warmup, compile_model, family):
    cfg = CONFIGS[name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if family == "llama":
        model = Llama(cfg)
    else:
        model = GPT(cfg["layers"], cfg["heads"], cfg["embd"], cfg["ctx"], cfg["vocab"])
    opt, opt_name = adamw(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if compile_model else model
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"]))
    tgt = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["ctx"]))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = fwd(idx, tgt)
        loss.backward()
        opt.step()
        return loss

    for _ in range(warmup):
        step()
    ts = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    med = statistics.median(ts)
    tokens = cfg["batch"] * cfg["ctx"]
    variant = ("compiled" if compile_model else "eager") + ", " + opt_name
    print(f"torch {name} {threads} {med * 1e3:.1f} {min(ts) * 1e3:.1f} {max(ts) * 1e3:.1f} "
          f"{tokens / med:.0f} {flops(cfg, family) / med / 1e9:.1f} {variant}", flush=True)


def generate(name, threads, out_dir, prompt_len, new_tokens):
    """Greedy generation (KV cache) with transformers; saves the model to out_dir so that
    `baton generate --init-from out_dir` runs the same weights."""
    cfg = CONFIGS[name]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = Llama(cfg).m.eval()
    m.save_pretrained(out_dir)
    ids = torch.randint(0, cfg["vocab"], (1, prompt_len))
    with open(f"{out_dir}/prompt_ids.txt", "w") as f:
        f.write(",".join(str(int(t)) for t in ids[0]))
    with torch.no_grad():
        m.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
        t0 = time.perf_counter()
        m.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        s = time.perf_counter() - t0
    print(f"torch-generate {name} {threads} {prompt_len} {new_tokens} {new_tokens / s:.1f}",
          flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="all")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--family", default="gpt", choices=["gpt", "llama"])
    ap.add_argument("--generate", metavar="DIR",
                    help="instead: greedy generation tokens/s of the llama config, model saved to DIR")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    a = ap.parse_args()
    torch.set_num_interop_threads(1)
    if a.generate:
        for threads in (int(x) for x in a.threads.split(",")):
            generate("B" if a.config == "all" else a.config, threads, a.generate, a.prompt_len,
                     a.new_tokens)
        return
    print(f"# torch {torch.__version__}, {torch.__config__.parallel_info().splitlines()[0]}",
          flush=True)
    names = ["A", "B"] if a.config == "all" else [a.config]
    for name in names:
        for threads in (int(x) for x in a.threads.split(",")):
            bench(name, threads, a.steps, a.warmup, a.compile, a.family)


if __name__ == "__main__":
    main()
