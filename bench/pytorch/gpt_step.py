#!/usr/bin/env python3
"""The GPT-2-style training step of bench/cuda/gpt_step.cpp in PyTorch, for comparison in
the same run on the same GPU: same shapes, same fixed batch of random tokens, same
optimizer (AdamW lr 6e-4, betas 0.9/0.95, fused), same precision (bf16: autocast with
f32 master weights; f32: TF32 off unless --tf32 1). Eager by default; --compile 1 uses
torch.compile. Prints the same lines and a RESULT line that tools/gpu-check.sh reads.
"""
import argparse
import math
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from torch_gpt import Block  # noqa: E402  (the shared block; this file runs from anywhere)


class Gpt(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.wte = nn.Embedding(a.vocab, a.hidden)
        self.wpe = nn.Embedding(a.ctx, a.hidden)
        self.h = nn.ModuleList(Block(a.hidden, a.heads) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.hidden)
        proj_std = 0.02 / math.sqrt(2 * a.layers)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, proj_std if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids, targets):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=12, hidden=768, heads=12, ctx=1024, batch=8, vocab=50304, steps=20, warmup=5,
                     tf32=0, compile=0).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpt_step.py: no CUDA device", file=sys.stderr)
        return 1
    torch.backends.cuda.matmul.allow_tf32 = bool(a.tf32)
    torch.backends.cudnn.allow_tf32 = bool(a.tf32)
    dev = "cuda"
    torch.manual_seed(1337)
    model = Gpt(a).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, a.vocab, (a.batch * a.ctx + 1,), generator=g)
    ids = data[:-1].view(a.batch, a.ctx).to(dev)
    targets = data[1:].view(a.batch, a.ctx).to(dev)
    step_fn = model
    if a.compile:
        step_fn = torch.compile(model)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = step_fn(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    ms, first, last = [], None, None
    for s in range(1, a.warmup + a.steps + 1):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        loss = step()
        t1.record()
        t1.synchronize()
        if s > a.warmup:
            ms.append(t0.elapsed_time(t1))
        if s == 1:
            first = loss.item()
        if s == a.warmup + a.steps:
            last = loss.item()
    tokens = a.batch * a.ctx
    n = a.layers * 12 * a.hidden * a.hidden + a.vocab * a.hidden
    flops = 6.0 * n * tokens + 12.0 * a.layers * a.ctx * a.hidden * tokens
    med = statistics.median(ms)
    mode = "compile" if a.compile else "eager"
    print(f"pytorch {torch.__version__} {mode} gpt_step: layers {a.layers} hidden {a.hidden} heads {a.heads} "
          f"ctx {a.ctx} batch {a.batch} vocab {a.vocab} dtype {a.dtype} tf32 {a.tf32}")
    print(f"  step ms: median {med:.3f} min {min(ms):.3f} max {max(ms):.3f} over {a.steps} steps after {a.warmup} warm-up")
    print(f"  tokens/s: {tokens / (med / 1e3):.0f} (median step)   TFLOP/step {flops / 1e12:.3f}   "
          f"achieved {flops / (med / 1e3) / 1e12:.1f} TFLOP/s   MFU {100 * flops / (med / 1e3) / (a.peak_tflops * 1e12):.1f}% "
          f"of {a.peak_tflops:.0f}")
    print(f"  loss: {first:.4f} at step 1, {last:.4f} at step {a.warmup + a.steps}   "
          f"device memory peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print(f"RESULT pytorch-{mode} {a.dtype} tokens_per_s {tokens / (med / 1e3):.0f} step_ms {med:.3f} "
          f"mfu {flops / (med / 1e3) / (a.peak_tflops * 1e12):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
