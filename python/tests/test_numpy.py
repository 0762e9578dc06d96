# SPDX-License-Identifier: MIT
"""libsdpa's NumPy API against the float64 reference (ref.py)."""
import threading

import numpy as np
import pytest

import libsdpa
import ref

RTOL, ATOL = 2e-4, 2e-5


def rnd(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def qkv(rng, B=2, Hq=4, Hkv=2, Tq=9, Tk=13, Dk=16, Dv=12):
    return rnd(rng, B, Hq, Tq, Dk), rnd(rng, B, Hkv, Tk, Dk), rnd(rng, B, Hkv, Tk, Dv)


def close(a, b, rtol=RTOL, atol=ATOL):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64).reshape(a.shape)
    fin = np.isfinite(b)
    assert np.array_equal(np.isfinite(a), fin), "infinite entries differ"
    assert np.array_equal(a[~fin], b[~fin])
    np.testing.assert_allclose(a[fin], b[fin], rtol=rtol, atol=atol)


# ---------------------------------------------------------------- package

def test_version_and_info():
    assert libsdpa.__version__ == libsdpa.info()["version"]
    info = libsdpa.info()
    for key in ("version", "active_isa", "compiled_isas", "supported_isas", "cpu_features",
                "openmp_threads", "library", "tuning", "bf16_pairs_isas",
                "bf16_pairs_backward_isas"):
        assert key in info
    assert info["active_isa"] in info["supported_isas"]
    assert info["tuning"].startswith("uarch ")
    assert set(info["bf16_pairs_isas"]) <= set(info["supported_isas"])
    assert set(info["bf16_pairs_backward_isas"]) <= set(info["supported_isas"])
    assert "scalar" in info["supported_isas"]
    assert info["openmp_threads"] >= 1
    # the bundled copy, never a system libsdpa
    import os
    assert os.path.dirname(info["library"]) == os.path.dirname(libsdpa.__file__) or \
        os.environ.get("LIBSDPA_LIBRARY")


# ---------------------------------------------------------------- forward

MASKS = {
    "plain": {},
    "scale": {"scale": 0.37},
    "causal_tl": {"causal": True},
    "causal_br": {"causal": "bottom-right"},
    "window_tl": {"window": (3, 2)},
    "window_br": {"window": (2, None), "window_align": "bottom-right"},
    "causal_window": {"causal": "bottom-right", "window": (4, None)},
    "kv_lengths": {"kv_lengths": np.array([13, 5], dtype=np.int64)},
    "kv_lengths_u8_causal_br": {"kv_lengths": np.array([7, 0], dtype=np.uint8),
                                "causal": "bottom-right"},
    "mask": {"mask": "bool"},
    "mask_u8_broadcast": {"mask": "u8_tq_tk"},
    "bias": {"bias": "full"},
    "bias_broadcast_inf": {"bias": "heads"},
    "softcap": {"softcap": 1.5},
    "alibi": {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]), "causal": True},
    "sinks": {"sinks": np.array([0.5, -1.0, 2.0, -np.inf], dtype=np.float32)},
    "sinks_all_masked": {"sinks": np.array([0.5, -1.0, 2.0, 1.0], dtype=np.float32),
                         "kv_lengths": np.array([0, 4], dtype=np.int32)},
    "everything": {"causal": "bottom-right", "window": (6, None), "softcap": 3.0,
                   "alibi_slopes": np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32),
                   "sinks": np.array([0.0, 1.0, -1.0, 0.5], dtype=np.float32),
                   "kv_lengths": np.array([11, 13], dtype=np.int16), "bias": "heads"},
}


def materialise(kw, rng, B=2, Hq=4, Tq=9, Tk=13):
    kw = dict(kw)
    if kw.get("mask") == "bool":
        m = rng.random((B, Hq, Tq, Tk)) < 0.7
        m[0, 0, 3, :] = False  # a fully masked row
        kw["mask"] = m
    elif kw.get("mask") == "u8_tq_tk":
        kw["mask"] = (rng.random((Tq, Tk)) < 0.6).astype(np.uint8)
    if kw.get("bias") == "full":
        kw["bias"] = rnd(rng, B, Hq, Tq, Tk)
    elif kw.get("bias") == "heads":
        b = rnd(rng, 1, Hq, 1, Tk)
        b[0, 1, 0, 2] = -np.inf
        kw["bias"] = b
    return kw


