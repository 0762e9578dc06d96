#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/openvino_sdpa.py - OpenVINO's CPU ScaledDotProductAttention on the shapes of `sdpa bench`.
"""Times OpenVINO's ScaledDotProductAttention (opset13) on the CPU, forward
only, on the same shapes, masks and thread counts as `sdpa bench`, in f32 and
in OpenVINO's default precision for this CPU, and prints the same JSON lines
as bench/torch_sdpa.py with "impl": "openvino-sdpa", "isa": "openvino" and a
"dtype" on stdout (a table goes to stderr).

    sdpa bench --json > sdpa.jsonl
    python3 bench/openvino_sdpa.py --from-sdpa sdpa.jsonl > openvino.jsonl
    python3 bench/plot.py sdpa.jsonl openvino.jsonl -o bench.png

The command line is torch_sdpa.py's (--threads, --shape, --mask, --op, --reps,
--warmup, --max-time, --quick, --from-sdpa, --dtype: same meanings and
defaults), and the shapes, masks, FLOP and byte counts, timing and the
--from-sdpa matching are the ones of that file, imported from it (it imports
torch only inside its main()). OpenVINO has no SDPA backward: --op backward or
both time the forward only and say so on stderr.

Installing OpenVINO (optional; only this script needs it):

    python3 -m pip install -r bench/requirements.txt

(or just the openvino and numpy lines of that file), with the same python3
that runs this script.

Model: per shape and mask one ov.Model of three f32 Parameters (Q [B,Hq,Tq,Dk],
K [B,H,Tk,Dk], V [B,H,Tk,Dv]) and, where the mask needs one, a boolean mask
Parameter, into one opset13 scaled_dot_product_attention (default scale
1/sqrt(Dk)). Masks: causal = the op's causal flag (top-left, as
is_causal=True); causal-bottom-right = a boolean [1,1,Tq,Tk] mask input, key
j allowed for query i when j <= i + Tk - Tq (the causal flag when Tq = Tk);
padding = a boolean [B,1,1,Tk] mask input with the key lengths of `sdpa
bench` (true = attend, as in PyTorch). GQA (Hq > Hkv): the op needs K and V
with Q's head count, so K and V are repeated to Hq heads with numpy.repeat
(head h reads KV head h // (Hq/Hkv), as repeat_interleave) outside the timed
region: "gqa": "repeat" and a "note" in the row; GB/s still count Hkv heads
(the bytes of the problem, as in every other row), while OpenVINO reads
Hq/Hkv times as many.

Precision (--dtype, default fp32,default): each entry compiles the model once
per thread count on "CPU" with INFERENCE_NUM_THREADS = that count,
NUM_STREAMS 1, PERFORMANCE_HINT LATENCY and:
  fp32     INFERENCE_PRECISION_HINT f32
  bf16     INFERENCE_PRECISION_HINT bf16
  fp16     INFERENCE_PRECISION_HINT f16
  default  no precision hint: what OpenVINO picks on this CPU (bf16 where the
           CPU has AVX512-BF16 or AMX, f32 elsewhere)
Inputs and output are f32 numpy arrays in every case; a 16-bit precision is
OpenVINO's internal compute type. Each row says what it asked and what ran:
"ov_hint" (f32, bf16, f16 or default), "ov_precision" (the compiled model's
INFERENCE_PRECISION_HINT, the precision OpenVINO resolved the request to),
"dtype" (that precision in the bench's spelling: fp32, bf16, fp16) and
"ov_layer" (layer type/primitive of the runtime graph's node that keeps the
op's name: "Subgraph/..." when OpenVINO fused the attention into one kernel,
"MatMul/..." when it runs separate MatMul and Softmax nodes; with openvino
2026.4.1 on an AVX512-BF16 Xeon, f32 and bf16 fuse and f16 does not). An entry that
resolves to the same precision as an earlier one (default on a CPU without
bf16, say) is skipped with a note. GB/s count K and V as f32 (4-byte)
elements, the inputs OpenVINO reads.

Timing: one tiny model compiled and run first per precision (one-time set-up),
then per row the model is compiled (outside the timed region), its inputs
bound once to the numpy arrays (no copies) and InferRequest.infer(
share_outputs=True) timed: a warm-up, then the median of --reps runs
(time.perf_counter), fewer, at least one, when one run is long (about
--max-time seconds per row), exactly as torch_sdpa.py. --check compares each
compiled model's output once with a float64 numpy reference before timing
(stderr only; exits 1 past 1e-4 for f32, 5e-2 for a 16-bit precision). It
found one fault: openvino 2026.4.1's bf16 precision with the causal flag and
Tq = 1 < Tk (a one-key causal decode, not a default shape) returns NaN or
values near 1e35; f32 is right there, and every Tq >= 2 shape checked is right
in both.
"""
import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa as common  # noqa: E402  (shapes, masks, counts, timing; no torch import at this level)

