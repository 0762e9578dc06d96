# SPDX-License-Identifier: MIT
"""libsdpa.torch with torch.bfloat16 / torch.float16 tensors: passed by data_ptr() with
their strides (no copy), O in the query's dtype, bit for bit the library's float32 call on
the widened inputs with O rounded (docs/design.md, "Reduced precision"; bf16 prefill on an
ISA that runs the bf16 pair products, libsdpa.info()["bf16_pairs_isas"], also rounds P to
bf16: then within that rounding); an fp32 query
over a 16-bit cache; the backward never upcasts (it raises where the library refuses
16-bit tensors); patch(); opcheck and torch.compile. Skipped without torch."""
import warnings

import pytest

torch = pytest.importorskip("torch")
import libsdpa  # noqa: E402
import libsdpa.torch as lt  # noqa: E402

F = torch.nn.functional
BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
ISAS = libsdpa.info()["supported_isas"]
PAIRS = libsdpa.info()["active_isa"] in libsdpa.info()["bf16_pairs_isas"]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def bits(t):
    t = t.contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def rn(*shape, dtype=F32):
    return torch.randn(*shape).to(dtype)


# (B, Hq, Hkv, Tq, Tk, D): prefill GQA, decode GQA / MQA over long caches, odd MHA
SHAPES = [(2, 4, 2, 9, 13, 16), (2, 8, 2, 1, 300, 64), (1, 8, 1, 1, 1000, 128),
          (1, 3, 3, 5, 7, 24), (1, 4, 2, 70, 90, 32)]


@pytest.mark.parametrize("dt", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_sdpa_bitwise_rounded_fp32(shape, dt):
    B, Hq, Hkv, Tq, Tk, D = shape
    q, k, v = rn(B, Hq, Tq, D, dtype=dt), rn(B, Hkv, Tk, D, dtype=dt), rn(B, Hkv, Tk, D, dtype=dt)
    for causal in (False, True):
        o = lt.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=Hq != Hkv)
        o32 = lt.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                              enable_gqa=Hq != Hkv)
        assert o.dtype == dt and o32.dtype == F32
        # P rounded to bf16 (relative error <= 2^-9 each) moves O by at most 2^-9 max|V|
        p_err = 2.0**-9 * float(v.float().abs().max()) if dt == BF16 and PAIRS and Tq > 1 else 0.0
        if p_err:
            torch.testing.assert_close(o.double(), o32.to(dt).double(), rtol=torch.finfo(dt).eps,
                                       atol=p_err)
        else:
            assert same_bits(o, o32.to(dt))
        # and near PyTorch's own SDPA in float64 on the same values (O's rounding only)
        r = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                           enable_gqa=Hq != Hkv)
        eps = torch.finfo(dt).eps
        torch.testing.assert_close(o.double(), r, rtol=eps, atol=4e-5 + p_err)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qt,kvt", [(F32, BF16), (F32, F16), (BF16, F16), (F16, F32)],
                         ids=["qf32_kvbf16", "qf32_kvf16", "qbf16_kvf16", "qf16_kvf32"])
def test_mixed_types(qt, kvt, isa):
    """An fp32 model over a bf16 cache (and the other mixes): O in q's type, bit for bit
    the fp32 call on the widened cache, rounded to q's type."""
    q, k, v = rn(2, 8, 1, 64, dtype=qt), rn(2, 2, 200, 64, dtype=kvt), rn(2, 2, 200, 64, dtype=kvt)
    libsdpa.force_isa(isa)
    try:
        o = lt.attention(q, k, v, causal="bottom-right", kv_lengths=torch.tensor([200, 77]))
        o32 = lt.attention(q.float(), k.float(), v.float(), causal="bottom-right",
                           kv_lengths=torch.tensor([200, 77]))
    finally:
        libsdpa.force_isa(None)
    assert o.dtype == qt
    assert same_bits(o, o32.to(qt))


def test_zero_copy_data_ptr(monkeypatch):
    """The library gets each tensor's own data_ptr() and element strides (a packed bf16
    QKV buffer's views, not copies), and writes O in place of a bf16 tensor."""
    qkv = rn(2, 10, 3, 4, 16, dtype=BF16)   # [B, T, 3, H, D]
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    seen = []
    real = lt._b.forward_packed

    def spy(p, qt, kt, vt, ot, lt_):   # the descriptor and views as packed bytes
        d = lt._b.Problem.from_buffer_copy(p)
        seen.append((d.q_dtype, d.kv_dtype, d.o_dtype) + tuple(
            lt._b.TENSOR.unpack(t) for t in (qt, kt, vt)))
        return real(p, qt, kt, vt, ot, lt_)

    monkeypatch.setattr(lt._b, "forward_packed", spy)
    o = lt.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert o.dtype == BF16
    (dq, dkv, do_, tq, tk, tv), = seen
    assert (dq, dkv, do_) == (1, 1, 1)   # SDPA_DTYPE_BF16
    for t, got in ((q, tq), (k, tk), (v, tv)):
        assert got == (t.data_ptr(),) + tuple(t.stride()[:3])
    monkeypatch.undo()
    o2 = lt.scaled_dot_product_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                         is_causal=True)
    assert same_bits(o, o2)


