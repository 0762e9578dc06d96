# SPDX-License-Identifier: MIT
"""Packed variable-length sequences and paged K/V (sdpa_seqs) through libsdpa.attention /
attention_backward: cu_seqlens_q, cu_seqlens_k, block_table, seq_lens_k, page_layout."""
import numpy as np
import pytest

import libsdpa

LQ = [5, 1, 0, 17, 9]
LK = [7, 3, 4, 17, 30]
HQ, HKV, DK, DV = 4, 2, 16, 12


def cu(lens, dtype=np.int32):
    return np.concatenate([[0], np.cumsum(lens)]).astype(dtype)


def packed(seed=0, lq=LQ, lk=LK):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((sum(lq), HQ, DK)).astype(np.float32)
    k = rng.standard_normal((sum(lk), HKV, DK)).astype(np.float32)
    v = rng.standard_normal((sum(lk), HKV, DV)).astype(np.float32)
    return q, k, v


def per_seq(x, c, b):
    """Sequence b of a token list, as a dense (1, H, T, D) / (1, H, T) array."""
    s = x[c[b]:c[b + 1]]
    return np.ascontiguousarray(np.moveaxis(s, 0, 1))[None]


KW = [{}, {"causal": True}, {"causal": "bottom-right"}, {"window": (3, 1)},
      {"causal": True, "softcap": 5.0, "alibi_slopes": [0.5, 0.25, 0.125, 0.0625],
       "sinks": [0.3, -1.0, 0.0, 2.0]}]


@pytest.mark.parametrize("kw", KW)
@pytest.mark.parametrize("threads", [1, 3])
def test_packed_forward_equals_dense_per_sequence(kw, threads):
    q, k, v = packed()
    cq, ck = cu(LQ), cu(LK)
    o, lse = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True,
                               threads=threads, **kw)
    assert o.shape == (sum(LQ), HQ, DV) and lse.shape == (sum(LQ), HQ)
    for b in range(len(LQ)):
        od, ld = libsdpa.attention(per_seq(q, cq, b), per_seq(k, ck, b), per_seq(v, ck, b),
                                   return_lse=True, threads=1, **kw)
        assert np.array_equal(per_seq(o, cq, b), od), b
        assert np.array_equal(per_seq(lse, cq, b), ld), b


