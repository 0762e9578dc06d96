# SPDX-License-Identifier: MIT
"""libsdpa for PyTorch (CPU float32, bfloat16 and float16 tensors): a torch.library custom
op with autograd (the backward is sdpa_backward) and fake kernels, so torch.compile traces it.
Tensors go to the library by address with their strides (no copy); O comes back in the
query's dtype. The backward passes the tensors to sdpa_backward in their own types (the
gradients in the types of q, k, v): a library whose backward refuses 16-bit tensors raises
libsdpa.SdpaError (SDPA_ERR_UNSUPPORTED); nothing is upcast behind the caller's back.

    from libsdpa.torch import scaled_dot_product_attention, attention, patch
    o = scaled_dot_product_attention(q, k, v, is_causal=True)   # torch's signature
    o = attention(q, k, v, kv_lengths=lengths)                  # libsdpa's own keywords
    with patch():                   # torch.nn.functional.scaled_dot_product_attention
        model(x)                    # on CPU tensors runs through libsdpa

Needs torch >= 2.4; `import libsdpa` itself never imports torch.
"""
import contextlib
import math
import threading
import warnings
from typing import List, Optional, Tuple

import torch

from . import _api
from . import _binding as _b

__all__ = ["scaled_dot_product_attention", "attention", "merge_states", "patch"]

_CAUSAL = _api._CAUSAL   # the NumPy API's spellings
_CAUSAL_NAME = {0: None, 1: "top-left", 2: "bottom-right"}
# sdpa_dtype of the tensor types the library stores (include/sdpa.h)
_DTYPE_CODE = {torch.float32: _api.DTYPE_F32, torch.bfloat16: _api.DTYPE_BF16,
               torch.float16: _api.DTYPE_F16}
_ITEMSIZE = _api._ITEMSIZE
_pack_t = _b.TENSOR.pack


def _raw(t, name):
    """The _api._Raw of a CPU strided tensor: data_ptr(), element strides, sdpa_dtype; no
    copy (a last dimension that is not contiguous is made so: an input only)."""
    code = _DTYPE_CODE.get(t.dtype)
    if code is None:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (libsdpa stores float32, "
                         "bfloat16 and float16)")
    shape = tuple(t.shape)
    if not t.numel():
        return _api._Raw(shape, 0, _api._packed(shape), code, t)
    st = t.stride()
    if shape[-1] > 1 and st[-1] != 1:
        t = t.contiguous()
        st = t.stride()
    ptr = t.data_ptr()
    if ptr % _ITEMSIZE[code]:
        raise ValueError(f"{name}: data is not aligned to its element size")
    return _api._Raw(shape, ptr, [s if n > 1 else 0 for n, s in zip(shape, st)], code, t)


_CPU = torch.device("cpu")
_NAN = float("nan")   # the op's scale when the default is wanted
_BAD_SCALE = -5       # SDPA_ERR_BAD_SCALE


def _out(shape, dtype):
    """A new contiguous tensor and its packed sdpa_tensor_out (rank 3 LSE or rank 4). (The
    sizes go to torch.empty one by one: a tuple costs it twice the time.)"""
    t = torch.empty(*shape, dtype=dtype, device=_CPU)
    st = t.stride()
    return t, _pack_t(t.data_ptr() if t.numel() else 0, st[0], st[1], st[2])


def _np(t):
    """A tensor operand as a NumPy array (a bfloat16 one, which NumPy lacks, widened exactly
    to float32 first: gpt-oss keeps its sinks in bfloat16)."""
    if t is None:
        return None
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _call(q, k, v, mask, bias, kv_lengths, alibi, sinks, scale, causal, wl, wr, walign,
          softcap, doff):
    """The _api._Call (descriptor and tensor views) of the op's arguments."""
    return _api._Call(
        _raw(q, "q"), _raw(k, "k"), _raw(v, "v"),
        scale=None if math.isnan(scale) else scale, causal=_CAUSAL_NAME[causal],
        window=None if wl == -1 and wr == -1 else (None if wl == -1 else wl,
                                                    None if wr == -1 else wr),
        window_align="bottom-right" if walign else None, kv_lengths=_np(kv_lengths),
        mask=_np(mask), bias=_np(bias), softcap=softcap or None, alibi_slopes=_np(alibi),
        sinks=_np(sinks), threads=torch.get_num_threads(), isa=None, diagonal_offset=doff)