def test_broadcast_and_last_dim():
    q = rn(4, 3, 7, 16, dtype=F16)
    k1, v1 = rn(1, 3, 9, 16, dtype=F16), rn(1, 3, 9, 16, dtype=F16)
    o = lt.scaled_dot_product_attention(q, k1.expand(4, 3, 9, 16), v1.expand(4, 3, 9, 16))
    o32 = lt.scaled_dot_product_attention(q.float(), k1.float().expand(4, 3, 9, 16),
                                          v1.float().expand(4, 3, 9, 16))
    assert same_bits(o, o32.to(F16))
    qt = rn(2, 3, 16, 7, dtype=BF16).transpose(-1, -2)   # last dim not contiguous
    k, v = rn(2, 3, 9, 16, dtype=BF16), rn(2, 3, 9, 16, dtype=BF16)
    assert same_bits(lt.scaled_dot_product_attention(qt, k, v),
                     lt.scaled_dot_product_attention(qt.contiguous(), k, v))


def test_float_mask_in_query_dtype():
    """A float attn_mask of the query's 16-bit dtype (as PyTorch requires) is the bias,
    widened exactly: the same bits as the float32 mask of the same values."""
    q = rn(2, 3, 7, 16, dtype=BF16)
    k, v = rn(2, 3, 11, 16, dtype=BF16), rn(2, 3, 11, 16, dtype=BF16)
    m = rn(1, 3, 7, 11, dtype=BF16)
    m[0, 0, 0, 4] = -float("inf")
    o = lt.scaled_dot_product_attention(q, k, v, attn_mask=m)
    assert same_bits(o, lt.scaled_dot_product_attention(q, k, v, attn_mask=m.float()))
    with pytest.raises(ValueError, match="attn_mask"):
        lt.scaled_dot_product_attention(q, k, v, attn_mask=m.half())


def test_bad_types():
    q = rn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        lt.scaled_dot_product_attention(q, q.double(), q.double())
    with pytest.raises(ValueError, match="dtype torch.int32"):
        lt.attention(q.int(), q, q)
    with pytest.raises(ValueError, match="key and value: dtypes torch.bfloat16 and torch.float16"):
        lt.attention(q, q.bfloat16(), q.half())
    with pytest.raises(ValueError, match="key and value: dtypes"):
        lt.scaled_dot_product_attention(q.half(), q.half(), q)


def test_backward_16bit_matches_fp32():
    """The autograd backward hands the 16-bit tensors to sdpa_backward as they are (never
    a float32 gradient computed in their place): gradients in the types of q, k, v near
    the float32 backward on the same values."""
    for qt, kvt in ((BF16, BF16), (F16, F16), (F32, BF16)):
        q = rn(2, 4, 5, 16, dtype=qt).requires_grad_()
        k = rn(2, 2, 9, 16, dtype=kvt).requires_grad_()
        v = rn(2, 2, 9, 16, dtype=kvt).requires_grad_()
        o = lt.attention(q, k, v, causal="bottom-right")
        assert o.dtype == qt
        do = torch.randn_like(o)
        assert libsdpa._api._backward_16bit()  # the bundled library computes it
        got = torch.autograd.grad(o, (q, k, v), do)
        ins = [t.detach().float().requires_grad_() for t in (q, k, v)]
        # the float32 backward on the same values, with the stored (rounded) O
        o32 = lt.attention(*ins, causal="bottom-right")
        want = torch.autograd.grad(o32, ins, do.float())
        for g, w, t in zip(got, want, (q, k, v)):
            assert g.dtype == t.dtype and g.shape == t.shape
            eps = torch.finfo(t.dtype).eps
            torch.testing.assert_close(g.float(), w, rtol=max(8 * eps, 5e-4),
                                       atol=8 * eps * w.abs().max().item() + 5e-5)


def test_no_grad_16bit_needs_no_backward():
    q = rn(1, 2, 4, 8, dtype=F16).requires_grad_()
    with torch.no_grad():
        o = lt.scaled_dot_product_attention(q, q.detach(), q.detach())
    assert o.dtype == F16 and not o.requires_grad