@pytest.mark.parametrize("name", sorted(MASKS))
def test_forward_masks(name):
    rng = np.random.default_rng(hash(name) % 2**32)
    q, k, v = qkv(rng)
    kw = materialise(MASKS[name], rng)
    o, lse = libsdpa.attention(q, k, v, return_lse=True, **kw)
    ro, rl = ref.forward(q, k, v, **kw)
    assert o.shape == (2, 4, 9, 12) and o.dtype == np.float32 and lse.shape == (2, 4, 9)
    close(o, ro)
    close(lse, rl)
    o2 = libsdpa.attention(q, k, v, **kw)
    assert np.array_equal(o, o2)


@pytest.mark.parametrize("name", sorted(MASKS))
def test_backward_masks(name):
    rng = np.random.default_rng(hash(name) % 2**32 + 1)
    q, k, v = qkv(rng)
    kw = materialise(MASKS[name], rng)
    o, lse = libsdpa.attention(q, k, v, return_lse=True, **kw)
    do = rnd(rng, *o.shape)
    got = libsdpa.attention_backward(q, k, v, o, lse, do, **kw)
    want = ref.backward(q, k, v, do, **kw)
    assert len(got) == len(want) == (4 if "sinks" in kw else 3)
    for g, w, a in zip(got, want, (q, k, v, None)):
        if a is not None:
            assert g.shape == a.shape and g.dtype == np.float32
        close(g, w, rtol=5e-4, atol=5e-5)


def test_backward_large_gradients_are_line_aligned():
    """dK, dV of 1 MiB or more start on a 64-byte line (the library streams a long decode
    backward's dK, dV with non-temporal stores only into aligned rows) and are ordinary
    C-order, writeable arrays with the right values."""
    rng = np.random.default_rng(64)
    q, k, v = qkv(rng, B=1, Hq=4, Hkv=2, Tq=1, Tk=1200, Dk=128, Dv=128)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    do = rnd(rng, *o.shape)
    dq, dk, dv = libsdpa.attention_backward(q, k, v, o, lse, do)
    for g, a in ((dk, k), (dv, v)):
        assert g.nbytes >= 1 << 20 and g.ctypes.data % 64 == 0
        assert g.shape == a.shape and g.dtype == np.float32 and g.flags.c_contiguous and g.flags.writeable
    want = ref.backward(q, k, v, do)
    for g, w in zip((dq, dk, dv), want):
        close(g, w, rtol=5e-4, atol=5e-5)


@pytest.mark.parametrize("rank", [2, 3, 4])
def test_ranks(rank):
    rng = np.random.default_rng(rank)
    shape_q = (2, 3, 7, 8)[4 - rank:]
    shape_k = (2, 3, 10, 8)[4 - rank:]
    q, k, v = rnd(rng, *shape_q), rnd(rng, *shape_k), rnd(rng, *shape_k)
    o, lse = libsdpa.attention(q, k, v, causal="bottom-right", return_lse=True)
    ro, rl = ref.forward(q, k, v, causal="bottom-right")
    assert o.shape == q.shape and lse.shape == q.shape[:-1]
    close(o, ro)
    close(lse, rl)
    do = rnd(rng, *o.shape)
    dq, dk, dv = libsdpa.attention_backward(q, k, v, o, lse, do, causal="bottom-right")
    rq, rk, rv = ref.backward(q, k, v, do, causal="bottom-right")
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    close(dq, rq, 5e-4, 5e-5)
    close(dk, rk, 5e-4, 5e-5)
    close(dv, rv, 5e-4, 5e-5)


@pytest.mark.parametrize("hq,hkv", [(8, 1), (8, 2), (6, 3), (4, 4)])
def test_gqa(hq, hkv):
    rng = np.random.default_rng(hq * 10 + hkv)
    q, k, v = qkv(rng, Hq=hq, Hkv=hkv)
    o, lse = libsdpa.attention(q, k, v, causal=True, return_lse=True)
    close(o, ref.forward(q, k, v, causal=True)[0])
    do = rnd(rng, *o.shape)
    for g, w in zip(libsdpa.attention_backward(q, k, v, o, lse, do, causal=True),
                    ref.backward(q, k, v, do, causal=True)):
        close(g, w, 5e-4, 5e-5)


