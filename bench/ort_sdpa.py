#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# bench/ort_sdpa.py - ONNX Runtime's CPU attention operators on the shapes of `sdpa bench`.
"""Times ONNX Runtime's attention operators on the CPU execution provider,
forward only, on the same shapes, masks and thread counts as `sdpa bench`:
the ONNX `Attention` operator of opset 23 ("impl": "ort-attention") and the
contrib operators com.microsoft `MultiHeadAttention` ("ort-mha") and
`GroupQueryAttention` ("ort-gqa"), and prints the same JSON lines as
bench/torch_sdpa.py with "isa": "ort" and a "dtype" on stdout (a table and
'#' notes go to stderr).

    sdpa bench --json > sdpa.jsonl
    python3 bench/ort_sdpa.py --from-sdpa sdpa.jsonl > ort.jsonl
    python3 bench/plot.py sdpa.jsonl ort.jsonl -o bench.png

The command line is torch_sdpa.py's (--threads, --shape, --mask, --op, --reps,
--warmup, --max-time, --quick, --from-sdpa, --dtype: same meanings and
defaults), and the shapes, masks, FLOP and byte counts, timing and the
--from-sdpa matching are the ones of that file, imported from it (it imports
torch only inside its main()), as bench/openvino_sdpa.py does. --ort-op picks
the operators (default attention,mha,gqa). ONNX Runtime has no backward for
these operators: --op backward or both time the forward only and say so.

Installing (optional; only this script needs them):

    python3 -m pip install -r bench/requirements.txt

(or just the onnx, onnxruntime and numpy lines of that file), with the same
python3 that runs this script.

Models: per shape, mask, operator and type one ONNX model of a single node,
built with onnx.helper; every tensor (Q, K, V, masks, lengths) is a graph
input, so nothing is constant-folded. Q, K, V hold the same values as in
openvino_sdpa.py (numpy, seed 1234, uniform in [-1, 1)). The default scale
1/sqrt(Dk) everywhere.
  ort-attention  Attention (opset 23), Q [B,Hq,Tq,Dk], K [B,Hkv,Tk,Dk],
                 V [B,Hkv,Tk,Dv] (4-D: the bench's own layout; GQA native, the
                 head counts read from the shapes). causal = is_causal=1 (the
                 upper-left alignment of opset 23, as is_causal=True);
                 causal-bottom-right = is_causal when Tq = Tk, else a boolean
                 attn_mask [1,1,Tq,Tk] (true = attend); padding = a boolean
                 attn_mask [B,1,Tq,Tk] with the key lengths of `sdpa bench`,
                 materialised over queries: onnxruntime 1.32's CPU kernel
                 refuses a [B,1,1,Tk] mask when Tq > 1 ("inconsistent
                 q_sequence_length (between attn_mask and Q)").
  ort-mha        MultiHeadAttention (com.microsoft), num_heads Hq, Q
                 [B,Tq,Hq*Dk] (the op takes Q only in that layout: transposed
                 outside the timed region), K [B,Hq,Tk,Dk] and V [B,Hq,Tk,Dv]
                 (its 4-D BNSH form; when Dk != Dv, which that form refuses, K
                 and V as [B,Tk,H*D], transposed outside it too). causal and causal-bottom-right = an
                 attention_bias [1,1,Tq,Tk] of 0 / -inf; padding =
                 key_padding_mask int32 [B,Tk] (1 = attend). GQA (Hq > Hkv):
                 the op has one head count, so K and V are repeated to Hq
                 heads (numpy.repeat, outside the timed region): "gqa":
                 "repeat" and a "note"; GB/s still count Hkv heads.
  ort-gqa        GroupQueryAttention (com.microsoft), num_heads Hq,
                 kv_num_heads Hkv, always causal with the bottom-right
                 alignment over per-batch total lengths L_b = seqlens_k[b] + 1:
                 new query i of Tq attends to keys 0 .. L_b - Tq + i. Q [B,Tq,Hq*D]
                 and the Tq new K/V rows [B,Tq,Hkv*D] (transposed outside the
                 timed region); past_key/past_value [B,Hkv,Tk,D] hold all of K
                 and V and are bound to the same buffers as present_key/
                 present_value (the shared-buffer KV cache of a decoder), so a
                 run reads the cache in place and writes its Tq new rows into
                 it (the same values, each run). It expresses a mask when every
                 row's allowed keys are such a prefix: decode (Tq = 1: none,
                 causal, padding), causal prefill (Tq = Tk; top-left causal
                 with Tq < Tk is the prefill of the first Tq keys) and
                 causal-bottom-right with Tq <= Tk (B = 1 only when Tq > 1 and
                 Tq < Tk: the CPU kernel refuses "sequence_length > 1 and past
                 context" for a larger batch); the rest (none or padding with
                 Tq > 1, and Dk != Dv: the op has one head size) is skipped with
                 a '#' note. "gqa_past": the past length(s) L_b - Tq.
A row that ONNX Runtime refuses when it runs (a shape or mask its CPU kernel
does not take) is skipped with a '#' note giving its message. Rows carry
"ort_op", "ort_mask" (how the mask was given), "ort_nodes" (the
operator types of the session's optimised graph: the node itself when ONNX
Runtime ran its kernel, something else if it expanded it into a function
body) and "onnxruntime_version".

Types (--dtype, default fp32): fp32, fp16 (Q, K, V, bias and output float16,
the fp32 values rounded) and bf16. Each (operator, type) is tried on a tiny
model first and skipped with a '#' note when ONNX Runtime's CPU EP has no
kernel of that type for it: when the session cannot be created, or when its
optimised graph is not the operator alone (ONNX Runtime then inserts Cast
nodes to run another type's kernel, which would time casts and fp32). With
onnxruntime 1.32: Attention and GroupQueryAttention have fp16 kernels;
MultiHeadAttention fp16 becomes Casts around the fp32 kernel (skipped); bf16
runs for none of them (Attention expands to a function whose Expand has no
bf16 kernel, the contrib operators have none). GB/s count K and V in the
row's type.

Session: CPUExecutionProvider, intra_op_num_threads = the row's thread count
(one session per thread count), inter_op_num_threads 1, sequential execution,
graph optimisation level ORT_ENABLE_ALL. Default thread counts: 1 and the
CPUs this process may run on. Timing: a tiny model of each (operator, type) is
run first (one-time set-up); per row the session is created and its inputs and
preallocated outputs bound once with an IOBinding (numpy arrays wrapped as
OrtValues, no copies), outside the timed region; run_with_iobinding is timed:
a warm-up, then the median of --reps runs (time.perf_counter), fewer, at least
one, when one run is long (about --max-time seconds per row), exactly as
torch_sdpa.py. --check compares each session's output once with a float64
numpy reference on the same (rounded) inputs before timing (stderr only; rows
with no allowed key are not compared; exits 1 past 1e-4 for fp32, 5e-2 for
fp16).
"""
import argparse
import functools
import json
import os
import re
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa as common  # noqa: E402  (shapes, masks, counts, timing; no torch import at this level)