def test_opcheck_16bit():
    for qt, kvt in ((BF16, BF16), (F16, F16), (F32, BF16)):
        q, k, v = rn(2, 4, 5, 8, dtype=qt), rn(2, 2, 7, 8, dtype=kvt), rn(2, 2, 7, 6, dtype=kvt)
        args = (q, k, v, None, None, None, None, None, float("nan"), 1, -1, -1, 0, 0.0, 0)
        torch.library.opcheck(torch.ops.libsdpa.attention.default, args)
        o, lse = torch.ops.libsdpa.attention(*args)
        assert o.dtype == qt and lse.dtype == F32


def test_torch_compile_bf16_inference():
    q, k, v = (rn(2, 4, 10, 16, dtype=BF16) for _ in range(3))
    f = torch.compile(lambda q, k, v: lt.scaled_dot_product_attention(q, k, v, is_causal=True) * 2,
                      fullgraph=True, backend="aot_eager")
    y = f(q, k, v)
    assert y.dtype == BF16
    assert same_bits(y, lt.scaled_dot_product_attention(q, k, v, is_causal=True) * 2)


def test_patch_16bit():
    calls = []
    real = lt._forward_kernel   # the op's kernel, also run without the op (lt._direct)
    q, k, v = rn(1, 2, 6, 8, dtype=BF16), rn(1, 2, 6, 8, dtype=BF16), rn(1, 2, 6, 8, dtype=BF16)
    with pytest.MonkeyPatch.context() as mp:
        def spy(*a, **kw):
            calls.append(a[0].dtype)
            return real(*a, **kw)
        mp.setattr(lt, "_forward_kernel", spy)
        lt._warned.clear()
        with lt.patch(), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            assert calls == [BF16] and o.dtype == BF16
            # mixed types: PyTorch's own call (and its error), not libsdpa's
            with pytest.raises(RuntimeError):
                F.scaled_dot_product_attention(q.float(), k, v)
            # gradients wanted: libsdpa only if its backward takes 16-bit tensors
            qg = q.clone().requires_grad_()
            og = F.scaled_dot_product_attention(qg, k, v, is_causal=True)
            og.sum().backward()
            assert qg.grad is not None and qg.grad.dtype == BF16
        msgs = [str(x.message) for x in w if "libsdpa" in str(x.message)]
        assert any("dtypes differ" in m for m in msgs)
        if libsdpa._api._backward_16bit():
            assert calls == [BF16, BF16]
        else:
            assert calls == [BF16] and any("autograd" in m for m in msgs)


# ---------------------------------------------------------------- merge_states

def test_attention_return_lse():
    """return_lse=True: the same O, the LSE of the NumPy API bit for bit, detached (O
    keeps its gradient); ranks 3 and 5 reshaped like O."""
    q, k, v = rn(2, 4, 9, 16), rn(2, 2, 13, 16), rn(2, 2, 13, 8)
    o, lse = lt.attention(q, k, v, causal=True, return_lse=True)
    assert same_bits(o, lt.attention(q, k, v, causal=True))
    _, lse_np = libsdpa.attention(q.numpy(), k.numpy(), v.numpy(), causal=True, return_lse=True)
    assert lse.dtype == F32 and tuple(lse.shape) == (2, 4, 9)
    assert torch.equal(bits(lse), bits(torch.from_numpy(lse_np)))
    qg = q.clone().requires_grad_()
    og, lg = lt.attention(qg, k, v, return_lse=True)
    assert og.requires_grad and not lg.requires_grad
    og.sum().backward()
    assert qg.grad is not None and torch.isfinite(qg.grad).all()
    o3, l3 = lt.attention(q[0], k[0], v[0], return_lse=True)
    assert tuple(o3.shape) == (4, 9, 8) and tuple(l3.shape) == (4, 9)
    o5, l5 = lt.attention(q[None], k[None], v[None], causal=True, return_lse=True)
    assert tuple(o5.shape) == (1, 2, 4, 9, 8) and tuple(l5.shape) == (1, 2, 4, 9)
    assert same_bits(o5[0], o) and torch.equal(bits(l5[0]), bits(lse))