def test_strided_packed_qkv_zero_copy():
    """q, k, v as views into one packed [B, T, 3, H, D] buffer (no copy)."""
    rng = np.random.default_rng(7)
    B, T, H, D = 2, 11, 3, 16
    packed = rnd(rng, B, T, 3, H, D)
    q, k, v = (packed[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    assert not q.flags.c_contiguous and np.shares_memory(q, packed)
    o, lse = libsdpa.attention(q, k, v, causal=True, return_lse=True)
    close(o, ref.forward(q, k, v, causal=True)[0])
    # the same numbers as the contiguous copies, bit for bit
    o2 = libsdpa.attention(*(np.ascontiguousarray(x) for x in (q, k, v)), causal=True)
    assert np.array_equal(o, o2)
    do = rnd(rng, *o.shape)
    for g, w in zip(libsdpa.attention_backward(q, k, v, o, lse, do, causal=True),
                    ref.backward(q, k, v, do, causal=True)):
        close(g, w, 5e-4, 5e-5)


def test_strided_rows_and_heads():
    rng = np.random.default_rng(8)
    big = rnd(rng, 3, 8, 30, 40)
    q = big[:, ::2, ::3, 5:21]     # head and row strides, offset, last dim contiguous
    k = big[:, 1::4, 1::2, 3:19]
    v = big[:, 2::4, 1::2, 20:28]
    o = libsdpa.attention(q, k, v)
    close(o, ref.forward(q, k, v)[0])


def test_broadcast_inputs():
    rng = np.random.default_rng(9)
    q = rnd(rng, 3, 4, 5, 8)
    k1, v1 = rnd(rng, 1, 2, 6, 8), rnd(rng, 1, 2, 6, 8)
    # stride-0 views from np.broadcast_to
    kb, vb = np.broadcast_to(k1, (3, 2, 6, 8)), np.broadcast_to(v1, (3, 2, 6, 8))
    assert kb.strides[0] == 0
    o1 = libsdpa.attention(q, kb, vb)
    # and a batch of 1 broadcast against q's batch
    o2 = libsdpa.attention(q, k1, v1)
    assert np.array_equal(o1, o2)
    close(o1, ref.forward(q, k1, v1)[0])
    # a broadcast query row (stride 0 along T)
    qr = np.broadcast_to(q[:, :, :1], q.shape)
    close(libsdpa.attention(qr, k1, v1), ref.forward(np.array(qr), k1, v1)[0])
    # gradients of a broadcast batch are summed over it
    o, lse = libsdpa.attention(q, k1, v1, return_lse=True)
    do = rnd(rng, *o.shape)
    dq, dk, dv = libsdpa.attention_backward(q, k1, v1, o, lse, do)
    assert dk.shape == k1.shape and dv.shape == v1.shape
    rq, rk, rv = ref.backward(q, k1, v1, do)
    close(dq, rq, 5e-4, 5e-5)
    close(dk, rk, 5e-4, 5e-5)
    close(dv, rv, 5e-4, 5e-5)


def test_out_argument_strided():
    rng = np.random.default_rng(10)
    q, k, v = qkv(rng)
    buf = np.full((2, 9, 4, 20), 7.0, dtype=np.float32)  # [B, T, H, Dv + pad]
    out = buf[..., :12].transpose(0, 2, 1, 3)
    res = libsdpa.attention(q, k, v, out=out)
    assert res is out
    close(out, ref.forward(q, k, v)[0])
    assert np.all(buf[..., 12:] == 7.0)


@pytest.mark.parametrize("isa", libsdpa.info()["supported_isas"])
def test_every_isa(isa):
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng)
    o = libsdpa.attention(q, k, v, causal=True, isa=isa, threads=1)
    close(o, ref.forward(q, k, v, causal=True)[0])


def test_threads_same_bits():
    rng = np.random.default_rng(12)
    q, k, v = qkv(rng, B=2, Hq=8, Hkv=2, Tq=70, Tk=90, Dk=32, Dv=32)
    a = libsdpa.attention(q, k, v, causal=True, threads=1)
    b = libsdpa.attention(q, k, v, causal=True, threads=2)
    assert np.array_equal(a, b)


def test_merge_states():
    rng = np.random.default_rng(13)
    q, k, v = qkv(rng, Tk=20)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    oa, la = libsdpa.attention(q, k[:, :, :8], v[:, :, :8], return_lse=True)
    ob, lb = libsdpa.attention(q, k[:, :, 8:], v[:, :, 8:], return_lse=True)
    om, lm = libsdpa.merge_states([oa, ob], [la, lb])
    close(om, o, 1e-5, 1e-6)
    close(lm, lse, 1e-5, 1e-6)


# ---------------------------------------------------------------- bad input

def bad_cases(rng):
    q, k, v = qkv(rng)
    return [
        ("float64 q", (q.astype(np.float64), k, v), {}, "dtype"),
        ("float16 k, float32 v", (q, k.astype(np.float16), v), {}, "dtype"),
        ("int v", (q, k, v.astype(np.int32)), {}, "dtype"),
        ("big-endian q", (q.astype(">f4"), k, v), {}, "dtype"),
        ("rank 5", (q[None], k[None], v[None]), {}, "rank"),
        ("rank 1", (q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]), {}, "rank"),
        ("rank mismatch", (q, k[0], v[0]), {}, "rank"),
        ("last dim strided", (np.asfortranarray(q), k, v), {}, "contiguous"),
        ("last dim step 2", (q, np.repeat(k, 2, -1)[..., ::2], v), {}, "contiguous"),
        ("negative stride", (q[:, :, ::-1], k, v), {}, "negative"),
        ("misaligned", (np.zeros(q.size * 4 + 4, np.uint8)[2:2 + q.size * 4].view(np.float32)
                        .reshape(q.shape), k, v), {}, "aligned"),
        ("Dk mismatch", (q, k[..., :8], v), {}, "head_dim"),
        ("v length", (q, k, v[:, :, :5]), {}, "length"),
        ("batch mismatch", (q, k[:, :, :], v), {"_q": 3}, "batch"),
        ("head grouping", (q[:, :3], k, v), {}, "SDPA_ERR_HEAD_GROUPING"),
        ("kv_lengths float", (q, k, v), {"kv_lengths": np.array([3.0, 4.0])}, "integer"),
        ("kv_lengths bool", (q, k, v), {"kv_lengths": np.array([True, True])}, "integer"),
        ("kv_lengths too big", (q, k, v), {"kv_lengths": np.array([14, 1])}, "kv_lengths"),
        ("kv_lengths wraps int32", (q, k, v), {"kv_lengths": np.array([2**32 + 3, 1])},
         "kv_lengths"),
        ("kv_lengths negative", (q, k, v), {"kv_lengths": np.array([-1, 1], np.int8)},
         "kv_lengths"),
        ("kv_lengths shape", (q, k, v), {"kv_lengths": np.array([1, 2, 3])}, "kv_lengths"),
        ("mask dtype", (q, k, v), {"mask": np.ones((9, 13), np.int32)}, "mask"),
        ("mask shape", (q, k, v), {"mask": np.ones((9, 12), bool)}, "broadcast"),
        ("bias dtype", (q, k, v), {"bias": np.zeros((9, 13))}, "bias"),
        ("causal name", (q, k, v), {"causal": "top"}, "causal"),
        ("window", (q, k, v), {"window": 3}, "window"),
        ("bad window", (q, k, v), {"window": (-5, None)}, "SDPA_ERR_BAD_WINDOW"),
        ("scale nan", (q, k, v), {"scale": float("nan")}, "SDPA_ERR_BAD_SCALE"),
        ("softcap", (q, k, v), {"softcap": -1.0}, "SDPA_ERR_BAD_SOFTCAP"),
        ("alibi nan", (q, k, v), {"alibi_slopes": np.array([np.nan, 1, 1, 1])},
         "SDPA_ERR_BAD_ALIBI"),
        ("alibi shape", (q, k, v), {"alibi_slopes": np.ones(2)}, "alibi_slopes"),
        ("sinks +inf", (q, k, v), {"sinks": np.array([np.inf, 1, 1, 1])}, "SDPA_ERR_BAD_SINKS"),
        ("threads", (q, k, v), {"threads": -1}, "threads"),
        ("isa name", (q, k, v), {"isa": "sse9"}, "isa"),
        # regressions (an adversarial review, session 29): accepted before, or another exception
        ("causal 1 (not True)", (q, k, v), {"causal": 1}, "causal"),
        ("causal 1.0", (q, k, v), {"causal": 1.0}, "causal"),
        ("scale as a string", (q, k, v), {"scale": "2"}, "scale"),
        ("scale bool", (q, k, v), {"scale": True}, "scale"),
        ("scale beyond a double (an int)", (q, k, v), {"scale": 10**400}, "SDPA_ERR_BAD_SCALE"),
        ("softcap rounds to 0 in float32", (q, k, v), {"softcap": 1e-46}, "softcap"),
    ]