PROG = "ort_sdpa.py"
DTYPES = ("fp32", "fp16", "bf16")
OPS = ("attention", "mha", "gqa")
IMPL = {"attention": "ort-attention", "mha": "ort-mha", "gqa": "ort-gqa"}
ORT_OP = {"attention": "Attention", "mha": "com.microsoft.MultiHeadAttention",
          "gqa": "com.microsoft.GroupQueryAttention"}
OPSET = 23
INSTALL_HINT = """ONNX Runtime and onnx are not installed for this python3 ({exe}).
Install them with:  {exe} -m pip install -r bench/requirements.txt
(only the onnx, onnxruntime and numpy lines are needed by this script)."""
MHA_GQA_NOTE = ("K and V repeated from Hkv to Hq heads (numpy.repeat) outside the timed region: "
                "MultiHeadAttention has one head count")
BSNH_NOTE = "Q given as [B,Tq,Hq*Dk] (the op's layout), transposed outside the timed region"
BSNH_KV_NOTE = ("Q, K and V given as [B,T,H*D] (the op's 4-D K/V form needs Dk = Dv), transposed outside "
                "the timed region")
GQA_OP_NOTE = ("Q and the Tq new K/V rows given as [B,Tq,H*D], transposed outside the timed region; "
               "past_key/past_value [B,Hkv,Tk,D] share their buffers with present_key/present_value: "
               "each run writes its Tq new rows into the cache")