@pytest.mark.parametrize("pt", [F32, BF16, F16])
@pytest.mark.parametrize("ot", [None, F32, BF16])
def test_merge_states(pt, ot):
    """Cascade attention: a shared prefix and a suffix computed apart, merged
    (sdpa_merge_states_typed): the bits of the float32 merge of the widened parts rounded
    once to O's type, close to the whole call; parts as strided views."""
    q, k, v = rn(1, 8, 3, 64, dtype=pt), rn(1, 2, 40, 64, dtype=pt), rn(1, 2, 40, 64, dtype=pt)
    o1, l1 = lt.attention(q, k[:, :, :25], v[:, :, :25], return_lse=True)
    o2, l2 = lt.attention(q, k[:, :, 25:], v[:, :, 25:], return_lse=True)
    o2 = o2.transpose(1, 2).contiguous().transpose(1, 2)   # [B, H, T, D] view of a BTHD buffer
    om, lm = lt.merge_states([o1, o2], [l1, l2], out_dtype=ot)
    assert om.dtype == (pt if ot is None else ot) and lm.dtype == F32
    o32, l32 = lt.merge_states([o1.float(), o2.float()], [l1, l2])
    assert same_bits(om, o32.to(om.dtype)) and same_bits(lm, l32)
    ow, lw = lt.attention(q, k, v, return_lse=True)
    tol = {F32: 2e-5, BF16: 2e-2, F16: 3e-3}[pt if ot is None or pt != F32 else ot]
    assert torch.allclose(om.float(), ow.float(), rtol=tol, atol=tol)
    assert torch.allclose(lm, lw, rtol=1e-5, atol=1e-5)


def test_merge_states_refused():
    o, l = lt.attention(rn(1, 2, 3, 8), rn(1, 2, 5, 8), rn(1, 2, 5, 8), return_lse=True)
    with pytest.raises(ValueError, match="the parts share one shape and one dtype"):
        lt.merge_states([o, o.to(BF16)], [l, l])
    with pytest.raises(ValueError, match=r"lses\[1\]"):
        lt.merge_states([o, o], [l, l.double()])
    with pytest.raises(ValueError, match="out_dtype"):
        lt.merge_states([o, o], [l, l], out_dtype=torch.float64)
    with pytest.raises(ValueError, match=r"outs\[0\]: rank 1"):
        lt.merge_states([o[0, 0, 0]], [l[0, 0]])


def test_merge_states_opcheck_and_compile():
    """libsdpa::merge_states passes torch.library.opcheck (fake kernel, schema) and
    traces under torch.compile(fullgraph=True) with the same bits."""
    o1, l1 = lt.attention(rn(1, 2, 3, 16), rn(1, 2, 5, 16), rn(1, 2, 5, 16), return_lse=True)
    o2, l2 = lt.attention(rn(1, 2, 3, 16), rn(1, 2, 7, 16), rn(1, 2, 7, 16), return_lse=True)
    for dt in (None, BF16):
        torch.library.opcheck(torch.ops.libsdpa.merge_states.default, ([o1, o2], [l1, l2], dt))
    f = torch.compile(lambda a, b, la, lb: lt.merge_states([a, b], [la, lb], out_dtype=BF16),
                      fullgraph=True)
    om, lm = f(o1, o2, l1, l2)
    oe, le = lt.merge_states([o1, o2], [l1, l2], out_dtype=BF16)
    assert same_bits(om, oe) and same_bits(lm, le)


def test_cascade_decode_readme():
    """The README's cascade attention: B decode rows over a shared prefix in one call, each
    over its own keys (kv_lengths), merged; against each request's whole attention in
    float32 (bf16 tensors: O's parts and the result each rounded once to bf16)."""
    B, Hq, Hkv, D, P = 4, 8, 2, 64, 300
    q = rn(B, Hq, 1, D, dtype=BF16)
    k_prefix, v_prefix = rn(1, Hkv, P, D, dtype=BF16), rn(1, Hkv, P, D, dtype=BF16)
    lens = torch.tensor([5, 17, 1, 40])
    k_own, v_own = rn(B, Hkv, 40, D, dtype=BF16), rn(B, Hkv, 40, D, dtype=BF16)
    o_pre, lse_pre = lt.attention(q.transpose(0, 2), k_prefix, v_prefix, return_lse=True)
    o_own, lse_own = lt.attention(q, k_own, v_own, kv_lengths=lens, return_lse=True)
    o, lse = lt.merge_states([o_pre.transpose(0, 2), o_own], [lse_pre.transpose(0, 2), lse_own])
    assert o.dtype == BF16 and tuple(o.shape) == (B, Hq, 1, D) and tuple(lse.shape) == (B, Hq, 1)
    for b in range(B):
        n = int(lens[b])
        k = torch.cat([k_prefix[0], k_own[b, :, :n]], 1)[None].float()
        v = torch.cat([v_prefix[0], v_own[b, :, :n]], 1)[None].float()
        ref, ref_lse = lt.attention(q[b:b + 1].float(), k, v, return_lse=True)
        assert torch.allclose(o[b:b + 1].float(), ref, rtol=2 ** -7, atol=2 ** -8)
        assert torch.allclose(lse[b:b + 1], ref_lse, rtol=1e-5, atol=1e-5)
