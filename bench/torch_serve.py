#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/torch_serve.py - the `sdpa bench --serve` step done with PyTorch's SDPA, one call per sequence.
"""Times the continuous-batching step of `sdpa bench --serve` the way a PyTorch
integrator without a paged kernel does it: per sequence, gather its pages from
the paged cache [num_blocks, Hkv, block_size, D] into a contiguous [1, Hkv, Tk, D]
(index_select on the block table), then torch.nn.functional.scaled_dot_product_attention
(enable_gqa; bottom-right causal for the prefill chunks, none for the decode rows,
whose one query sees every key). Prints the same JSON lines as `sdpa bench --serve
--json` with "impl": "torch-sdpa" on stdout, a table on stderr.

    sdpa bench --serve --json > serve.jsonl
    python3 bench/torch_serve.py --from-sdpa serve.jsonl >> serve.jsonl

--from-sdpa fills peak_gbps / pct_bw (the read bandwidth `sdpa bench` measured at
the same thread count) and ratio_vs_paged (torch ms / sdpa-paged ms). Without
PyTorch the script says so on stderr and exits 0 (nothing to time): install it
as bench/torch_sdpa.py explains.

The step: 32 decode rows at context lengths 256 + round(i * 7936 / 31), then two
512-token chunks over 2048 cached keys; Hq 32, Hkv 8, D 128, pages of 16 keys,
shuffled. "step" rows time all 34 sequences, "decode" rows the 32 decode rows.
GB/s = K and V bytes of every sequence read once / time, as in `sdpa bench`.
"""
import argparse
import json
import resource
import statistics
import sys
import time
import warnings

DECODE, PREFILL, CHUNK, PREFIX = 32, 2, 512, 2048
HQ, HKV, D, BS = 32, 8, 128, 16


