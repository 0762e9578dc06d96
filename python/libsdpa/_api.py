# SPDX-License-Identifier: MIT
"""The NumPy API: attention(), attention_backward(), merge_states(), info()."""
import ctypes

import numpy as np

from . import _binding as _b

__all__ = ["SdpaError", "attention", "attention_backward", "merge_states", "info", "force_isa",
           "isa_names"]

_F32 = np.dtype(np.float32)
_F16 = np.dtype(np.float16)
_U8 = np.dtype(np.uint8)
_BOOL = np.dtype(np.bool_)
_INT_MAX = 2**31 - 1
_Tensor = _b.Tensor
_byref = ctypes.byref


class SdpaError(ValueError):
    """A status code of the C library: .status (int), .name (SDPA_ERR_...), the
    library's own sdpa_status_string() as the message (plus, where given, what the
    call was, e.g. its storage types)."""

    def __init__(self, func, status, detail=""):
        self.status = status
        self.name = _b.STATUS_NAMES.get(status, "unknown")
        self.function = func
        text = _b.status_string(status).decode()
        super().__init__(f"{func}: {text} ({self.name}){detail}")


def _check(func, status, detail=""):
    if status != 0:
        if status == _b.ERR_OUT_OF_MEMORY:
            raise MemoryError(str(SdpaError(func, status, detail)))
        raise SdpaError(func, status, detail)


# ---------------------------------------------------------------- storage types

# sdpa_dtype (include/sdpa.h) of a NumPy dtype. NumPy has no bfloat16: ml_dtypes'
# bfloat16 (not a dependency) is recognised by its name when an array first brings it.
DTYPE_F32, DTYPE_BF16, DTYPE_F16 = 0, 1, 2
_DTYPE_CODE = {_F32: DTYPE_F32, _F16: DTYPE_F16}
_DTYPE_NAME = ("float32", "bfloat16", "float16")
_ITEMSIZE = (4, 2, 2)
_TYPED = "float32, float16 or bfloat16"


def _dtype_code(dt, name, allowed=_TYPED):
    """sdpa_dtype of the NumPy dtype dt; ValueError if it is not one. The common
    types are one dict look-up."""
    code = _DTYPE_CODE.get(dt)
    if code is None:
        if dt.name == "bfloat16" and dt.itemsize == 2 and dt.isnative and allowed is _TYPED:
            _DTYPE_CODE[dt] = code = DTYPE_BF16   # ml_dtypes.bfloat16
        else:
            raise ValueError(f"{name}: dtype {dt} is not supported (expected {allowed}, "
                             "native byte order)")
    elif code and allowed is not _TYPED:
        raise ValueError(f"{name}: dtype {dt} is not supported (expected {allowed})")
    return code


def _bfloat16():
    """ml_dtypes' bfloat16 NumPy dtype, if that package is installed."""
    try:
        import ml_dtypes
    except ImportError:
        raise ValueError("bfloat16: NumPy has no bfloat16 type; install ml_dtypes (its "
                         "bfloat16 arrays are taken as bf16) or pass out= an ml_dtypes "
                         "bfloat16 array") from None
    return np.dtype(ml_dtypes.bfloat16)


def _out_dtype(out_dtype):
    """The NumPy dtype of out_dtype= (float32, float16, 'bfloat16' or ml_dtypes.bfloat16)."""
    if isinstance(out_dtype, str) and out_dtype.lower() in ("bfloat16", "bf16"):
        dt = _bfloat16()
    else:
        try:
            dt = np.dtype(out_dtype)
        except TypeError:
            raise ValueError(f"out_dtype: {out_dtype!r} is not a dtype (expected {_TYPED})") \
                from None
    _dtype_code(dt, "out_dtype")
    return dt


class _Raw:
    """A tensor given by address rather than as an array (libsdpa.torch): its shape,
    data pointer, element strides (0 for dimensions of size <= 1) and sdpa_dtype, as
    _view returns them, and the object that owns the memory (kept alive)."""
    __slots__ = ("shape", "ndim", "ptr", "st", "code", "owner")

    def __init__(self, shape, ptr, st, code, owner):
        self.shape, self.ndim, self.ptr, self.st, self.code, self.owner = \
            shape, len(shape), ptr, st, code, owner