def import_ort():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numpy as np
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    return np, onnx, ort, helper, TensorProto


# ---------------------------------------------------------------- inputs and the reference

def base_inputs(np, s):
    """Q [B,Hq,Tq,Dk], K [B,Hkv,Tk,Dk], V [B,Hkv,Tk,Dv] f32, as openvino_sdpa.py draws them."""
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    rng = np.random.default_rng(1234)
    q = rng.uniform(-1.0, 1.0, (B, Hq, Tq, Dk)).astype(np.float32)
    k = rng.uniform(-1.0, 1.0, (B, Hkv, Tk, Dk)).astype(np.float32)
    v = rng.uniform(-1.0, 1.0, (B, Hkv, Tk, Dv)).astype(np.float32)
    return q, k, v


def row_limits(np, s, mask):
    """hi[b, i]: query i of batch b attends to keys 0 .. hi - 1 (the masks of `sdpa bench`)."""
    B, Tq = s[0], s[3]
    return np.array([[common.row_hi(s, mask, b, i) for i in range(Tq)] for b in range(B)], dtype=np.int64)


def allow_matrix(np, s, mask):
    """Boolean [B,1,Tq,Tk], true = attend."""
    Tk = s[4]
    hi = row_limits(np, s, mask)
    return (np.arange(Tk).reshape(1, 1, Tk) < hi[:, :, None])[:, None]


def reference(np, s, mask, q, k, v):
    """O [B,Hq,Tq,Dv] in float64 (NaN rows: no allowed key) from the given (rounded) inputs."""
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    g = Hq // Hkv
    k64 = np.repeat(k.astype(np.float64), g, axis=1)
    v64 = np.repeat(v.astype(np.float64), g, axis=1)
    sc = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k64) / np.sqrt(Dk)
    sc = np.where(allow_matrix(np, s, mask), sc, -np.inf)
    with np.errstate(invalid="ignore"):
        sc = np.exp(sc - sc.max(axis=-1, keepdims=True))
        sc /= sc.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", sc, v64)


# ---------------------------------------------------------------- the three models

class Prepared:
    """One single-node model with its input arrays and preallocated outputs.
    outputs: name -> numpy array, or the name of an input whose buffer it shares."""

    def __init__(self, model, inputs, outputs, result, to_bhsd, fields, note=None):
        self.model, self.inputs, self.outputs = model, inputs, outputs
        self.result, self.to_bhsd, self.fields, self.note = result, to_bhsd, fields, note


def make_model(onnx, helper, node, inputs, outputs):
    graph = helper.make_graph([node], "sdpa", inputs, outputs)
    model = helper.make_model(graph, producer_name="libsdpa bench/ort_sdpa.py",
                              opset_imports=[helper.make_opsetid("", OPSET),
                                             helper.make_opsetid("com.microsoft", 1)])
    return model.SerializeToString()


def vi(helper, name, etype, shape):
    return helper.make_tensor_value_info(name, etype, list(shape))