def _fast_kernel(q, k, v, scale, causal, want_lse):
    """_forward_kernel for a call without masks, bias, key lengths, ALiBi, sinks, window or
    softcap, in fewer operations: None unless q, k, v are non-empty [B, H, T, D] tensors
    of supported types (k's that of v), one batch size, consistent sizes, aligned, with a
    contiguous last dimension; then _forward_kernel's general path does it all (and words
    the errors). The library gets the bytes the general path would give it (test_torch
    checks that)."""
    qc = _DTYPE_CODE.get(q.dtype)
    kc = _DTYPE_CODE.get(k.dtype)
    if qc is None or kc is None or v.dtype != k.dtype or causal not in _CAUSAL_NAME or \
            q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return None
    B, Hq, Tq, Dk = q.shape
    Bk, Hkv, Tk, Dk2 = k.shape
    Bv, Hv, Tv, Dv = v.shape
    if Bk != B or Bv != B or Dk2 != Dk or Hv != Hkv or Tv != Tk or \
            not (B and Hq and Tq and Dk and Hkv and Tk and Dv):
        return None
    q0, q1, q2, q3 = q.stride()
    k0, k1, k2, k3 = k.stride()
    v0, v1, v2, v3 = v.stride()
    qp, kp, vp = q.data_ptr(), k.data_ptr(), v.data_ptr()
    qm, km = _ITEMSIZE[qc] - 1, _ITEMSIZE[kc] - 1
    if (q3 != 1 and Dk > 1) or (k3 != 1 and Dk > 1) or (v3 != 1 and Dv > 1) or qp & qm or \
            (kp | vp) & km:
        return None
    pb = _api._fast_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv, qc, kc, qc,
                            None if math.isnan(scale) else scale, causal, torch.get_num_threads())
    b1 = B > 1
    h1 = Hkv > 1
    t1 = Tk > 1
    q_t = _pack_t(qp, q0 if b1 else 0, q1 if Hq > 1 else 0, q2 if Tq > 1 else 0)
    k_t = _pack_t(kp, k0 if b1 else 0, k1 if h1 else 0, k2 if t1 else 0)
    v_t = _pack_t(vp, v0 if b1 else 0, v1 if h1 else 0, v2 if t1 else 0)
    o, o_t = _out((B, Hq, Tq, Dv), q.dtype)
    lse = l_t = None
    if want_lse:
        lse, l_t = _out((B, Hq, Tq), torch.float32)
    st = _b.forward_packed(pb, q_t, k_t, v_t, o_t, l_t)
    if st:
        _api._types_check("sdpa_forward", st, qc, kc, qc)
    return o, lse


def _forward_kernel(q, k, v, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal,
                    window_left, window_right, window_align, softcap, diagonal_offset,
                    want_lse=True):
    """The op's kernel: (O, LSE), or (O, None) with want_lse=False (attention() when no
    gradient is wanted)."""
    if mask is None and bias is None and kv_lengths is None and alibi_slopes is None and \
            sinks is None and window_left == -1 and window_right == -1 and not window_align \
            and not softcap and not diagonal_offset:
        r = _fast_kernel(q, k, v, scale, causal, want_lse)
        if r is not None:
            return r
    c = _call(q, k, v, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal, window_left,
              window_right, window_align, softcap, diagonal_offset)
    if c.rank != 4:
        raise ValueError(f"libsdpa::attention: q of rank {c.rank}, expected 4")
    o, o_t = _out((c.B, c.Hq, c.Tq, c.Dv), q.dtype)   # O in q's type, as torch SDPA
    lse = l_t = None
    if want_lse:
        lse, l_t = _out((c.B, c.Hq, c.Tq), torch.float32)
    c.set_o_dtype(c.qc)
    st = _b.forward_packed(bytes(c.pb), c.q, c.k, c.v, o_t, l_t)
    if st:
        c.check("sdpa_forward", st)
    return o, lse


@torch.library.custom_op("libsdpa::attention", mutates_args=(), device_types="cpu")
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  mask: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  kv_lengths: Optional[torch.Tensor], alibi_slopes: Optional[torch.Tensor],
                  sinks: Optional[torch.Tensor], scale: float, causal: int, window_left: int,
                  window_right: int, window_align: int, softcap: float, diagonal_offset: int
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    return _forward_kernel(q, k, v, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal,
                           window_left, window_right, window_align, softcap, diagonal_offset)


@_attention_op.register_fake
def _(q, k, v, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal, window_left,
      window_right, window_align, softcap, diagonal_offset):
    B = max(q.shape[0], k.shape[0])
    shape = (B,) + tuple(q.shape[1:-1])
    return q.new_empty(shape + (v.shape[-1],)), q.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("libsdpa::attention_backward", mutates_args=(), device_types="cpu")
