# SPDX-License-Identifier: MIT
"""The NumPy API: attention(), attention_backward(), merge_states(), info().

Per-call cost: the Python layer checks everything it checked before, but a call builds no
ctypes objects. The descriptor is a bytearray copy of sdpa_problem_init()'s template with the
fields that differ written by struct.pack_into, the tensor views are struct-packed bytes,
and both go to the library through _binding.forward_packed / backward_packed (void *
parameters). Data pointers are read by _data_ptr (see there), not by ndarray.ctypes.data.
python/bench_overhead.py measures the result.
"""
import ctypes
import struct
import sys

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
_ndarray = np.ndarray
_empty = np.empty
_pack_t = _b.TENSOR.pack
_forward = _b.forward_packed
_backward = _b.backward_packed


def _header_offset():
    """Where the data pointer of an ndarray lies in the array object, or 0 (then
    ndarray.ctypes.data it is).

    ndarray.ctypes.data builds a numpy._core._internal._ctypes object per call (1-2 us, as
    much as the rest of a small call). On CPython, id() is the object's address, and the
    first field of PyArrayObject after the object header (sizeof(PyObject) =
    object.__basicsize__, which covers free-threaded and debug builds) is `char *data`:
    NumPy's C ABI since 1.0 (the PyArray_DATA of extensions compiled long ago reads it
    there). That is checked here against .ctypes.data on arrays of several kinds (offset,
    reversed, strided, read-only, broadcast, empty, a subclass); any difference, or another
    Python implementation, and the offset is 0. Only ndarray instances are ever read so
    (subclasses share the layout), and only while a reference holds them."""
    if sys.implementation.name != "cpython":
        return 0
    off = object.__basicsize__
    at = ctypes.c_size_t.from_address

    class _Sub(np.ndarray):
        pass

    base = np.arange(64, dtype=np.float32)
    ro = base[1:9].copy()
    ro.flags.writeable = False
    probes = (base, base[3:], base[::-2], base.reshape(8, 8)[2:, 1::3], base.view(np.uint16)[1:],
              np.broadcast_to(base[5:6], (4, 4)), ro, np.frombuffer(b"abcdefgh", np.uint8)[3:],
              np.empty((2, 0, 3), np.float16), base.view(_Sub)[7:])
    try:
        if all(at(id(a) + off).value == a.ctypes.data for a in probes):
            return off
    except Exception:  # noqa: BLE001 - any surprise: the documented route
        pass
    return 0


_HDR_OFF = _header_offset()
_HDR_AT = ctypes.c_size_t.from_address


def _data_ptr(a):
    """The address of the first element of the ndarray a (see _header_offset; the hot paths
    below inline this)."""
    return _HDR_AT(id(a) + _HDR_OFF).value if _HDR_OFF else a.ctypes.data


class SdpaError(ValueError):
    """A status code of the C library: .status (int), .name (SDPA_ERR_...), the
    library's own sdpa_status_string() as the message (plus, where given, what the
    call was, e.g. its storage types)."""

    def __init__(self, func, status, detail=""):
        self.status = status
        self.name = _b.STATUS_NAMES.get(status, "unknown")
        self.function = func
        text = _b.status_string(status).decode()
        super().__init__(f"{func}: {text} ({self.name}){detail}{_PYTHON_HINTS.get(status, '')}")


