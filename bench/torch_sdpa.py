#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/torch_sdpa.py - PyTorch's CPU scaled_dot_product_attention on the shapes of `sdpa bench`.
"""Times torch.nn.functional.scaled_dot_product_attention on the CPU (forward,
and backward through autograd) on the same shapes, masks and thread counts as
`sdpa bench`, and prints the same JSON lines with "impl": "torch-sdpa",
"isa": "torch" on stdout (a table goes to stderr).

    sdpa bench --json > sdpa.jsonl
    python3 bench/torch_sdpa.py --from-sdpa sdpa.jsonl > torch.jsonl
    python3 bench/plot.py sdpa.jsonl torch.jsonl -o bench.png

--from-sdpa fills peak_gflops / peak_gbps (the best ISA's measured peak at the
same thread count) and speedup_vs_scalar from the rows of `sdpa bench`;
without it they are null / absent. Without --shape, --mask and --quick, the
shapes and masks (and, without --threads, the thread counts) are those of the
file's rows, so `sdpa bench --quick --json` and a custom `--shape` run are
matched row for row; with none of them (and no --from-sdpa) the defaults of
`sdpa bench`.

Installing PyTorch (optional; only this script needs it):

    python3 -m pip install -r bench/requirements.txt

with the same python3 that runs this script. On Linux x86-64, PyPI's torch
wheel is built with CUDA and pulls the NVIDIA runtime wheels as dependencies
(about 4.5 GB installed for torch 2.15.0: torch 1.2 GB, nvidia-* 3 GB); it runs
on machines without a GPU and its CPU kernels are the ones measured here. The
much smaller CPU-only wheels are on PyTorch's own package index (see the
install selector on pytorch.org), which is not PyPI; use it where you can reach
it. Debian's python3-torch (1.13) predates scaled_dot_product_attention.

Timing: one tiny forward and backward first (PyTorch's one-time set-up),
then per row a warm-up and the median of --reps runs (time.perf_counter, a
monotonic clock); fewer runs, at least one, when one run is long (about
--max-time seconds per row). Forward runs under torch.no_grad() (inference); backward times
torch.autograd.grad of the output with a fixed dO, the forward graph built once
beforehand and retained. FLOPs: forward 2 P (Dk + Dv), backward
2 P (3 Dk + 2 Dv), P = allowed (query, key) pairs, as in `sdpa bench`.
Masks: causal = is_causal=True (top-left); causal-bottom-right =
torch.nn.attention.bias.causal_lower_right (is_causal when Tq = Tk); padding = a
boolean [B, 1, 1, Tk] mask with the same key lengths as `sdpa bench` (Tk/2 for
batch 0 up to Tk for the last). GQA (Hq > Hkv) uses enable_gqa=True where
PyTorch has it, else K and V are expanded with repeat_interleave outside the
timed region ("gqa": "repeat" in the row).
Types: --dtype fp32,bf16 times each shape once per type (default fp32 only),
with Q, K, V (and dO) torch.bfloat16 tensors holding the fp32 inputs rounded
to bf16, PyTorch's own kernels and accumulation. fp32 rows are exactly as
without the option (no "dtype" field, as before; plot.py reads a missing dtype
as fp32); bf16 rows add "dtype": "bf16", count K and V as 2-byte elements in
GB/s and take speedup_vs_scalar from the bf16 rows of `sdpa bench --dtype`.
"""
import argparse
import json
import resource
import statistics
import sys
import time
import warnings

DECODE_MAX_TQ = 16
MASKS = ("none", "causal", "causal-bottom-right", "padding")
DEFAULT_CASES = [
    ((1, 8, 8, 512, 512, 64, 64), "none"),
    ((1, 8, 8, 512, 512, 64, 64), "causal"),
    ((1, 8, 8, 2048, 2048, 128, 128), "causal"),
    ((1, 32, 8, 1, 4096, 128, 128), "none"),
    ((8, 12, 12, 128, 128, 64, 64), "padding"),
]
QUICK_CASES = [
    ((1, 4, 4, 256, 256, 64, 64), "none"),
    ((1, 4, 4, 256, 256, 64, 64), "causal"),
    ((1, 4, 4, 512, 512, 128, 128), "causal"),
    ((1, 32, 8, 1, 1024, 128, 128), "none"),
    ((4, 4, 4, 128, 128, 64, 64), "padding"),
]
INSTALL_HINT = """PyTorch is not installed for this python3 ({exe}).
Install it with:  {exe} -m pip install -r bench/requirements.txt
(see the notes at the top of bench/torch_sdpa.py about the wheel's size)."""


# ---------------------------------------------------------------- shapes and counts (as bench.c)