def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                           lse: torch.Tensor, do: torch.Tensor, mask: Optional[torch.Tensor],
                           bias: Optional[torch.Tensor], kv_lengths: Optional[torch.Tensor],
                           alibi_slopes: Optional[torch.Tensor], sinks: Optional[torch.Tensor],
                           scale: float, causal: int, window_left: int, window_right: int,
                           window_align: int, softcap: float, diagonal_offset: int
                           ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    c = _call(q, k, v, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal, window_left,
              window_right, window_align, softcap, diagonal_offset)
    if c.rank != 4:
        raise ValueError(f"libsdpa::attention_backward: q of rank {c.rank}, expected 4")
    B, Hq, Hkv, Tq, Tk, Dk, Dv = c.B, c.Hq, c.Hkv, c.Tq, c.Tk, c.Dk, c.Dv
    oshape = (B, Hq, Tq, Dv)
    if do.dtype != o.dtype:
        raise ValueError(f"do: dtype {do.dtype} differs from o's {o.dtype} (dO is stored in "
                         "O's type)")
    o_r = c.tensor_in(_raw(o, "o"), "o", oshape)
    l_r = c.tensor_in(_raw(lse, "lse"), "lse", oshape[:-1])
    do_r = c.tensor_in(_raw(do, "do"), "do", oshape)
    if l_r[3] != _api.DTYPE_F32:
        raise ValueError(f"lse: dtype {lse.dtype}, expected torch.float32")
    c.set_o_dtype(o_r[3])
    o_t, do_t = _pack_t(o_r[1], *o_r[2][:3]), _pack_t(do_r[1], *do_r[2][:3])
    l_t = _pack_t(l_r[1], *l_r[2])
    # the gradients in the types of q, k, v; a library that refuses 16-bit tensors gives
    # SdpaError here, never a float32 computation in their place
    dq, dq_t = _out((B, Hq, Tq, Dk), q.dtype)
    dk, dk_t = _out((B, Hkv, Tk, Dk), k.dtype)
    dv, dv_t = _out((B, Hkv, Tk, Dv), v.dtype)
    dsinks = q.new_zeros(0, dtype=torch.float32)
    if sinks is not None:
        dsinks = torch.empty(Hq, dtype=torch.float32, device="cpu")
        c.set_dsinks(dsinks.data_ptr())
    st = _b.backward_packed(bytes(c.pb), c.q, c.k, c.v, o_t, l_t, do_t, dq_t, dk_t, dv_t)
    if st:
        c.check("sdpa_backward", st)
    bq, bk, bv = c.bcast_b
    if bq:
        dq = dq.sum(0, keepdim=True, dtype=torch.float32).to(q.dtype)
    if bk:
        dk = dk.sum(0, keepdim=True, dtype=torch.float32).to(k.dtype)
    if bv:
        dv = dv.sum(0, keepdim=True, dtype=torch.float32).to(v.dtype)
    return dq, dk, dv, dsinks


@_attention_backward_op.register_fake
def _(q, k, v, o, lse, do, mask, bias, kv_lengths, alibi_slopes, sinks, scale, causal,
      window_left, window_right, window_align, softcap, diagonal_offset):
    ds = q.new_empty(sinks.shape if sinks is not None else (0,), dtype=torch.float32)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), ds


def _setup_context(ctx, inputs, output):
    q, k, v, mask, bias, kvl, alibi, sinks = inputs[:8]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask, bias, kvl, alibi, sinks)
    ctx.scalars = inputs[8:]


def _backward(ctx, do, dlse):
    q, k, v, o, lse, mask, bias, kvl, alibi, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _attention_backward_op(q, k, v, o, lse, do, mask, bias, kvl, alibi,
                                                sinks, *ctx.scalars)
    return (dq, dk, dv, None, None, None, None, dsinks if sinks is not None else None,
            None, None, None, None, None, None, None)


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def _check_tensor(t, name):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cpu:   # (t.device builds a torch.device: ten times the time)
        raise ValueError(f"{name}: libsdpa runs on CPU tensors (got device {t.device})")
    if t.dtype not in _DTYPE_CODE:
        raise ValueError(f"{name}: dtype {t.dtype} is not supported (libsdpa stores float32, "
                         "bfloat16 and float16 and computes in float32)")
    if t.layout != torch.strided or t.is_nested:
        raise ValueError(f"{name}: only strided (dense) tensors are supported")