# What a status means in this package's own terms, where the library's text speaks of C
# descriptor fields that a Python caller never sets.
_PYTHON_HINTS = {
    -5: "; in Python: scale must be a finite number, or None for 1/sqrt(head_dim) (which "
        "needs head_dim > 0)",   # SDPA_ERR_BAD_SCALE
}


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
# per sdpa_dtype: the bits that must be clear in a byte stride that is >= 0 (the sign bits
# of a negative int are all set) and a multiple of the item size
_BAD = tuple(-(1 << 62) | (n - 1) for n in _ITEMSIZE)
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
    "float32" (LSE, bias, merge_states' LSE), or _TYPED for Q, K, V, O, dO and
    merge_states' O."""
    dt = a.dtype
    code = 0 if dt is _F32 else _dtype_code(dt, name, allowed)
    if a.ndim != rank:
        raise ValueError(f"{name}: rank {a.ndim}, expected {rank} (like q)")
    if writable and not a.flags.writeable:
        raise ValueError(f"{name}: array is read-only")
    shape = a.shape
    if not a.size:  # nothing is read or written: NULL data, packed strides
        return 0, _packed(shape), code
    ptr = _HDR_AT(id(a) + _HDR_OFF).value if _HDR_OFF else a.ctypes.data
    item = _ITEMSIZE[code]
    # The common case in a few operations: the address and the strides of the leading
    # dimensions non-negative multiples of the item size (s & _BAD[code] == 0), the last
    # stride the item size. A stricter test than the one below: whatever fails it goes
    # there, for its message, or for the strides of dimensions of size 1 (anything goes).
    if not ptr & (item - 1):
        bad = _BAD[code]
        if rank == 4:
            n0, n1, n2, n3 = shape
            s0, s1, s2, s3 = a.strides
            if (s3 == item or n3 <= 1) and not (s0 | s1 | s2) & bad:
                return ptr, (s0 // item if n0 > 1 else 0, s1 // item if n1 > 1 else 0,
                             s2 // item if n2 > 1 else 0, 1 if n3 > 1 else 0), code
        elif rank == 3:
            n0, n1, n2 = shape
            s0, s1, s2 = a.strides
            if (s2 == item or n2 <= 1) and not (s0 | s1) & bad:
                return ptr, (s0 // item if n0 > 1 else 0, s1 // item if n1 > 1 else 0,
                             1 if n2 > 1 else 0), code
        elif rank == 2:
            n0, n1 = shape
            s0, s1 = a.strides
            if (s1 == item or n1 <= 1) and not s0 & bad:
                return ptr, (s0 // item if n0 > 1 else 0, 1 if n1 > 1 else 0), code
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
    """(packed sdpa_tensor, sdpa_dtype, (B, H, T, D)) of q, k, v: a NumPy array of a
    supported type (as _view checks it), or a _Raw. Rank 4 arrays, the common case, are
    checked here in fewer operations (the same checks; anything unusual goes to _view)."""
    if type(x) is _Raw:
        if x.ndim != rank:
            raise ValueError(f"{name}: rank {x.ndim}, expected {rank} (like q)")
        ptr, st, code, shape = x.ptr, x.st, x.code, x.shape
    else:
        if rank == 4:
            dt = x.dtype
            code = 0 if dt is _F32 else _dtype_code(dt, name, _TYPED)
            if x.ndim == 4 and x.size:
                shape = x.shape
                n0, n1, n2, n3 = shape
                s0, s1, s2, s3 = x.strides
                ptr = _HDR_AT(id(x) + _HDR_OFF).value if _HDR_OFF else x.ctypes.data
                item = _ITEMSIZE[code]
                if (s3 == item or n3 <= 1) and not (s0 | s1 | s2) & _BAD[code] and \
                        not ptr & (item - 1):
                    return (_pack_t(ptr, s0 // item if n0 > 1 else 0, s1 // item if n1 > 1 else 0,
                                    s2 // item if n2 > 1 else 0), code, shape)
        ptr, st, code = _view(x, name, rank, allowed=_TYPED)
        shape = x.shape
    if rank == 4:
        return _pack_t(ptr, st[0], st[1], st[2]), code, shape
    if rank == 3:
        return _pack_t(ptr, 0, st[0], st[1]), code, (1,) + shape
    return _pack_t(ptr, 0, 0, st[0]), code, (1, 1) + shape


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
    [B, Hq, Tq, Tk] (in q's rank); returns it and the sdpa_bool_mask / sdpa_bias fields."""
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
    if any(s < 0 or s % item for s in mb.strides) or (mb.size and _data_ptr(mb) % item):
        m = np.ascontiguousarray(m)  # an input: a copy changes nothing but the speed
        mb = np.broadcast_to(m, target)
    st = [0] * (4 - rank) + [s // item if n > 1 else 0 for n, s in zip(mb.shape, mb.strides)]
    ptr = _data_ptr(mb) if mb.size else 0
    return mb, (ptr, st[0], st[1], st[2], st[3])


def _head_vector(x, name, H):
    """One float32 per query head (float16, bfloat16 and float64 arrays converted: the
    first two exactly; a float64 beyond float32's range becomes +-inf, which the library
    refuses with its own status, without NumPy's overflow warning)."""
    x = _as_array(x, name)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":   # ml_dtypes' bfloat16: kind 'V'
        raise ValueError(f"{name}: dtype {x.dtype} is not supported (expected a float array of shape ({H},))")
    if x.shape != (H,):
        raise ValueError(f"{name}: shape {x.shape}, expected ({H},) (one per query head)")
    with np.errstate(over="ignore"):
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


# Offsets of the descriptor fields the Python layer writes (ctypes' own layout of
# _binding.Problem, checked against the library's struct_size at import), and their
# struct formats; the 7 sizes are consecutive int64.
_OFF = _b.PROBLEM_OFFSETS
_O_DIMS, _O_UDS, _O_SCALE, _O_CAUSAL, _O_WALIGN, _O_WL, _O_WR, _O_DOFF = (
    _OFF[n] for n in ("batch", "use_default_scale", "scale", "causal", "window_alignment",
                      "window_left", "window_right", "diagonal_offset"))
_MAX_DIAGONAL_OFFSET = 2**48   # SDPA_MAX_DIAGONAL_OFFSET
_O_KVL, _O_MASK, _O_BIAS, _O_THREADS, _O_ISA, _O_BQ, _O_BK, _O_SOFTCAP = (
    _OFF[n] for n in ("kv_lengths", "bool_mask", "bias", "num_threads", "isa", "block_q",
                      "block_k", "softcap"))
_O_ALIBI, _O_SINKS, _O_DSINKS, _O_QDT, _O_KVDT, _O_ODT, _O_SEQS, _O_FPMATH = (
    _OFF[n] for n in ("alibi_slopes", "sinks", "dsinks", "q_dtype", "kv_dtype", "o_dtype",
                      "seqs", "fpmath_mode"))
_FPMATH = {"default": 0, "strict": 1}   # sdpa_fpmath_mode
_DIMS = struct.Struct("@7q")
_I32 = struct.Struct("@i")
_I64 = struct.Struct("@q")
_FLT = struct.Struct("@f")
_PTR = struct.Struct("@P")
_PROBLEM = _b.PROBLEM_TEMPLATE
_FLT_MAX = 3.4028234663852886e38
# The fields a call does not set keep the template's values; num_threads and the dtypes
# are written only when they differ from 0, so 0 must be the template's.
if _OFF["head_dim_v"] != _O_DIMS + 48 or any(
        _I32.unpack_from(_PROBLEM, o)[0] for o in (_O_THREADS, _O_QDT, _O_KVDT, _O_ODT)):
    raise ImportError("libsdpa: sdpa_problem's layout or defaults are not what _api expects")


def _f32(x, name):
    """float(x) for a float field: what a C float conversion (ctypes.c_float) stores, without
    struct's OverflowError for finite values beyond FLT_MAX (they become +-inf, which the
    library rejects with its own status, as it did through ctypes). A real number only
    (not a string, not a bool); an int beyond a double's range is +-inf likewise."""
    if isinstance(x, (str, bytes, bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}: expected a real number, got {x!r}")
    try:
        x = float(x)
    except OverflowError:
        x = float("inf") if x > 0 else float("-inf")
    if -_FLT_MAX <= x <= _FLT_MAX or x != x:
        return x
    return ctypes.c_float(x).value


def _window(window):
    """(left, right) of a window argument as the descriptor's int64 bounds (-1, the
    library's SDPA_WINDOW_UNBOUNDED, for None); ValueError for anything but a pair of
    integers or None."""
    try:
        left, right = window
    except (TypeError, ValueError):
        raise ValueError(f"window: expected (left, right), None for an unbounded side, "
                         f"got {window!r}") from None
    lim = 2**63 - 1
    return (-1 if left is None else _int_arg(left, "window left", -lim, lim),
            -1 if right is None else _int_arg(right, "window right", -lim, lim))


def _window_align(window_align):
    """sdpa_alignment of a window_align argument; ValueError for other spellings."""
    try:
        return _ALIGN[window_align]
    except (KeyError, TypeError):
        raise ValueError(f"window_align: expected 'top-left' or 'bottom-right', got "
                         f"{window_align!r}") from None


def _softcap(softcap):
    """The float32 softcap of a softcap argument (0: off); ValueError for a non-number or a
    nonzero value that rounds to 0 (which would turn the softcap off)."""
    cap = _f32(softcap, "softcap")
    if cap != 0.0 and _FLT.unpack(_FLT.pack(cap))[0] == 0.0:
        raise ValueError(f"softcap: {softcap!r} rounds to 0 in float32, which turns it off "
                         f"(give 0 or None for off)")
    return cap


class _Call:
    """Everything a forward/backward call shares: the descriptor (pb: sdpa_problem_init()'s
    bytes, the fields that differ written in place) and the packed sdpa_tensor views of
    q, k, v; keeps the arrays it points into alive."""
    __slots__ = ("pb", "q", "k", "v", "rank", "B", "Hq", "Hkv", "Tq", "Tk", "Dk", "Dv", "keep",
                 "bcast_b", "sinks", "qdt", "kvdt", "qc", "kvc")

    def __init__(self, q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias,
                 softcap, alibi_slopes, sinks, threads, isa, block_q=0, block_k=0,
                 diagonal_offset=0, fpmath=None):
        if type(q) is not _Raw:
            if type(q) is not _ndarray:
                q = _as_array(q, "q")
            if type(k) is not _ndarray:
                k = _as_array(k, "k")
            if type(v) is not _ndarray:
                v = _as_array(v, "v")
            self.qdt, self.kvdt = q.dtype, k.dtype
        else:
            self.qdt = self.kvdt = None   # libsdpa.torch allocates its own outputs
        rank = q.ndim
        if rank not in (2, 3, 4):
            raise ValueError(f"q: rank {rank}; expected 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D)")
        self.q, qc, (Bq, Hq, Tq, Dk) = _operand(q, "q", rank)
        self.k, kc, (Bk, Hkv, Tk, Dk2) = _operand(k, "k", rank)
        self.v, vc, (Bv, Hv, Tv, Dv) = _operand(v, "v", rank)
        if kc != vc:
            raise ValueError(f"k and v: dtypes {_DTYPE_NAME[kc]} and {_DTYPE_NAME[vc]} differ "
                             "(K and V must share one storage type; q's may differ)")
        if Dk2 != Dk:
            raise ValueError(f"k: head_dim {Dk2} differs from q's {Dk} (shapes q {q.shape}, k {k.shape})")
        if Hv != Hkv or Tv != Tk:
            raise ValueError(f"v: heads and length {(Hv, Tv)} differ from k's {(Hkv, Tk)} "
                             f"(shapes k {k.shape}, v {v.shape})")
        if Bq == Bk == Bv:
            B = Bq
            self.bcast_b = (False, False, False)
        else:
            B = max(Bq, Bk, Bv)
            for nm, n in (("q", Bq), ("k", Bk), ("v", Bv)):
                if n not in (1, B):
                    raise ValueError(f"{nm}: batch {n} does not broadcast with {B} "
                                     f"(shapes q {q.shape}, k {k.shape}, v {v.shape})")
            self.bcast_b = (Bq != B, Bk != B, Bv != B)
        self.rank, self.B, self.Hq, self.Hkv, self.Tq, self.Tk, self.Dk, self.Dv = \
            rank, B, Hq, Hkv, Tq, Tk, Dk, Dv
        self.qc, self.kvc = qc, kc
        keep = [q, k, v]
        pb = bytearray(_PROBLEM)
        _DIMS.pack_into(pb, _O_DIMS, B, Hq, Hkv, Tq, Tk, Dk, Dv)
        if qc:
            _I32.pack_into(pb, _O_QDT, qc)
        if kc:
            _I32.pack_into(pb, _O_KVDT, kc)
        if scale is not None:
            _I32.pack_into(pb, _O_UDS, 0)
            _FLT.pack_into(pb, _O_SCALE, _f32(scale, "scale"))
        if causal is not None and causal is not False:
            try:
                if not isinstance(causal, (str, bool, np.bool_)):
                    raise TypeError  # 1 or 1.0 would find True's entry
                _I32.pack_into(pb, _O_CAUSAL, _CAUSAL[causal])
            except (KeyError, TypeError):
                raise ValueError(f"causal: expected None, False, True (top-left), 'top-left' or "
                                 f"'bottom-right', got {causal!r}") from None
        if window_align is not None:
            _I32.pack_into(pb, _O_WALIGN, _window_align(window_align))
        if window is not None:
            left, right = _window(window)
            _I64.pack_into(pb, _O_WL, left)
            _I64.pack_into(pb, _O_WR, right)
        if diagonal_offset is not None and (type(diagonal_offset) is not int or diagonal_offset):
            _I64.pack_into(pb, _O_DOFF, _int_arg(diagonal_offset, "diagonal_offset",
                                                 -_MAX_DIAGONAL_OFFSET, _MAX_DIAGONAL_OFFSET))
        if kv_lengths is not None:
            kl = _as_array(kv_lengths, "kv_lengths")
            if kl.dtype.kind not in "iu":
                raise ValueError(f"kv_lengths: dtype {kl.dtype} is not an integer type")
            if kl.shape != (B,):
                raise ValueError(f"kv_lengths: shape {kl.shape}, expected ({B},) (one per batch)")
            if B and (int(kl.min()) < 0 or int(kl.max()) > min(Tk, _INT_MAX)):
                raise ValueError(f"kv_lengths: values must be in [0, {min(Tk, _INT_MAX)}] (the key length, "
                                 f"and int32), got min {int(kl.min())}, max {int(kl.max())}")
            kl = np.ascontiguousarray(kl, dtype=np.int32)
            keep.append(kl)
            _PTR.pack_into(pb, _O_KVL, _data_ptr(kl))
        if mask is not None or bias is not None:
            full = (B, Hq, Tq, Tk)
            if mask is not None:
                m, fields = _mask_view(mask, "mask", rank, full, (_BOOL, _U8))
                _b.MASK.pack_into(pb, _O_MASK, *fields)
                keep.append(m)
            if bias is not None:
                m, fields = _mask_view(bias, "bias", rank, full, (_F32,))
                _b.MASK.pack_into(pb, _O_BIAS, *fields)
                keep.append(m)
        if softcap is not None:
            _FLT.pack_into(pb, _O_SOFTCAP, _softcap(softcap))
        if alibi_slopes is not None:
            a = _head_vector(alibi_slopes, "alibi_slopes", Hq)
            keep.append(a)
            _PTR.pack_into(pb, _O_ALIBI, _data_ptr(a))
        self.sinks = None
        if sinks is not None:
            s = _head_vector(sinks, "sinks", Hq)
            keep.append(s)
            self.sinks = s
            _PTR.pack_into(pb, _O_SINKS, _data_ptr(s))
        if type(threads) is not int or not 0 <= threads <= _INT_MAX:
            threads = _int_arg(threads, "threads", 0, _INT_MAX)
        if threads:
            _I32.pack_into(pb, _O_THREADS, threads)
        if isa is not None:
            _I32.pack_into(pb, _O_ISA, _isa_value(isa))
        if block_q:
            _I32.pack_into(pb, _O_BQ, _int_arg(block_q, "block_q", 0, _INT_MAX))
        if block_k:
            _I32.pack_into(pb, _O_BK, _int_arg(block_k, "block_k", 0, _INT_MAX))
        if fpmath is not None:
            if not isinstance(fpmath, str) or fpmath not in _FPMATH:
                raise ValueError(f"fpmath: expected None, 'default' or 'strict', got {fpmath!r}")
            _I32.pack_into(pb, _O_FPMATH, _FPMATH[fpmath])
        self.pb = pb
        self.keep = keep

    @property
    def p(self):
        """The descriptor as a ctypes Problem over the same bytes (reading it, or writing a
        field, goes to pb): for inspection; the calls use pb."""
        return _b.Problem.from_buffer(self.pb)

    def set_o_dtype(self, code):
        if code:
            _I32.pack_into(self.pb, _O_ODT, code)

    def set_dsinks(self, ptr):
        _PTR.pack_into(self.pb, _O_DSINKS, ptr)

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

    def dtypes(self):
        """(q_dtype, kv_dtype, o_dtype) as the descriptor holds them."""
        pb = self.pb
        return (_I32.unpack_from(pb, _O_QDT)[0], _I32.unpack_from(pb, _O_KVDT)[0],
                _I32.unpack_from(pb, _O_ODT)[0])

    def types(self):
        """' (q float16, k/v float16, o float32)': the storage types, for a message."""
        qd, kvd, od = self.dtypes()
        return f" (q {_DTYPE_NAME[qd]}, k/v {_DTYPE_NAME[kvd]}, o {_DTYPE_NAME[od]})"

    def check(self, func, status):
        """_check, naming the storage types when a 16-bit call is refused."""
        if status != 0:
            _types_check(func, status, *self.dtypes())


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


def _tp(ptr, st, rank):
    """_t packed (bytes). The leading strides (batch, head, sequence) come first in st
    for a [.., T, D] view and for an LSE view [.., T] alike, so _lse_t packed is the
    same function (_lse_tp)."""
    if rank == 4:
        return _pack_t(ptr, st[0], st[1], st[2])
    if rank == 3:
        return _pack_t(ptr, 0, st[0], st[1])
    return _pack_t(ptr, 0, 0, st[0])


_lse_tp = _tp


_ALIGNED_OUT_BYTES = 1 << 20


def _empty_aligned(shape, dt):
    """np.empty(shape, dt), but a large one starts on a 64-byte line: numpy's allocator
    puts large arrays 16 or 48 bytes off a line, and the library writes the dK, dV of a
    long decode backward with non-temporal stores only into line-aligned rows (plain
    stores also read every line first: slower from memory, docs/perf-notes.md). Such
    an array is a view of a slightly larger buffer (owndata False: ndarray.resize refuses
    it; np.resize and copies work)."""
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
    if n < _ALIGNED_OUT_BYTES:
        return _empty(shape, dt)
    raw = _empty(n + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n].view(dt).reshape(shape)


def _new_out(shape, dt, item, rank, H, T, D):
    """A new C-order array [.., T, D] (shape, in a rank-`rank` call whose sizes are H, T, D)
    and its packed sdpa_tensor_out: the strides numpy gives it, in elements."""
    a = _empty_aligned(shape, dt)
    if a.size:
        return a, _pack_t(_data_ptr(a), H * T * D if rank == 4 else 0, T * D if rank > 2 else 0, D)
    return a, _tp(_data_ptr(a), [s // item for s in a.strides], rank)


def _new_lse(shape, rank, H, T):
    """A new float32 LSE [.., T] (shape) of a rank-`rank` call and its sdpa_tensor_out."""
    a = _empty(shape, _F32)
    if a.size:
        return a, _pack_t(_data_ptr(a), H * T if rank == 4 else 0, T if rank > 2 else 0, 1)
    return a, _lse_tp(_data_ptr(a), [s // 4 for s in a.strides], rank)


def _types_check(func, status, qd, kvd, od):
    """_check, naming the storage types when a 16-bit call is refused."""
    _check(func, status, f" (q {_DTYPE_NAME[qd]}, k/v {_DTYPE_NAME[kvd]}, o {_DTYPE_NAME[od]})"
           if qd or kvd or od else "")


def _fast_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv, qc, kc, oc, scale, causal, threads):
    """The descriptor (bytes) that _Call builds, and attention() completes with o_dtype = oc,
    for a call that sets nothing but the sizes, the storage types, scale (None or a float),
    causal (its sdpa_causal value) and threads (an int in [0, INT_MAX]): the fast paths'
    (_fast_forward, libsdpa.torch's _fast_kernel)."""
    pb = bytearray(_PROBLEM)
    _DIMS.pack_into(pb, _O_DIMS, B, Hq, Hkv, Tq, Tk, Dk, Dv)
    if scale is not None:
        _I32.pack_into(pb, _O_UDS, 0)
        _FLT.pack_into(pb, _O_SCALE, _f32(scale, "scale"))
    if causal:
        _I32.pack_into(pb, _O_CAUSAL, causal)
    if threads:
        _I32.pack_into(pb, _O_THREADS, threads)
    if qc:
        _I32.pack_into(pb, _O_QDT, qc)
    if kc:
        _I32.pack_into(pb, _O_KVDT, kc)
    if oc:
        _I32.pack_into(pb, _O_ODT, oc)
    return bytes(pb)


def _fast_forward(q, k, v, scale, causal, threads, return_lse):
    """attention() in the common case, in fewer operations; None when the call is not that
    case, and then attention() takes the general path (_Call), which checks everything and
    words the errors: this function raises nothing of its own, and what it hands the library
    is byte for byte what _Call would (test_numpy checks that).

    The common case: q, k, v ndarrays (the class itself) of rank 4, not empty, of supported
    types (k's that of v), one batch size, the data aligned and the strides of the leading
    dimensions non-negative multiples of the item size, the last dimension contiguous, the
    head_dim, heads and lengths of k and v consistent; threads an int in [0, INT_MAX], scale
    None or a float, causal one of _CAUSAL's keys; O new, of q's type."""
    dq = q.dtype
    dk = k.dtype
    qc = 0 if dq is _F32 else _DTYPE_CODE.get(dq)
    kc = 0 if dk is _F32 else _DTYPE_CODE.get(dk)
    if qc is None or kc is None or v.dtype is not dk or q.ndim != 4 or k.ndim != 4 or \
            v.ndim != 4 or not q.size or not k.size or not v.size:
        return None
    B, Hq, Tq, Dk = q.shape
    Bk, Hkv, Tk, Dk2 = k.shape
    Bv, Hv, Tv, Dv = v.shape
    if Bk != B or Bv != B or Dk2 != Dk or Hv != Hkv or Tv != Tk:
        return None
    q0, q1, q2, q3 = q.strides
    k0, k1, k2, k3 = k.strides
    v0, v1, v2, v3 = v.strides
    qi = _ITEMSIZE[qc]
    ki = _ITEMSIZE[kc]
    qp = _HDR_AT(id(q) + _HDR_OFF).value
    kp = _HDR_AT(id(k) + _HDR_OFF).value
    vp = _HDR_AT(id(v) + _HDR_OFF).value
    if (q3 != qi and Dk > 1) or (k3 != ki and Dk > 1) or (v3 != ki and Dv > 1) or \
            (q0 | q1 | q2) & _BAD[qc] or (k0 | k1 | k2 | v0 | v1 | v2) & _BAD[kc] or \
            qp & (qi - 1) or (kp | vp) & (ki - 1):
        return None
    if scale is not None and type(scale) is not float:
        return None
    if causal is None or causal is False:
        causal = 0
    elif type(causal) is not bool and type(causal) is not str:
        return None  # 1 or 1.0 would find True's entry: the general path refuses them
    else:
        try:
            causal = _CAUSAL[causal]
        except (KeyError, TypeError):
            return None
    pb = _fast_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv, qc, kc, qc, scale, causal, threads)
    b1, h1 = B > 1, Hq > 1
    q_t = _pack_t(qp, q0 // qi if b1 else 0, q1 // qi if h1 else 0, q2 // qi if Tq > 1 else 0)
    h1 = Hkv > 1
    t1 = Tk > 1
    k_t = _pack_t(kp, k0 // ki if b1 else 0, k1 // ki if h1 else 0, k2 // ki if t1 else 0)
    v_t = _pack_t(vp, v0 // ki if b1 else 0, v1 // ki if h1 else 0, v2 // ki if t1 else 0)
    out = _empty((B, Hq, Tq, Dv), dq)
    o_t = _pack_t(_HDR_AT(id(out) + _HDR_OFF).value, Hq * Tq * Dv, Tq * Dv, Dv)
    if return_lse:
        lse = _empty((B, Hq, Tq), _F32)
        st = _forward(pb, q_t, k_t, v_t, o_t,
                      _pack_t(_HDR_AT(id(lse) + _HDR_OFF).value, Hq * Tq, Tq, 1))
        if st:
            _types_check("sdpa_forward", st, qc, kc, qc)
        return out, lse
    st = _forward(pb, q_t, k_t, v_t, o_t, None)
    if st:
        _types_check("sdpa_forward", st, qc, kc, qc)
    return out


def _load_fast_c():
    """libsdpa._fastpath.forward: _fast_forward in C (float32 / float16 ndarrays; the
    extension is built where Python's and NumPy's headers were found), set up with this
    package's library; None without it, and attention() runs _fast_forward alone."""
    try:
        from . import _fastpath
    except ImportError:
        return None
    _fastpath.init(ctypes.cast(_b.lib.sdpa_forward, ctypes.c_void_p).value, _PROBLEM, _CAUSAL)
    return _fastpath.forward


_fast_c = _load_fast_c()


# ---------------------------------------------------------------- packed / paged sequences

def _int32_array(x, name, shape, why=""):
    """x (any integer dtype, of this shape) as a C-contiguous int32 array: the values are
    checked to fit int32 and converted, never reinterpreted. why: what the expected shape
    comes from, for the error."""
    a = _as_array(x, name)
    if a.dtype.kind not in "iu":
        raise ValueError(f"{name}: dtype {a.dtype} is not an integer type")
    if a.shape != shape:
        raise ValueError(f"{name}: shape {a.shape}, expected {shape}{why}")
    if a.size and (int(a.min()) < -2**31 or int(a.max()) > _INT_MAX):
        raise ValueError(f"{name}: values must fit int32, got min {int(a.min())}, "
                         f"max {int(a.max())}")
    return np.ascontiguousarray(a, dtype=np.int32)


def _seqs_call(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, seq_lens_k, page_layout,
               kv_lengths, mask, bias, rest):
    """The _Call of a call over packed sequences (sdpa_seqs): q a token list (total_q, Hq, Dk);
    k, v token lists (total_k, Hkv, D) with cu_seqlens_k, or paged caches with block_table
    and seq_lens_k ((num_blocks, Hkv, block_size, D) for page_layout 'HND', (num_blocks,
    block_size, Hkv, D) for 'NHD'). The tensors go to _Call as rank-4 views of batch 1
    (the token axis as T, so the strides are the library's seq/head strides), then the
    sizes and the seqs pointer are written over. Returns (c, total_q, total_k)."""
    if cu_seqlens_q is None:
        raise ValueError("cu_seqlens_q: needed with cu_seqlens_k, block_table or seq_lens_k "
                         "(Q is then a token list)")
    for nm, x in (("kv_lengths", kv_lengths), ("mask", mask), ("bias", bias)):
        if x is not None:
            raise ValueError(f"{nm}: not supported with cu_seqlens_q (the library refuses it: "
                             "SDPA_ERR_UNSUPPORTED); give each sequence its own length instead")
    q = _as_array(q, "q")
    k = _as_array(k, "k")
    v = _as_array(v, "v")
    if q.ndim != 3:
        raise ValueError(f"q: rank {q.ndim}; with cu_seqlens_q Q is a token list "
                         "(total_q, Hq, Dk)")
    cuq = _as_array(cu_seqlens_q, "cu_seqlens_q")
    if cuq.ndim != 1 or cuq.shape[0] < 1:
        raise ValueError(f"cu_seqlens_q: shape {cuq.shape}, expected (B + 1,)")
    B = cuq.shape[0] - 1
    cuq = _int32_array(cuq, "cu_seqlens_q", (B + 1,))
    keep = [cuq]
    total_q, Hq, Dk = q.shape
    paged = block_table is not None or seq_lens_k is not None
    if cu_seqlens_k is not None:
        if paged:
            raise ValueError("cu_seqlens_k: packed K/V, or block_table and seq_lens_k (paged "
                             "K/V), not both")
        if page_layout != "HND":
            raise ValueError("page_layout: only with block_table (paged K/V)")
        cuk = _int32_array(cu_seqlens_k, "cu_seqlens_k", (B + 1,),
                           f" (B = {B} sequences: cu_seqlens_q has {B + 1} entries)")
        keep.append(cuk)
        for nm, x in (("k", k), ("v", v)):
            if x.ndim != 3:
                raise ValueError(f"{nm}: rank {x.ndim}; with cu_seqlens_k K and V are token "
                                 "lists (total_k, Hkv, D)")
        total_k, Hkv, Dk2 = k.shape
        if v.shape[:2] != (total_k, Hkv):
            raise ValueError(f"v: tokens and heads {v.shape[:2]} differ from k's "
                             f"{(total_k, Hkv)} (shapes k {k.shape}, v {v.shape})")
        k4 = k.transpose(1, 0, 2)[None]
        v4 = v.transpose(1, 0, 2)[None]
        seqs = _b.Seqs(_data_ptr(cuq), _data_ptr(cuk), None, 0, None, 0, 0)
    elif paged:
        if block_table is None or seq_lens_k is None:
            raise ValueError("block_table and seq_lens_k: paged K/V needs both")
        if page_layout not in ("HND", "NHD"):
            raise ValueError(f"page_layout: expected 'HND' or 'NHD', got {page_layout!r}")
        bt = _as_array(block_table, "block_table")
        if bt.ndim != 2 or bt.shape[0] != B:
            raise ValueError(f"block_table: shape {bt.shape}, expected ({B}, max_blocks_per_seq) (B = "
                             f"{B} sequences: cu_seqlens_q has {B + 1} entries)")
        bt = _int32_array(bt, "block_table", bt.shape)
        lk = _int32_array(seq_lens_k, "seq_lens_k", (B,),
                          f" (B = {B} sequences: cu_seqlens_q has {B + 1} entries)")
        keep += [bt, lk]
        for nm, x in (("k", k), ("v", v)):
            if x.ndim != 4:
                raise ValueError(f"{nm}: rank {x.ndim}; a paged cache is (num_blocks, Hkv, "
                                 "block_size, D) ('HND') or (num_blocks, block_size, Hkv, D) "
                                 "('NHD')")
        if page_layout == "NHD":
            k4 = k.transpose(0, 2, 1, 3)
            v4 = v.transpose(0, 2, 1, 3)
        else:
            k4, v4 = k, v
        num_blocks, Hkv, block_size, Dk2 = k4.shape
        if v4.shape[:3] != k4.shape[:3]:
            raise ValueError(f"v: pages, heads and page size differ from k's (shapes k "
                             f"{k.shape}, v {v.shape}, page_layout {page_layout!r})")
        if num_blocks < 1:   # no page, as packed K/V may have no token: fine if none is read
            if lk.any():
                raise ValueError(f"k: the paged cache has no pages (shape {k.shape}) but "
                                 f"seq_lens_k has keys")
            k4 = np.zeros((1,) + k4.shape[1:], k4.dtype)   # one page, never read
            v4 = np.zeros((1,) + v4.shape[1:], v4.dtype)
            num_blocks = 1
        total_k = 0
        seqs = _b.Seqs(_data_ptr(cuq), None, _data_ptr(bt), bt.shape[1], _data_ptr(lk),
                       block_size, num_blocks)
    else:
        raise ValueError("cu_seqlens_q: needs cu_seqlens_k (packed K/V) or block_table and "
                         "seq_lens_k (paged K/V)")
    if Dk2 != Dk:
        raise ValueError(f"k: head_dim {Dk2} differs from q's {Dk} (shapes q {q.shape}, "
                         f"k {k.shape})")
    c = _Call(q.transpose(1, 0, 2)[None], k4, v4, *rest)
    keep.append(seqs)
    c.keep += keep
    c.Tq, c.Tk = total_q, total_k
    _DIMS.pack_into(c.pb, _O_DIMS, B, Hq, Hkv, total_q, total_k, Dk, c.Dv)
    _PTR.pack_into(c.pb, _O_SEQS, ctypes.addressof(seqs))
    return c


def _token_out(shape, dt):
    """A new C-order token list (total, H, D) and its packed sdpa_tensor_out."""
    a = _empty_aligned(shape, dt)
    _, H, D = shape
    return a, _pack_t(_data_ptr(a), 0, D, H * D)


def _token_in(c, arr, name, shape, allowed="float32"):
    """(array, packed sdpa_tensor, sdpa_dtype) of a token list (total, H[, D]) input."""
    arr = _as_array(arr, name)
    if arr.shape != shape:
        raise ValueError(f"{name}: shape {arr.shape}, expected {shape} (a token list)")
    ptr, st, code = _view(arr, name, len(shape), allowed=allowed)
    return arr, _pack_t(ptr, 0, st[1], st[0]), code   # head stride, token stride


def _attention_seqs(q, k, v, seq_args, kv_lengths, mask, bias, rest, return_lse, out, out_dtype):
    c = _seqs_call(q, k, v, *seq_args, kv_lengths, mask, bias, rest)
    Tq, Hq, Dv = c.Tq, c.Hq, c.Dv
    oshape = (Tq, Hq, Dv)
    if out is None:
        odt = c.qdt if out_dtype is None else _out_dtype(out_dtype)
        code = _DTYPE_CODE[odt]
        out, o_t = _token_out(oshape, odt)
    else:
        if out_dtype is not None and _out_dtype(out_dtype) != getattr(out, "dtype", None):
            raise ValueError(f"out_dtype: {out_dtype!r} differs from out's dtype "
                             f"{getattr(out, 'dtype', None)} (give one of them)")
        out, ptr, st, code = c.out_view(out, "out", oshape)
        o_t = _pack_t(ptr, 0, st[1], st[0])
    c.set_o_dtype(code)
    lse_t = None
    if return_lse:
        lse = _empty((Tq, Hq), _F32)
        lse_t = _pack_t(_data_ptr(lse), 0, 1, Hq)
    st = _forward(bytes(c.pb), c.q, c.k, c.v, o_t, lse_t)
    if st:
        c.check("sdpa_forward", st)
    return (out, lse) if return_lse else out


def attention(q, k, v, *, scale=None, causal=None, window=None, window_align=None, diagonal_offset=0,
              kv_lengths=None, mask=None, bias=None, softcap=None, alibi_slopes=None, sinks=None,
              return_lse=False, threads=0, isa=None, out=None, out_dtype=None, block_q=0,
              block_k=0, cu_seqlens_q=None, cu_seqlens_k=None, block_table=None,
              seq_lens_k=None, page_layout="HND", fpmath=None):
    """O = softmax(scale * q k^T + bias, masked) v on NumPy arrays (sdpa_forward).

    q [.., Tq, Dk], k [.., Tk, Dk], v [.., Tk, Dv] of rank 4 (B, H, T, D), 3 (H, T, D) or
    2 (T, D); any strides whose last dimension is contiguous (no copy). Batch sizes of 1
    broadcast; q's heads must be a multiple of k's (GQA).
    Types: float32, float16, or ml_dtypes' bfloat16 (NumPy has none of its own), read in
    place; q's may differ from k's, and k and v share one. Every product and sum runs in
    float32; O is rounded once to its type, which is q's unless out= or out_dtype= says
    otherwise. LSE is float32. Keywords:
      scale: float (default 1/sqrt(Dk)).  causal: None/False, True or 'top-left', 'bottom-right'.
      diagonal_offset: moves the diagonal of causal, the window and ALiBi by that many keys
        (an int in [-2^48, 2^48]; a query block later in the sequence than its key block).
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
      fpmath: None or 'default' (the ISA's fastest products: with a bfloat16 k/v where
        libsdpa.info() says bf16_dot 1, a prefill rounds P, and a float32 q, to bfloat16)
        or 'strict' (nothing rounded: the float32 products of the values as stored;
        sdpa_problem.fpmath_mode).
    Packed variable-length sequences (sdpa_seqs; B sequences):
      cu_seqlens_q: (B + 1,) token offsets (0, nondecreasing, last = total_q); q is then a
        token list (total_q, Hq, Dk), O (total_q, Hq, Dv), LSE (total_q, Hq).
      cu_seqlens_k: (B + 1,) likewise for k, v (total_k, Hkv, D); or instead
      block_table (B, max_blocks_per_seq) page ids and seq_lens_k (B,) key counts: k, v are
        paged caches (num_blocks, Hkv, block_size, D) with page_layout='HND' (default) or
        (num_blocks, block_size, Hkv, D) with 'NHD' (block_size, num_blocks from the shape).
      Integer arrays of any integer dtype, checked and converted to int32. kv_lengths, mask
      and bias are refused with them (the library does not take them).
    Returns O, or (O, LSE) with return_lse=True (LSE [.., Tq], natural log).
    Raises ValueError (SdpaError for a status of the library) on bad input.
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None or block_table is not None or \
            seq_lens_k is not None:
        return _attention_seqs(q, k, v, (cu_seqlens_q, cu_seqlens_k, block_table, seq_lens_k,
                                         page_layout), kv_lengths, mask, bias,
                               (scale, causal, window, window_align, None, None, None, softcap,
                                alibi_slopes, sinks, threads, isa, block_q, block_k,
                                diagonal_offset, fpmath),
                               return_lse, out, out_dtype)
    if page_layout != "HND":
        raise ValueError("page_layout: only with block_table and seq_lens_k (paged K/V)")
    if _HDR_OFF and type(q) is _ndarray and type(k) is _ndarray and type(v) is _ndarray and \
            out is None and out_dtype is None and window is None and window_align is None and \
            kv_lengths is None and mask is None and bias is None and softcap is None and \
            alibi_slopes is None and sinks is None and isa is None and not block_q and \
            not block_k and type(threads) is int and 0 <= threads <= _INT_MAX and \
            type(diagonal_offset) is int and not diagonal_offset and fpmath is None:
        if _fast_c is not None:
            r = _fast_c(q, k, v, scale, causal, threads, return_lse)
            if r is not None:
                return r
        r = _fast_forward(q, k, v, scale, causal, threads, return_lse)
        if r is not None:
            return r
    c = _Call(q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias, softcap,
              alibi_slopes, sinks, threads, isa, block_q, block_k, diagonal_offset, fpmath)
    rank, Hq, Tq, Dv = c.rank, c.Hq, c.Tq, c.Dv
    oshape = (c.B, Hq, Tq, Dv) if rank == 4 else (Hq, Tq, Dv) if rank == 3 else (Tq, Dv)
    if out is None:
        if out_dtype is None:
            odt, code = c.qdt, c.qc
        else:
            odt = _out_dtype(out_dtype)
            code = _DTYPE_CODE[odt]
        if odt is None:
            raise ValueError("out: needed when q is an address view (_Raw)")
        out = _empty(oshape, odt)
        if out.size:   # C order: the strides in elements as numpy gives them
            o_t = _pack_t(_HDR_AT(id(out) + _HDR_OFF).value if _HDR_OFF else out.ctypes.data,
                          Hq * Tq * Dv if rank == 4 else 0, Tq * Dv if rank > 2 else 0, Dv)
        else:
            o_t = _tp(_data_ptr(out), [s // _ITEMSIZE[code] for s in out.strides], rank)
    else:
        if out_dtype is not None and _out_dtype(out_dtype) != getattr(out, "dtype", None):
            raise ValueError(f"out_dtype: {out_dtype!r} differs from out's dtype "
                             f"{getattr(out, 'dtype', None)} (give one of them)")
        out, ptr, st, code = c.out_view(out, "out", oshape)
        o_t = _tp(ptr, st, rank)
    if code:
        _I32.pack_into(c.pb, _O_ODT, code)
    if return_lse:
        lse, lse_t = _new_lse(oshape[:-1], rank, Hq, Tq)
        st = _forward(bytes(c.pb), c.q, c.k, c.v, o_t, lse_t)
        if st:
            c.check("sdpa_forward", st)
        return out, lse
    st = _forward(bytes(c.pb), c.q, c.k, c.v, o_t, None)
    if st:
        c.check("sdpa_forward", st)
    return out


def attention_backward(q, k, v, o, lse, do, *, scale=None, causal=None, window=None,
                       window_align=None, diagonal_offset=0, kv_lengths=None, mask=None, bias=None, softcap=None,
                       alibi_slopes=None, sinks=None, threads=0, isa=None, block_q=0, block_k=0,
                       cu_seqlens_q=None, cu_seqlens_k=None, fpmath=None):
    """dQ, dK, dV (sdpa_backward) of a loss whose gradient with respect to O is do.

    q, k, v and every keyword as given to attention() (fpmath too: give the forward's);
    o and lse are attention()'s outputs
    (return_lse=True), do is dL/dO (shaped like O, of O's type). Returns (dq, dk, dv), shaped
    like q, k, v and of their types (a k or v whose batch of 1 was broadcast gets its
    gradient summed over the batch), and, with sinks, (dq, dk, dv, dsinks) with dsinks [Hq]
    float32. float16 / bfloat16 tensors go to sdpa_backward as they are: a library whose
    backward refuses them raises SdpaError (SDPA_ERR_UNSUPPORTED); nothing is converted to
    float32 behind the caller's back.
    cu_seqlens_q and cu_seqlens_k: packed sequences as in attention() (both needed; the
    library has no paged backward): q, o, do, dq token lists (total_q, Hq, D), lse
    (total_q, Hq), k, v, dk, dv (total_k, Hkv, D).
    """
    if cu_seqlens_q is not None or cu_seqlens_k is not None:
        if cu_seqlens_k is None:
            raise ValueError("cu_seqlens_k: needed with cu_seqlens_q in the backward (packed "
                             "K/V; the library has no backward over a paged cache)")
        return _backward_seqs(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, kv_lengths,
                              mask, bias, (scale, causal, window, window_align, None, None,
                                           None, softcap, alibi_slopes, sinks, threads, isa,
                                           block_q, block_k, diagonal_offset, fpmath))
    c = _Call(q, k, v, scale, causal, window, window_align, kv_lengths, mask, bias, softcap,
              alibi_slopes, sinks, threads, isa, block_q, block_k, diagonal_offset, fpmath)
    rank, B, Hq, Hkv, Tq, Tk, Dk, Dv = c.rank, c.B, c.Hq, c.Hkv, c.Tq, c.Tk, c.Dk, c.Dv
    oshape = _tshape(rank, B, Hq, Tq, Dv)
    o_arr, op, os_, oc = c.tensor_in(o, "o", oshape, _TYPED)
    lse_arr, lp, ls, _ = c.tensor_in(lse, "lse", oshape[:-1])
    do_arr, dop, dos, doc = c.tensor_in(do, "do", oshape, _TYPED)
    if doc != oc:
        raise ValueError(f"o and do: dtypes {_DTYPE_NAME[oc]} and {_DTYPE_NAME[doc]} differ "
                         "(dO is stored in O's type)")
    c.set_o_dtype(oc)
    o_t = _tp(op, os_, rank)
    l_t = _lse_tp(lp, ls, rank)
    do_t = _tp(dop, dos, rank)
    qi, ki = _ITEMSIZE[c.qc], _ITEMSIZE[c.kvc]
    dq, dq_t = _new_out(_tshape(rank, B, Hq, Tq, Dk), c.qdt, qi, rank, Hq, Tq, Dk)
    dk, dk_t = _new_out(_tshape(rank, B, Hkv, Tk, Dk), c.kvdt, ki, rank, Hkv, Tk, Dk)
    dv, dv_t = _new_out(_tshape(rank, B, Hkv, Tk, Dv), c.kvdt, ki, rank, Hkv, Tk, Dv)
    dsinks = None
    if c.sinks is not None:
        dsinks = _empty(Hq, dtype=_F32)
        c.set_dsinks(_data_ptr(dsinks))
    st = _backward(bytes(c.pb), c.q, c.k, c.v, o_t, l_t, do_t, dq_t, dk_t, dv_t)
    if st:
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


def _backward_seqs(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, kv_lengths, mask, bias,
                   rest):
    c = _seqs_call(q, k, v, cu_seqlens_q, cu_seqlens_k, None, None, "HND", kv_lengths, mask,
                   bias, rest)
    Tq, Tk, Hq, Hkv, Dk, Dv = c.Tq, c.Tk, c.Hq, c.Hkv, c.Dk, c.Dv
    o_arr, o_t, oc = _token_in(c, o, "o", (Tq, Hq, Dv), _TYPED)
    lse_arr, l_t, _ = _token_in(c, lse, "lse", (Tq, Hq))
    do_arr, do_t, doc = _token_in(c, do, "do", (Tq, Hq, Dv), _TYPED)
    if doc != oc:
        raise ValueError(f"o and do: dtypes {_DTYPE_NAME[oc]} and {_DTYPE_NAME[doc]} differ "
                         "(dO is stored in O's type)")
    c.set_o_dtype(oc)
    dq, dq_t = _token_out((Tq, Hq, Dk), c.qdt)
    dk, dk_t = _token_out((Tk, Hkv, Dk), c.kvdt)
    dv, dv_t = _token_out((Tk, Hkv, Dv), c.kvdt)
    dsinks = None
    if c.sinks is not None:
        dsinks = _empty(Hq, dtype=_F32)
        c.set_dsinks(_data_ptr(dsinks))
    st = _backward(bytes(c.pb), c.q, c.k, c.v, o_t, l_t, do_t, dq_t, dk_t, dv_t)
    if st:
        c.check("sdpa_backward", st)
    del o_arr, lse_arr, do_arr
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


def merge_states(outs, lses, *, out=None, lse_out=None, out_dtype=None):
    """Merges partial attention states (O_s, LSE_s) over disjoint key sets
    (sdpa_merge_states_typed): O = sum_s exp(LSE_s - LSE) O_s, LSE = log sum_s exp(LSE_s).
    outs: sequence of O arrays [.., T, Dv] of one shape and one type (float32, float16 or
    ml_dtypes' bfloat16); lses: their float32 LSE [.., T]. The merged O has out's type
    if out is given, else out_dtype's (float32, float16, 'bfloat16'), else the parts'
    type; the merge runs in float32 and rounds O once (nearest even). out may be one of
    outs (the same array, in place) only when the types agree.
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
    parts_code = None
    for i in range(n):
        if outs[i].shape != shape:
            raise ValueError(f"outs[{i}]: shape {outs[i].shape}, expected {shape}")
        if lses[i].shape != shape[:-1]:
            raise ValueError(f"lses[{i}]: shape {lses[i].shape}, expected {shape[:-1]}")
        p, s, code = _view(outs[i], f"outs[{i}]", rank, allowed=_TYPED)
        if parts_code is None:
            parts_code = code
        elif code != parts_code:
            raise ValueError(f"outs[{i}]: dtype {outs[i].dtype}, expected {outs[0].dtype} "
                             "(the parts share one type)")
        Ot[i] = _t(p, s, rank)
        p, s, _ = _view(lses[i], f"lses[{i}]", rank - 1)
        Lt[i] = _lse_t(p, s, rank)
    (B, H, T, D), _ = _split(shape, [0] * rank, rank)
    if out is None:
        out = np.empty(shape, dtype=outs[0].dtype if out_dtype is None else _out_dtype(out_dtype))
    elif not isinstance(out, np.ndarray):
        raise ValueError(f"out: expected a NumPy array to write into, got {type(out).__name__}")
    elif out.shape != shape:
        raise ValueError(f"out: shape {out.shape}, expected {shape}")
    elif out_dtype is not None and out.dtype != _out_dtype(out_dtype):
        raise ValueError(f"out: dtype {out.dtype}, but out_dtype is {out_dtype!r}")
    if lse_out is None:
        lse_out = np.empty(shape[:-1], dtype=_F32)
    elif not isinstance(lse_out, np.ndarray):
        raise ValueError(f"lse_out: expected a NumPy array to write into, got {type(lse_out).__name__}")
    elif lse_out.shape != shape[:-1]:
        raise ValueError(f"lse_out: shape {lse_out.shape}, expected {shape[:-1]}")
    p, s, o_code = _view(out, "out", rank, writable=True, allowed=_TYPED)
    o_t = _t(p, s, rank)
    p, s, _ = _view(lse_out, "lse_out", rank - 1, writable=True)
    l_t = _lse_t(p, s, rank)
    st = _b.merge_states_typed(n, B, H, T, D, parts_code, Ot, Lt, o_code, _byref(o_t), _byref(l_t))
    _check("sdpa_merge_states_typed", st)
    return out, lse_out


def isa_names():
    return [_b.isa_name(i).decode() for i in range(_b.ISA_COUNT)]


def force_isa(isa):
    """Sets the process-wide default ISA ('scalar', 'avx2', 'avx512', 'amx', 'neon', or
    None / 'auto' for the load-time choice): sdpa_force_isa."""
    _check("sdpa_force_isa", _b.force_isa(_isa_value(isa)))


def info():
    """The facts of `sdpa info` as a dict: also "tuning" (sdpa_tuning(): the detected
    microarchitecture and each ISA's block sizes) and "bf16_pairs_isas" (the ISAs on which
    bf16 K/V with a bf16 or fp32 Q run their prefill tiles on bf16 pair products, AVX512-BF16's
    vdpbf16ps or AMX's tdpbf16ps, rounding P to bf16 before P V: sdpa_isa_bf16_pairs) and
    "bf16_pairs_backward_isas" (the ISAs on which a backward of bf16 q, k, v and o runs its
    prefill tiles' products on them, rounding P and dS to bf16: sdpa_isa_bf16_pairs_backward)."""
    names = isa_names()
    rejected = _b.isa_env_rejected()
    tuning = _b.tuning().decode()
    import os
    return {
        "tuning": tuning,
        "bf16_pairs_isas": [n for i, n in enumerate(names) if _b.isa_bf16_pairs(i)],
        "bf16_pairs_backward_isas": [n for i, n in enumerate(names) if _b.isa_bf16_pairs_backward(i)],
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