def paged_cache(k, v, ck, block_size, layout, rng):
    """k, v token lists scattered into shuffled pages; returns caches, block table, lengths."""
    B = len(ck) - 1
    lens = np.diff(ck)
    m = max(1, int(max((n + block_size - 1) // block_size for n in lens)))
    need = sum((n + block_size - 1) // block_size for n in lens)
    nb = need + 3
    pages = rng.permutation(nb)
    kc = rng.standard_normal((nb, HKV, block_size, DK)).astype(np.float32)
    vc = rng.standard_normal((nb, HKV, block_size, DV)).astype(np.float32)
    bt = np.full((B, m), -1, np.int64)   # entries past a sequence's last page: never read
    it = iter(pages)
    for b in range(B):
        for j in range((lens[b] + block_size - 1) // block_size):
            p = next(it)
            bt[b, j] = p
            n = min(block_size, lens[b] - j * block_size)
            t0 = ck[b] + j * block_size
            kc[p, :, :n] = np.moveaxis(k[t0:t0 + n], 0, 1)
            vc[p, :, :n] = np.moveaxis(v[t0:t0 + n], 0, 1)
    if layout == "NHD":
        kc = np.ascontiguousarray(kc.transpose(0, 2, 1, 3))
        vc = np.ascontiguousarray(vc.transpose(0, 2, 1, 3))
    return kc, vc, bt, lens.astype(np.int64)


@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("kw", KW)
def test_paged_equals_packed(block_size, kw):
    """Bitwise when the key tiles match: block_k = block_size in both calls (the library
    cuts a paged sequence's key tiles at page boundaries, so other block_k may round
    differently); both layouts, shuffled pages, entries past the last page never read."""
    q, k, v = packed(1)
    cq, ck = cu(LQ), cu(LK)
    ref, ref_lse = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                     return_lse=True, threads=2, block_k=block_size, **kw)
    for layout in ("HND", "NHD"):
        kc, vc, bt, lens = paged_cache(k, v, ck, block_size, layout,
                                       np.random.default_rng(block_size))
        o, lse = libsdpa.attention(q, kc, vc, cu_seqlens_q=cq, block_table=bt,
                                   seq_lens_k=lens, page_layout=layout, return_lse=True,
                                   threads=2, block_k=block_size, **kw)
        assert np.array_equal(o, ref), layout
        assert np.array_equal(lse, ref_lse), layout


@pytest.mark.parametrize("block_size", [1, 3, 4])
@pytest.mark.parametrize("kw", KW[:3])
def test_paged_small_pages(block_size, kw):
    """Small pages: HND and NHD bitwise equal, other shuffles bitwise equal, and close to
    the packed call (the key tiles differ from its)."""
    q, k, v = packed(1)
    cq, ck = cu(LQ), cu(LK)
    ref = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **kw)
    outs = []
    for seed, layout in ((0, "HND"), (0, "NHD"), (1, "HND")):
        kc, vc, bt, lens = paged_cache(k, v, ck, block_size, layout,
                                       np.random.default_rng(seed))
        outs.append(libsdpa.attention(q, kc, vc, cu_seqlens_q=cq, block_table=bt,
                                      seq_lens_k=lens, page_layout=layout, **kw))
    assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])
    np.testing.assert_allclose(outs[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", KW)
def test_packed_backward_equals_dense_per_sequence(kw):
    q, k, v = packed(2)
    cq, ck = cu(LQ), cu(LK)
    o, lse = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True, **kw)
    do = np.random.default_rng(3).standard_normal(o.shape).astype(np.float32)
    g = libsdpa.attention_backward(q, k, v, o, lse, do, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                   threads=2, **kw)
    dq, dk, dv = g[:3]
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    dsinks = np.zeros(HQ, np.float32)
    for b in range(len(LQ)):
        args = [per_seq(x, c, b) for x, c in ((q, cq), (k, ck), (v, ck), (o, cq), (lse, cq),
                                             (do, cq))]
        gd = libsdpa.attention_backward(*args, threads=1, **kw)
        assert np.array_equal(per_seq(dq, cq, b), gd[0]), b
        assert np.array_equal(per_seq(dk, ck, b), gd[1]), b
        assert np.array_equal(per_seq(dv, ck, b), gd[2]), b
        if "sinks" in kw:
            dsinks += gd[3]
    if "sinks" in kw:
        np.testing.assert_allclose(g[3], dsinks, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.uint16, np.int8])
def test_int_dtypes_accepted(dtype):
    q, k, v = packed(4, [3, 2], [4, 5])
    o32 = libsdpa.attention(q, k, v, cu_seqlens_q=cu([3, 2]), cu_seqlens_k=cu([4, 5]))
    o = libsdpa.attention(q, k, v, cu_seqlens_q=cu([3, 2], dtype),
                          cu_seqlens_k=list(cu([4, 5])))
    assert np.array_equal(o, o32)


def test_out_and_out_dtype():
    q, k, v = packed(5)
    cq, ck = cu(LQ), cu(LK)
    ref = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    buf = np.full((sum(LQ), HQ, 2 * DV), 7.0, np.float32)
    out = buf[:, :, 3:3 + DV]
    r = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, out=out)
    assert r is out and np.array_equal(out, ref) and (buf[:, :, :3] == 7).all()
    h = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, out_dtype=np.float16)
    assert h.dtype == np.float16 and h.shape == ref.shape


