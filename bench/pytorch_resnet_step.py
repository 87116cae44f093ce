#!/usr/bin/env python3
"""The peer of bench/run_conv.sh's baton ResNet step: one training step (forward,
backward, AdamW) of the same `"type": "resnet"` model in PyTorch eager on CPU (and
optionally torch.compile), same batch and thread count. The network is built from the
baton model JSON (torchvision's ResNet v1.5 layout, basic or bottleneck blocks; no
torchvision needed), float32, random images.

    python3 bench/pytorch_resnet_step.py --model M.json --batch 32 --threads 1
                                         [--steps 10] [--warmup 3] [--compile]
Prints "torch <variant> <threads> <median ms> <min ms> <max ms> <images/s>".
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResnetBlock(nn.Module):
    def __init__(self, cin, width, stride, bottleneck):
        super().__init__()
        cout = width * 4 if bottleneck else width
        if bottleneck:
            convs = [(cin, width, 1, 1), (width, width, 3, stride), (width, cout, 1, 1)]
        else:
            convs = [(cin, width, 3, stride), (width, cout, 3, 1)]
        self.convs = nn.ModuleList(nn.Conv2d(i, o, k, s, k // 2, bias=False) for i, o, k, s in convs)
        self.bns = nn.ModuleList(nn.BatchNorm2d(o) for _, o, _, _ in convs)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = x
        for i, (c, b) in enumerate(zip(self.convs, self.bns)):
            y = b(c(y))
            if i + 1 < len(self.convs):
                y = F.relu(y)
        return F.relu(y + (self.down(x) if self.down is not None else x))


class Resnet(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        sc, sk, ss = cfg.get("stem_channels", 64), cfg.get("stem_kernel", 7), cfg.get("stem_stride", 2)
        self.stem = nn.Sequential(nn.Conv2d(cfg["in_channels"], sc, sk, ss, sk // 2, bias=False),
                                  nn.BatchNorm2d(sc), nn.ReLU())
        self.pool = nn.MaxPool2d(3, 2, 1) if cfg.get("stem_pool", True) else nn.Identity()
        bottleneck = cfg.get("block", "basic") == "bottleneck"
        strides = cfg.get("strides", [1] + [2] * (len(cfg["widths"]) - 1))
        blocks, cin = [], sc
        for w, d, s in zip(cfg["widths"], cfg["depths"], strides):
            for i in range(d):
                blocks.append(ResnetBlock(cin, w, s if i == 0 else 1, bottleneck))
                cin = w * 4 if bottleneck else w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, cfg["classes"])

    def forward(self, x, y):
        h = self.blocks(self.pool(self.stem(x)))
        return F.cross_entropy(self.fc(h.mean((2, 3))), y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.model) as f:
        cfg = json.load(f)
    size = cfg["image_size"]
    h, w = (size, size) if isinstance(size, int) else size
    model = Resnet(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, foreach=True)
    x = torch.randn(a.batch, cfg["in_channels"], h, w)
    y = torch.randint(0, cfg["classes"], (a.batch,))
    fn = torch.compile(model) if a.compile else model

    def step():
        opt.zero_grad(set_to_none=True)
        fn(x, y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    variant = "compile" if a.compile else "eager"
    print(f"torch {variant} {a.threads} {med:.2f} {min(times):.2f} {max(times):.2f} {a.batch / med * 1e3:.1f}")


if __name__ == "__main__":
    main()
