#!/usr/bin/env python3
"""The peer of baton's pipeline benchmark: the same GPT (config B by default), cut into
the same two stages (embedding + blocks 0-3 | blocks 4-7 + head), trained with the same
schedule and micro-batches by torch.distributed.pipelining over gloo on CPU, two
processes with one thread each (each bound to its own core, as baton launch binds).

    python3 bench/torch_pipeline.py [--schedule 1f1b|gpipe] [--micro-batches 8]
                                    [--steps 5] [--warmup 2] [--config B]
Prints "torch-pipelining <schedule> <median ms> <min ms> <max ms> <tokens/s>" (rank 0:
the step is done when both stages are, so it times a barrier-to-barrier step).

Differences from baton's run, in torch's favour: the LM head is a separate weight on the
last stage (torch's pipelining has no tied parameters across stages, so there is no
all-reduce of wte's gradient). Otherwise as bench/pytorch_gpt_step.py: a nanoGPT-style
model, scaled_dot_product_attention, tanh GELU, AdamW (fused where the build has it).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt import CONFIGS, Block, adamw


class First(nn.Module):  # embed + the first half of the blocks
    def __init__(self, cfg, blocks):
        super().__init__()
        self.wte = nn.Embedding(cfg["vocab"], cfg["embd"])
        self.wpe = nn.Embedding(cfg["ctx"], cfg["embd"])
        self.h = nn.ModuleList(Block(cfg["embd"], cfg["heads"]) for _ in range(blocks))
        self.register_buffer("pos", torch.arange(cfg["ctx"]), persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(self.pos[: idx.shape[1]])
        for blk in self.h:
            x = blk(x)
        return x


class Last(nn.Module):  # the other blocks + ln_f + LM head
    def __init__(self, cfg, blocks):
        super().__init__()
        self.h = nn.ModuleList(Block(cfg["embd"], cfg["heads"]) for _ in range(blocks))
        self.ln_f = nn.LayerNorm(cfg["embd"])
        self.head = nn.Linear(cfg["embd"], cfg["vocab"], bias=False)

    def forward(self, x):
        for blk in self.h:
            x = blk(x)
        return self.head(self.ln_f(x))


def init(module):
    for p in module.parameters():
        if p.dim() >= 2:
            nn.init.normal_(p, std=0.02)


def worker(rank, a):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = CONFIGS[a.config]
    torch.manual_seed(rank)
    half = cfg["layers"] // 2
    mod = First(cfg, half) if rank == 0 else Last(cfg, cfg["layers"] - half)
    init(mod)
    mb = cfg["batch"] // a.micro_batches
    example = (torch.randint(0, cfg["vocab"], (mb, cfg["ctx"])) if rank == 0
               else torch.randn(mb, cfg["ctx"], cfg["embd"]))
    try:
        stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
    except TypeError:  # older releases want example inputs
        stage = PipelineStage(mod, rank, 2, torch.device("cpu"), input_args=(example,))
    vocab = cfg["vocab"]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))

    kind = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
    sched = kind(stage, n_microbatches=a.micro_batches, loss_fn=loss_fn)
    opt, _ = adamw(mod.parameters(), lr=1e-4)
    idx = torch.randint(0, vocab, (cfg["batch"], cfg["ctx"]))
    tgt = torch.randint(0, vocab, (cfg["batch"], cfg["ctx"]))
    times = []
    for it in range(a.warmup + a.steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if rank == 0:
            sched.step(idx)
        else:
            losses = []
            sched.step(target=tgt, losses=losses)
        opt.step()
        dist.barrier()
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        med = statistics.median(times)
        tokens = cfg["batch"] * cfg["ctx"]
        print(f"torch-pipelining {a.schedule} {med * 1e3:.1f} {min(times) * 1e3:.1f} {max(times) * 1e3:.1f} "
              f"{tokens / med:.0f}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="B", choices=sorted(CONFIGS))
    ap.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    # Checked here: a batch that the micro-batches do not divide had ended in a traceback
    # from the spawned workers.
    batch = CONFIGS[a.config]["batch"]
    if a.micro_batches < 1 or batch % a.micro_batches:
        ap.error(f"--micro-batches {a.micro_batches}: expected a divisor of config {a.config}'s "
                 f"batch of {batch}")
    if a.steps < 1:
        ap.error(f"--steps {a.steps}: expected at least 1")
    if a.warmup < 0:
        ap.error(f"--warmup {a.warmup}: expected at least 0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    print(f"# torch {torch.__version__}, torch.distributed.pipelining over gloo, 2 processes x 1 thread", flush=True)
    mp.spawn(worker, args=(a,), nprocs=2, join=True)


if __name__ == "__main__":
    main()
