#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A tiny causal transformer (character level) trained twice from the same seed: once with
its attention computed by libsdpa.torch (forward sdpa_forward, backward sdpa_backward,
through the libsdpa::attention custom op's autograd), once with PyTorch's
torch.nn.functional.scaled_dot_product_attention. Everything else (weights, batches,
optimizer, thread count) is the same, so the two loss curves differ only by the rounding
of the two attention implementations.

    python3 examples/python/train_tiny_lm.py [--check] [--steps 300] [--threads 2]

The corpus is tiny_corpus.txt next to this script (the opening of Lewis Carroll's
"Alice's Adventures in Wonderland", 1865, public domain; ~7 KB, vocabulary = its
characters). The model: 2 pre-norm blocks, d_model 64, 4 heads of 16, MLP 256, learned
positions, context 64, batch 32, AdamW 3e-3, no dropout. Prints both loss curves every
--every steps, the last step's training loss and a held-out loss (the last 10% of the
text, fixed windows) of each run, and their relative differences.

--check exits 1 unless the last step's training loss of the libsdpa run is within 1% of
the PyTorch run's (and the held-out loss too).
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import libsdpa
import libsdpa.torch as lt

HERE = os.path.dirname(os.path.abspath(__file__))


class Block(nn.Module):
    def __init__(self, d, heads, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        B, T, D = x.shape
        h = self.ln1(x)
        # [B, T, 3, H, Dh] -> three [B, H, T, Dh] strided views of one buffer (libsdpa reads
        # them in place; torch SDPA gets the same views)
        q, k, v = self.qkv(h).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        a = self.attn(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, d, heads, layers, ctx, attn):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads, attn) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def train(name, attn, data, val, vocab, args):
    """One run; returns (losses per step, held-out loss, seconds)."""
    torch.manual_seed(args.seed)                          # the same initial weights
    model = TinyLM(vocab, args.d_model, args.heads, args.layers, args.ctx, attn)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed + 1)      # the same batches
    losses = []
    t0 = time.perf_counter()
    for step in range(args.steps):
        ix = torch.randint(len(data) - args.ctx - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + args.ctx] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + args.ctx] for i in ix])
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    secs = time.perf_counter() - t0
    with torch.no_grad():                                 # fixed, non-overlapping windows
        n = (len(val) - 1) // args.ctx
        xs = val[:n * args.ctx].view(n, args.ctx)
        ys = val[1:n * args.ctx + 1].view(n, args.ctx)
        held = F.cross_entropy(model(xs).reshape(-1, vocab), ys.reshape(-1)).item()
    return losses, held, secs


def attention_time(args, reps=60):
    """One block's attention (the training shape), forward + backward, libsdpa against
    torch SDPA, interleaved (order alternating), medians."""
    import statistics
    Dh = args.d_model // args.heads
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(args.batch, args.ctx, 3, args.heads, Dh, generator=g).requires_grad_()
    do = torch.randn(args.batch, args.heads, args.ctx, Dh, generator=g)

    def run(f):
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        t = time.perf_counter()
        f(q, k, v, is_causal=True).backward(do)
        return time.perf_counter() - t

    fns = {"libsdpa": lt.scaled_dot_product_attention, "torch": F.scaled_dot_product_attention}
    ts = {n: [] for n in fns}
    for i in range(reps + 2):
        for n in (("libsdpa", "torch") if i % 2 else ("torch", "libsdpa")):
            t = run(fns[n])
            if i >= 2:
                ts[n].append(t)
    a, b = (statistics.median(ts[n]) * 1e3 for n in ("libsdpa", "torch"))
    print(f"one attention call [B={args.batch}, H={args.heads}, T={args.ctx}, D={Dh}] causal, "
          f"forward + backward, median of {reps} interleaved: libsdpa {a:.2f} ms, torch SDPA "
          f"{b:.2f} ms ({args.threads} thread(s))")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless within 1%%")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=25, help="print the losses every N steps")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ctx", type=int, default=64)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)                   # libsdpa.torch uses the same count

    with open(os.path.join(HERE, "tiny_corpus.txt"), encoding="utf-8") as f:
        text = f.read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    data, val = ids[:split], ids[split:]
    print(f"libsdpa {libsdpa.__version__} (isa {libsdpa.info()['active_isa']}), torch "
          f"{torch.__version__}, {args.threads} thread(s); corpus {len(text)} chars, vocab "
          f"{len(chars)}; model {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"context {args.ctx}, batch {args.batch}, {args.steps} steps, AdamW lr {args.lr}, "
          f"seed {args.seed}")

    runs = {}
    for name, attn in (("libsdpa", lt.scaled_dot_product_attention),
                       ("torch", F.scaled_dot_product_attention)):
        runs[name] = train(name, attn, data, val, len(chars), args)
    (la, ha, sa), (lb, hb, sb) = runs["libsdpa"], runs["torch"]

    print(f"\n{'step':>6} {'libsdpa':>10} {'torch SDPA':>11} {'rel diff':>10}")
    for s in list(range(0, args.steps, args.every)) + [args.steps - 1]:
        if s == args.steps - 1 and s % args.every == 0:
            continue
        print(f"{s + 1:>6} {la[s]:>10.6f} {lb[s]:>11.6f} {(la[s] - lb[s]) / lb[s]:>+10.2e}")
    rel = [abs(a - b) / b for a, b in zip(la, lb)]
    first = next((i for i, r in enumerate(rel) if r > 0), None)
    final = abs(la[-1] - lb[-1]) / lb[-1]
    held = abs(ha - hb) / hb
    print(f"\nlast step's training loss: libsdpa {la[-1]:.6f}, torch SDPA {lb[-1]:.6f}, "
          f"relative difference {final:.2e} (check: <= 1e-2)")
    print(f"held-out loss ({len(val)} chars): libsdpa {ha:.6f}, torch SDPA {hb:.6f}, relative "
          f"difference {held:.2e}")
    print(f"largest relative difference over all {args.steps} steps {max(rel):.2e}; the losses "
          f"first differ at step {first + 1 if first is not None else '-'} (from then on the "
          "two runs' weights differ by rounding, which training carries forward)")
    print(f"training time: libsdpa run {sa:.1f} s, torch SDPA run {sb:.1f} s "
          f"({args.threads} thread(s))")
    attention_time(args)
    ok = final <= 1e-2 and held <= 1e-2 and all(map(math.isfinite, la))
    if args.check:
        print(f"check: {'passed' if ok else 'FAILED'}")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