@pytest.mark.parametrize("case", range(len(bad_cases(np.random.default_rng(0)))))
def test_bad_input_raises_and_leaves_out(case):
    rng = np.random.default_rng(0)
    name, (q, k, v), kw, words = bad_cases(rng)[case]
    if kw.pop("_q", None):
        q = np.concatenate([q, q[:1]])
    qs = q.shape[:-1] + (v.shape[-1],) if q.ndim in (2, 3, 4) else (1,)
    out = np.full(qs, 42.0, dtype=np.float32)
    with pytest.raises(ValueError) as e:
        libsdpa.attention(q, k, v, out=out, **kw)
    assert words.lower() in str(e.value).lower(), (name, str(e.value))
    assert np.all(out == 42.0)


def test_library_message_and_status():
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng)
    with pytest.raises(libsdpa.SdpaError) as e:
        libsdpa.attention(q[:, :3], k, v)
    assert e.value.status == -4 and e.value.name == "SDPA_ERR_HEAD_GROUPING"
    assert "q_heads is not a multiple of kv_heads" in str(e.value)


def test_aliasing_out_untouched():
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng, Dv=16)
    before = q.copy()
    with pytest.raises(libsdpa.SdpaError, match="ALIASING"):
        libsdpa.attention(q, k, v, out=q)
    assert np.array_equal(q, before)
    out = np.full((2, 4, 9, 16), 3.0, np.float32)
    with pytest.raises(ValueError):
        libsdpa.attention(q, k, v, out=out[..., :8])       # wrong shape
    with pytest.raises(ValueError):
        libsdpa.attention(q, k, v, out=out.astype(np.float64))
    ro = out.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        libsdpa.attention(q, k, v, out=ro)
    overlap = np.lib.stride_tricks.as_strided(out, (2, 4, 9, 16), (0, 64, 64, 4))
    with pytest.raises(libsdpa.SdpaError, match="BAD_STRIDE"):
        libsdpa.attention(q, k, v, out=overlap)
    assert np.all(out == 3.0)


