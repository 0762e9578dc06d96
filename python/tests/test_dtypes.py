# SPDX-License-Identifier: MIT
"""bf16 / fp16 storage through the NumPy API (include/sdpa.h q_dtype, kv_dtype, o_dtype).

The library computes every product and sum in float32 on exactly widened values and
rounds only O (docs/design.md, "Reduced precision"), except where an ISA runs a bf16 or
fp32 Q with bf16 K/V on its bf16 pair products (libsdpa.info()["bf16_pairs_isas"]; AMX,
AVX512-BF16 on Zen 4), which also rounds P (and an fp32 Q) to bf16. So a 16-bit call must give, bit for
bit, the library's own float32 call on the widened inputs with its O rounded (to nearest
even) to the output type, and the same LSE: checked on every supported ISA, decode
(Tq = 1) and GQA included; on the pair products, O within P's rounding of that call and
LSE within float32 summation order. float16 always runs; bfloat16 needs ml_dtypes (NumPy has no
bfloat16 of its own; libsdpa recognises ml_dtypes' type but does not depend on it)."""
import sys
import zlib

import numpy as np
import pytest

import libsdpa
import ref

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # the bfloat16 cases are skipped
    ml_dtypes = None
    BF16 = None

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
ISAS = libsdpa.info()["supported_isas"]
PAIRS_ISAS = libsdpa.info()["bf16_pairs_isas"]
BWD_PAIRS_ISAS = libsdpa.info()["bf16_pairs_backward_isas"]
needs_bf16 = pytest.mark.skipif(ml_dtypes is None, reason="ml_dtypes (NumPy bfloat16) absent")


def T(name):
    """A storage type by name; bfloat16 skips the test without ml_dtypes."""
    if name == "bf16":
        if BF16 is None:
            pytest.skip("ml_dtypes (NumPy bfloat16) absent")
        return BF16
    return {"f16": F16, "f32": F32}[name]


def bits(a):
    """The stored bits of an array, to compare bit for bit (NaN included)."""
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def rounded(o32, dt):
    """float32 O rounded to nearest even into dt (NumPy's and ml_dtypes' casts both round
    to nearest even; fp16 overflow gives inf)."""
    return o32.astype(dt)


def widened(a):
    return a.astype(F32)   # exact for float16 and bfloat16


def seed(*parts):
    """A seed that is the same in every run (str hashes are not)."""
    return zlib.crc32(repr(parts).encode())


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# (B, Hq, Hkv, Tq, Tk, Dk, Dv): prefill with GQA, decode (Tq = 1) over a long cache with
# GQA and MQA (split keys), a small odd MHA shape, and a larger prefill of several tiles
SHAPES = {
    "gqa": (2, 4, 2, 9, 13, 16, 12),
    "decode_gqa": (2, 8, 2, 1, 300, 64, 64),
    "decode_mqa": (1, 8, 1, 1, 1000, 128, 128),
    "mha_odd": (1, 3, 3, 5, 7, 24, 8),
    "prefill": (1, 4, 2, 70, 90, 32, 32),
}
# (q type, k/v type): both 16-bit, an fp32 query over a 16-bit cache, and the reverse
TYPES = [("f16", "f16"), ("bf16", "bf16"), ("f32", "f16"), ("f32", "bf16"), ("f16", "f32"),
         ("bf16", "f16")]


def make(rng, shape, qt, kvt):
    B, Hq, Hkv, Tq, Tk, Dk, Dv = shape
    return (rnd(rng, B, Hq, Tq, Dk).astype(qt), rnd(rng, B, Hkv, Tk, Dk).astype(kvt),
            rnd(rng, B, Hkv, Tk, Dv).astype(kvt))


def rounds_p(q, k, v, isa):
    """Whether this call may run on the bf16 pair products (P rounded to bf16; an fp32 Q
    over bf16 K/V rounded to bf16 too)."""
    isa = isa or libsdpa.info()["active_isa"]
    return (q.dtype in (BF16, F32) and k.dtype == BF16 and isa in PAIRS_ISAS and q.shape[-1] % 2 == 0
            and q.shape[-2] > 1 and v.shape[-1] > 0)