# ---------------------------------------------------------------- array views

def _as_array(x, name):
    if type(x) is not np.ndarray:
        if not isinstance(x, np.ndarray):
            try:
                x = np.asarray(x)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"{name}: not an array ({type(x).__name__})") from e
    return x


def _view(a, name, rank, writable=False, allowed="float32"):
    """(pointer, element strides of every dim, sdpa_dtype) of an array whose last dim
    is contiguous; ValueError otherwise. Dimensions of size 1 get stride 0. allowed:
    "float32" (LSE, bias, merge_states), or _TYPED for Q, K, V, O, dO."""
    code = _dtype_code(a.dtype, name, allowed)
    if a.ndim != rank:
        raise ValueError(f"{name}: rank {a.ndim}, expected {rank} (like q)")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name}: array is read-only")
    shape = a.shape
    item = _ITEMSIZE[code]
    if not a.size:  # nothing is read or written: NULL data, packed strides
        return 0, _packed(shape), code
    ptr = a.ctypes.data
    if ptr % item:
        raise ValueError(f"{name}: data is not aligned to {item} bytes")
    st = []
    for n, s in zip(shape, a.strides):
        if n <= 1:
            st.append(0)
            continue
        if s < 0:
            raise ValueError(f"{name}: negative stride {s} bytes (reversed views are not supported; "
                             "use np.ascontiguousarray)")
        if s % item:
            raise ValueError(f"{name}: stride {s} bytes is not a multiple of the item size {item}")
        st.append(s // item)
    if shape and shape[-1] > 1 and st[-1] != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (its stride is "
                         f"{a.strides[-1]} bytes, expected {item}); use np.ascontiguousarray")
    return ptr, st, code


def _packed(shape):
    """Element strides of a packed (C-order) tensor of this shape, for empty ones."""
    st, n = [], 1
    for d in reversed(shape):
        st.append(n)
        n *= max(d, 1)
    return st[::-1]


def _operand(x, name, rank):
    """_view of q, k, v, o or do: a NumPy array of a supported type, or a _Raw."""
    if type(x) is _Raw:
        if x.ndim != rank:
            raise ValueError(f"{name}: rank {x.ndim}, expected {rank} (like q)")
        return x.ptr, x.st, x.code
    return _view(x, name, rank, allowed=_TYPED)


def _split(shape, st, rank):
    """(B, H, T, D) sizes and (batch, head, seq) strides of a rank-2/3/4 view."""
    if rank == 4:
        return shape, (st[0], st[1], st[2])
    if rank == 3:
        return (1,) + shape, (0, st[0], st[1])
    return (1, 1) + shape, (0, 0, st[0])


def _lead_shape(rank, B, H, T):
    return ((B, H, T), (H, T), (T,))[4 - rank]


def _mask_view(m, name, rank, full, dtype_ok):
    """A mask or bias broadcast (zero copy where possible) to the logical
    [B, Hq, Tq, Tk] (in q's rank); returns Mask4 fields."""
    m = _as_array(m, name)
    if m.dtype not in dtype_ok:
        raise ValueError(f"{name}: dtype {m.dtype} is not supported (expected "
                         f"{' or '.join(str(d) for d in dtype_ok)})")
    if m.dtype == _BOOL:
        m = m.view(_U8)
    target = full[4 - rank:]
    try:
        mb = np.broadcast_to(m, target)
    except ValueError as e:
        raise ValueError(f"{name}: shape {m.shape} does not broadcast to {target}") from e
    item = m.dtype.itemsize
    if any(s < 0 or s % item for s in mb.strides) or (mb.size and mb.ctypes.data % item):
        m = np.ascontiguousarray(m)  # an input: a copy changes nothing but the speed
        mb = np.broadcast_to(m, target)
    st = [0] * (4 - rank) + [s // item if n > 1 else 0 for n, s in zip(mb.shape, mb.strides)]
    ptr = mb.ctypes.data if mb.size else 0
    return mb, _b.Mask4(ptr, st[0], st[1], st[2], st[3])


def _head_vector(x, name, H):
    x = _as_array(x, name)
    if x.dtype.kind != "f":
        raise ValueError(f"{name}: dtype {x.dtype} is not supported (expected a float array of shape ({H},))")
    if x.shape != (H,):
        raise ValueError(f"{name}: shape {x.shape}, expected ({H},) (one per query head)")
    return np.ascontiguousarray(x, dtype=_F32)


_CAUSAL = {None: 0, False: 0, "none": 0, True: 1, "top-left": 1, "top_left": 1,
           "bottom-right": 2, "bottom_right": 2}
_ALIGN = {None: 0, "top-left": 0, "top_left": 0, "bottom-right": 1, "bottom_right": 1}


def _isa_value(isa):
    if isa is None:
        return _b.ISA_AUTO
    if not isinstance(isa, str):
        raise ValueError(f"isa: expected a name ({', '.join(isa_names())}) or None, got {isa!r}")
    out = ctypes.c_int()
    if _b.isa_from_name(isa.encode(), _byref(out)) != 0:
        raise ValueError(f"isa: unknown ISA name {isa!r} (expected one of {', '.join(isa_names())}, auto)")
    return out.value


def _int_arg(x, name, lo, hi):
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise ValueError(f"{name}: expected an integer, got {x!r}")
    x = int(x)
    if not lo <= x <= hi:
        raise ValueError(f"{name}: {x} is outside [{lo}, {hi}]")
    return x


class _Call:
    """Everything a forward/backward call shares: the descriptor and the views of
    q, k, v; keeps the arrays it points into alive."""
    __slots__ = ("p", "q", "k", "v", "rank", "B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv", "keep",
                 "bcast_b", "sinks", "qdt", "kvdt")

    def __init__(self, q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias,
                 softcap, alibi_slopes, sinks, threads, isa, block_q=0, block_k=0):
        if type(q) is not _Raw:
            q = _as_array(q, "q")
            k = _as_array(k, "k")
            v = _as_array(v, "v")
            self.qdt, self.kvdt = q.dtype, k.dtype
        else:
            self.qdt = self.kvdt = None   # libsdpa.torch allocates its own outputs
        rank = q.ndim
        if rank not in (2, 3, 4):
            raise ValueError(f"q: rank {rank}; expected 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D)")
        qp, qs, qc = _operand(q, "q", rank)
        kp, ks, kc = _operand(k, "k", rank)
        vp, vs, vc = _operand(v, "v", rank)
        if kc != vc:
            raise ValueError(f"k and v: dtypes {_DTYPE_NAME[kc]} and {_DTYPE_NAME[vc]} differ "
                             "(K and V must share one storage type; q's may differ)")
        (Bq, Hq, Tq, Dk), qs = _split(q.shape, qs, rank)
        (Bk, Hkv, Tk, Dk2), ks = _split(k.shape, ks, rank)
        (Bv, Hv, Tv, Dv), vs = _split(v.shape, vs, rank)
        if Dk2 != Dk:
            raise ValueError(f"k: head_dim {Dk2} differs from q's {Dk} (shapes q {q.shape}, k {k.shape})")
        if (Hv, Tv) != (Hkv, Tk):
            raise ValueError(f"v: heads and length {(Hv, Tv)} differ from k's {(Hkv, Tk)} "
                             f"(shapes k {k.shape}, v {v.shape})")
        B = max(Bq, Bk, Bv)
        for nm, n in (("q", Bq), ("k", Bk), ("v", Bv)):
            if n not in (1, B):
                raise ValueError(f"{nm}: batch {n} does not broadcast with {B} "
                                 f"(shapes q {q.shape}, k {k.shape}, v {v.shape})")
        self.bcast_b = (Bq != B, Bk != B, Bv != B)
        self.q = _Tensor(qp, *qs)
        self.k = _Tensor(kp, *ks)
        self.v = _Tensor(vp, *vs)
        self.rank, self.B, self.Hq, self.Hkv, self.Tq, self.Tk, self.Dk, self.Dv = \
            rank, B, Hq, Hkv, Tq, Tk, Dk, Dv
        keep = [q, k, v]
        p = _b.Problem.from_buffer_copy(_b.PROBLEM_TEMPLATE)
        if qc:
            p.q_dtype = qc
        if kc:
            p.kv_dtype = kc
        p.batch, p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim_qk, p.head_dim_v = \
            B, Hq, Hkv, Tq, Tk, Dk, Dv
        if scale is not None:
            p.use_default_scale = 0
            p.scale = float(scale)
        if causal is not None and causal is not False:
            try:
                p.causal = _CAUSAL[causal]
            except (KeyError, TypeError):
                raise ValueError(f"causal: expected None, False, True (top-left), 'top-left' or "
                                 f"'bottom-right', got {causal!r}") from None
        if window_align is not None:
            try:
                p.window_alignment = _ALIGN[window_align]
            except (KeyError, TypeError):
                raise ValueError(f"window_align: expected 'top-left' or 'bottom-right', got "
                                 f"{window_align!r}") from None
        if window is not None:
            try:
                left, right = window
            except (TypeError, ValueError):
                raise ValueError(f"window: expected (left, right), None for an unbounded side, "
                                 f"got {window!r}") from None
            lim = 2**63 - 1
            p.window_left = -1 if left is None else _int_arg(left, "window left", -lim, lim)
            p.window_right = -1 if right is None else _int_arg(right, "window right", -lim, lim)
        if kv_lengths is not None:
            kl = _as_array(kv_lengths, "kv_lengths")
            if kl.dtype.kind not in "iu":
                raise ValueError(f"kv_lengths: dtype {kl.dtype} is not an integer type")
            if kl.shape != (B,):
                raise ValueError(f"kv_lengths: shape {kl.shape}, expected ({B},) (one per batch)")
            if B and (int(kl.min()) < 0 or int(kl.max()) > Tk):
                raise ValueError(f"kv_lengths: values must be in [0, {Tk}] (the key length), got "
                                 f"min {int(kl.min())}, max {int(kl.max())}")
            kl = np.ascontiguousarray(kl, dtype=np.int32)
            keep.append(kl)
            p.kv_lengths = kl.ctypes.data
        full = (B, Hq, Tq, Tk)
        if mask is not None:
            m, p.bool_mask = _mask_view(mask, "mask", rank, full, (_BOOL, _U8))
            keep.append(m)
        if bias is not None:
            m, p.bias = _mask_view(bias, "bias", rank, full, (_F32,))
            keep.append(m)
        if softcap is not None:
            p.softcap = float(softcap)
        if alibi_slopes is not None:
            a = _head_vector(alibi_slopes, "alibi_slopes", Hq)
            keep.append(a)
            p.alibi_slopes = a.ctypes.data
        self.sinks = None
        if sinks is not None:
            s = _head_vector(sinks, "sinks", Hq)
            keep.append(s)
            self.sinks = s
            p.sinks = s.ctypes.data
        p.num_threads = _int_arg(threads, "threads", 0, _INT_MAX)
        if isa is not None:
            p.isa = _isa_value(isa)
        if block_q:
            p.block_q = _int_arg(block_q, "block_q", 0, _INT_MAX)
        if block_k:
            p.block_k = _int_arg(block_k, "block_k", 0, _INT_MAX)
        self.p = p
        self.keep = keep

    def out_view(self, arr, name, rank_shape):
        """Checks a caller's output array (shape, dtype, layout, writable)."""
        arr = _as_array(arr, name)
        if arr.shape != rank_shape:
            raise ValueError(f"{name}: shape {arr.shape}, expected {rank_shape}")
        ptr, st, code = _view(arr, name, len(rank_shape), writable=True, allowed=_TYPED)
        return arr, ptr, st, code

    def tensor_in(self, arr, name, rank_shape, allowed="float32"):
        if type(arr) is _Raw:
            if arr.shape != rank_shape:
                raise ValueError(f"{name}: shape {arr.shape}, expected {rank_shape}")
            return arr, arr.ptr, arr.st, arr.code
        arr = _as_array(arr, name)
        if arr.shape != rank_shape:
            raise ValueError(f"{name}: shape {arr.shape}, expected {rank_shape}")
        ptr, st, code = _view(arr, name, len(rank_shape), allowed=allowed)
        return arr, ptr, st, code

    def types(self):
        """' (q float16, k/v float16, o float32)': the storage types, for a message."""
        p = self.p
        return (f" (q {_DTYPE_NAME[p.q_dtype]}, k/v {_DTYPE_NAME[p.kv_dtype]}, "
                f"o {_DTYPE_NAME[p.o_dtype]})")

    def check(self, func, status):
        """_check, naming the storage types when a 16-bit call is refused."""
        if status != 0:
            p = self.p
            _check(func, status, self.types() if p.q_dtype or p.kv_dtype or p.o_dtype else "")


def _tshape(rank, B, H, T, D):
    return ((B, H, T, D), (H, T, D), (T, D))[4 - rank]


def _t(ptr, st, rank):
    """sdpa_tensor of a [.., T, D] view (rank = its rank)."""
    _, s = _split((0,) * rank, st, rank)
    return _Tensor(ptr, *s)


def _lse_t(ptr, st, rank):
    """sdpa_tensor of an LSE view [.., T] whose rank is rank - 1."""
    if rank == 4:
        return _Tensor(ptr, st[0], st[1], st[2])
    if rank == 3:
        return _Tensor(ptr, 0, st[0], st[1])
    return _Tensor(ptr, 0, 0, st[0])


def attention(q, k, v, *, scale=None, causal=None, window=None, window_align=None,
              kv_lengths=None, mask=None, bias=None, softcap=None, alibi_slopes=None, sinks=None,
              return_lse=False, threads=0, isa=None, out=None, out_dtype=None, block_q=0,
              block_k=0):
    """O = softmax(scale * q k^T + bias, masked) v on NumPy arrays (sdpa_forward).

    q [.., Tq, Dk], k [.., Tk, Dk], v [.., Tk, Dv] of rank 4 (B, H, T, D), 3 (H, T, D) or
    2 (T, D); any strides whose last dimension is contiguous (no copy). Batch sizes of 1
    broadcast; q's heads must be a multiple of k's (GQA).
    Types: float32, float16, or ml_dtypes' bfloat16 (NumPy has none of its own), read in
    place; q's may differ from k's, and k and v share one. Every product and sum runs in
    float32; O is rounded once to its type, which is q's unless out= or out_dtype= says
    otherwise. LSE is float32. Keywords:
      scale: float (default 1/sqrt(Dk)).  causal: None/False, True or 'top-left', 'bottom-right'.
      window: (left, right), None for an unbounded side; window_align: 'top-left' (default)
        or 'bottom-right' (the diagonal of a window without causal).
      kv_lengths: B key lengths, any integer dtype, each in [0, Tk].
      mask: bool/uint8 (nonzero = may attend) broadcastable to (B, Hq, Tq, Tk) (in q's rank).
      bias: float32 broadcastable likewise, added after scaling; -inf disallows a key.
      softcap: C > 0 (C * tanh(x / C) on the scaled logits), 0/None: off.
      alibi_slopes, sinks: Hq floats (converted to float32).
      threads: OpenMP threads (0: OpenMP's default).  isa: 'scalar', 'avx2', ... or None.
      out: an O array to write into (shape [.., Tq, Dv], last dim contiguous, any of the
        types above); on any error it is left untouched.
      out_dtype: O's type when out is not given (np.float32, np.float16, 'bfloat16' or
        ml_dtypes.bfloat16; default q's).
    Returns O, or (O, LSE) with return_lse=True (LSE [.., Tq], natural log).
    Raises ValueError (SdpaError for a status of the library) on bad input.
    """
    c = _Call(q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias, softcap,
              alibi_slopes, sinks, threads, isa, block_q, block_k)
    rank = c.rank
    oshape = _tshape(rank, c.B, c.Hq, c.Tq, c.Dv)
    if out is None:
        odt = c.qdt if out_dtype is None else _out_dtype(out_dtype)
        if odt is None:
            raise ValueError("out: needed when q is an address view (_Raw)")
        out = np.empty(oshape, dtype=odt)
        code = _DTYPE_CODE[odt]
        item = _ITEMSIZE[code]
        o = _t(out.ctypes.data, [s // item for s in out.strides], rank)
    else:
        if out_dtype is not None and _out_dtype(out_dtype) != getattr(out, "dtype", None):
            raise ValueError(f"out_dtype: {out_dtype!r} differs from out's dtype "
                             f"{getattr(out, 'dtype', None)} (give one of them)")
        out, ptr, st, code = c.out_view(out, "out", oshape)
        o = _t(ptr, st, rank)
    if code:
        c.p.o_dtype = code
    lse_t = None
    lse = None
    if return_lse:
        lse = np.empty(oshape[:-1], dtype=_F32)
        lse_t = _byref(_lse_t(lse.ctypes.data, [s // 4 for s in lse.strides], rank))
    st = _b.forward(_byref(c.p), _byref(c.q), _byref(c.k), _byref(c.v), _byref(o), lse_t)
    c.check("sdpa_forward", st)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, o, lse, do, *, scale=None, causal=None, window=None,
                       window_align=None, kv_lengths=None, mask=None, bias=None, softcap=None,
                       alibi_slopes=None, sinks=None, threads=0, isa=None, block_q=0, block_k=0):
    """dQ, dK, dV (sdpa_backward) of a loss whose gradient with respect to O is do.

    q, k, v and every keyword as given to attention(); o and lse are attention()'s outputs
    (return_lse=True), do is dL/dO (shaped like O, of O's type). Returns (dq, dk, dv), shaped
    like q, k, v and of their types (a k or v whose batch of 1 was broadcast gets its
    gradient summed over the batch), and, with sinks, (dq, dk, dv, dsinks) with dsinks [Hq]
    float32. float16 / bfloat16 tensors go to sdpa_backward as they are: a library whose
    backward refuses them raises SdpaError (SDPA_ERR_UNSUPPORTED); nothing is converted to
    float32 behind the caller's back.
    """
    c = _Call(q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias, softcap,
              alibi_slopes, sinks, threads, isa, block_q, block_k)
    rank, B, Hq, Hkv, Tq, Tk, Dk, Dv = c.rank, c.B, c.Hq, c.Hkv, c.Tq, c.Tk, c.Dk, c.Dv
    oshape = _tshape(rank, B, Hq, Tq, Dv)
    o_arr, op, os_, oc = c.tensor_in(o, "o", oshape, _TYPED)
    lse_arr, lp, ls, _ = c.tensor_in(lse, "lse", oshape[:-1])
    do_arr, dop, dos, doc = c.tensor_in(do, "do", oshape, _TYPED)
    if doc != oc:
        raise ValueError(f"o and do: dtypes {_DTYPE_NAME[oc]} and {_DTYPE_NAME[doc]} differ "
                         "(dO is stored in O's type)")
    if oc:
        c.p.o_dtype = oc
    o_t = _t(op, os_, rank)
    l_t = _lse_t(lp, ls, rank)
    do_t = _t(dop, dos, rank)
    qi, ki = _ITEMSIZE[c.p.q_dtype], _ITEMSIZE[c.p.kv_dtype]
    dq = np.empty(_tshape(rank, B, Hq, Tq, Dk), dtype=c.qdt)
    dk = np.empty(_tshape(rank, B, Hkv, Tk, Dk), dtype=c.kvdt)
    dv = np.empty(_tshape(rank, B, Hkv, Tk, Dv), dtype=c.kvdt)
    dq_t = _t(dq.ctypes.data, [s // qi for s in dq.strides], rank)
    dk_t = _t(dk.ctypes.data, [s // ki for s in dk.strides], rank)
    dv_t = _t(dv.ctypes.data, [s // ki for s in dv.strides], rank)
    dsinks = None
    if c.sinks is not None:
        dsinks = np.empty(Hq, dtype=_F32)
        c.p.dsinks = dsinks.ctypes.data
    st = _b.backward(_byref(c.p), _byref(c.q), _byref(c.k), _byref(c.v), _byref(o_t),
                     _byref(l_t), _byref(do_t), _byref(dq_t), _byref(dk_t), _byref(dv_t))
    c.check("sdpa_backward", st)
    del o_arr, lse_arr, do_arr
    bq, bk, bv = c.bcast_b
    if bq:
        dq = _batch_sum(dq)
    if bk:
        dk = _batch_sum(dk)
    if bv:
        dv = _batch_sum(dv)
    return (dq, dk, dv) if dsinks is None else (dq, dk, dv, dsinks)


_backward_16bit_probe = []


def _backward_16bit():
    """Whether the library's sdpa_backward takes bf16 / fp16 tensors (probed once, on a
    one-element float16 problem)."""
    if not _backward_16bit_probe:
        x = np.ones((1, 1), _F16)
        o, lse = attention(x, x, x, return_lse=True, threads=1)
        try:
            attention_backward(x, x, x, o, lse, o, threads=1)
            _backward_16bit_probe.append(True)
        except SdpaError as e:
            if e.status != -21:   # SDPA_ERR_UNSUPPORTED
                raise
            _backward_16bit_probe.append(False)
    return _backward_16bit_probe[0]


def _batch_sum(g):
    """The gradient of a broadcast batch of 1: the sum over the batch, in float32 and
    rounded once to g's type."""
    if g.dtype == _F32:
        return g.sum(0, keepdims=True)
    return g.sum(0, keepdims=True, dtype=_F32).astype(g.dtype)


def merge_states(outs, lses, *, out=None, lse_out=None):
    """Merges partial attention states (O_s, LSE_s) over disjoint key sets
    (sdpa_merge_states_n): O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s).
    outs: sequence of float32 O arrays [.., T, Dv] of one shape (sdpa_merge_states takes
    float32 only); lses: their LSE [.., T].
    Returns (O, LSE)."""
    outs = [_as_array(x, f"outs[{i}]") for i, x in enumerate(outs)]
    lses = [_as_array(x, f"lses[{i}]") for i, x in enumerate(lses)]
    n = len(outs)
    if n < 1 or len(lses) != n:
        raise ValueError(f"merge_states: {n} outs and {len(lses)} lses (need as many, at least 1)")
    shape = outs[0].shape
    rank = len(shape)
    if rank not in (2, 3, 4):
        raise ValueError(f"outs[0]: rank {rank}; expected 2, 3 or 4")
    Ot = (_Tensor * n)()
    Lt = (_Tensor * n)()
    for i in range(n):
        if outs[i].shape != shape:
            raise ValueError(f"outs[{i}]: shape {outs[i].shape}, expected {shape}")
        if lses[i].shape != shape[:-1]:
            raise ValueError(f"lses[{i}]: shape {lses[i].shape}, expected {shape[:-1]}")
        p, s, _ = _view(outs[i], f"outs[{i}]", rank)
        Ot[i] = _t(p, s, rank)
        p, s, _ = _view(lses[i], f"lses[{i}]", rank - 1)
        Lt[i] = _lse_t(p, s, rank)
    (B, H, T, D), _ = _split(shape, [0] * rank, rank)
    if out is None:
        out = np.empty(shape, dtype=_F32)
    elif out.shape != shape:
        raise ValueError(f"out: shape {out.shape}, expected {shape}")
    if lse_out is None:
        lse_out = np.empty(shape[:-1], dtype=_F32)
    elif lse_out.shape != shape[:-1]:
        raise ValueError(f"lse_out: shape {lse_out.shape}, expected {shape[:-1]}")
    p, s, _ = _view(out, "out", rank, writable=True)
    o_t = _t(p, s, rank)
    p, s, _ = _view(lse_out, "lse_out", rank - 1, writable=True)
    l_t = _lse_t(p, s, rank)
    st = _b.merge_states_n(n, B, H, T, D, Ot, Lt, _byref(o_t), _byref(l_t))
    _check("sdpa_merge_states_n", st)
    return out, lse_out


def isa_names():
    return [_b.isa_name(i).decode() for i in range(_b.ISA_COUNT)]


def force_isa(isa):
    """Sets the process-wide default ISA ('scalar', 'avx2', 'avx512', 'neon', or
    None / 'auto' for the load-time choice): sdpa_force_isa."""
    _check("sdpa_force_isa", _b.force_isa(_isa_value(isa)))


def info():
    """The facts of `sdpa info` as a dict."""
    names = isa_names()
    rejected = _b.isa_env_rejected()
    import os
    return {
        "version": _b.version().decode(),
        "version_number": int(_b.version_number()),
        "active_isa": _b.isa_name(_b.isa_active()).decode(),
        "compiled_isas": [n for i, n in enumerate(names) if _b.isa_compiled(i)],
        "supported_isas": [n for i, n in enumerate(names) if _b.isa_supported(i)],
        "cpu_features": _b.cpu_features().decode().split(),
        "sdpa_isa_env": os.environ.get("SDPA_ISA"),
        "sdpa_isa_env_rejected": None if rejected is None else rejected.decode(),
        "openmp_threads": _b.omp_max_threads(),
        "library": _b.LIBRARY_PATH,
    }