def _last_contig(t):
    return t if t.stride()[-1] == 1 or t.shape[-1] <= 1 else t.contiguous()


def _to4(q, k, v):
    """(q, k, v) as [B, H, T, D] views plus the leading shape to give back."""
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"query, key and value must have the same rank >= 2 (got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)})")
    if q.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0]:
        # the common case: nothing to broadcast or fold (expand and reshape would give
        # views of the same shape and strides)
        return _last_contig(q), _last_contig(k), _last_contig(v), (q.shape[0],)
    lead = torch.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3]) if q.dim() > 3 else ()

    def four(t):
        t = _last_contig(t)
        if t.dim() == 2:
            return t[None, None]
        if t.dim() == 3:
            return t[None]
        t = t.expand(tuple(lead) + tuple(t.shape[-3:]))
        return t.reshape((-1,) + tuple(t.shape[-3:]))   # a view where strides allow

    return four(q), four(k), four(v), tuple(lead)


def _merge_checked(outs, lses, out_dtype):
    """merge_states' arguments checked (as lists); the merged O's dtype."""
    n = len(outs)
    if n < 1 or len(lses) != n:
        raise ValueError(f"merge_states: {n} outs and {len(lses)} lses (need as many, at least 1)")
    for i in range(n):
        _check_tensor(outs[i], f"outs[{i}]")
        _check_tensor(lses[i], f"lses[{i}]")
    shape, dtype = tuple(outs[0].shape), outs[0].dtype
    if len(shape) not in (2, 3, 4):
        raise ValueError(f"outs[0]: rank {len(shape)}; expected 2, 3 or 4")
    o_dtype = dtype if out_dtype is None else out_dtype
    if o_dtype not in _DTYPE_CODE:
        raise ValueError(f"out_dtype: {out_dtype} is not supported (float32, bfloat16, float16)")
    for i in range(n):
        if tuple(outs[i].shape) != shape or outs[i].dtype != dtype:
            raise ValueError(f"outs[{i}]: {tuple(outs[i].shape)} {outs[i].dtype}, expected {shape} "
                             f"{dtype} (the parts share one shape and one dtype)")
        if tuple(lses[i].shape) != shape[:-1] or lses[i].dtype != torch.float32:
            raise ValueError(f"lses[{i}]: {tuple(lses[i].shape)} {lses[i].dtype}, expected "
                             f"{shape[:-1]} torch.float32")
    return o_dtype


@torch.library.custom_op("libsdpa::merge_states", mutates_args=(), device_types="cpu")
def _merge_op(outs: List[torch.Tensor], lses: List[torch.Tensor],
              out_dtype: Optional[torch.dtype]) -> Tuple[torch.Tensor, torch.Tensor]:
    o_dtype = _merge_checked(outs, lses, out_dtype)
    n, shape = len(outs), tuple(outs[0].shape)
    rank = len(shape)
    Ot = (_api._Tensor * n)()
    Lt = (_api._Tensor * n)()
    keep = []   # the _Raw views (and any contiguous copy) alive until the call returns
    for i in range(n):
        ro, rl = _raw(outs[i], f"outs[{i}]"), _raw(lses[i], f"lses[{i}]")
        keep += [ro, rl]
        Ot[i] = _api._t(ro.ptr, ro.st, rank)
        Lt[i] = _api._lse_t(rl.ptr, rl.st, rank)
    o = torch.empty(shape, dtype=o_dtype, device=_CPU)
    lse = torch.empty(shape[:-1], dtype=torch.float32, device=_CPU)
    (B, H, T, D), _ = _api._split(shape, [0] * rank, rank)
    o_t = _api._t(o.data_ptr() if o.numel() else 0, list(o.stride()), rank)
    l_t = _api._lse_t(lse.data_ptr() if lse.numel() else 0, list(lse.stride()), rank)
    st = _b.merge_states_typed(n, B, H, T, D, _DTYPE_CODE[outs[0].dtype], Ot, Lt, _DTYPE_CODE[o_dtype],
                               _api._byref(o_t), _api._byref(l_t))
    del keep
    _api._check("sdpa_merge_states_typed", st)
    return o, lse


@_merge_op.register_fake
def _(outs, lses, out_dtype):
    o_dtype = _merge_checked(outs, lses, out_dtype)
    return outs[0].new_empty(outs[0].shape, dtype=o_dtype), lses[0].new_empty(lses[0].shape)