def padding_length(s, b):
    B, Tk = s[0], s[4]
    half = Tk // 2
    return half + b * (Tk - half) // (B - 1) if B > 1 else half


def row_hi(s, mask, b, i):
    Tq, Tk = s[3], s[4]
    if mask == "causal":
        hi = i + 1
    elif mask == "causal-bottom-right":
        hi = i + Tk - Tq + 1
    elif mask == "padding":
        hi = padding_length(s, b)
    else:
        hi = Tk
    return max(0, min(hi, Tk))


def allowed_pairs(s, mask):
    B, Hq, Tq = s[0], s[1], s[3]
    return float(Hq * sum(row_hi(s, mask, b, i) for b in range(B) for i in range(Tq)))


def kv_bytes_read(s, mask, esize=4):
    B, Hkv, Tq, Dk, Dv = s[0], s[2], s[3], s[5], s[6]
    keys = sum(max(row_hi(s, mask, b, i) for i in range(Tq)) for b in range(B))
    return float(keys * Hkv * (Dk + Dv) * esize)


def op_flops(s, mask, backward):
    d = 3 * s[5] + 2 * s[6] if backward else s[5] + s[6]
    return 2.0 * allowed_pairs(s, mask) * d


def footprint(s):
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    q, kv = B * Hq * Tq, B * Hkv * Tk
    return 4.0 * (2 * q * Dk + 2 * kv * (Dk + Dv) + 3 * q * Dv + q)


def parse_list(text, what):
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} '{text}': expected integers separated by commas")
    return vals


def parse_dtypes(text, allowed, prog):
    out = []
    for x in text.split(","):
        if x not in allowed:
            sys.exit(f"{prog}: error: --dtype '{x}': expected one of {', '.join(allowed)}")
        if x not in out:
            out.append(x)
    return out


def build_cases(args, prog="torch_sdpa.py"):
    masks = []
    for m in args.mask or []:
        for x in m.split(","):
            if x not in MASKS:
                sys.exit(f"{prog}: error: --mask '{x}': expected one of {', '.join(MASKS)}")
            if x not in masks:
                masks.append(x)
    cases = []
    if args.shape:
        for text in args.shape:
            s = tuple(parse_list(text, "--shape"))
            if len(s) != 7 or min(s) < 1 or s[1] % s[2] != 0:
                sys.exit(f"{prog}: error: --shape '{text}': expected B,Hq,Hkv,Tq,Tk,Dk,Dv "
                         "(each >= 1, Hq a multiple of Hkv)")
            for m in MASKS:
                if (not masks and m == "none") or m in masks:
                    cases.append((s, m))
    else:
        for s, own in (QUICK_CASES if args.quick else DEFAULT_CASES):
            for m in MASKS:
                if (not masks and m == own) or m in masks:
                    cases.append((s, m))
    seen, out = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            out.append(c)
    out.sort(key=lambda c: footprint(c[0]))  # stable: big shapes last (rss is a high-water mark)
    return out


# ---------------------------------------------------------------- timing

def peak_rss_mb():
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024.0 * 1024.0) if sys.platform == "darwin" else r / 1024.0


def time_runs(fn, args):
    last = 0.0
    for _ in range(args.warmup):
        t0 = time.perf_counter()
        fn()
        last = time.perf_counter() - t0
    reps = args.reps
    if args.warmup > 0 and last * reps > args.max_time and last > 0:
        reps = max(1, int(args.max_time / last))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), reps


# ---------------------------------------------------------------- torch