def step_lengths():
    seqs = []  # (Tq, Tk)
    for b in range(DECODE):
        seqs.append((1, 256 + (b * (8192 - 256) + (DECODE - 1) // 2) // (DECODE - 1)))
    seqs += [(CHUNK, PREFIX + CHUNK)] * PREFILL
    return seqs


def counts(seqs):
    keys = sum(tk for _, tk in seqs)
    tokens = sum(tq for tq, _ in seqs)
    pairs = HQ * sum(tk - tq + i + 1 for tq, tk in seqs for i in range(tq))
    return keys, tokens, pairs


def peak_rss_mb():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def load_sdpa_rows(paths):
    bw, paged = {}, {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "serve" not in r or not r.get("impl", "").startswith("sdpa"):
                    continue
                if r.get("peak_gbps"):
                    bw[r["threads"]] = r["peak_gbps"]
                if r["impl"] == "sdpa-paged":
                    paged[(r["serve"], r["threads"])] = r["ms"]
    return bw, paged


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default 1 and torch's default)")
    p.add_argument("--reps", type=int, default=5, help="timed runs per row (default 5)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-time", type=float, default=5.0, help="seconds of timed runs per row, about")
    p.add_argument("--from-sdpa", metavar="FILE", action="append",
                   help="JSON lines of `sdpa bench --serve --json` (repeatable)")
    args = p.parse_args()
    if args.reps < 1 or args.warmup < 0 or args.max_time <= 0:
        p.error("--reps must be >= 1, --warmup >= 0, --max-time > 0")
    try:
        threads = [int(t) for t in args.threads.split(",")] if args.threads else None
    except ValueError:
        p.error(f"--threads '{args.threads}': expected integers separated by commas")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch
            import torch.nn.functional as F
    except ImportError:
        print(f"torch_serve.py: PyTorch is not installed for {sys.executable}: no torch-sdpa rows "
              "(see bench/torch_sdpa.py for how to install it)", file=sys.stderr)
        return 0
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"torch_serve.py: torch {torch.__version__} has no scaled_dot_product_attention: skipped",
              file=sys.stderr)
        return 0

    bw, paged = load_sdpa_rows(args.from_sdpa or [])
    default_threads = torch.get_num_threads()
    threads = threads or sorted({1, default_threads})
    seqs = step_lengths()
    pages = [(tk + BS - 1) // BS for _, tk in seqs]
    nb = sum(pages)
    g = torch.Generator().manual_seed(1234)
    perm = torch.randperm(nb, generator=g)
    tables, at = [], 0
    for n in pages:
        tables.append(perm[at:at + n].clone())
        at += n
    kc = torch.rand(nb, HKV, BS, D, generator=g) * 2 - 1
    vc = torch.rand(nb, HKV, BS, D, generator=g) * 2 - 1
    qs = [torch.rand(1, HQ, tq, D, generator=g) * 2 - 1 for tq, _ in seqs]
    kw_gqa = {}
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4),
                                       enable_gqa=True)
        kw_gqa["enable_gqa"] = True
    except (TypeError, RuntimeError):
        pass
    masks = []
    for tq, tk in seqs:
        if tq == 1:
            masks.append(None)  # one query sees every key
        else:
            try:
                from torch.nn.attention.bias import causal_lower_right
                masks.append(causal_lower_right(tq, tk))
            except ImportError:
                i = torch.arange(tq).unsqueeze(1)
                j = torch.arange(tk).unsqueeze(0)
                masks.append(j <= i + (tk - tq))

    def run(nseq):
        outs = []
        with torch.no_grad():
            for b in range(nseq):
                tq, tk = seqs[b]
                k = kc.index_select(0, tables[b]).transpose(0, 1).reshape(1, HKV, -1, D)[:, :, :tk]
                v = vc.index_select(0, tables[b]).transpose(0, 1).reshape(1, HKV, -1, D)[:, :, :tk]
                if not kw_gqa:
                    k = k.repeat_interleave(HQ // HKV, dim=1)
                    v = v.repeat_interleave(HQ // HKV, dim=1)
                outs.append(F.scaled_dot_product_attention(qs[b], k, v, attn_mask=masks[b], **kw_gqa))
        return outs

    err = sys.stderr
    print(f"# torch_serve.py: torch {torch.__version__}, threads {','.join(map(str, threads))}; the step of "
          f"`sdpa bench --serve`, pages gathered per sequence (index_select), then SDPA per sequence", file=err)
    print(f"{'impl':<13} {'thr':>3}  {'part':<6} {'seqs':>4} {'ms':>10} {'tokens/s':>11} {'GB/s':>8} {'%bw':>6} "
          f"{'/paged':>9}", file=err)
    for t in threads:
        torch.set_num_threads(t)
        for part, nseq in (("step", len(seqs)), ("decode", DECODE)):
            keys, tokens, pairs = counts(seqs[:nseq])
            last = 0.0
            for _ in range(args.warmup):
                t0 = time.perf_counter()
                run(nseq)
                last = time.perf_counter() - t0
            reps = args.reps
            if args.warmup > 0 and last * reps > args.max_time and last > 0:
                reps = max(1, int(args.max_time / last))
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                run(nseq)
                times.append(time.perf_counter() - t0)
            sec = statistics.median(times)
            gbps = keys * HKV * 2 * D * 4 / sec * 1e-9
            row = {"impl": "torch-sdpa", "op": "forward", "isa": "torch", "threads": t, "serve": part,
                   "seqs": nseq, "Hq": HQ, "Hkv": HKV, "Dk": D, "Dv": D, "block_size": BS,
                   "tokens": tokens, "kv_keys": keys, "ms": sec * 1e3, "tokens_per_s": tokens / sec,
                   "gbps": gbps, "peak_gbps": bw.get(t),
                   "pct_bw": 100 * gbps / bw[t] if bw.get(t) else None,
                   "gflops": 2.0 * pairs * 2 * D / sec * 1e-9, "pairs": pairs}
            if paged.get((part, t)):
                row["ratio_vs_paged"] = sec * 1e3 / paged[(part, t)]
            row["rss_mb"] = peak_rss_mb()
            row["reps"] = reps
            row["torch_version"] = torch.__version__
            print(json.dumps(row), flush=True)
            pb = f"{row['pct_bw']:.1f}" if row["pct_bw"] else "-"
            ra = f"{row['ratio_vs_paged']:.3f}x" if "ratio_vs_paged" in row else "-"
            print(f"{'torch-sdpa':<13} {t:>3}  {part:<6} {nseq:>4} {sec * 1e3:>10.3f} {tokens / sec:>11.1f} "
                  f"{gbps:>8.2f} {pb:>6} {ra:>9}", file=err, flush=True)
    torch.set_num_threads(default_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