def q_rounding_bound(q, k, v, kw):
    """A bound on how far the scores move when the pair products round an fp32 Q to
    bf16 (each element by at most 2^-9 of itself): scale 2^-9 max sum_d |q_d k_d|; 0 when
    Q is not rounded. O then moves by at most (e^{2 dS} - 1) max|V|, LSE by dS."""
    if q.dtype != F32 or not rounds_p(q, k, v, kw.get("isa")) or q.size == 0 or k.size == 0:
        return 0.0
    qa, ka = np.abs(q.astype(np.float64)), np.abs(widened(k).astype(np.float64))
    ka = np.repeat(ka, q.shape[1] // k.shape[1], axis=1)
    scale = kw.get("scale") or 1.0 / np.sqrt(q.shape[-1])
    return abs(scale) * 2.0**-9 * float(np.max(np.einsum("bhqd,bhkd->bhqk", qa, ka)))


def check_same_as_widened(q, k, v, out_dtype=None, **kw):
    """The 16-bit call's O and LSE against the float32 call on the widened inputs: the
    same bits, or on the bf16 pair products O within P's rounding (each probability's
    relative error at most 2^-9, so O's at most 2^-9 max|V| beside O's own rounding) and
    LSE within float32 summation order."""
    o, lse = libsdpa.attention(q, k, v, return_lse=True, out_dtype=out_dtype, **kw)
    o32, lse32 = libsdpa.attention(widened(q), widened(k), widened(v), return_lse=True, **kw)
    want_dt = q.dtype if out_dtype is None else np.dtype(out_dtype)
    assert o.dtype == want_dt and lse.dtype == F32
    assert o.shape == o32.shape and lse.shape == lse32.shape
    if rounds_p(q, k, v, kw.get("isa")):
        eps = float(np.finfo(want_dt).eps) if want_dt != BF16 else 2.0**-7
        vmax = float(np.max(np.abs(widened(v)))) if v.size else 0.0
        ds = q_rounding_bound(q, k, v, kw)
        np.testing.assert_allclose(widened(o), widened(rounded(o32, want_dt)), rtol=eps,
                                   atol=(2.0**-9 + np.expm1(2 * ds)) * vmax + 1e-6)
        assert np.array_equal(np.isfinite(lse), np.isfinite(lse32))
        fin = np.isfinite(lse32)
        np.testing.assert_allclose(lse[fin], lse32[fin], rtol=1e-5, atol=1e-5 + ds)
        return o, lse
    diff = int(np.sum(bits(o) != bits(rounded(o32, want_dt))))
    assert diff == 0, f"O differs from the float32 call's rounded O in {diff} places"
    assert np.array_equal(bits(lse), bits(lse32))
    return o, lse


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("types", TYPES, ids=lambda t: f"q{t[0]}_kv{t[1]}")
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_bitwise_rounded_fp32(shape, types, isa):
    rng = np.random.default_rng(seed(shape, types))
    qt, kvt = T(types[0]), T(types[1])
    q, k, v = make(rng, SHAPES[shape], qt, kvt)
    for causal in (None, "bottom-right"):
        check_same_as_widened(q, k, v, causal=causal, isa=isa, threads=1)


MASKS = {
    "kv_lengths_causal": {"kv_lengths": np.array([13, 5]), "causal": "bottom-right"},
    "window": {"window": (3, 2)},
    "bias_mask": {"bias": "heads", "mask": "bool"},
    "softcap_alibi_sinks": {"softcap": 2.0, "alibi_slopes": np.array([0.5, 0.25, 0.1, 0.05]),
                            "sinks": np.array([0.5, -1.0, 2.0, 0.0], np.float32)},
}


@pytest.mark.parametrize("qkv_t", [("f16", "f16"), ("f32", "bf16"), ("bf16", "bf16")],
                         ids=lambda t: f"q{t[0]}_kv{t[1]}")
@pytest.mark.parametrize("name", sorted(MASKS))
def test_masks_bitwise_and_near_reference(name, qkv_t):
    rng = np.random.default_rng(seed(name, qkv_t))
    q, k, v = make(rng, SHAPES["gqa"], T(qkv_t[0]), T(qkv_t[1]))
    kw = dict(MASKS[name])
    if kw.get("bias") == "heads":
        b = rnd(rng, 1, 4, 1, 13)
        b[0, 1, 0, 2] = -np.inf
        kw["bias"] = b
    if kw.get("mask") == "bool":
        m = rng.random((2, 4, 9, 13)) < 0.7
        m[0, 0, 3, :] = False   # a fully masked row: O = 0, LSE = -inf
        kw["mask"] = m
    o, lse = check_same_as_widened(q, k, v, **kw)
    # and near float64 on the same (rounded) inputs: the only new error is O's rounding
    # (and P's on the bf16 pair products: at most 2^-9 max|V|)
    ro, rl = ref.forward(widened(q), widened(k), widened(v), **kw)
    eps = float(np.finfo(o.dtype).eps) if o.dtype != BF16 else 2.0**-7
    ds = q_rounding_bound(q, k, v, kw)
    p_err = ((2.0**-9 + np.expm1(2 * ds)) * float(np.max(np.abs(widened(v))))
             if rounds_p(q, k, v, None) else 0.0)
    np.testing.assert_allclose(widened(o), ro, rtol=eps, atol=4e-5 + p_err)
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(lse), fin)
    np.testing.assert_allclose(lse[fin], rl[fin], rtol=2e-4, atol=2e-5 + ds)