def prep_attention(np, onnx, helper, TP, s, mask, q, k, v, npdt, etype):
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    inputs = {"q": q.astype(npdt), "k": k.astype(npdt), "v": v.astype(npdt)}
    attrs, how = {}, "none"
    if mask == "causal" or (mask == "causal-bottom-right" and Tq == Tk):
        attrs["is_causal"] = 1
        how = "is_causal"
    elif mask in ("causal-bottom-right", "padding"):
        m = allow_matrix(np, s, mask)  # [B,1,Tq,Tk]; padding stays materialised over queries:
        m = m[:1] if mask == "causal-bottom-right" else m  # ORT's CPU kernel refuses a [B,1,1,Tk] mask
        inputs["mask"] = np.ascontiguousarray(m)           # ("inconsistent q_sequence_length") when Tq > 1
        how = "attn_mask bool [" + ("1,1,Tq,Tk" if mask == "causal-bottom-right" else "B,1,Tq,Tk") + "]"
    names = ["q", "k", "v"] + (["mask"] if "mask" in inputs else [])
    ins = [vi(helper, n, TP.BOOL if n == "mask" else etype, inputs[n].shape) for n in names]
    out = np.empty((B, Hq, Tq, Dv), dtype=npdt)
    node = helper.make_node("Attention", names, ["y"], name="sdpa", **attrs)
    model = make_model(onnx, helper, node, ins, [vi(helper, "y", etype, out.shape)])
    return Prepared(model, inputs, {"y": out}, "y", lambda a: a,
                    {"gqa": "native" if Hq != Hkv else "none", "ort_mask": how})


def prep_mha(np, onnx, helper, TP, s, mask, q, k, v, npdt, etype):
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    if Hq != Hkv:
        k = np.repeat(k, Hq // Hkv, axis=1)
        v = np.repeat(v, Hq // Hkv, axis=1)
    inputs = {"q": np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, Tq, Hq * Dk)).astype(npdt)}
    if Dk == Dv:  # the 4-D BNSH form needs K and V of one shape
        inputs["k"] = np.ascontiguousarray(k).astype(npdt)
        inputs["v"] = np.ascontiguousarray(v).astype(npdt)
    else:
        inputs["k"] = np.ascontiguousarray(k.transpose(0, 2, 1, 3).reshape(B, Tk, Hq * Dk)).astype(npdt)
        inputs["v"] = np.ascontiguousarray(v.transpose(0, 2, 1, 3).reshape(B, Tk, Hq * Dv)).astype(npdt)
    names, how = ["q", "k", "v"], "none"
    if mask in ("causal", "causal-bottom-right"):
        bias = np.where(allow_matrix(np, s, mask)[:1], 0.0, -np.inf).astype(npdt)  # [1,1,Tq,Tk]
        inputs["bias"] = bias
        names += ["", "", "bias"]
        how = "attention_bias 0/-inf [1,1,Tq,Tk]"
    elif mask == "padding":
        inputs["kpm"] = allow_matrix(np, s, mask)[:, 0, 0, :].astype(np.int32)  # [B,Tk]
        names += ["", "kpm"]
        how = "key_padding_mask int32 [B,Tk]"
    ins = [vi(helper, n, TP.INT32 if n == "kpm" else etype, inputs[n].shape) for n in names if n]
    out = np.empty((B, Tq, Hq * Dv), dtype=npdt)
    node = helper.make_node("MultiHeadAttention", names, ["y"], name="sdpa", domain="com.microsoft",
                            num_heads=Hq)
    model = make_model(onnx, helper, node, ins, [vi(helper, "y", etype, out.shape)])
    fields = {"gqa": "repeat" if Hq != Hkv else "none", "ort_mask": how}
    note = (BSNH_NOTE if Dk == Dv else BSNH_KV_NOTE) + ("; " + MHA_GQA_NOTE if Hq != Hkv else "")
    return Prepared(model, inputs, {"y": out}, "y",
                    lambda a: a.reshape(B, Tq, Hq, Dv).transpose(0, 2, 1, 3), fields, note)


def gqa_lengths(np, s, mask):
    """Per-batch total lengths L_b if GroupQueryAttention expresses the mask, else a reason."""
    B, Hq, Hkv, Tq, Tk, Dk, Dv = s
    if Dk != Dv:
        return None, "GroupQueryAttention has one head size (Dk = Dv)"
    hi = row_limits(np, s, mask)
    lens = hi[:, -1]
    want = lens[:, None] - Tq + 1 + np.arange(Tq)[None, :]
    if np.any(lens < Tq) or np.any(lens > Tk) or not np.array_equal(hi, want):
        return None, ("GroupQueryAttention is always causal, bottom-right over per-batch lengths: "
                      f"mask {mask} with Tq={Tq}, Tk={Tk} is not such a mask")
    if B > 1 and Tq > 1 and np.any(lens > Tq):
        return None, ("GroupQueryAttention's CPU kernel takes Tq > 1 new tokens after a past only for batch 1 "
                      "(\"batch_size must be 1 when sequence_length > 1 and past context is given\")")
    return lens, None