def merge_states(outs, lses, *, out_dtype=None):
    """Merges partial attention states (O_s, LSE_s) over disjoint key sets of the same
    queries (cascade attention, a prefix cache, split-KV across calls: vLLM's
    merge_attn_states) through sdpa_merge_states_typed: O = sum_s exp(LSE_s - LSE) O_s,
    LSE = log sum_s exp(LSE_s) (natural log, as attention(..., return_lse=True) gives it).
    outs: CPU tensors [.., T, Dv] (rank 2 to 4) of one shape and one dtype (float32,
    bfloat16 or float16, any strides); lses: float32 [.., T]. Returns new (O, LSE)
    tensors, O in out_dtype (default: the parts' dtype), merged in float32 and rounded
    once. The custom op libsdpa::merge_states (torch.compile traces it). Inference only:
    no autograd (the inputs are read detached; the results do not require grad)."""
    outs = [t.detach() if isinstance(t, torch.Tensor) else t for t in outs]
    lses = [t.detach() if isinstance(t, torch.Tensor) else t for t in lses]
    _merge_checked(outs, lses, out_dtype)
    return _merge_op(outs, lses, out_dtype)


# What _direct() asks of the dispatcher's state (torch internals; without one of them every
# call takes the custom op).
_C = torch._C
_modes_dispatch = getattr(_C, "_len_torch_dispatch_stack", None)
_modes_function = getattr(_C, "_is_torch_function_mode_enabled", None)
_functorch_stack = getattr(getattr(_C, "_functorch", None), "peek_interpreter_stack", None)
_tracing_state = getattr(_C, "_get_tracing_state", None)
_profiling = getattr(getattr(_C, "_autograd", None), "_profiler_enabled", None)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
import torch.autograd.forward_ad as _fwd_ad  # noqa: E402
_DIRECT = None not in (_modes_dispatch, _modes_function, _functorch_stack, _tracing_state,
                       _profiling, _is_compiling, getattr(_fwd_ad, "_current_level", None))
_PlainTensor = torch.Tensor


def _differentiating_transform(tensors):
    """Whether one of the tensors is tracked by a torch.func transform that differentiates
    (grad, vjp, jacrev, jacfwd, jvp, hessian: a GradTrackingTensor): the custom op's
    autograd formula is registered for torch.autograd only, and torch fails inside the op
    on such a tensor ("In order to use an autograd.Function with functorch transforms ...
    setup_context"). A constant under such a transform, and vmap alone, are fine. Not asked
    while torch.compile traces (dynamo runs no transform of this kind there)."""
    if _functorch_stack is None or (_is_compiling is not None and _is_compiling()) or \
            _functorch_stack() is None:
        return False
    tracked = getattr(_C._functorch, "is_gradtrackingtensor", None)
    if tracked is None:   # another torch: cannot tell, so assume so
        return True
    return any(isinstance(t, torch.Tensor) and _tracked_somewhere(t, tracked) for t in tensors)


def _tracked_somewhere(t, tracked):
    """Whether t, or a tensor it wraps (a vmap level around a grad level), is a
    GradTrackingTensor."""
    unwrap = getattr(_C._functorch, "get_unwrapped", None)
    wrapped = getattr(_C._functorch, "is_functorch_wrapped_tensor", None)
    for _ in range(64):   # levels of nested transforms
        if tracked(t):
            return True
        if unwrap is None or wrapped is None or not wrapped(t):
            return False
        t = unwrap(t)
    return True


_FUNC_TRANSFORM = ("libsdpa.torch: torch.func transforms that differentiate (grad, vjp, "
                   "jacrev, jacfwd, hessian) are not supported (the op's gradient is "
                   "registered for torch.autograd: use loss.backward() or "
                   "torch.autograd.grad; under libsdpa.torch.patch() such calls go to "
                   "PyTorch's scaled_dot_product_attention)")


def _tangents(tensors):
    """Whether a forward-mode AD level is open (torch.func.jvp, torch.autograd.forward_ad)
    and one of the tensors carries a tangent at it: torch gives a custom op without a jvp
    rule a tangent of zeros, silently, so such calls are refused (patch(): PyTorch's)."""
    if getattr(_fwd_ad, "_current_level", -1) < 0:
        return False
    return any(isinstance(t, torch.Tensor) and _fwd_ad.unpack_dual(t).tangent is not None
               for t in tensors)