def test_kv_lengths_beyond_int32_raise():
    """Regression (session 29): with Tk > 2^31 - 1 (broadcast keys), a length in (2^31 - 1,
    Tk] passed the range check and wrapped to int32 on its way to the library."""
    q = np.ones((1, 1, 1, 8), np.float32)
    kv = np.lib.stride_tricks.as_strided(np.ones(8, np.float32), (1, 1, 2**32 + 2, 8), (0, 0, 0, 4))
    with pytest.raises(ValueError, match="kv_lengths"):
        libsdpa.attention(q, kv, kv, kv_lengths=np.array([2**32 + 1]))


def test_merge_states_out_not_an_array():
    """Regression (session 29): out= / lse_out= of another type raised AttributeError."""
    o = np.ones((1, 1, 4, 8), np.float32)
    lse = np.zeros((1, 1, 4), np.float32)
    with pytest.raises(ValueError, match="out"):
        libsdpa.merge_states([o], [lse], out=[0])
    with pytest.raises(ValueError, match="lse_out"):
        libsdpa.merge_states([o], [lse], lse_out=[[0, 0, 0, 0]])


def test_backward_bad_input():
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="lse"):
        libsdpa.attention_backward(q, k, v, o, lse[..., :3], o)
    with pytest.raises(ValueError, match="dtype"):
        libsdpa.attention_backward(q, k, v, o, lse, o.astype(np.float64))
    with pytest.raises(ValueError, match="do"):
        libsdpa.attention_backward(q, k, v, o, lse, o[:, :2])


def test_empty():
    q = np.zeros((1, 2, 0, 8), np.float32)
    k = np.zeros((1, 2, 5, 8), np.float32)
    o = libsdpa.attention(q, k, k)
    assert o.shape == (1, 2, 0, 8)
    o, lse = libsdpa.attention(np.ones((1, 1, 3, 8), np.float32), k[:, :1, :0], k[:, :1, :0],
                               return_lse=True)
    assert np.all(o == 0) and np.all(lse == -np.inf)


@pytest.mark.parametrize("case", range(len(bad_cases(np.random.default_rng(0)))))
def test_bad_input_raises_without_out(case):
    """The same cases without out= (which takes attention()'s fast path when the rest is
    plain): the same errors, the fast path declines every one of them."""
    rng = np.random.default_rng(0)
    name, (q, k, v), kw, words = bad_cases(rng)[case]
    if kw.pop("_q", None):
        q = np.concatenate([q, q[:1]])
    with pytest.raises(ValueError) as e:
        libsdpa.attention(q, k, v, **kw)
    assert words.lower() in str(e.value).lower(), (name, str(e.value))


# ---------------------------------------------------------------- the fast path