def prep_gqa(np, onnx, helper, TP, s, mask, q, k, v, npdt, etype):
    B, Hq, Hkv, Tq, Tk, D, _ = s
    lens, why = gqa_lengths(np, s, mask)
    if why:
        return why
    kn = np.stack([k[b, :, lens[b] - Tq:lens[b], :] for b in range(B)])  # [B,Hkv,Tq,D]
    vn = np.stack([v[b, :, lens[b] - Tq:lens[b], :] for b in range(B)])
    inputs = {"q": np.ascontiguousarray(q.transpose(0, 2, 1, 3).reshape(B, Tq, Hq * D)).astype(npdt),
              "k": np.ascontiguousarray(kn.transpose(0, 2, 1, 3).reshape(B, Tq, Hkv * D)).astype(npdt),
              "v": np.ascontiguousarray(vn.transpose(0, 2, 1, 3).reshape(B, Tq, Hkv * D)).astype(npdt),
              "past_key": np.ascontiguousarray(k).astype(npdt), "past_value": np.ascontiguousarray(v).astype(npdt),
              "seqlens_k": (lens - 1).astype(np.int32),
              "total_sequence_length": np.array(int(lens.max()), dtype=np.int32)}
    names = ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"]
    ins = [vi(helper, n, TP.INT32 if n in ("seqlens_k", "total_sequence_length") else etype, inputs[n].shape)
           for n in names]
    out = np.empty((B, Tq, Hq * D), dtype=npdt)
    outs = [vi(helper, "y", etype, out.shape), vi(helper, "present_key", etype, inputs["past_key"].shape),
            vi(helper, "present_value", etype, inputs["past_value"].shape)]
    node = helper.make_node("GroupQueryAttention", names, ["y", "present_key", "present_value"], name="sdpa",
                            domain="com.microsoft", num_heads=Hq, kv_num_heads=Hkv)
    model = make_model(onnx, helper, node, ins, outs)
    past = sorted({int(x) for x in lens - Tq})
    fields = {"gqa": "native" if Hq != Hkv else "none",
              "ort_mask": "causal over seqlens_k (bottom-right)", "gqa_past": past[0] if len(past) == 1 else past}
    return Prepared(model, inputs, {"y": out, "present_key": "past_key", "present_value": "past_value"}, "y",
                    lambda a: a.reshape(B, Tq, Hq, D).transpose(0, 2, 1, 3), fields, GQA_OP_NOTE)


PREP = {"attention": prep_attention, "mha": prep_mha, "gqa": prep_gqa}


# ---------------------------------------------------------------- sessions

