#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/compare.py - libsdpa and every peer, interleaved call by call in one process.
"""Times libsdpa (its Python package) against PyTorch's CPU SDPA, ONNX Runtime
(opset 23 Attention, contrib MultiHeadAttention / GroupQueryAttention) and
OpenVINO's ScaledDotProductAttention (f32 hint and its default precision), and
libsdpa itself with bf16 tensors ("sdpa-bf16": rows "impl": "sdpa", "dtype": "bf16"), on the
shapes of `sdpa bench`, with the implementations interleaved: each round calls
every implementation once, in an order that rotates from round to round, and a
row's time is the median of its rounds. On a shared machine whose speed moves by
tens of per cent from one minute to the next (docs/perf-notes.md), separate runs
of the bench and the peer scripts cannot rank implementations that are within
that spread of each other; rounds interleaved this way see the same machine.

    python3 -m pip install .                       # the libsdpa package
    python3 -m pip install -r bench/requirements.txt
    OMP_WAIT_POLICY=passive python3 bench/compare.py --from-sdpa sdpa.jsonl > compare.jsonl
    python3 bench/table.py compare.jsonl

Prints the JSON rows of the scripts it borrows from (bench/torch_sdpa.py,
bench/ort_sdpa.py, bench/openvino_sdpa.py: the same impl names and fields) plus
"interleaved": true and "rounds"; libsdpa's rows are "impl": "sdpa" with the ISA
the library chose. --from-sdpa takes the JSON of `sdpa bench --json` for the
FMA peaks and read bandwidths of the same machine (peak_gflops / peak_gbps),
and the shapes and thread counts when no --shape / --mask is given. Peers that
are not installed are left out with a note on stderr, and so is, for one row, a
peer that fails on it or whose output is not finite (OpenVINO's bf16 precision
returns NaN on a causal Tq = 1 < Tk problem, see bench/openvino_sdpa.py); --impl
must include sdpa. Every implementation gets
the same inputs' shapes and masks as in its own script; decode rows (Tq <= 16)
read a --flush-mib buffer before every call of every implementation, so that
each reads K and V from memory as the bench's flushed decode rows do. Between
two calls the script sleeps --pause-ms so that no implementation's idle worker
threads still spin while the next one runs (ONNX Runtime's spinning is also
turned off); OMP_WAIT_POLICY=passive does the same for libsdpa's and torch's
OpenMP pools. ONNX Runtime and OpenVINO have no backward: backward rows are
libsdpa and torch only.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa as common  # noqa: E402  (shapes, masks, counts; no torch import at this level)

PROG = "compare.py"
IMPLS = ("sdpa", "torch", "ort-attention", "ort-mha", "ort-gqa", "openvino", "openvino-default", "sdpa-bf16")
EXTRA_IMPLS = ("torch-bf16",)  # accepted by --impl, not timed by default


def sdpa_problem(s, mask, t, dtype):
    """Q, K, V (uniform in [-1, 1), fixed seed, rounded to dtype) and libsdpa's keywords
    for shape s, mask and t threads."""
    import numpy as np
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    rng = np.random.default_rng(1234)
    q, k, v = (rng.uniform(-1.0, 1.0, shape).astype(np.float32).astype(dtype)
               for shape in ((B, Hq, Tq, Dk), (B, Hkv, Tk, Dk), (B, Hkv, Tk, Dv)))
    kw = {"threads": t}
    if mask == "causal":
        kw["causal"] = "top-left"
    elif mask == "causal-bottom-right":
        kw["causal"] = "bottom-right"
    elif mask == "padding":
        kw["kv_lengths"] = np.array([common.padding_length(s, b) for b in range(B)], dtype=np.int32)
    return rng, q, k, v, kw


def sdpa_impl(s, mask, op, t):
    """libsdpa through its Python package (the C extension's fast path where it applies)."""
    import numpy as np
    import libsdpa
    rng, q, k, v, kw = sdpa_problem(s, mask, t, np.float32)
    if op == "forward":
        return lambda: libsdpa.attention(q, k, v, **kw), {"isa": libsdpa.info()["active_isa"]}
    o, lse = libsdpa.attention(q, k, v, return_lse=True, **kw)
    do = rng.uniform(-1.0, 1.0, o.shape).astype(np.float32)
    return lambda: libsdpa.attention_backward(q, k, v, o, lse, do, **kw), {"isa": libsdpa.info()["active_isa"]}


def sdpa_bf16_impl(s, mask, op, t):
    """libsdpa with Q, K, V and O in bf16 (ml_dtypes' NumPy bfloat16; dO too in the
    backward): rows "impl": "sdpa", "dtype": "bf16", beside OpenVINO's default (bf16)
    precision; on CPUs whose tuning runs bf16 prefill on AVX512-BF16 pair products
    (libsdpa.info()["bf16_pairs_isas"]) P is rounded to bf16 there."""
    import numpy as np
    import libsdpa
    try:
        import ml_dtypes
    except ImportError:
        return None, "ml_dtypes (NumPy bfloat16) absent"
    bf16 = ml_dtypes.bfloat16
    rng, q, k, v, kw = sdpa_problem(s, mask, t, bf16)
    isa = libsdpa.info()["active_isa"]
    extra = {"isa": isa, "dtype": "bf16", "bf16_pairs": isa in libsdpa.info()["bf16_pairs_isas"]}
    if op == "forward":
        return lambda: libsdpa.attention(q, k, v, **kw), extra
    o, lse = libsdpa.attention(q, k, v, return_lse=True, **kw)
    do = rng.uniform(-1.0, 1.0, o.shape).astype(np.float32).astype(bf16)
    return lambda: libsdpa.attention_backward(q, k, v, o, lse, do, **kw), extra


def torch_impl(s, mask, op, t):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import torch.nn.functional as F
    q, k, v, kw, gqa = common.make_problem(torch, F, s, mask, op == "backward")

    def run_fwd():
        torch.set_num_threads(t)
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, **kw)
    if op == "forward":
        return run_fwd, {"isa": "torch", "gqa": gqa, "torch_version": torch.__version__}
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    dout = torch.rand(out.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1

    def run_bwd():
        torch.set_num_threads(t)
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return run_bwd, {"isa": "torch", "gqa": gqa, "torch_version": torch.__version__}


def torch_bf16_impl(s, mask, op, t):
    """PyTorch's CPU SDPA on torch.bfloat16 q, k, v (the same inputs rounded; dO too in the
    backward), its own kernels and accumulation: rows "impl": "torch-sdpa", "dtype": "bf16"
    (not in the default list; table.py's peer columns take fp32 rows only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        import torch.nn.functional as F
    q, k, v, kw, gqa = common.make_problem(torch, F, s, mask, op == "backward", torch.bfloat16)
    extra = {"isa": "torch", "gqa": gqa, "torch_version": torch.__version__, "dtype": "bf16"}

    def run_fwd():
        torch.set_num_threads(t)
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, **kw)
    if op == "forward":
        return run_fwd, extra
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    dout = (torch.rand(out.shape, generator=torch.Generator().manual_seed(4)) * 2 - 1).to(torch.bfloat16)

    def run_bwd():
        torch.set_num_threads(t)
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    return run_bwd, extra


class OrtState:
    mod = None
    tmp = None


def ort_impl(which):
    def make(s, mask, op, t):
        if op != "forward":
            return None, "no backward"
        import ort_sdpa as o
        np, onnx, ort, helper, TP = o.import_ort()
        if OrtState.tmp is None:
            OrtState.tmp = tempfile.TemporaryDirectory(prefix="compare.")
        q, k, v = o.base_inputs(np, s)
        prep = o.PREP[which](np, onnx, helper, TP, s, mask, q, k, v, np.float32, TP.FLOAT)
        if isinstance(prep, str):
            return None, prep
        path = os.path.join(OrtState.tmp.name, "opt.onnx")
        sess = o.make_session(ort, prep.model, t, path, spinning=False)
        nodes = o.graph_nodes(onnx, path)
        if nodes != o.ORT_OP[which]:
            return None, f"the optimised graph is {nodes}"
        binding, vals = o.bind(ort, sess, prep)
        extra = {"isa": "ort", "ort_op": o.ORT_OP[which], **prep.fields, "ort_nodes": nodes,
                 "onnxruntime_version": ort.__version__}
        if prep.note:
            extra["note"] = prep.note

        def run():
            sess.run_with_iobinding(binding)
            return prep.outputs[prep.result]
        run.keep = (vals, prep)
        return run, extra
    return make


def openvino_impl(hint):
    def make(s, mask, op, t):
        if op != "forward":
            return None, "no backward"
        import openvino_sdpa as o
        np, ov, opset = o.import_openvino()
        q, k, v, m, causal, gqa = o.make_inputs(np, s, mask)
        model = o.make_model(ov, opset, q, k, v, m, causal)
        compiled = o.compile_model(ov.Core(), model, hint, t)
        req = o.bind(ov, compiled, q, k, v, m)
        prec = o.precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        extra = {"isa": "openvino", "dtype": o.OV_TO_BENCH.get(prec, prec), "ov_hint": o.HINTS[hint] or "default",
                 "ov_precision": prec, "gqa": gqa, "openvino_version": ov.get_version()}
        if gqa == "repeat":
            extra["note"] = o.GQA_NOTE

        def run():
            req.infer(share_outputs=True)
            return req.get_output_tensor(0).data
        run.keep = (q, k, v, m)
        return run, extra
    return make


def finite(x):
    """Every value of an output (an array, a tensor, or a tuple of them) is finite."""
    import numpy as np
    if isinstance(x, (tuple, list)):
        return all(finite(y) for y in x)
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().float().numpy()
    return bool(np.isfinite(np.asarray(x, dtype=np.float64)).all())


FACTORIES = {"sdpa": sdpa_impl, "torch": torch_impl, "ort-attention": ort_impl("attention"),
             "ort-mha": ort_impl("mha"), "ort-gqa": ort_impl("gqa"), "openvino": openvino_impl("fp32"),
             "openvino-default": openvino_impl("default"), "sdpa-bf16": sdpa_bf16_impl,
             "torch-bf16": torch_bf16_impl}
ROW_IMPL = {"sdpa": "sdpa", "torch": "torch-sdpa", "ort-attention": "ort-attention", "ort-mha": "ort-mha",
            "ort-gqa": "ort-gqa", "openvino": "openvino-sdpa", "openvino-default": "openvino-sdpa",
            "sdpa-bf16": "sdpa", "torch-bf16": "torch-sdpa"}


def available(names, err):
    """The implementations whose packages import here."""
    probes = {"sdpa": ("libsdpa",), "torch": ("torch",), "ort-attention": ("onnxruntime", "onnx"),
              "ort-mha": ("onnxruntime", "onnx"), "ort-gqa": ("onnxruntime", "onnx"),
              "openvino": ("openvino",), "openvino-default": ("openvino",), "sdpa-bf16": ("libsdpa", "ml_dtypes"),
              "torch-bf16": ("torch",)}
    out = []
    for n in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for mod in probes[n]:
                    __import__(mod)
            out.append(n)
        except Exception as e:  # ImportError, or a broken install that fails while loading
            print(f"# {PROG}: {n} left out: {type(e).__name__}: {' '.join(str(e).split())[:200]}", file=err)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=lambda x: common.parse_list(x, "--threads"), default=None,
                   help="thread counts (default: those of --from-sdpa, else 1 and the CPUs)")
    p.add_argument("--shape", action="append", help="B,Hq,Hkv,Tq,Tk,Dk,Dv (repeatable)")
    p.add_argument("--mask", action="append", help="none|causal|causal-bottom-right|padding[,..]")
    p.add_argument("--op", choices=("forward", "backward", "both"), default="both")
    p.add_argument("--impl", default=",".join(IMPLS),
                   help=f"implementations (default {','.join(IMPLS)}; also {','.join(EXTRA_IMPLS)})")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds per row (default 15)")
    p.add_argument("--max-time", type=float, default=20.0,
                   help="seconds per (shape, op, threads) group, about: fewer rounds (at least 3) "
                        "when one round takes longer than this / --rounds (default 20)")
    p.add_argument("--pause-ms", type=float, default=0.0, help="sleep between two calls (default 0)")
    p.add_argument("--flush-mib", type=int, default=256, help="buffer read before decode calls (default 256)")
    p.add_argument("--quick", action="store_true", help="the small shapes of `sdpa bench --quick`")
    p.add_argument("--from-sdpa", metavar="FILE", action="append",
                   help="JSON lines of `sdpa bench --json`: peaks, bandwidths, shapes and threads")
    args = p.parse_args()
    if args.rounds < 1 or args.max_time <= 0 or args.pause_ms < 0 or args.flush_mib < 1:
        p.error("--rounds >= 1, --max-time > 0, --pause-ms >= 0, --flush-mib >= 1")
    names = []
    for x in args.impl.split(","):
        if x not in IMPLS + EXTRA_IMPLS:
            p.error(f"--impl '{x}': expected some of {', '.join(IMPLS + EXTRA_IMPLS)}")
        if x not in names:
            names.append(x)
    if "sdpa" not in names:
        p.error("--impl must include sdpa: every row's ratio is to libsdpa's time")
    if len(set(args.threads or [])) != len(args.threads or []):
        p.error("--threads: a count is repeated")
    err = sys.stderr
    names = available(names, err)
    if "sdpa" not in names:
        print(f"# {PROG}: the libsdpa package does not load in this python (python3 -m pip install .)", file=err)
        return 3
    import numpy as np

    try:
        peaks, bw, _, file_cases, file_threads = common.load_sdpa_rows(args.from_sdpa or [])
    except (OSError, UnicodeDecodeError) as e:
        p.error(f"--from-sdpa: {e}")
    from_file = bool(file_cases) and not (args.shape or args.mask or args.quick)
    try:
        ncpu = len(os.sched_getaffinity(0))
    except AttributeError:
        ncpu = os.cpu_count() or 1
    threads = args.threads or (sorted(file_threads) if from_file else sorted({1, ncpu}))
    if min(threads) < 1:
        p.error("--threads: every count must be >= 1")
    try:
        cases = sorted(file_cases, key=lambda c: common.footprint(c[0])) if from_file else common.build_cases(args, PROG)
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    ops = ["forward", "backward"] if args.op == "both" else [args.op]
    flush = np.ones(args.flush_mib * (1 << 20) // 8, dtype=np.float64)
    print(f"# {PROG}: {', '.join(names)}; threads {','.join(map(str, threads))}; up to {args.rounds} "
          f"interleaved rounds per row (order rotating), {args.pause_ms:g} ms pause between calls; "
          f"decode rows: a {args.flush_mib} MiB buffer read before every call", file=err)
    print(f"{'impl':<22} {'thr':>3}  {'B,Hq,Hkv,Tq,Tk,Dk,Dv':<28} {'mask':<19} {'op':<8} {'ms':>10} "
          f"{'GFLOP/s':>9} {'/sdpa':>7}", file=err)
    noted = set()

    def note(key, text):  # each skip said once, not once per thread count
        if key not in noted:
            noted.add(key)
            print(f"# {PROG}: {text}: skipped", file=err)
    for s, mask in cases:
        decode = s[3] <= common.DECODE_MAX_TQ
        for op in ops:
            for t in threads:
                runs = []
                where = f"{','.join(map(str, s))} {mask} {op}"
                for n in names:
                    try:
                        fn, extra = FACTORIES[n](s, mask, op, t)
                        if fn is not None and not finite(fn()):  # warm-up (set-up, kernel choice), checked
                            fn, extra = None, "its output is not finite (NaN or inf)"
                    except Exception as e:  # a peer that cannot build or run this case
                        fn, extra = None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
                    if fn is None:
                        if extra != "no backward":
                            note((n, where, extra), f"{n} {where}: {extra}")
                        continue
                    runs.append((n, fn, extra))
                if not runs or runs[0][0] != "sdpa":
                    note(("sdpa", where), f"{where}: libsdpa did not run it")
                    continue
                t0 = time.perf_counter()
                for n, fn, _ in runs:
                    fn()
                one_round = time.perf_counter() - t0
                rounds = args.rounds
                if one_round * rounds > args.max_time:
                    rounds = min(rounds, max(3, int(args.max_time / max(one_round, 1e-9))))
                times = {n: [] for n, _, _ in runs}
                failed = set()
                for r in range(rounds):
                    for i in range(len(runs)):
                        n, fn, _ = runs[(i + r) % len(runs)]
                        if n in failed:
                            continue
                        if decode:
                            flush.sum()
                        time.sleep(args.pause_ms * 1e-3)
                        try:
                            c0 = time.perf_counter()
                            fn()
                            times[n].append(time.perf_counter() - c0)
                        except Exception as e:  # a peer failing mid-row: drop it from the row
                            failed.add(n)
                            note((n, where, "run"), f"{n} {where}: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
                if "sdpa" in failed:
                    continue
                runs = [x for x in runs if x[0] not in failed]
                ref = statistics.median(times["sdpa"]) if "sdpa" in times else None
                for n, _, extra in runs:
                    sec = statistics.median(times[n])
                    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
                    gflops = common.op_flops(s, mask, op == "backward") / sec * 1e-9
                    row = {"impl": ROW_IMPL[n], "op": op, "isa": extra.pop("isa"), "threads": t, "B": B, "Hq": Hq,
                           "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "Dk": Dk, "Dv": Dv, "mask": mask, "dtype": "fp32",
                           "ms": sec * 1e3, "gflops": gflops, "peak_gflops": peaks.get(t)}
                    if decode:
                        row["gbps"] = common.kv_bytes_read(s, mask) / sec * 1e-9
                        row["peak_gbps"] = bw.get(t)
                    row["pairs"] = common.allowed_pairs(s, mask)
                    row.update(extra)
                    if n == "sdpa-bf16" and "gbps" in row:  # K and V in bf16: half the bytes
                        row["gbps"] /= 2.0
                    row["interleaved"] = True
                    row["rounds"] = rounds
                    if ref:
                        row["ratio_vs_sdpa"] = sec / ref
                    print(json.dumps(row), flush=True)
                    label = ROW_IMPL[n] + (" " + row.get("ov_hint", "") if n.startswith("openvino") else
                                           " bf16" if n == "sdpa-bf16" else "")
                    label = label[:22]
                    ratio = f"{sec / ref:.3f}" if ref else "-"
                    print(f"{label:<22} {t:>3}  {','.join(map(str, s)):<28} {mask:<19} {op:<8} {sec * 1e3:>10.3f} "
                          f"{gflops:>9.2f} {ratio:>7}", file=err, flush=True)
                del runs
    return 0


if __name__ == "__main__":
    sys.exit(main())