def test_strided_token_lists():
    q, k, v = packed(6)
    cq, ck = cu(LQ), cu(LK)
    ref = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    qkv = np.concatenate([k, v[:, :, :4]], axis=2)   # a wider buffer: k is a strided view
    o = libsdpa.attention(q, qkv[:, :, :DK], v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert np.array_equal(o, ref)


def lib_error(name, f, *a, **kw):
    with pytest.raises(libsdpa.SdpaError) as e:
        f(*a, **kw)
    assert e.value.name == name, str(e.value)
    assert name in str(e.value)


def test_bad_tables_and_lengths_library_status():
    q, k, v = packed(7, [3, 2], [4, 5])
    att = libsdpa.attention
    lib_error("SDPA_ERR_BAD_SEQLENS", att, q, k, v, cu_seqlens_q=[0, 3, 4],
              cu_seqlens_k=cu([4, 5]))                                      # last != total_q
    lib_error("SDPA_ERR_BAD_SEQLENS", att, q, k, v, cu_seqlens_q=[0, 4, 5][::-1][::-1],
              cu_seqlens_k=[0, 6, 5])                                       # decreasing
    lib_error("SDPA_ERR_BAD_SEQLENS", att, q, k, v, cu_seqlens_q=[1, 3, 5],
              cu_seqlens_k=cu([4, 5]))                                      # not 0-based
    kc, vc, bt, lens = paged_cache(k, v, cu([4, 5]), 4, "HND", np.random.default_rng(0))
    nb = kc.shape[0]
    bad = bt.copy()
    bad[1, 0] = nb
    lib_error("SDPA_ERR_BAD_BLOCK_TABLE", att, q, kc, vc, cu_seqlens_q=cu([3, 2]),
              block_table=bad, seq_lens_k=lens)
    bad[1, 0] = -2
    lib_error("SDPA_ERR_BAD_BLOCK_TABLE", att, q, kc, vc, cu_seqlens_q=cu([3, 2]),
              block_table=bad, seq_lens_k=lens)
    lib_error("SDPA_ERR_BAD_SEQLENS", att, q, kc, vc, cu_seqlens_q=cu([3, 2]),
              block_table=bt, seq_lens_k=[4, bt.shape[1] * 4 + 1])           # beyond its row
    lib_error("SDPA_ERR_BAD_SEQLENS", att, q, kc, vc, cu_seqlens_q=cu([3, 2]),
              block_table=bt, seq_lens_k=[-1, 5])
    o, lse = att(q, k, v, cu_seqlens_q=cu([3, 2]), cu_seqlens_k=cu([4, 5]), return_lse=True)
    lib_error("SDPA_ERR_BAD_SEQLENS", libsdpa.attention_backward, q, k, v, o, lse, o,
              cu_seqlens_q=cu([3, 2]), cu_seqlens_k=[0, 4, 4])


def test_unused_table_entries_not_read():
    q, k, v = packed(8, [3, 2], [4, 5])
    kc, vc, bt, lens = paged_cache(k, v, cu([4, 5]), 4, "HND", np.random.default_rng(1))
    bt2 = np.concatenate([bt, np.full((2, 3), 10**6)], axis=1)   # past the last page
    a = libsdpa.attention(q, kc, vc, cu_seqlens_q=cu([3, 2]), block_table=bt, seq_lens_k=lens)
    b = libsdpa.attention(q, kc, vc, cu_seqlens_q=cu([3, 2]), block_table=bt2, seq_lens_k=lens)
    assert np.array_equal(a, b)


@pytest.mark.parametrize("case", [
    ("mask", {"mask": np.ones((1, 1, 5, 9), bool)}, "SDPA_ERR_UNSUPPORTED"),
    ("bias", {"bias": np.zeros((1, 1, 5, 9), np.float32)}, "SDPA_ERR_UNSUPPORTED"),
    ("kv_lengths", {"kv_lengths": [4, 5]}, "SDPA_ERR_UNSUPPORTED"),
    ("no cu_seqlens_q", {"cu_seqlens_q": None}, "cu_seqlens_q: needed"),
    ("cu_seqlens_q alone", {"cu_seqlens_k": None}, "cu_seqlens_k (packed K/V)"),
    ("float cu", {"cu_seqlens_q": np.array([0.0, 3.0, 5.0])}, "not an integer type"),
    ("bool cu", {"cu_seqlens_q": np.array([False, True, True])}, "not an integer type"),
    ("wraps int32", {"cu_seqlens_k": np.array([0, 4, 2**32 + 9])}, "fit int32"),
    ("cu_k length", {"cu_seqlens_k": [0, 9]}, "cu_seqlens_k: shape (2,), expected (3,)"),
    ("cu_q rank", {"cu_seqlens_q": [[0, 3, 5]]}, "cu_seqlens_q: shape"),
    ("both kinds", {"block_table": [[0], [1]], "seq_lens_k": [1, 1]}, "not both"),
    ("layout without pages", {"page_layout": "NHD"}, "page_layout"),
])
def test_refused_before_the_call(case):
    _, kw, msg = case
    q, k, v = packed(9, [3, 2], [4, 5])
    base = {"cu_seqlens_q": cu([3, 2]), "cu_seqlens_k": cu([4, 5])}
    base.update(kw)
    with pytest.raises(ValueError) as e:
        libsdpa.attention(q, k, v, **base)
    assert msg in str(e.value)
    assert not isinstance(e.value, libsdpa.SdpaError)


def test_refused_shapes():
    q, k, v = packed(10, [3, 2], [4, 5])
    cq, ck = cu([3, 2]), cu([4, 5])
    with pytest.raises(ValueError, match="token list"):
        libsdpa.attention(q[None], k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    with pytest.raises(ValueError, match="k: rank 4"):
        libsdpa.attention(q, k[None], v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    kc, vc, bt, lens = paged_cache(k, v, ck, 4, "HND", np.random.default_rng(2))
    with pytest.raises(ValueError, match="page_layout"):
        libsdpa.attention(q, kc, vc, cu_seqlens_q=cq, block_table=bt, seq_lens_k=lens,
                          page_layout="BHSD")
    with pytest.raises(ValueError, match="block_table: shape"):
        libsdpa.attention(q, kc, vc, cu_seqlens_q=cq, block_table=bt[0], seq_lens_k=lens)
    with pytest.raises(ValueError, match="paged K/V needs both"):
        libsdpa.attention(q, kc, vc, cu_seqlens_q=cq, block_table=bt)
    with pytest.raises(ValueError, match="head_dim"):
        libsdpa.attention(q[:, :, :8], k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    o, lse = libsdpa.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, return_lse=True)
    with pytest.raises(ValueError, match="cu_seqlens_k: needed"):
        libsdpa.attention_backward(q, k, v, o, lse, o, cu_seqlens_q=cq)
    with pytest.raises(ValueError, match="lse: shape"):
        libsdpa.attention_backward(q, k, v, o, lse[None], o, cu_seqlens_q=cq, cu_seqlens_k=ck)


def test_empty_sequences_and_no_sequences():
    q, k, v = packed(11, [0, 4, 0], [3, 0, 6])
    o, lse = libsdpa.attention(q, k, v, cu_seqlens_q=cu([0, 4, 0]), cu_seqlens_k=cu([3, 0, 6]),
                               return_lse=True)
    assert (o == 0).all() and np.isneginf(lse).all()   # sequence 1 has no keys
    q0 = np.zeros((0, HQ, DK), np.float32)
    o = libsdpa.attention(q0, k[:0], v[:0], cu_seqlens_q=[0], cu_seqlens_k=[0])
    assert o.shape == (0, HQ, DV)


def test_paged_cache_without_pages_when_no_sequence_has_keys():
    """A paged call whose cache has no page and whose sequences have no keys (a server's
    first step): O = 0 and LSE = -inf, as the packed call with no key token gives; it was
    refused ("the paged cache has no pages") where the packed one ran (session 32 review).
    With keys to read it is still refused."""
    q = np.random.default_rng(3).standard_normal((3, 2, 8)).astype(np.float32)
    for layout, kc in (("HND", np.zeros((0, 1, 4, 8), np.float32)), ("NHD", np.zeros((0, 4, 1, 8), np.float32))):
        o, lse = libsdpa.attention(q, kc, kc, cu_seqlens_q=[0, 1, 3], block_table=np.full((2, 1), -1),
                                   seq_lens_k=[0, 0], page_layout=layout, return_lse=True)
        op, lp = libsdpa.attention(q, np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 8), np.float32),
                                   cu_seqlens_q=[0, 1, 3], cu_seqlens_k=[0, 0, 0], return_lse=True)
        assert np.array_equal(o, op) and np.array_equal(lse, lp) and not o.any() and np.all(lse == -np.inf)
        with pytest.raises(ValueError, match="no pages"):
            libsdpa.attention(q, kc, kc, cu_seqlens_q=[0, 1, 3], block_table=np.zeros((2, 1), np.int32),
                              seq_lens_k=[0, 2], page_layout=layout)


def test_a_short_cu_seqlens_q_is_named_in_the_error():
    """B comes from cu_seqlens_q's length: one entry short, the error blamed cu_seqlens_k
    (or seq_lens_k, block_table) without saying why it expected that shape (session 32
    review); it now says where B came from."""
    q = np.zeros((3, 2, 8), np.float32)
    k = np.zeros((5, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"cu_seqlens_k: shape \(3,\), expected \(2,\) \(B = 1 sequences: "
                                         r"cu_seqlens_q has 2 entries\)"):
        libsdpa.attention(q, k, k, cu_seqlens_q=[0, 1], cu_seqlens_k=[0, 2, 5])
    kc = np.zeros((2, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens_q has 2 entries"):
        libsdpa.attention(q, kc, kc, cu_seqlens_q=[0, 1], block_table=np.zeros((1, 2), np.int32), seq_lens_k=[1, 2])