def make_session(ort, model, threads, optimized_path=None, spinning=True):
    """spinning=False: idle intra-op threads sleep instead of spinning (bench/compare.py,
    where another implementation runs right after each call)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 4  # fatal only: the optimised-model dump warns, refusals are reported as notes
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        # onnx writes its own (newest) IR version; an onnxruntime older than that onnx
        # refuses the file ("Unsupported model IR version: 14, max supported IR version:
        # 13") although it implements opset 23: the same model written with the IR
        # version it names (the opsets unchanged; one it still cannot run fails again)
        m = re.search(r"max supported IR version: (\d+)", str(e))
        if not m:
            raise
        return ort.InferenceSession(with_ir_version(model, int(m.group(1))), so,
                                    providers=["CPUExecutionProvider"])


def with_ir_version(model, ir_version):
    """The serialized model with its ir_version field set to ir_version (a note on stderr,
    once per process)."""
    import onnx
    proto = onnx.ModelProto()
    proto.ParseFromString(model)
    if ir_version not in IR_NOTED:
        IR_NOTED.add(ir_version)
        print(f"# {PROG}: this onnxruntime reads ONNX IR versions up to {ir_version} and onnx "
              f"{onnx.__version__} writes {proto.ir_version}: models written with IR version {ir_version} "
              f"(opset {OPSET} unchanged)", file=sys.stderr)
    proto.ir_version = ir_version
    return proto.SerializeToString()


IR_NOTED = set()


def graph_nodes(onnx, path):
    """'domain.OpType' of each node of the optimised model ONNX Runtime saved."""
    try:
        m = onnx.load(path)
        return "+".join((n.domain + "." if n.domain else "") + n.op_type for n in m.graph.node)
    except Exception:  # informational only
        return None


def bind(ort, sess, prep):
    """An IOBinding of the prepared arrays (OrtValues wrap them, no copies); the OrtValues are
    returned too, to keep them alive."""
    binding = sess.io_binding()
    vals = {}
    for name, a in prep.inputs.items():
        vals[name] = ort.OrtValue.ortvalue_from_numpy(a)
        binding.bind_ortvalue_input(name, vals[name])
    for name, a in prep.outputs.items():
        if isinstance(a, str):  # shares an input's buffer (GroupQueryAttention's KV cache)
            binding.bind_ortvalue_output(name, vals[a])
        else:
            vals[name] = ort.OrtValue.ortvalue_from_numpy(a)
            binding.bind_ortvalue_output(name, vals[name])
    return binding, vals


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=lambda t: common.parse_list(t, "--threads"), default=None,
                   help="thread counts, e.g. 1,2 (default 1 and the CPUs this process may use)")
    p.add_argument("--shape", action="append", help="B,Hq,Hkv,Tq,Tk,Dk,Dv (repeatable)")
    p.add_argument("--mask", action="append", help="none|causal|causal-bottom-right|padding[,..]")
    p.add_argument("--op", choices=("forward", "backward", "both"), default=None,
                   help="ONNX Runtime has no backward for these operators: the forward is timed")
    p.add_argument("--ort-op", default="attention,mha,gqa", metavar="attention,mha,gqa",
                   help="operators to time: opset 23 Attention, com.microsoft MultiHeadAttention, "
                        "GroupQueryAttention (default all three)")
    p.add_argument("--dtype", default="fp32", metavar="fp32,fp16,bf16",
                   help="tensor types to time, each shape once per type (default fp32)")
    p.add_argument("--reps", type=int, default=None, help="timed runs per row (default 5, --quick 3)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--max-time", type=float, default=None,
                   help="seconds of timed runs per row, about (default 5, --quick 1)")
    p.add_argument("--quick", action="store_true", help="the small shapes of `sdpa bench --quick`")
    p.add_argument("--from-sdpa", metavar="FILE", action="append",
                   help="JSON lines of `sdpa bench --json` (repeatable): peaks and scalar times")
    p.add_argument("--check", action="store_true",
                   help="compare each session's output once with a float64 numpy reference first")
    args = p.parse_args()
    if args.reps is None:
        args.reps = 3 if args.quick else 5
    if args.max_time is None:
        args.max_time = 1.0 if args.quick else 5.0
    if args.reps < 1 or args.warmup < 0 or args.max_time <= 0:
        p.error("--reps must be >= 1, --warmup >= 0, --max-time > 0")
    dtypes = common.parse_dtypes(args.dtype, DTYPES, PROG)
    ops = []
    for x in args.ort_op.split(","):
        if x not in OPS:
            p.error(f"--ort-op '{x}': expected one of {', '.join(OPS)}")
        if x not in ops:
            ops.append(x)

    try:
        np, onnx, ort, helper, TP = import_ort()
    except ImportError:
        print(INSTALL_HINT.format(exe=sys.executable), file=sys.stderr)
        return 3
    err = sys.stderr
    if args.op in ("backward", "both"):
        print(f"# {PROG}: ONNX Runtime has no backward for these operators; forward rows only", file=err)
    np_types = {"fp32": np.float32, "fp16": np.float16}
    onnx_types = {"fp32": TP.FLOAT, "fp16": TP.FLOAT16, "bf16": TP.BFLOAT16}

    peaks, bw, scalar, file_cases, file_threads = common.load_sdpa_rows(args.from_sdpa or [])
    try:
        default_threads = len(os.sched_getaffinity(0))
    except AttributeError:
        default_threads = os.cpu_count() or 1
    from_file = bool(file_cases) and not (args.shape or args.mask or args.quick)
    threads = args.threads or (sorted(file_threads) if from_file else sorted({1, default_threads}))
    if min(threads) < 1:
        p.error("--threads: every count must be >= 1")
    if from_file:
        cases = sorted(file_cases, key=lambda c: common.footprint(c[0]))  # stable: big shapes last
    else:
        cases = common.build_cases(args, PROG)

    tmpdir = tempfile.TemporaryDirectory(prefix="ort_sdpa.")
    opt_path = os.path.join(tmpdir.name, "optimized.onnx")  # each session's optimised graph, read back

    # One-time set-up per (operator, type) outside every row, on a tiny causal problem; it also
    # finds the pairs ONNX Runtime's CPU EP cannot run.
    combos = []
    ws = (1, 2, 1, 16, 16, 16, 16)
    wq, wk, wv = base_inputs(np, ws)
    for dt in dtypes:
        for o in ops:
            etype = onnx_types[dt]
            npdt = np_types.get(dt, np.float32)  # bf16: only the model's type matters for the probe
            prep = PREP[o](np, onnx, helper, TP, ws, "causal", wq, wk, wv, npdt, etype)
            try:
                sess = make_session(ort, prep.model, 1, opt_path)
            except Exception as e:  # NOT_IMPLEMENTED: no kernel for the type
                msg = " ".join(str(e).split())
                print(f"# {PROG}: {IMPL[o]} {dt}: onnxruntime {ort.__version__}'s CPU EP cannot run it "
                      f"({msg if len(msg) <= 300 else msg[:100] + ' ... ' + msg[-200:]}): skipped", file=err)
                continue
            nodes = graph_nodes(onnx, opt_path)
            if nodes != ORT_OP[o]:  # e.g. Cast nodes around the fp32 kernel: no kernel of this type
                print(f"# {PROG}: {IMPL[o]} {dt}: onnxruntime {ort.__version__}'s CPU EP has no {dt} kernel for "
                      f"it (the optimised graph is {nodes}: it would time casts around another type's "
                      f"kernel): skipped", file=err)
                continue
            if dt not in np_types:
                print(f"# {PROG}: {IMPL[o]} {dt}: a session can be created but this script has no "
                      f"{dt} inputs to feed it: skipped", file=err)
                continue
            binding, _ = bind(ort, sess, prep)
            sess.run_with_iobinding(binding)
            combos.append((dt, o))

    print(f"# {PROG}: onnxruntime {ort.__version__}, onnx {onnx.__version__} (opset {OPSET}), "
          f"CPUExecutionProvider; threads {','.join(map(str, threads))}; "
          f"{', '.join(f'{IMPL[o]} {dt}' for dt, o in combos) or 'nothing to run'}; "
          f"median of up to {args.reps} runs after {args.warmup} warm-up", file=err)
    print(f"{'impl':<13} {'isa':<4} {'thr':>3}  {'B,Hq,Hkv,Tq,Tk,Dk,Dv':<28} {'mask':<19} {'dtype':<5} {'op':<8} "
          f"{'ms':>10} {'GFLOP/s':>9} {'%peak':>6} {'xscalar':>8} {'GB/s':>8} {'RSS MiB':>8}", file=err)
    bad = refused = 0
    op = "forward"
    for s, mask in cases:
        rss_before = common.peak_rss_mb()
        q, k, v = base_inputs(np, s)
        B, Hq, Hkv, Tq, Tk, Dk, Dv = s
        for dt, o in combos:
            npdt = np_types[dt]
            prep = PREP[o](np, onnx, helper, TP, s, mask, q, k, v, npdt, onnx_types[dt])
            if isinstance(prep, str):
                print(f"# {PROG}: {IMPL[o]} {','.join(map(str, s))} {mask} {dt}: {prep}: skipped", file=err)
                continue
            ref = None
            if args.check:  # on the rounded values the operator sees
                ref = reference(np, s, mask, q.astype(npdt), k.astype(npdt), v.astype(npdt))
            for t in threads:
                sess = make_session(ort, prep.model, t, opt_path)
                nodes = graph_nodes(onnx, opt_path)
                binding, vals = bind(ort, sess, prep)
                try:
                    sess.run_with_iobinding(binding)
                except Exception as e:  # a shape or mask the operator's CPU kernel refuses
                    msg = " ".join(str(e).split())
                    msg = msg if len(msg) <= 300 else "..." + msg[-300:]
                    print(f"# {PROG}: {IMPL[o]} {','.join(map(str, s))} {mask} {dt} {t} threads: "
                          f"onnxruntime refused it ({msg}): skipped", file=err)
                    refused += 1
                    continue
                if ref is not None:
                    got = prep.to_bhsd(prep.outputs[prep.result]).astype(np.float64)
                    rows = ~np.isnan(ref).any(axis=-1)
                    e = float(np.max(np.abs(got - ref)[rows])) if rows.any() else 0.0
                    tol = 1e-4 if dt == "fp32" else 5e-2
                    ok = bool(np.isfinite(e) and e <= tol)
                    bad += not ok
                    print(f"# check {IMPL[o]} {','.join(map(str, s))} {mask} {dt} {t} threads: "
                          f"max |O - ref| = {e:.3g} ({'ok' if ok else 'FAILED'}, tolerance {tol:g})", file=err)

                fn = functools.partial(sess.run_with_iobinding, binding)  # timed: the run alone
                sec, reps = common.time_runs(fn, args)
                gflops = common.op_flops(s, mask, False) / sec * 1e-9
                row = {"impl": IMPL[o], "op": op, "isa": "ort", "threads": t,
                       "B": B, "Hq": Hq, "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "Dk": Dk, "Dv": Dv,
                       "mask": mask, "dtype": dt, "ms": sec * 1e3, "gflops": gflops,
                       "peak_gflops": peaks.get(t)}
                if Tq <= common.DECODE_MAX_TQ:
                    row["gbps"] = common.kv_bytes_read(s, mask, 4 if dt == "fp32" else 2) / sec * 1e-9
                    row["peak_gbps"] = bw.get(t)
                row["rss_mb"] = common.peak_rss_mb()
                row["rss_increase_mb"] = row["rss_mb"] - rss_before
                row["reps"] = reps
                row["pairs"] = common.allowed_pairs(s, mask)
                sref = scalar.get((s, mask, op, t, dt))
                if sref:
                    row["speedup_vs_scalar"] = sref / row["ms"]
                row.update(prep.fields)
                if prep.note:
                    row["note"] = prep.note
                row["ort_op"] = ORT_OP[o]
                row["ort_nodes"] = nodes
                row["onnxruntime_version"] = ort.__version__
                print(json.dumps(row), flush=True)
                pk = f"{100 * gflops / row['peak_gflops']:.1f}" if row["peak_gflops"] else "-"
                sp = f"{row['speedup_vs_scalar']:.2f}x" if sref else "-"
                gb = f"{row['gbps']:.2f}" if "gbps" in row else ""
                print(f"{IMPL[o]:<13} {'ort':<4} {t:>3}  {','.join(map(str, s)):<28} {mask:<19} "
                      f"{dt:<5} {op:<8} {row['ms']:>10.3f} {gflops:>9.2f} {pk:>6} {sp:>8} {gb:>8} "
                      f"{row['rss_mb']:>8.1f}", file=err, flush=True)
                del binding, vals, sess
            del prep, ref
        del q, k, v
    tmpdir.cleanup()
    if refused:
        print(f"# {PROG}: {refused} row(s) refused by onnxruntime (see the notes above)", file=err)
    if bad:
        print(f"# {PROG}: {bad} check(s) FAILED", file=err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
