"""The PyTorch side of baton's benchmarks: the GPT-2-style block and the configs that
bench/pytorch_gpt_step.py, bench/torch_pipeline.py and bench/pytorch/gpt_step.py build
their models from, so every peer run measures the same model as baton's
(nanoGPT-style: fused qkv, scaled_dot_product_attention, tanh GELU)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

# PERFORMANCE.md's configs A and B.
CONFIGS = {"A": dict(layers=4, heads=4, embd=256, ctx=128, batch=8, vocab=256),
           "B": dict(layers=8, heads=8, embd=512, ctx=256, batch=8, vocab=256)}


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


def adamw(params, **kwargs):
    """AdamW, fused where this build of PyTorch has it; returns (optimizer, its name)."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs), "fused AdamW"
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, foreach=True, **kwargs), "foreach AdamW"