def _direct(tensors):
    """Whether attention() may run the op's kernel itself instead of calling the custom op
    (whose dispatch costs tens of microseconds a call, most of a small call's time): only in
    plain eager PyTorch (torch.compile not tracing, no torch function or dispatch mode, e.g.
    FakeTensorMode, no functorch transform such as vmap, no forward-mode AD level, no
    torch.jit tracing, no profiler), for tensors of the class torch.Tensor itself (no
    subclass, no negative-bit view or zero tensor), none of which wants a gradient while
    grad mode is on. Then the op would compute the very same O, and autograd would record
    nothing: the result is the same tensor values without a detour. Anything else takes
    the op. (is_compiling comes first: under torch.compile the rest is never traced.)"""
    if not _DIRECT or _is_compiling() or _modes_dispatch() or _modes_function() or \
            _functorch_stack() is not None or _fwd_ad._current_level >= 0 or \
            _tracing_state() is not None or _profiling():
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is not None and (type(t) is not _PlainTensor or (grad and t.requires_grad) or
                              t.is_neg() or t._is_zerotensor()):
            return False
    return True


def attention(query, key, value, *, scale=None, causal=None, window=None, window_align=None,
              diagonal_offset=0, kv_lengths=None, mask=None, bias=None, softcap=None,
              alibi_slopes=None, sinks=None, return_lse=False):
    """libsdpa's attention on CPU tensors [.., H, T, D] with autograd (query, key, value, and
    sinks when given; mask, bias and alibi_slopes get none: a bias or slopes tensor that
    requires grad, with grad mode on, is a ValueError; inputs tracked by torch.func.grad or
    another differentiating torch.func transform are NotImplementedError). float32,
    bfloat16 or float16, read in place; key and value share one dtype, query's may differ (a float32 query over a
    bfloat16 cache); O has the query's dtype. The gradients have the types of query, key,
    value (a library whose backward refuses 16-bit tensors raises SdpaError). Keywords as
    libsdpa.attention (the NumPy API): causal None/True/'top-left'/'bottom-right', window
    (left, right), diagonal_offset, kv_lengths (an integer tensor of B lengths), mask (bool, True = may attend)
    and bias (float32) broadcastable to [B, Hq, Tq, Tk], softcap, alibi_slopes, sinks.
    GQA: query heads a multiple of key heads. Returns O [.., Hq, Tq, Dv]; with
    return_lse=True, (O, LSE): LSE [.., Hq, Tq] float32, natural log (-inf for a row with no
    key), the state merge_states() takes; the LSE is detached (no gradient flows through it:
    O's does)."""
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        _check_tensor(t, n)
    return _attention(query, key, value, scale, causal, window, window_align, kv_lengths, mask,
                      bias, softcap, alibi_slopes, sinks, diagonal_offset, return_lse)