PROG = "openvino_sdpa.py"
DTYPES = ("fp32", "bf16", "fp16", "default")
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "default": None}
OV_TO_BENCH = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
INSTALL_HINT = """OpenVINO is not installed for this python3 ({exe}).
Install it with:  {exe} -m pip install -r bench/requirements.txt
(only the openvino and numpy lines are needed by this script)."""
GQA_NOTE = ("K and V repeated from Hkv to Hq heads (numpy.repeat) outside the timed region: "
            "OpenVINO's ScaledDotProductAttention takes K/V with Q's head count")


def import_openvino():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # openvino.runtime is deprecated in recent releases
        import numpy as np
        import openvino as ov
        try:
            import openvino.opset13 as opset
        except ImportError:
            from openvino.runtime import opset13 as opset
    return np, ov, opset


def precision_name(ov_type):
    """An ov.Type (or its string) as OpenVINO spells it: f32, bf16, f16."""
    name = getattr(ov_type, "get_type_name", None)
    if callable(name):
        return name()
    text = str(ov_type)
    for full, short in (("bfloat16", "bf16"), ("float32", "f32"), ("float16", "f16")):
        if full in text:
            return short
    return text


# ---------------------------------------------------------------- the model and its inputs

def make_inputs(np, s, mask):
    """Q, K, V (f32, K/V repeated to Hq heads for GQA), the mask array or None,
    the causal flag, and the row's gqa value."""
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    rng = np.random.default_rng(1234)
    q = rng.uniform(-1.0, 1.0, (B, Hq, Tq, Dk)).astype(np.float32)
    k = rng.uniform(-1.0, 1.0, (B, Hkv, Tk, Dk)).astype(np.float32)
    v = rng.uniform(-1.0, 1.0, (B, Hkv, Tk, Dv)).astype(np.float32)
    gqa = "none"
    if Hq != Hkv:
        k = np.ascontiguousarray(np.repeat(k, Hq // Hkv, axis=1))
        v = np.ascontiguousarray(np.repeat(v, Hq // Hkv, axis=1))
        gqa = "repeat"
    causal, m = False, None
    if mask == "causal" or (mask == "causal-bottom-right" and Tq == Tk):
        causal = True
    elif mask == "causal-bottom-right":
        i = np.arange(Tq).reshape(Tq, 1)
        j = np.arange(Tk).reshape(1, Tk)
        m = (j <= i + (Tk - Tq)).reshape(1, 1, Tq, Tk)
    elif mask == "padding":
        lens = np.array([common.padding_length(s, b) for b in range(B)]).reshape(B, 1)
        m = (np.arange(Tk).reshape(1, Tk) < lens).reshape(B, 1, 1, Tk)
    return q, k, v, (np.ascontiguousarray(m) if m is not None else None), causal, gqa


def make_model(ov, opset, q, k, v, m, causal):
    pq = opset.parameter(list(q.shape), ov.Type.f32, name="q")
    pk = opset.parameter(list(k.shape), ov.Type.f32, name="k")
    pv = opset.parameter(list(v.shape), ov.Type.f32, name="v")
    params = [pq, pk, pv]
    if m is not None:
        pm = opset.parameter(list(m.shape), ov.Type.boolean, name="mask")
        params.append(pm)
        o = opset.scaled_dot_product_attention(pq, pk, pv, pm, name="sdpa")
    else:
        o = opset.scaled_dot_product_attention(pq, pk, pv, causal=causal, name="sdpa")
    return ov.Model([o], params, "sdpa")


def compile_model(core, model, dtype, threads):
    config = {"NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = threads
    if HINTS[dtype] is not None:
        config["INFERENCE_PRECISION_HINT"] = HINTS[dtype]
    return core.compile_model(model, "CPU", config)


def runtime_layer(compiled):
    """'layerType/primitiveType' of the runtime node(s) that keep the op's name."""
    found = []
    try:
        for op in compiled.get_runtime_model().get_ordered_ops():
            if op.get_friendly_name() == "sdpa" or op.get_friendly_name().startswith("sdpa/"):
                ri = op.get_rt_info()
                found.append(f"{ri['layerType'].astype(str)}/{ri['primitiveType'].astype(str)}")
    except Exception:  # the runtime model is informational only
        pass
    return "+".join(found) if found else None


def bind(ov, compiled, q, k, v, m):
    req = compiled.create_infer_request()
    arrays = {"q": q, "k": k, "v": v}
    if m is not None:
        arrays["mask"] = m
    for name, a in arrays.items():
        req.set_tensor(name, ov.Tensor(a, shared_memory=True))
    return req


def reference(np, q, k, v, m, causal):
    Tq, Tk = q.shape[2], k.shape[2]
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[3])
    if causal:
        allow = np.arange(Tk).reshape(1, Tk) <= np.arange(Tq).reshape(Tq, 1)
        s = np.where(allow, s, -np.inf)
    elif m is not None:
        s = np.where(m, s, -np.inf)
    s = np.exp(s - s.max(axis=-1, keepdims=True))
    s /= s.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", s, v.astype(np.float64))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=lambda t: common.parse_list(t, "--threads"), default=None,
                   help="thread counts, e.g. 1,2 (default 1 and OpenVINO's default)")
    p.add_argument("--shape", action="append", help="B,Hq,Hkv,Tq,Tk,Dk,Dv (repeatable)")
    p.add_argument("--mask", action="append", help="none|causal|causal-bottom-right|padding[,..]")
    p.add_argument("--op", choices=("forward", "backward", "both"), default=None,
                   help="OpenVINO has no SDPA backward: the forward is timed whatever this says")
    p.add_argument("--dtype", default="fp32,default", metavar="fp32,bf16,fp16,default",
                   help="precisions to compile for, each shape once per entry (default fp32,default)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row (default 5, --quick 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-time", type=float, default=None,
                   help="seconds of timed runs per row, about (default 5, --quick 1)")
    p.add_argument("--quick", action="store_true", help="the small shapes of `sdpa bench --quick`")
    p.add_argument("--from-sdpa", metavar="FILE", action="append",
                   help="JSON lines of `sdpa bench --json` (repeatable): peaks and scalar times")
    p.add_argument("--check", action="store_true",
                   help="compare each compiled model's output with a float64 numpy reference first")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.max_time is None:
        args.max_time = 1.0 if args.quick else 5.0
    if args.reps < 1 or args.warmup < 0 or args.max_time <= 0:
        p.error("--reps must be >= 1, --warmup >= 0, --max-time > 0")
    asked = common.parse_dtypes(args.dtype, DTYPES, PROG)

    try:
        np, ov, opset = import_openvino()
    except ImportError:
        print(INSTALL_HINT.format(exe=sys.executable), file=sys.stderr)
        return 3
    err = sys.stderr
    if args.op in ("backward", "both"):
        print(f"# {PROG}: OpenVINO has no ScaledDotProductAttention backward; forward rows only", file=err)

    peaks, bw, scalar, file_cases, file_threads = common.load_sdpa_rows(args.from_sdpa or [])
    core = ov.Core()

    # One-time set-up per precision outside every row; it also resolves what each
    # entry of --dtype runs as on this CPU and OpenVINO's default thread count.
    wq, wk, wv, wm, wc, _ = make_inputs(np, (1, 1, 1, 16, 16, 16, 16), "causal")
    wmodel = make_model(ov, opset, wq, wk, wv, wm, wc)
    default_threads = None
    dtypes = []  # (asked, precision OpenVINO resolved it to)
    for dt in asked:
        c = compile_model(core, wmodel, dt, None)
        bind(ov, c, wq, wk, wv, wm).infer(share_outputs=True)
        prec = precision_name(c.get_property("INFERENCE_PRECISION_HINT"))
        if default_threads is None:
            default_threads = int(c.get_property("INFERENCE_NUM_THREADS"))
        same = [a for a, pr in dtypes if pr == prec]
        if same:
            print(f"# {PROG}: --dtype {dt} runs as {prec} on this CPU, as {same[0]} does: skipped", file=err)
            continue
        dtypes.append((dt, prec))

    from_file = bool(file_cases) and not (args.shape or args.mask or args.quick)
    threads = args.threads or (sorted(file_threads) if from_file else sorted({1, default_threads}))
    if min(threads) < 1:
        p.error("--threads: every count must be >= 1")
    if from_file:
        cases = sorted(file_cases, key=lambda c: common.footprint(c[0]))  # stable: big shapes last
    else:
        cases = common.build_cases(args, PROG)

    print(f"# {PROG}: openvino {ov.get_version()} (CPU: {core.get_property('CPU', 'FULL_DEVICE_NAME')}), "
          f"default threads {default_threads}; threads {','.join(map(str, threads))}; precisions "
          f"{', '.join(f'{dt} (runs {pr})' for dt, pr in dtypes)}; "
          f"median of up to {args.reps} runs after {args.warmup} warm-up", file=err)
    print(f"{'impl':<13} {'isa':<8} {'thr':>3}  {'B,Hq,Hkv,Tq,Tk,Dk,Dv':<28} {'mask':<19} {'dtype':<5} {'op':<8} "
          f"{'ms':>10} {'GFLOP/s':>9} {'%peak':>6} {'xscalar':>8} {'GB/s':>8} {'RSS MiB':>8}", file=err)
    bad = 0
    op = "forward"
    for s, mask in cases:
        rss_before = common.peak_rss_mb()
        q, k, v, m, causal, gqa = make_inputs(np, s, mask)
        model = make_model(ov, opset, q, k, v, m, causal)
        ref = reference(np, q, k, v, m, causal) if args.check else None
        for dt, _ in dtypes:
            for t in threads:
                compiled = compile_model(core, model, dt, t)
                prec = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
                ov_threads = int(compiled.get_property("INFERENCE_NUM_THREADS"))
                req = bind(ov, compiled, q, k, v, m)
                if ref is not None:
                    out = req.infer(share_outputs=True)[0]
                    e = float(np.max(np.abs(out - ref)))
                    tol = 1e-4 if prec == "f32" else 5e-2
                    ok = np.isfinite(e) and e <= tol
                    bad += not ok
                    print(f"# check {','.join(map(str, s))} {mask} {prec} {t} threads: max |O - ref| = {e:.3g} "
                          f"({'ok' if ok else 'FAILED'}, tolerance {tol:g})", file=err)

                def fn():
                    req.infer(share_outputs=True)
                sec, reps = common.time_runs(fn, args)
                B, Hq, Hkv, Tq, Tk, Dk, Dv = s
                gflops = common.op_flops(s, mask, False) / sec * 1e-9
                bench_dtype = OV_TO_BENCH.get(prec, prec)
                row = {"impl": "openvino-sdpa", "op": op, "isa": "openvino", "threads": t,
                       "B": B, "Hq": Hq, "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "Dk": Dk, "Dv": Dv,
                       "mask": mask, "dtype": bench_dtype, "ms": sec * 1e3, "gflops": gflops,
                       "peak_gflops": peaks.get(t)}
                if Tq <= common.DECODE_MAX_TQ:
                    row["gbps"] = common.kv_bytes_read(s, mask, 4) / sec * 1e-9  # f32 inputs
                    row["peak_gbps"] = bw.get(t)
                row["rss_mb"] = common.peak_rss_mb()
                row["rss_increase_mb"] = row["rss_mb"] - rss_before
                row["reps"] = reps
                row["pairs"] = common.allowed_pairs(s, mask)
                sref = scalar.get((s, mask, op, t, bench_dtype))
                if sref:
                    row["speedup_vs_scalar"] = sref / row["ms"]
                row["gqa"] = gqa
                if gqa == "repeat":
                    row["note"] = GQA_NOTE
                row["ov_hint"] = HINTS[dt] or "default"
                row["ov_precision"] = prec
                row["ov_layer"] = runtime_layer(compiled)
                if ov_threads != t:
                    row["ov_threads"] = ov_threads
                    print(f"# {PROG}: asked for {t} threads, the compiled model has {ov_threads}", file=err)
                row["openvino_version"] = ov.get_version()
                print(json.dumps(row), flush=True)
                pk = f"{100 * gflops / row['peak_gflops']:.1f}" if row["peak_gflops"] else "-"
                sp = f"{row['speedup_vs_scalar']:.2f}x" if sref else "-"
                gb = f"{row['gbps']:.2f}" if "gbps" in row else ""
                print(f"{'openvino-sdpa':<13} {'openvino':<8} {t:>3}  {','.join(map(str, s)):<28} {mask:<19} "
                      f"{bench_dtype:<5} {op:<8} {row['ms']:>10.3f} {gflops:>9.2f} {pk:>6} {sp:>8} {gb:>8} "
                      f"{row['rss_mb']:>8.1f}", file=err, flush=True)
                del req, compiled
        del q, k, v, m, model, ref
    if bad:
        print(f"# {PROG}: {bad} check(s) FAILED", file=err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