@pytest.mark.parametrize("isa", PAIRS_ISAS or ["none"])
def test_bf16_pairs_round_p(isa):
    """On an ISA that lists the bf16 pair products, a bf16 prefill is not the float32
    call's bits (P was rounded: the path ran) and is as close to float64 as a float32
    reference that rounds P to bf16 the same way (2x its error, the accuracy rule)."""
    if isa == "none":
        pytest.skip("no ISA of this CPU runs the bf16 pair products (AVX512-BF16, Zen 4)")
    rng = np.random.default_rng(33)
    q, k, v = make(rng, (1, 4, 2, 150, 150, 64, 64), T("bf16"), T("bf16"))
    o = libsdpa.attention(q, k, v, causal=True, isa=isa, out_dtype=F32)
    o32 = libsdpa.attention(widened(q), widened(k), widened(v), causal=True, isa=isa)
    assert not np.array_equal(bits(o), bits(o32))
    ro, _ = ref.forward(widened(q), widened(k), widened(v), causal=True)
    s = np.einsum("bhqd,bhkd->bhqk", widened(q).astype(np.float64),
                  np.repeat(widened(k), 2, axis=1).astype(np.float64)) / 8.0
    s = np.where(np.tril(np.ones((150, 150), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p_bf16 = p.astype(np.float32).astype(BF16).astype(np.float64)
    naive = np.einsum("bhqk,bhkd->bhqd", p_bf16, np.repeat(widened(v), 2, axis=1).astype(np.float64))
    assert np.max(np.abs(o - ro)) <= 2.0 * np.max(np.abs(naive - ro)) + 1e-7


@pytest.mark.parametrize("isa", PAIRS_ISAS or ["none"])
def test_fp32_q_over_bf16_kv_rounds_q(isa):
    """On the bf16 pair products an fp32 Q over bf16 K/V (a float32 model's chunked
    prefill over a bf16 cache) is rounded to bf16 (nearest even) and then runs as a bf16
    Q does: the same bits as the call with Q rounded beforehand, and not the float32
    call's on the widened cache."""
    if isa == "none":
        pytest.skip("no ISA of this CPU runs the bf16 pair products")
    rng = np.random.default_rng(34)
    q, k, v = make(rng, (1, 8, 2, 200, 260, 64, 48), F32, T("bf16"))
    for causal in (None, "bottom-right"):
        o, lse = libsdpa.attention(q, k, v, causal=causal, isa=isa, return_lse=True)
        ob, lseb = libsdpa.attention(q.astype(BF16), k, v, causal=causal, isa=isa, out_dtype=F32,
                                     return_lse=True)
        assert np.array_equal(bits(o), bits(ob)) and np.array_equal(bits(lse), bits(lseb))
        o32 = libsdpa.attention(q, widened(k), widened(v), causal=causal, isa=isa)
        assert not np.array_equal(bits(o), bits(o32))


@pytest.mark.parametrize("isa", ISAS)
def test_fpmath_strict_rounds_nothing(isa):
    """fpmath='strict' (sdpa_problem.fpmath_mode): an fp32 q over a bf16 cache, a 40-token
    chunk at G = 4 (past decode size on every CPU's tuning), gives the bits of the float32 call on the
    widened cache, forward and backward, on every ISA; 'default' differs where the ISA
    runs the pair products; anything else is a ValueError."""
    rng = np.random.default_rng(35)
    q, k, v = make(rng, (1, 8, 2, 40, 100, 128, 128), F32, T("bf16"))
    do = rnd(rng, 1, 8, 40, 128)
    o, lse = libsdpa.attention(q, k, v, causal="bottom-right", isa=isa, return_lse=True, fpmath="strict")
    o32, lse32 = libsdpa.attention(q, widened(k), widened(v), causal="bottom-right", isa=isa,
                                   return_lse=True)
    assert np.array_equal(bits(o), bits(o32)) and np.array_equal(bits(lse), bits(lse32))
    g = libsdpa.attention_backward(q, k, v, o, lse, do, causal="bottom-right", isa=isa, fpmath="strict")
    g32 = libsdpa.attention_backward(q, widened(k), widened(v), o32, lse32, do, causal="bottom-right",
                                     isa=isa)
    assert np.array_equal(bits(g[0]), bits(g32[0]))
    for x, x32 in zip(g[1:], g32[1:]):
        assert np.array_equal(bits(x), bits(rounded(x32, BF16)))
    od = libsdpa.attention(q, k, v, causal="bottom-right", isa=isa, fpmath="default")
    if isa in PAIRS_ISAS:
        assert not np.array_equal(bits(od), bits(o32))
    for bad in ("fast", 1, True):
        with pytest.raises(ValueError, match="fpmath"):
            libsdpa.attention(q, k, v, isa=isa, fpmath=bad)


@pytest.mark.parametrize("isa", BWD_PAIRS_ISAS or ["none"])
def test_bf16_backward_pairs_round_p_ds(isa):
    """On an ISA that lists the backward's bf16 pair products, the backward of bf16 q, k, v
    and o (GQA, causal, an odd number of query rows per tile) is not the float32 backward's
    bits on the widened values (P and dS were rounded: the path ran), its gradients are as
    close to float64 as a float64 computation that rounds P and dS to bf16 the same way
    and its gradients to bf16 (3x its error), and 1 and 2 threads
    give the same bits."""
    if isa == "none":
        pytest.skip("no ISA of this CPU runs the backward's bf16 pair products (AMX)")
    rng = np.random.default_rng(35)
    B, Hq, Hkv, Tq, Tk, D = 1, 4, 2, 131, 150, 64
    q, k, v = make(rng, (B, Hq, Hkv, Tq, Tk, D, D), T("bf16"), T("bf16"))
    do = rnd(rng, B, Hq, Tq, D).astype(BF16)
    o, lse = libsdpa.attention(q, k, v, causal="bottom-right", isa=isa, return_lse=True)
    grads = [libsdpa.attention_backward(q, k, v, o, lse, do, causal="bottom-right", isa=isa, threads=t)
             for t in (1, 2)]
    for a, b in zip(*grads):
        assert np.array_equal(bits(a), bits(b))
    w = [widened(x) for x in (q, k, v, o, do)]
    g32 = libsdpa.attention_backward(w[0], w[1], w[2], w[3], lse, w[4], causal="bottom-right", isa=isa)
    assert any(not np.array_equal(bits(a), bits(b.astype(BF16))) for a, b in zip(grads[0], g32))
    # float64 reference, and the naive one rounding P and dS (D from the stored O)
    q64, do64, o64 = (x.astype(np.float64) for x in (w[0], w[4], w[3]))
    k64, v64 = (np.repeat(x.astype(np.float64), Hq // Hkv, axis=1) for x in (w[1], w[2]))
    rg = ref.backward(w[0], w[1], w[2], w[4], causal="bottom-right")
    s = np.einsum("bhqd,bhkd->bhqk", q64, k64) / 8.0
    allowed = np.tril(np.ones((Tq, Tk), bool), Tk - Tq)
    s = np.where(allowed, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("bhqd,bhkd->bhqk", do64, v64)
    ds = p * (dp - (do64 * o64).sum(-1, keepdims=True))
    r16 = lambda x: x.astype(np.float32).astype(BF16).astype(np.float64)
    pr, dsr = r16(p), r16(ds)
    def per_kv(x):  # [B, Hq, Tk, D] summed over each GQA group
        return x.reshape(B, Hkv, Hq // Hkv, Tk, D).sum(2)
    naive = (np.einsum("bhqk,bhkd->bhqd", dsr, k64) / 8.0,
             per_kv(np.einsum("bhqk,bhqd->bhkd", dsr, q64) / 8.0),
             per_kv(np.einsum("bhqk,bhqd->bhkd", pr, do64)))
    for got, want, r in zip(grads[0], naive, rg[:3]):
        got64 = got.astype(np.float64)
        nv = r16(want)
        assert np.max(np.abs(got64 - r)) <= 3.0 * np.max(np.abs(nv - r)) + 1e-7


def test_bf16_without_ml_dtypes_internal_path():
    """bfloat16 without ml_dtypes or torch: the library's bf16 reading through the path
    libsdpa.torch takes (_api._Raw: an address, element strides and SDPA_DTYPE_BF16), here
    over uint16 arrays of bf16 bits, into a float32 O: bit for bit the float32 call on the
    widened values (nothing is rounded at all), or, for the prefill on an ISA that runs the
    bf16 pair products, within P's rounding of it (2^-9 max|V|) and the same LSE to float32
    summation order; the decode on avx512's pair products (scores on vdpbf16ps, nothing
    rounded) within float32 summation order."""
    from libsdpa import _api
    rng = np.random.default_rng(31)
    B, Hq, Hkv, Tq, Tk, D = 2, 8, 2, 1, 300, 64

    def bf16_bits(*shape):   # random bf16 values (truncated fp32), as uint16 bits
        return (rnd(rng, *shape).view(np.uint32) >> 16).astype(np.uint16)

    def raw(a):
        return _api._Raw(a.shape, a.ctypes.data, [s // 2 if n > 1 else 0
                                                  for n, s in zip(a.shape, a.strides)],
                         _api.DTYPE_BF16, a)

    def wide(a):
        return (a.astype(np.uint32) << 16).view(np.float32)

    kv = bf16_bits(B, Tk, 2, Hkv, D)            # a packed [B, T, 2, H, D] cache
    k, v = (kv[:, :, i].transpose(0, 2, 1, 3) for i in range(2))
    for q in (bf16_bits(B, Hq, Tq, D), bf16_bits(B, Hq, 17, D)):
        out = np.empty((B, Hq, q.shape[2], D), F32)
        lse = libsdpa.attention(raw(q), raw(k), raw(v), out=out, causal="bottom-right",
                                return_lse=True)[1]
        o32, lse32 = libsdpa.attention(wide(q), wide(k), wide(v), causal="bottom-right",
                                       return_lse=True)
        active = libsdpa.info()["active_isa"]
        if q.shape[2] > 1 and active in PAIRS_ISAS:
            np.testing.assert_allclose(out, o32, rtol=0, atol=2.0**-9 * np.max(np.abs(wide(v))))
            np.testing.assert_allclose(lse, lse32, rtol=1e-5, atol=1e-5)
        elif active == "avx512" and active in PAIRS_ISAS:
            np.testing.assert_allclose(out, o32, rtol=1e-5, atol=1e-6 * np.max(np.abs(wide(v))))
            np.testing.assert_allclose(lse, lse32, rtol=1e-6, atol=1e-6)
        else:
            assert np.array_equal(bits(out), bits(o32)) and np.array_equal(bits(lse), bits(lse32))


def test_threads_same_bits_fp16():
    rng = np.random.default_rng(20)
    q, k, v = make(rng, (2, 8, 2, 70, 90, 32, 32), F16, F16)
    a = libsdpa.attention(q, k, v, causal=True, threads=1)
    b = libsdpa.attention(q, k, v, causal=True, threads=2)
    assert a.dtype == F16 and np.array_equal(bits(a), bits(b))


# ---------------------------------------------------------------- zero copy and layout

def test_fp16_strided_views_zero_copy():
    """q, k, v as float16 views into one packed [B, T, 3, H, D] buffer, strides in
    elements: the same bits as contiguous copies."""
    rng = np.random.default_rng(21)
    packed = rnd(rng, 2, 11, 3, 4, 16).astype(F16)
    q, k, v = (packed[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert not q.flags.c_contiguous and np.shares_memory(q, packed)
    o = libsdpa.attention(q, k, v, causal=True)
    o2 = libsdpa.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
    assert o.dtype == F16 and np.array_equal(bits(o), bits(o2))
    check_same_as_widened(q, k, v, causal=True)


def test_fp16_rows_heads_offsets_and_broadcast():
    rng = np.random.default_rng(22)
    big = rnd(rng, 3, 8, 30, 40).astype(F16)
    q = big[:, ::2, ::3, 5:21]     # head and row strides, an odd element offset
    k = big[:, 1::4, 1::2, 3:19]
    v = big[:, 2::4, 1::2, 20:28]
    check_same_as_widened(q, k, v)
    # a key/value batch of 1 (and its stride-0 broadcast) against q's batch of 3
    k1, v1 = k[:1], v[:1]
    o1 = check_same_as_widened(q, k1, v1)[0]
    o2 = libsdpa.attention(q, np.broadcast_to(k1, k.shape), np.broadcast_to(v1, v.shape))
    assert np.array_equal(bits(o1), bits(o2))


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_fp16_ranks(rank):
    rng = np.random.default_rng(23 + rank)
    sq, sk = (2, 3, 7, 8)[4 - rank:], (2, 3, 10, 8)[4 - rank:]
    q, k, v = (rnd(rng, *s).astype(F16) for s in (sq, sk, sk))
    o, lse = check_same_as_widened(q, k, v, causal="bottom-right")
    assert o.shape == q.shape and lse.shape == q.shape[:-1]


def test_empty_fp16():
    q = np.zeros((1, 2, 0, 8), F16)
    k = np.zeros((1, 2, 5, 8), F16)
    o = libsdpa.attention(q, k, k)
    assert o.shape == (1, 2, 0, 8) and o.dtype == F16
    o, lse = libsdpa.attention(np.ones((1, 1, 3, 8), F16), k[:, :1, :0], k[:, :1, :0],
                               return_lse=True)
    assert o.dtype == F16 and np.all(o == 0) and np.all(lse == -np.inf)


# ---------------------------------------------------------------- output type

def test_out_dtype_and_out():
    rng = np.random.default_rng(24)
    q, k, v = make(rng, SHAPES["gqa"], F16, F16)
    o32, _ = libsdpa.attention(widened(q), widened(k), widened(v), return_lse=True)
    # fp16 inputs, fp32 O: exactly the fp32 call's O (nothing is rounded at all)
    o = libsdpa.attention(q, k, v, out_dtype=np.float32)
    assert o.dtype == F32 and np.array_equal(bits(o), bits(o32))
    # fp32 inputs, fp16 O
    o = libsdpa.attention(widened(q), widened(k), widened(v), out_dtype="float16")
    assert o.dtype == F16 and np.array_equal(bits(o), bits(o32.astype(F16)))
    # out= a strided float16 array: its type is O's
    buf = np.full((2, 9, 4, 20), 7.0, F16)
    out = buf[..., :12].transpose(0, 2, 1, 3)
    assert libsdpa.attention(widened(q), k, v, out=out) is out
    assert np.array_equal(bits(out), bits(o32.astype(F16))) and np.all(buf[..., 12:] == 7)
    out32 = np.empty(o32.shape, F32)
    libsdpa.attention(q, k, v, out=out32, out_dtype=np.float32)   # agreeing: fine
    assert np.array_equal(bits(out32), bits(o32))


def test_out_dtype_bad():
    rng = np.random.default_rng(25)
    q, k, v = make(rng, SHAPES["gqa"], F16, F16)
    out = np.full((2, 4, 9, 12), 42.0, F16)
    with pytest.raises(ValueError, match="differs from out's dtype"):
        libsdpa.attention(q, k, v, out=out, out_dtype=np.float32)
    for bad in (np.float64, "int8", ">f2", "no such type"):
        with pytest.raises(ValueError, match="out_dtype"):
            libsdpa.attention(q, k, v, out_dtype=bad)
    with pytest.raises(ValueError, match="dtype"):
        libsdpa.attention(q, k, v, out=out.astype(np.float64))
    assert np.all(out == 42.0)


def test_out_dtype_bfloat16_without_ml_dtypes(monkeypatch):
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)   # import ml_dtypes fails
    rng = np.random.default_rng(26)
    q, k, v = make(rng, SHAPES["gqa"], F16, F16)
    with pytest.raises(ValueError, match="ml_dtypes"):
        libsdpa.attention(q, k, v, out_dtype="bfloat16")


@needs_bf16
def test_bfloat16_out_dtype_and_out():
    rng = np.random.default_rng(27)
    q, k, v = make(rng, SHAPES["decode_gqa"], F32, BF16)
    o32 = libsdpa.attention(q, widened(k), widened(v))
    for od in ("bfloat16", ml_dtypes.bfloat16, BF16):
        o = libsdpa.attention(q, k, v, out_dtype=od)
        assert o.dtype == BF16 and np.array_equal(bits(o), bits(o32.astype(BF16)))
    out = np.empty(o32.shape, BF16)
    libsdpa.attention(q, k, v, out=out)
    assert np.array_equal(bits(out), bits(o32.astype(BF16)))


def test_fp16_overflow_is_inf():
    """An fp16 O beyond 65504 is inf (fp32 V, fp16 O), as IEEE rounding says. One key:
    P = 1, so O is V's row exactly before the rounding."""
    q = np.zeros((1, 1, 2, 4), F32)
    v = np.array([70000.0, 65519.0, 65520.0, -70000.0], F32).reshape(1, 1, 1, 4)
    o = libsdpa.attention(q, v, v, out_dtype=np.float16)
    # 65519 is under the half-way point to 65536 and rounds to 65504; 65520 rounds to inf
    assert o.dtype == F16
    assert np.array_equal(o[0, 0], np.array([[np.inf, 65504, np.inf, -np.inf]] * 2, F16))


# ---------------------------------------------------------------- bad types

def bad_type_cases(rng):
    q, k, v = (x.astype(F16) for x in make(rng, SHAPES["gqa"], F32, F32))
    return [
        ("float64 q", (q.astype(np.float64), k, v), "dtype float64"),
        ("float64 k and v", (q, k.astype(np.float64), v.astype(np.float64)), "dtype float64"),
        ("int32 v", (q, k.astype(np.int32), v.astype(np.int32)), "dtype int32"),
        ("int8 q", (q.astype(np.int8), k, v), "dtype int8"),
        ("k fp16, v fp32", (q, k, v.astype(F32)), "k and v: dtypes float16 and float32 differ"),
        ("k fp32, v fp16", (q, k.astype(F32), v), "k and v: dtypes float32 and float16 differ"),
        ("big-endian fp16", (q.astype(">f2"), k, v), "native byte order"),
        ("complex", (q.astype(np.complex64), k, v), "dtype complex64"),
        ("misaligned fp16", (np.zeros(q.size * 2 + 2, np.uint8)[1:1 + q.size * 2].view(F16)
                             .reshape(q.shape), k, v), "aligned"),
    ]


@pytest.mark.parametrize("case", range(len(bad_type_cases(np.random.default_rng(0)))))
def test_bad_types_raise_and_leave_out(case):
    name, (q, k, v), words = bad_type_cases(np.random.default_rng(0))[case]
    out = np.full((2, 4, 9, 12), 42.0, F16)
    with pytest.raises(ValueError) as e:
        libsdpa.attention(q, k, v, out=out)
    assert words in str(e.value), (name, str(e.value))
    assert np.all(out == 42.0)


def test_fp32_only_operands_refuse_16bit():
    """LSE and the bias stay float32 (merge_states takes 16-bit O, its LSE stays float32)."""
    rng = np.random.default_rng(28)
    q, k, v = make(rng, SHAPES["gqa"], F16, F16)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="bias: dtype float16"):
        libsdpa.attention(q, k, v, bias=np.zeros((9, 13), F16))
    with pytest.raises(ValueError, match="lse: dtype float16"):
        libsdpa.attention_backward(q, k, v, o, lse.astype(F16), o)
    with pytest.raises(ValueError, match="o and do: dtypes float16 and float32 differ"):
        libsdpa.attention_backward(q, k, v, o, lse, widened(o))
    with pytest.raises(ValueError, match=r"lses\[0\]: dtype float16"):
        libsdpa.merge_states([o, o], [lse.astype(F16), lse])


@pytest.mark.parametrize("pt", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("ot", ["f32", "bf16", "f16"])
def test_merge_states_typed(pt, ot):
    """16-bit parts and O (sdpa_merge_states_typed): the bits of the float32 merge of
    the widened parts rounded once to O's type, and within half a unit of O's last place
    of a float64 merge of the parts as stored; in place into a part of O's type."""
    pt, ot = T(pt), T(ot)
    rng = np.random.default_rng(29)
    q, k, v = make(rng, SHAPES["gqa"], F32, F32)
    cut = k.shape[2] // 3
    parts = [libsdpa.attention(q, k[:, :, a:b], v[:, :, a:b], return_lse=True)
             for a, b in ((0, cut), (cut, cut + 1), (cut + 1, k.shape[2]))]
    outs = [o.astype(pt) for o, _ in parts]
    lses = [lse for _, lse in parts]
    om, lm = libsdpa.merge_states(outs, lses, out_dtype=ot)
    assert om.dtype == ot and lm.dtype == F32
    o32, l32 = libsdpa.merge_states([widened(o) for o in outs], lses)
    assert np.array_equal(bits(om), bits(rounded(o32, ot))), "not the float32 merge rounded once"
    assert np.array_equal(bits(lm), bits(l32))
    L = np.stack([x.astype(np.float64) for x in lses])
    M = L.max(0)
    w = np.exp(L - M)
    ref64 = (w[..., None] * np.stack([x.astype(np.float64) for x in outs])).sum(0) / w.sum(0)[..., None]
    half_ulp = {F32: 2.0 ** -24, F16: 2.0 ** -11}.get(ot, 2.0 ** -8)
    err = np.abs(om.astype(np.float64) - ref64) / (half_ulp * np.abs(ref64) + 48 * 2.0 ** -24)
    assert err.max() <= 1.0, err.max()
    if pt == ot:   # in place into part 0
        first = outs[0]
        o_in, _ = libsdpa.merge_states(outs, lses, out=first)
        assert o_in is first and np.array_equal(bits(first), bits(om))


def test_merge_states_typed_refused():
    """Parts of two types, and an out whose dtype is not out_dtype, are ValueErrors; an
    O of another type over a part's memory is the library's aliasing error."""
    rng = np.random.default_rng(30)
    q, k, v = make(rng, SHAPES["gqa"], F32, F32)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"outs\[1\]: dtype float32, expected float16"):
        libsdpa.merge_states([o.astype(F16), o], [lse, lse])
    with pytest.raises(ValueError, match="out: dtype float32, but out_dtype"):
        libsdpa.merge_states([o, o], [lse, lse], out=np.empty_like(o), out_dtype=np.float16)
    buf = np.zeros(o.size * 2, F16)
    parts32 = buf.view(F32).reshape(o.shape)
    parts32[...] = o
    over = buf[:o.size].reshape(o.shape)   # fp16 O over the fp32 part's first half
    before = buf.copy()
    with pytest.raises(libsdpa.SdpaError, match="an output overlaps an input"):
        libsdpa.merge_states([parts32, parts32], [lse, lse], out=over)
    assert np.array_equal(bits(buf), bits(before))


# ---------------------------------------------------------------- backward

def test_backward_16bit_matches_fp32():
    """Every tensor goes to sdpa_backward in its own type (nothing is computed in float32
    in Python instead): gradients in the types of q, k, v near the float32 backward on the
    same rounded values."""
    rng = np.random.default_rng(29)
    for qt, kvt in (("f16", "f16"), ("f32", "f16"), ("f16", "f32")):
        q, k, v = make(rng, SHAPES["gqa"], T(qt), T(kvt))
        o, lse = libsdpa.attention(q, k, v, return_lse=True, causal=True)
        do = rnd(rng, *o.shape).astype(o.dtype)
        assert libsdpa._api._backward_16bit()  # the bundled library computes it
        dq, dk, dv = libsdpa.attention_backward(q, k, v, o, lse, do, causal=True)
        assert (dq.dtype, dk.dtype, dv.dtype) == (q.dtype, k.dtype, k.dtype)
        want = libsdpa.attention_backward(widened(q), widened(k), widened(v), widened(o), lse,
                                          widened(do), causal=True)
        for g, w in zip((dq, dk, dv), want):
            eps = float(np.finfo(g.dtype).eps)
            np.testing.assert_allclose(widened(g), w, rtol=max(4 * eps, 5e-4),
                                       atol=4 * eps * float(np.abs(w).max()) + 5e-5)


def test_fp32_backward_unchanged():
    """float32 arrays: the same descriptor as before the storage types (all fp32)."""
    rng = np.random.default_rng(30)
    q, k, v = make(rng, SHAPES["gqa"], F32, F32)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    assert o.dtype == F32
    dq, dk, dv = libsdpa.attention_backward(q, k, v, o, lse, o)
    assert dq.dtype == dk.dtype == dv.dtype == F32


@needs_bf16
def test_bfloat16_sinks_and_slopes_are_widened():
    """Sinks and ALiBi slopes as ml_dtypes bfloat16 arrays (the models' storage): widened
    exactly, the bits of the float32 call (before: ValueError "dtype bfloat16 is not
    supported"). Out-of-range float64 values become inf and the library's status, with no
    NumPy overflow warning on the way (the library prints nothing)."""
    import warnings
    rng = np.random.default_rng(30)
    q, k, v = (rng.standard_normal((1, 2, 5, 8)).astype(F32) for _ in range(3))
    s, a = np.array([0.5, -1.25], dtype=BF16), np.array([0.25, 0.5], dtype=BF16)
    o16 = libsdpa.attention(q, k, v, sinks=s, alibi_slopes=a)
    o32 = libsdpa.attention(q, k, v, sinks=s.astype(F32), alibi_slopes=a.astype(F32))
    assert np.array_equal(o16, o32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(libsdpa.SdpaError):
            libsdpa.attention(q, k, v, sinks=np.array([1e39, 0.0]))
        with pytest.raises(libsdpa.SdpaError):
            libsdpa.attention(q, k, v, alibi_slopes=np.array([0.5, -1e39]))