def _attention(query, key, value, scale, causal, window, window_align, kv_lengths, mask, bias,
               softcap, alibi_slopes, sinks, diagonal_offset=0, return_lse=False):
    """attention() after _check_tensor of query, key and value."""
    if key.dtype != value.dtype:
        raise ValueError(f"key and value: dtypes {key.dtype} and {value.dtype} differ (libsdpa "
                         "stores K and V in one type; the query's may differ)")
    q, k, v, lead = _to4(query, key, value)

    def m4(x, name, dtype):
        """A mask or bias: right-aligned broadcast to [.., Hq, Tq, Tk] as in PyTorch; above
        rank 4 its leading dims are folded like the query's."""
        if not isinstance(x, torch.Tensor):
            x = torch.as_tensor(x)
        if x.dtype != dtype:
            raise ValueError(f"{name}: dtype {x.dtype}, expected {dtype}")
        x = x.detach()
        if query.dim() > 4:
            B, Hq, Tq, Tk = max(q.shape[0], k.shape[0]), q.shape[1], q.shape[2], k.shape[2]
            x = x.expand(tuple(lead) + (Hq, Tq, Tk)).reshape((B, Hq, Tq, Tk))
        return x

    kvl = None
    if kv_lengths is not None:
        kvl = kv_lengths if isinstance(kv_lengths, torch.Tensor) else torch.as_tensor(kv_lengths)
        if kvl.dtype.is_floating_point or kvl.dtype == torch.bool or kvl.dtype.is_complex:
            raise ValueError(f"kv_lengths: dtype {kvl.dtype} is not an integer type")
        kvl = kvl.detach()
    # the keywords checked as the NumPy API checks them (same errors)
    wl, wr = (-1, -1) if window is None else _api._window(window)
    walign = 0 if window_align is None else _api._window_align(window_align)
    try:
        if causal is not None and not isinstance(causal, (bool, str, _api.np.bool_)):
            raise TypeError  # 1 or 1.0 would find True's entry (as in libsdpa.attention)
        cz = _CAUSAL[causal]
    except (KeyError, TypeError):
        raise ValueError(f"causal: expected None, False, True (top-left), 'top-left' or "
                         f"'bottom-right', got {causal!r}") from None
    if scale is not None:
        scale = _api._f32(scale, "scale")
        if scale != scale:   # the op's NaN means the default: a caller's NaN is the library's error
            raise _api.SdpaError("sdpa_forward", _BAD_SCALE)
    cap = 0.0 if softcap is None else _api._softcap(softcap)
    al = None if alibi_slopes is None else torch.as_tensor(alibi_slopes, dtype=torch.float32)
    sk = None if sinks is None else (sinks if isinstance(sinks, torch.Tensor)
                                     else torch.as_tensor(sinks, dtype=torch.float32))
    args = (q, k, v, None if mask is None else m4(mask, "mask", torch.bool),
            None if bias is None else m4(bias, "bias", torch.float32), kvl, al, sk,
            _NAN if scale is None else scale, cz, wl, wr, walign, cap,
            _api._int_arg(diagonal_offset, "diagonal_offset", -_api._MAX_DIAGONAL_OFFSET,
                          _api._MAX_DIAGONAL_OFFSET) if diagonal_offset is not None else 0)
    if torch.is_grad_enabled():
        for t, name in ((bias, "bias"), (al, "alibi_slopes")):
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise ValueError(f"libsdpa.torch.attention: no gradient for {name} (it requires "
                                 f"grad; libsdpa computes dQ, dK, dV and dsinks only): pass "
                                 f"{name}.detach()")
    if _differentiating_transform((q, k, v, sk)):
        raise NotImplementedError(_FUNC_TRANSFORM)
    if _tangents(args[:8]):
        raise NotImplementedError(
            "libsdpa.torch: forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) is not "
            "supported (a custom op's tangent would silently be 0)")
    if _direct(args[:8]):
        o, lse = _forward_kernel(*args, want_lse=return_lse)
    else:
        o, lse = _attention_op(*args)
    rank = query.dim()
    if return_lse:
        lse = lse.detach()
        if rank == 2:
            return o[0, 0], lse[0, 0]
        if rank == 3:
            return o[0], lse[0]
        if rank > 4:
            return (o.reshape(tuple(lead) + tuple(o.shape[1:])),
                    lse.reshape(tuple(lead) + tuple(lse.shape[1:])))
        return o, lse
    if rank == 4:
        return o   # [B, Hq, Tq, Dv] already, B = lead[0]
    if rank == 2:
        return o[0, 0]
    if rank == 3:
        return o[0]
    return o.reshape(tuple(lead) + tuple(o.shape[1:]))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention computed by libsdpa (CPU float32,
    bfloat16 or float16; key and value of one dtype, the query's may differ; the output has
    the query's): query [N, .., Hq, L, E], key [N, .., H, S, E], value [N, .., H, S, Ev];
    attn_mask bool (True = takes part) or float (float32 or the query's dtype, widened
    exactly to float32, added to the scaled scores) broadcastable to [N, .., Hq, L, S];
    is_causal: top-left causal mask; scale: default 1/sqrt(E); enable_gqa: Hq a multiple of
    H. dropout_p must be 0. A query row that no key may attend gives 0 (PyTorch's math
    backend gives NaN there). The backward of a 16-bit call raises SdpaError where the
    library's backward refuses 16-bit tensors."""
    if dropout_p != 0.0:
        raise ValueError("libsdpa: dropout_p must be 0 (libsdpa has no dropout)")
    if attn_mask is not None and is_causal:
        raise ValueError("libsdpa: _scaled_dot_product_attention: Explicit attn_mask should "
                         "not be set when is_causal=True (as PyTorch)")
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        _check_tensor(t, n)
    if query.dim() >= 3 and key.shape[-3] != query.shape[-3] and not enable_gqa:
        raise ValueError(f"libsdpa: query has {query.shape[-3]} heads and key {key.shape[-3]}: "
                         "pass enable_gqa=True for grouped-query attention")
    mask = bias = None
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError("attn_mask: expected a torch.Tensor")
        if attn_mask.dtype == torch.bool:
            mask = attn_mask
        elif attn_mask.dtype == torch.float32 or attn_mask.dtype == query.dtype:
            if attn_mask.requires_grad:
                raise ValueError("libsdpa: no gradient for a float attn_mask (requires_grad)")
            bias = attn_mask.float()   # a 16-bit mask: widened exactly (the bias is float32)
        else:
            raise ValueError(f"attn_mask: dtype {attn_mask.dtype} is not supported "
                             "(bool, float32 or the query's dtype)")
    return _attention(query, key, value, scale, True if is_causal else None, None, None, None,
                      mask, bias, None, None, None)


_torch_sdpa = torch.nn.functional.scaled_dot_product_attention
_warned = set()
_warn_lock = threading.Lock()


def _unsupported(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Why libsdpa cannot compute this call (None: it can)."""
    for t, n in ((query, "query"), (key, "key"), (value, "value")):
        if not isinstance(t, torch.Tensor) or t.is_nested or t.layout != torch.strided:
            return f"{n} is not a dense tensor"
        if t.device.type != "cpu":
            return f"{n} is on {t.device}"
        if t.dtype not in _DTYPE_CODE:
            return f"{n} is {t.dtype}"
    if not query.dtype == key.dtype == value.dtype:
        return "query, key and value dtypes differ"   # PyTorch's own error
    if query.dtype != torch.float32 and torch.is_grad_enabled() and (
            query.requires_grad or key.requires_grad or value.requires_grad) \
            and not _api._backward_16bit():
        return f"{query.dtype} with autograd (this libsdpa's backward is float32 only)"
    if dropout_p != 0.0:
        return "dropout_p != 0"
    if _differentiating_transform((query, key, value)):
        return "a torch.func transform that differentiates (grad, vjp, jacrev, ...)"
    if _tangents((query, key, value, attn_mask)):
        return "forward-mode AD"
    if query.dim() < 2 or key.dim() != query.dim() or value.dim() != query.dim():
        return "ranks differ"
    if scale is None and query.shape[-1] == 0:
        return "head_dim 0 with the default scale 1/sqrt(0)"
    if attn_mask is not None:
        if is_causal:
            return "attn_mask with is_causal"
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.device.type != "cpu":
            return "attn_mask not a CPU tensor"
        if attn_mask.dtype not in (torch.bool, torch.float32, query.dtype):
            return f"attn_mask is {attn_mask.dtype}"
        if attn_mask.requires_grad:
            return "attn_mask requires grad"
        try:   # PyTorch's own error (a RuntimeError) for a mask that does not broadcast
            torch.broadcast_shapes(attn_mask.shape, query.shape[:-1] + (key.shape[-2],))
        except RuntimeError:
            return "attn_mask does not broadcast"
    if query.dim() >= 3 and key.shape[-3] != query.shape[-3]:
        if not enable_gqa or query.shape[-3] % key.shape[-3]:
            return "head counts differ"
    return None


def _patched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
    why = _unsupported(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if why is None:
        return scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal,
                                            scale, enable_gqa)
    with _warn_lock:
        first = why not in _warned
        _warned.add(why)
    if first:
        warnings.warn(f"libsdpa.torch.patch: falling back to PyTorch's "
                      f"scaled_dot_product_attention ({why})", RuntimeWarning, stacklevel=2)
    kw = {"enable_gqa": enable_gqa} if enable_gqa else {}
    return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                       is_causal=is_causal, scale=scale, **kw)


_patch_lock = threading.Lock()
_patch_depth = 0        # patch() blocks open in the process (every thread)
_patch_saved = None     # the function the first of them replaced


@contextlib.contextmanager
def patch():
    """Routes torch.nn.functional.scaled_dot_product_attention through libsdpa inside the
    block (CPU float32, bfloat16 and float16 tensors; a 16-bit call that wants gradients
    only if the library's backward takes 16-bit tensors; anything else falls back to
    PyTorch, with one warning per reason). Code that looks the function up at call time
    (torch.nn.functional.<name>, F.<name>, transformers' "sdpa" attention) is affected; a
    name imported before the block with `from torch.nn.functional import
    scaled_dot_product_attention` is not. The patch is process-wide: while any thread is
    inside a block, every thread's calls go through libsdpa; blocks may nest and overlap
    across threads, and the function is restored when the last open block ends."""
    global _patch_depth, _patch_saved
    F = torch.nn.functional
    # _unsupported() asks this of the library; asked here, outside any torch.compile
    # trace, so that dynamo only reads the cached answer (tracing the probe's call into
    # the C extension broke fullgraph=True in a process's first 16-bit call)
    _api._backward_16bit()
    with _patch_lock:   # blocks of several threads may overlap: the last one out restores
        if _patch_depth == 0:
            _patch_saved = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _patched
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                F.scaled_dot_product_attention = _patch_saved
                _patch_saved = None