def make_problem(torch, F, s, mask, grad, dtype=None):
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    g = torch.Generator().manual_seed(1234)
    q = torch.rand(B, Hq, Tq, Dk, generator=g) * 2 - 1
    k = torch.rand(B, Hkv, Tk, Dk, generator=g) * 2 - 1
    v = torch.rand(B, Hkv, Tk, Dv, generator=g) * 2 - 1
    if dtype is not None and dtype != torch.float32:  # the same values, rounded (bf16)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    kw = {}
    gqa = "none"
    if Hq != Hkv:
        if supports_gqa(F):
            kw["enable_gqa"] = True
            gqa = "enable_gqa"
        else:
            k = k.repeat_interleave(Hq // Hkv, dim=1)
            v = v.repeat_interleave(Hq // Hkv, dim=1)
            gqa = "repeat"
    if mask == "causal" or (mask == "causal-bottom-right" and Tq == Tk):
        kw["is_causal"] = True
    elif mask == "causal-bottom-right":
        try:
            from torch.nn.attention.bias import causal_lower_right
            kw["attn_mask"] = causal_lower_right(Tq, Tk)
        except ImportError:
            i = torch.arange(Tq).unsqueeze(1)
            j = torch.arange(Tk).unsqueeze(0)
            kw["attn_mask"] = j <= i + (Tk - Tq)
    elif mask == "padding":
        lens = torch.tensor([padding_length(s, b) for b in range(B)])
        kw["attn_mask"] = (torch.arange(Tk).unsqueeze(0) < lens.unsqueeze(1)).view(B, 1, 1, Tk)
    if grad:
        q.requires_grad_(True)
        k.requires_grad_(True)
        v.requires_grad_(True)
    return q, k, v, kw, gqa


_GQA = None


def supports_gqa(F):
    """enable_gqa= exists from PyTorch 2.5 on (the builtin has no inspectable signature)."""
    global _GQA
    if _GQA is None:
        import torch
        try:
            F.scaled_dot_product_attention(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4),
                                           torch.zeros(1, 1, 1, 4), enable_gqa=True)
            _GQA = True
        except (TypeError, RuntimeError):
            _GQA = False
    return _GQA


def json_rows(paths):
    """The JSON objects of the lines of these files ('-': stdin), in order; lines that
    are not a JSON object (comments, tables, a truncated line) are skipped. Shared by
    every script of bench/ that reads the rows of `sdpa bench --json` and its peers."""
    for path in paths:
        f = sys.stdin if path == "-" else open(path, errors="replace")
        with f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(r, dict):
                    yield r


def load_sdpa_rows(paths):
    """Peaks, read bandwidths and scalar times by thread count / row (scalar
    times keyed by (shape, mask, op, threads, dtype)), and the (shape, mask)
    cases and thread counts of the rows, in order."""
    peaks, bw, scalar, cases, threads = {}, {}, {}, [], []
    for r in json_rows(paths):
        if any(x not in r for x in ("threads", "B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv", "mask", "op", "ms")):
            continue
        if r.get("impl") != "sdpa" or r.get("variant", "plain") != "plain":
            continue  # torch runs plain attention: skip `sdpa bench --softcap/--alibi/--sinks` rows
        if "ratio_vs_kv_lengths" in r:
            continue  # padding given as a mask or bias (padding-bool, ...): the `padding` row's problem
        t = r["threads"]
        case = (tuple(r[x] for x in ("B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv")), r["mask"])
        if case not in cases:
            cases.append(case)
        if t not in threads:
            threads.append(t)
        if r.get("peak_gflops"):
            peaks[t] = max(peaks.get(t, 0.0), r["peak_gflops"])
        if r.get("peak_gbps"):
            bw[t] = max(bw.get(t, 0.0), r["peak_gbps"])
        if r.get("isa") == "scalar":  # compared per type: fp32 rows with fp32, bf16 with bf16
            key = (tuple(r[x] for x in ("B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv")), r["mask"], r["op"], t,
                   r.get("dtype", "fp32"))
            scalar[key] = r["ms"]
    return peaks, bw, scalar, cases, threads


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=lambda t: parse_list(t, "--threads"), default=None,
                   help="thread counts, e.g. 1,2 (default 1 and torch's default)")
    p.add_argument("--shape", action="append", help="B,Hq,Hkv,Tq,Tk,Dk,Dv (repeatable)")
    p.add_argument("--mask", action="append", help="none|causal|causal-bottom-right|padding[,..]")
    p.add_argument("--op", choices=("forward", "backward", "both"), default="both")
    p.add_argument("--dtype", default="fp32", metavar="fp32,bf16",
                   help="tensor types to time, each shape once per type (default fp32)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row (default 5, --quick 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-time", type=float, default=None,
                   help="seconds of timed runs per row, about (default 5, --quick 1)")
    p.add_argument("--quick", action="store_true", help="the small shapes of `sdpa bench --quick`")
    p.add_argument("--from-sdpa", metavar="FILE", action="append",
                   help="JSON lines of `sdpa bench --json` (repeatable): peaks and scalar times")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.max_time is None:
        args.max_time = 1.0 if args.quick else 5.0
    if args.reps < 1 or args.warmup < 0 or args.max_time <= 0:
        p.error("--reps must be >= 1, --warmup >= 0, --max-time > 0")
    dtypes = parse_dtypes(args.dtype, ("fp32", "bf16"), "torch_sdpa.py")

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. "Failed to initialize NumPy" when numpy is absent
            import torch
            import torch.nn.functional as F
    except ImportError:
        print(INSTALL_HINT.format(exe=sys.executable), file=sys.stderr)
        return 3
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"torch {torch.__version__} has no scaled_dot_product_attention (needs >= 2.0)", file=sys.stderr)
        return 3

    peaks, bw, scalar, file_cases, file_threads = load_sdpa_rows(args.from_sdpa or [])
    default_threads = torch.get_num_threads()
    from_file = bool(file_cases) and not (args.shape or args.mask or args.quick)
    threads = args.threads or (sorted(file_threads) if from_file else sorted({1, default_threads}))
    if min(threads) < 1:
        p.error("--threads: every count must be >= 1")
    if from_file:
        cases = sorted(file_cases, key=lambda c: footprint(c[0]))  # stable: big shapes last
    else:
        cases = build_cases(args)
    ops = ["forward", "backward"] if args.op == "both" else [args.op]

    # One-time initialisation (autograd engine, kernel selection) outside every row.
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    for dt in dtypes:
        wq = torch.rand(1, 1, 16, 16).to(torch_dtypes[dt]).requires_grad_(True)
        wo = F.scaled_dot_product_attention(wq, wq, wq, is_causal=True)
        torch.autograd.grad(wo, (wq,), torch.ones_like(wo))
    typed = dtypes != ["fp32"]  # a dtype column in the table, as `sdpa bench` has one

    cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    err = sys.stderr
    print(f"# torch_sdpa.py: torch {torch.__version__} (CPU capability {cap}), "
          f"default threads {default_threads}; threads {','.join(map(str, threads))}; "
          + (f"types {','.join(dtypes)}; " if typed else "")
          + f"median of up to {args.reps} runs after {args.warmup} warm-up", file=err)
    dcol = f" {'dtype':<5}" if typed else ""
    print(f"{'impl':<10} {'isa':<8} {'thr':>3}  {'B,Hq,Hkv,Tq,Tk,Dk,Dv':<28} {'mask':<19}{dcol} {'op':<8} "
          f"{'ms':>10} {'GFLOP/s':>9} {'%peak':>6} {'xscalar':>8} {'GB/s':>8} {'RSS MiB':>8}", file=err)
    for s, mask in cases:
        rss_before = peak_rss_mb()
        for dt, op in [(dt, op) for dt in dtypes for op in ops]:
            backward = op == "backward"
            q, k, v, kw, gqa = make_problem(torch, F, s, mask, backward, torch_dtypes[dt])
            if backward:
                out = F.scaled_dot_product_attention(q, k, v, **kw)
                dout = (torch.rand(out.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1).to(out.dtype)

                def fn():
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
            else:
                def fn():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, k, v, **kw)
            for t in threads:
                torch.set_num_threads(t)
                sec, reps = time_runs(fn, args)
                B, Hq, Hkv, Tq, Tk, Dk, Dv = s
                gflops = op_flops(s, mask, backward) / sec * 1e-9
                row = {"impl": "torch-sdpa", "op": op, "isa": "torch", "threads": t,
                       "B": B, "Hq": Hq, "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "Dk": Dk, "Dv": Dv,
                       "mask": mask}
                if dt != "fp32":
                    row["dtype"] = dt  # fp32 rows keep the fields they always had
                row.update({"ms": sec * 1e3, "gflops": gflops, "peak_gflops": peaks.get(t)})
                if Tq <= DECODE_MAX_TQ:
                    row["gbps"] = kv_bytes_read(s, mask, 4 if dt == "fp32" else 2) / sec * 1e-9
                    row["peak_gbps"] = bw.get(t)
                row["rss_mb"] = peak_rss_mb()
                row["rss_increase_mb"] = row["rss_mb"] - rss_before
                row["reps"] = reps
                row["pairs"] = allowed_pairs(s, mask)
                ref = scalar.get((s, mask, op, t, dt))
                if ref:
                    row["speedup_vs_scalar"] = ref / row["ms"]
                row["gqa"] = gqa
                row["torch_version"] = torch.__version__
                print(json.dumps(row), flush=True)
                pk = f"{100 * gflops / row['peak_gflops']:.1f}" if row["peak_gflops"] else "-"
                sp = f"{row['speedup_vs_scalar']:.2f}x" if ref else "-"
                gb = f"{row['gbps']:.2f}" if "gbps" in row else ""
                dv = f" {dt:<5}" if typed else ""
                print(f"{'torch-sdpa':<10} {'torch':<8} {t:>3}  {','.join(map(str, s)):<28} {mask:<19}{dv} "
                      f"{op:<8} {row['ms']:>10.3f} {gflops:>9.2f} {pk:>6} {sp:>8} {gb:>8} "
                      f"{row['rss_mb']:>8.1f}", file=err, flush=True)
            del q, k, v, kw
    torch.set_num_threads(default_threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