def fast_path_cases():
    """(q, k, v, keywords) that attention()'s fast path (_api._fast_forward) takes."""
    rng = np.random.default_rng(8)
    f16 = np.float16
    packed = rnd(rng, 2, 11, 3, 4, 16)                        # [B, T, 3, H, D]
    pq, pk, pv = (packed[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
    big = rnd(rng, 3, 8, 30, 40)
    cases = [
        (rnd(rng, 1, 1, 1, 8),) * 3 + ({"threads": 1},),
        qkv(rng) + ({},),
        qkv(rng, B=1, Hq=8, Hkv=2, Tq=1, Tk=40) + ({"threads": 2, "return_lse": True},),
        qkv(rng, Tq=13) + ({"causal": True, "scale": 0.37},),
        qkv(rng, Tq=5) + ({"causal": "bottom-right", "return_lse": True},),
        (pq, pk, pv, {"causal": False}),
        (big[:, ::2, ::3, 5:21], big[:, 1::2, :17, 3:19], big[:, ::2, 2:19, 1:17], {}),
        tuple(x.astype(f16) for x in qkv(rng)) + ({"return_lse": True},),
        (rnd(rng, 2, 4, 3, 16),) + tuple(x.astype(f16) for x in qkv(rng)[1:]) + ({},),
        (rnd(rng, 1, 2, 1, 1), rnd(rng, 1, 2, 6, 1), rnd(rng, 1, 2, 6, 1), {}),
    ]
    return cases


@pytest.mark.parametrize("case", range(len(fast_path_cases())))
def test_fast_path_same_call_as_general(case, monkeypatch):
    """The fast path hands the library the very descriptor and q, k, v views that the
    general path (_Call) builds, O and LSE the same strides, and the results are the same
    bits."""
    from libsdpa import _api
    q, k, v, kw = fast_path_cases()[case]
    seen, taken = [], []
    real_forward, real_fast = _api._forward, _api._fast_forward

    def spy(p, qt, kt, vt, ot, lt):
        un = _api._b.TENSOR.unpack
        seen.append((p, qt, kt, vt, un(ot)[1:], None if lt is None else un(lt)[1:]))
        return real_forward(p, qt, kt, vt, ot, lt)

    def fast(*a):
        r = real_fast(*a)
        taken.append(r is not None)
        return r

    monkeypatch.setattr(_api, "_forward", spy)
    monkeypatch.setattr(_api, "_fast_forward", fast)
    monkeypatch.setattr(_api, "_fast_c", None)     # the Python fast path (C's: below)
    r1 = libsdpa.attention(q, k, v, **kw)
    monkeypatch.setattr(_api, "_fast_forward", lambda *a: None)
    r2 = libsdpa.attention(q, k, v, **kw)
    assert taken == [True]
    assert seen[0] == seen[1]
    for a, b in zip(r1 if isinstance(r1, tuple) else (r1,), r2 if isinstance(r2, tuple) else (r2,)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _fast_c_or_skip():
    from libsdpa import _api
    if _api._fast_c is None:
        pytest.skip("libsdpa._fastpath not built (no Python or NumPy headers at build time)")
    from libsdpa import _fastpath
    return _api, _fastpath


@pytest.mark.parametrize("case", range(len(fast_path_cases())))
def test_fast_c_same_call_as_python_fast_path(case, monkeypatch):
    """The C fast path (libsdpa._fastpath) takes every case the Python one takes, hands the
    library the same descriptor and q, k, v views (describe() gives its bytes), and the
    results are the bits of the general path's."""
    _api, fp = _fast_c_or_skip()
    q, k, v, kw = fast_path_cases()[case]
    seen = []
    real_forward = _api._forward

    def spy(p, qt, kt, vt, ot, lt):
        seen.append((p, qt, kt, vt))
        return real_forward(p, qt, kt, vt, ot, lt)

    r1 = libsdpa.attention(q, k, v, **kw)             # through C: no ctypes call
    monkeypatch.setattr(_api, "_forward", spy)
    monkeypatch.setattr(_api, "_fast_c", None)
    libsdpa.attention(q, k, v, **kw)                  # the Python fast path
    monkeypatch.setattr(_api, "_fast_forward", lambda *a: None)
    r2 = libsdpa.attention(q, k, v, **kw)             # the general path
    assert len(seen) == 2 and seen[0] == seen[1]
    d = fp.describe(q, k, v, kw.get("scale"), kw.get("causal"), kw.get("threads", 0))
    assert d == seen[0]
    for a, b in zip(r1 if isinstance(r1, tuple) else (r1,), r2 if isinstance(r2, tuple) else (r2,)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.flags.c_contiguous
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_fast_c_declines_what_python_declines():
    """Calls outside the common case: describe() says None (attention() then goes on to the
    Python paths), and a refused call returns None from forward() rather than raising, so
    the general path words the error."""
    _api, fp = _fast_c_or_skip()
    rng = np.random.default_rng(3)
    q, k, v = qkv(rng)
    sub = q.view(type("Sub", (np.ndarray,), {}))
    declined = [
        (q[0], k[0], v[0], None, None, 0),                      # rank 3
        (sub, k, v, None, None, 0),                             # a subclass
        (q.astype(np.float64), k, v, None, None, 0),            # float64
        (q.astype(q.dtype.newbyteorder()), k, v, None, None, 0),  # swapped bytes
        (q, k, v.astype(np.float16), None, None, 0),            # k and v of two types
        (q[..., ::2], k[..., ::2], v[..., ::2], None, None, 0),  # last dim strided
        (q[:, ::-1], k, v, None, None, 0),                      # negative stride
        (q[:, :, :0], k, v, None, None, 0),                     # empty
        (q, k[:, :, :3], v, None, None, 0),                     # Tk of k and v differ
        (q, k, v, 1, None, 0),                                  # int scale
        (q, k, v, 1e39, None, 0),                               # beyond float32
        (q, k, v, None, "sideways", 0),                         # unknown causal
        (q, k, v, None, [1], 0),                                # unhashable causal
        (q, k, v, None, None, -1),                              # negative threads
        (q, k, v, None, None, 2**31),                           # threads beyond int
        (q, k, v, None, None, True),                            # bool threads
    ]
    for i, a in enumerate(declined):
        assert fp.describe(*a) is None, i
        assert fp.forward(*a, False) is None, i
    # taken by describe, refused by the library (GQA grouping): forward() says None
    qb = rng.standard_normal((2, 3, 4, 16), dtype=np.float32)
    assert fp.describe(qb, k, v, None, None, 0) is not None
    assert fp.forward(qb, k, v, None, None, 0, False) is None
    with pytest.raises(libsdpa.SdpaError):
        libsdpa.attention(qb, k, v)


def test_fast_c_causal_that_reshapes_q():
    """A causal= object whose __eq__ reshapes q (numpy frees the old shape storage) and
    allocates over it. causal= takes None, a bool or a name only (since session 29: 1 and
    1.0 had been taken as True through the dict lookup), so such an object is refused
    with ValueError; the fast path declines it without running its __eq__, and a str
    subclass with the same __eq__ gets the general path's lookup (Python code only)."""
    _fast_c_or_skip()
    rng = np.random.default_rng(5)
    q, k, v = rnd(rng, 1, 1, 2, 64), rnd(rng, 1, 1, 1, 64), rnd(rng, 1, 1, 1, 4)
    calls = []

    class Causal:
        def __hash__(self):
            return hash(True)

        def __eq__(self, other):
            calls.append(other)
            q.shape = q.shape
            np.empty((3, 5, 7, 9), np.uint8)
            return other is True

    with pytest.raises(ValueError, match="causal"):
        libsdpa.attention(q, k, v, causal=Causal())
    assert not calls

    class Name(str):
        def __hash__(self):
            return hash("top-left")

        def __eq__(self, other):
            calls.append(other)
            q.shape = q.shape
            np.empty((3, 5, 7, 9), np.uint8)
            return str.__eq__(self, other)

    o = libsdpa.attention(q, k, v, causal=Name("top-left"))
    assert o.shape == (1, 1, 2, 4)
    assert np.array_equal(o, libsdpa.attention(q, k, v, causal=True, out=np.empty_like(o)))


def test_fast_c_keeps_dtype_metadata():
    """O has q's dtype object, metadata included, as numpy.empty(shape, q.dtype) gives."""
    _fast_c_or_skip()
    for t in (np.float32, np.float16):
        dt = np.dtype(t, metadata={"unit": "m"})
        q = np.ones((1, 1, 4, 8), dt)
        assert libsdpa.attention(q, q, q).dtype.metadata == {"unit": "m"}


def test_fast_c_timing_checks_the_clock():
    _, fp = _fast_c_or_skip()
    import time
    with pytest.raises(ValueError):
        fp.timing(1000)
    with pytest.raises((ValueError, OverflowError)):
        fp.timing(2**32 + 1)
    fp.timing(time.CLOCK_MONOTONIC)
    fp.timing(-1)
    assert fp.inside_ns() == 0


def test_data_pointer_route():
    """_api._data_ptr (the address read from the array object where that was verified at
    import) agrees with ndarray.ctypes.data on views of every kind."""
    from libsdpa import _api
    base = np.arange(300, dtype=np.float32)
    views = [base, base[7:], base[::-3], base.reshape(10, 30)[3:, 2::4], base.view(np.float16)[5:],
             np.broadcast_to(base[9:10], (3, 4)), np.empty((0, 4)), np.asfortranarray(
                 base.reshape(10, 30)), base.reshape(10, 30).T[1:], np.zeros((2, 3), bool)]
    for a in views:
        assert _api._data_ptr(a) == a.ctypes.data


# ---------------------------------------------------------------- threads

def test_sixteen_python_threads_same_bits():
    """16 Python threads call at once (the GIL is released in the C call): each result
    is bitwise the single-threaded one."""
    rng = np.random.default_rng(4)
    problems = []
    for i in range(16):
        q, k, v = qkv(rng, B=1 + i % 2, Hq=4, Hkv=1 + (i % 2) * 3 // 3, Tq=17 + i, Tk=40 + 3 * i,
                      Dk=32, Dv=16)
        kw = {"causal": [None, True, "bottom-right"][i % 3], "kv_lengths": None}
        if i % 4 == 3:
            kw["softcap"] = 2.0
        problems.append((q, k, v, kw))
    expect = []
    for q, k, v, kw in problems:
        o, lse = libsdpa.attention(q, k, v, return_lse=True, threads=1, **kw)
        g = libsdpa.attention_backward(q, k, v, o, lse, o, threads=1, **kw)
        expect.append((o, lse) + g)
    got = [None] * 16
    errors = []
    barrier = threading.Barrier(16)

    def work(i):
        try:
            q, k, v, kw = problems[i]
            barrier.wait()
            res = []
            for _ in range(5):
                o, lse = libsdpa.attention(q, k, v, return_lse=True, threads=1 + i % 2, **kw)
                g = libsdpa.attention_backward(q, k, v, o, lse, o, threads=1 + i % 2, **kw)
                res.append((o, lse) + g)
            got[i] = res
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for i in range(16):
        for res in got[i]:
            for a, b in zip(res, expect[i]):
                assert np.array_equal(a, b), i


def test_gil_released():
    """A Python thread keeps running while another is inside a long C call.

    The problem grows until one call lasts at least 0.1 s on this machine, so the
    middle of the call is a window wide enough for the spinner whatever the CPU's
    speed; no speed is asserted."""
    import time
    rng = np.random.default_rng(5)
    batch = 2
    while True:
        q, k, v = qkv(rng, B=batch, Hq=8, Hkv=8, Tq=512, Tk=512, Dk=64, Dv=64)
        libsdpa.attention(q, k, v, threads=1)
        t0 = time.perf_counter()
        libsdpa.attention(q, k, v, threads=1)
        one = time.perf_counter() - t0
        if one >= 0.1 or batch >= 256:
            break
        batch *= 2
    hits = [0]
    window = [float("inf"), float("-inf")]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            t = time.perf_counter()
            if window[0] < t < window[1]:
                hits[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.02)
        t0 = time.perf_counter()
        window[:] = [t0 + 0.3 * one, t0 + 0.7 * one]
        libsdpa.attention(q, k, v, threads=1)
    finally:
        stop.set()
        t.join()
    # with the GIL held through the call the spinner could not run inside that window
    assert hits[0] > 0, (one, batch, hits[0])


# ---------------------------------------------------------------- diagonal_offset

@pytest.mark.parametrize("off", [-5, 0, 3, 40])
def test_diagonal_offset_against_reference(off):
    """diagonal_offset reaches the library: causal masking on the moved diagonal (query i
    sees keys j <= i + off) gives what the same mask given as a boolean mask gives, forward
    and backward (the library's float64-reference tests cover the offset itself)."""
    rng = np.random.default_rng(11)
    q, k, v = qkv(rng, B=1, Hq=2, Hkv=1, Tq=9, Tk=13)
    o, lse = libsdpa.attention(q, k, v, causal=True, diagonal_offset=off, return_lse=True)
    i = np.arange(9)[:, None]
    j = np.arange(13)[None, :]
    m = j <= i + off
    o2, lse2 = libsdpa.attention(q, k, v, mask=m, return_lse=True)
    close(o, o2)
    close(lse, lse2)
    do = rnd(rng, 1, 2, 9, 12)
    g1 = libsdpa.attention_backward(q, k, v, o, lse, do, causal=True, diagonal_offset=off)
    g2 = libsdpa.attention_backward(q, k, v, o2, lse2, do, mask=m)
    for a, b in zip(g1, g2):
        close(a, b)


def test_diagonal_offset_refusals():
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng)
    for bad in (True, 1.5, "3", 2**48 + 1, -(2**48) - 1):
        with pytest.raises(ValueError):
            libsdpa.attention(q, k, v, causal=True, diagonal_offset=bad)


def test_bad_scale_error_speaks_python():
    """A NaN, infinite or (head_dim 0) default scale: the library's status text names C
    descriptor fields (use_default_scale); the error also says what to pass in Python
    (session 32 review)."""
    q = np.ones((1, 1, 2, 4), np.float32)
    for kw in ({"scale": float("nan")}, {"scale": float("inf")}):
        with pytest.raises(libsdpa.SdpaError, match="in Python: scale must be a finite number"):
            libsdpa.attention(q, q, q, **kw)
    z = np.ones((1, 1, 2, 0), np.float32)
    with pytest.raises(libsdpa.SdpaError, match="needs head_dim > 0"):
        libsdpa.attention(z, z, q)
