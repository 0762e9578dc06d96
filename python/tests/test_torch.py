# SPDX-License-Identifier: MIT
"""libsdpa.torch against torch.nn.functional.scaled_dot_product_attention (in float64):
masks, GQA, strided and broadcast inputs, gradients, the custom op's registrations
(opcheck), torch.compile without graph breaks, and patch(). Skipped without torch."""
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import libsdpa.torch as lt  # noqa: E402
import ref  # noqa: E402

F = torch.nn.functional


def ref_sdpa(q, k, v, **kw):
    """PyTorch's SDPA in float64 (math backend) with gradients."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    m = kw.get("attn_mask")
    if m is not None and m.dtype == torch.float32:
        kw = dict(kw, attn_mask=m.double())
    return (qd, kd, vd), F.scaled_dot_product_attention(qd, kd, vd, **kw)


def check(q, k, v, atol=2e-5, **kw):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = lt.scaled_dot_product_attention(q, k, v, **kw)
    ins, r = ref_sdpa(q, k, v, **kw)
    assert o.shape == r.shape and o.dtype == torch.float32
    torch.testing.assert_close(o.double(), r, atol=atol, rtol=1e-4)
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), do)
    want = torch.autograd.grad(r, ins, do.double())
    for g, w, t in zip(got, want, (q, k, v)):
        assert g.shape == t.shape
        torch.testing.assert_close(g.double(), w, atol=5e-5, rtol=5e-4)


def rn(*shape):
    return torch.randn(*shape)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def test_plain_and_scale():
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 8))
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 8), scale=0.3)


def test_causal():
    check(rn(2, 3, 9, 16), rn(2, 3, 9, 16), rn(2, 3, 9, 16), is_causal=True)
    check(rn(2, 3, 5, 16), rn(2, 3, 9, 16), rn(2, 3, 9, 16), is_causal=True)  # top-left


def test_bool_mask_broadcast():
    m = torch.rand(7, 11) < 0.7
    m[:, 0] = True   # no fully masked row (PyTorch gives NaN there, libsdpa 0)
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 16), attn_mask=m)
    m4 = torch.rand(2, 1, 7, 11) < 0.5
    m4[..., 3] = True
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 16), attn_mask=m4)


def test_float_mask():
    b = torch.randn(1, 3, 1, 11)
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 16), attn_mask=b)
    b = torch.randn(2, 3, 7, 11)
    b[0, 0, 0, 4] = -float("inf")
    check(rn(2, 3, 7, 16), rn(2, 3, 11, 16), rn(2, 3, 11, 16), attn_mask=b)


@pytest.mark.parametrize("hq,hkv", [(8, 2), (6, 1)])
def test_gqa(hq, hkv):
    check(rn(2, hq, 7, 16), rn(2, hkv, 10, 16), rn(2, hkv, 10, 16), is_causal=True,
          enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        lt.scaled_dot_product_attention(rn(2, hq, 7, 16), rn(2, hkv, 10, 16), rn(2, hkv, 10, 16))


def test_ranks():
    check(rn(7, 16), rn(9, 16), rn(9, 8))
    check(rn(3, 7, 16), rn(3, 9, 16), rn(3, 9, 8), is_causal=True)
    check(rn(2, 2, 3, 7, 16), rn(2, 2, 3, 9, 16), rn(2, 2, 3, 9, 8),
          attn_mask=torch.rand(2, 1, 1, 7, 9) < 2)


def test_strided_and_broadcast():
    qkv = rn(2, 10, 3, 4, 16)  # [B, T, 3, H, D]: the usual fused projection
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check(q, k, v, is_causal=True)
    # last dimension not contiguous: made contiguous by the wrapper
    check(rn(2, 3, 16, 7).transpose(-1, -2), rn(2, 3, 9, 16), rn(2, 3, 9, 16))
    # expanded (stride-0) key/value batch
    k1, v1 = rn(1, 3, 9, 16), rn(1, 3, 9, 16)
    check(rn(4, 3, 7, 16), k1.expand(4, 3, 9, 16), v1.expand(4, 3, 9, 16))


def test_kv_lengths_attention_matches_padding_mask():
    q, k, v = rn(3, 4, 6, 16), rn(3, 4, 10, 16), rn(3, 4, 10, 16)
    lens = torch.tensor([10, 4, 7], dtype=torch.int64)
    o = lt.attention(q, k, v, kv_lengths=lens)
    m = (torch.arange(10)[None, :] < lens[:, None])[:, None, None, :]
    r = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m)
    torch.testing.assert_close(o.double(), r, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="integer"):
        lt.attention(q, k, v, kv_lengths=lens.float())


def test_sinks_gradient():
    q, k, v = rn(2, 4, 5, 8), rn(2, 4, 7, 8), rn(2, 4, 7, 8)
    s = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    q.requires_grad_()
    o = lt.attention(q, k, v, sinks=s, causal="bottom-right")
    do = torch.randn_like(o)
    dq, ds = torch.autograd.grad(o, (q, s), do)
    want = ref.backward(q.detach().numpy(), k.numpy(), v.numpy(), do.numpy(),
                        sinks=s.detach().numpy(), causal="bottom-right")
    np.testing.assert_allclose(dq.numpy(), want[0], atol=5e-5, rtol=5e-4)
    np.testing.assert_allclose(ds.numpy(), want[3], atol=5e-5, rtol=5e-4)


def test_errors():
    q = rn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="dropout"):
        lt.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="dtype"):
        lt.scaled_dot_product_attention(q.double(), q.double(), q.double())
    with pytest.raises(ValueError, match="is_causal"):
        lt.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(4, 4, dtype=torch.bool),
                                        is_causal=True)


def test_opcheck():
    q, k, v = rn(2, 4, 5, 8), rn(2, 2, 7, 8), rn(2, 2, 7, 6)
    for t in (q, k, v):
        t.requires_grad_()
    args = (q, k, v, None, None, None, None, None, float("nan"), 1, -1, -1, 0, 0.0, 0)
    torch.library.opcheck(torch.ops.libsdpa.attention.default, args)
    sinks = torch.zeros(4, requires_grad=True)
    args = (q, k, v, torch.rand(5, 7) < 0.9, torch.randn(1, 4, 1, 7), torch.tensor([7, 3]),
            torch.ones(4), sinks, 0.5, 2, 3, -1, 0, 2.0, -2)
    torch.library.opcheck(torch.ops.libsdpa.attention.default, args)


class Block(torch.nn.Module):
    def __init__(self, d=32, h=4):
        super().__init__()
        self.h = h
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)

    def forward(self, x, sdpa):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4)
        y = sdpa(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


def test_torch_compile_fullgraph():
    m = Block()
    x = torch.randn(2, 10, 32)
    eager = m(x, lt.scaled_dot_product_attention)
    compiled = torch.compile(lambda x: m(x, lt.scaled_dot_product_attention), fullgraph=True,
                             backend="aot_eager")
    y = compiled(x)
    torch.testing.assert_close(y, eager)
    y.sum().backward()
    g_compiled = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    eager.sum().backward()
    for a, b in zip(g_compiled, (p.grad for p in m.parameters())):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", range(4))
def test_fast_kernel_same_call_as_general(case, monkeypatch):
    """lt._fast_kernel hands the library the descriptor and views that the general path
    (_api._Call over _raw views) builds, and gives the same bits."""
    qkv = rn(2, 7, 3, 4, 16)   # [B, T, 3, H, D]: strided views
    cases = [
        (rn(1, 1, 1, 8), rn(1, 1, 1, 8), rn(1, 1, 1, 8), float("nan"), 0),
        (rn(2, 8, 5, 16), rn(2, 2, 9, 16), rn(2, 2, 9, 12), 0.3, 1),
        tuple(qkv[:, :, i].transpose(1, 2) for i in range(3)) + (float("nan"), 2),
        (rn(3, 4, 6, 8).bfloat16(), rn(1, 2, 9, 8).half().expand(3, 2, 9, 8),
         rn(1, 2, 9, 8).half().expand(3, 2, 9, 8), float("nan"), 1),
    ]
    q, k, v, scale, causal = cases[case]
    seen, taken = [], []
    real_forward, real_fast = lt._b.forward_packed, lt._fast_kernel

    def spy(p, qt, kt, vt, ot, lt_):
        un = lt._b.TENSOR.unpack
        seen.append((p, qt, kt, vt, un(ot)[1:], None if lt_ is None else un(lt_)[1:]))
        return real_forward(p, qt, kt, vt, ot, lt_)

    def fast(*a):
        r = real_fast(*a)
        taken.append(r is not None)
        return r

    monkeypatch.setattr(lt._b, "forward_packed", spy)
    monkeypatch.setattr(lt, "_fast_kernel", fast)
    args = (q, k, v, None, None, None, None, None, scale, causal, -1, -1, 0, 0.0, 0)
    o1, l1 = lt._forward_kernel(*args)
    monkeypatch.setattr(lt, "_fast_kernel", lambda *a: None)
    o2, l2 = lt._forward_kernel(*args)
    assert taken == [True] and seen[0] == seen[1]
    assert o1.dtype == o2.dtype == q.dtype and torch.equal(o1, o2) and torch.equal(l1, l2)


def test_direct_call_only_in_plain_eager(monkeypatch):
    """attention() runs the op's kernel itself only where the op would add nothing (plain
    eager tensors, no gradient wanted); wanted gradients, FakeTensorMode, vmap and the
    profiler take the custom op."""
    q, k, v = rn(2, 4, 3, 8), rn(2, 4, 5, 8), rn(2, 4, 5, 8)
    ops = []
    real = lt._attention_op

    def spy(*a):
        ops.append(1)
        return real(*a)

    monkeypatch.setattr(lt, "_attention_op", spy)
    o = lt.scaled_dot_product_attention(q, k, v)
    assert not ops and o.grad_fn is None
    with torch.no_grad():
        lt.scaled_dot_product_attention(q.requires_grad_(), k, v)
    assert not ops
    og = lt.scaled_dot_product_attention(q, k, v)   # q wants a gradient
    assert ops == [1] and og.grad_fn is not None
    assert torch.equal(o, og)   # without the op (and without LSE): the same bits
    q.requires_grad_(False)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fq, fk, fv = torch.empty(2, 4, 3, 8), torch.empty(2, 4, 5, 8), torch.empty(2, 4, 5, 6)
        fo = lt.scaled_dot_product_attention(fq, fk, fv)
    assert ops == [1, 1] and fo.shape == (2, 4, 3, 6)
    with torch.autograd.profiler.profile() as prof:
        lt.scaled_dot_product_attention(q, k, v)
    assert ops == [1, 1, 1]
    assert any("libsdpa::attention" in e.name for e in prof.function_events)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # no batching rule for the op: torch's loop
        ov = torch.vmap(lambda a: lt.scaled_dot_product_attention(a, k[0], v[0]))(q)
    assert len(ops) >= 4
    import torch.autograd.forward_ad as fwAD
    n = len(ops)
    with fwAD.dual_level(), warnings.catch_warnings():   # a forward-mode AD level: the op
        warnings.simplefilter("ignore")   # (torch's own deprecation notes inside)
        lt.scaled_dot_product_attention(q, k, v)
        with pytest.raises(NotImplementedError):   # a tangent: refused before the op
            lt.scaled_dot_product_attention(fwAD.make_dual(q, torch.ones_like(q)), k, v)
    assert len(ops) == n + 1
    torch.testing.assert_close(ov, lt.scaled_dot_product_attention(q, k[:1], v[:1]))


def test_patch_routes_and_falls_back():
    m = Block()
    x = torch.randn(2, 10, 32)
    calls = []
    real = lt._attention_op

    with pytest.MonkeyPatch.context() as mp:
        def spy(*a):
            calls.append(1)
            return real(*a)
        mp.setattr(lt, "_attention_op", spy)
        with lt.patch():
            y = m(x, lambda *a, **kw: F.scaled_dot_product_attention(*a, **kw))
        assert calls, "patched SDPA did not reach libsdpa"
    assert F.scaled_dot_product_attention is lt._torch_sdpa
    r = m(x, F.scaled_dot_product_attention)
    torch.testing.assert_close(y, r, atol=2e-5, rtol=1e-4)
    lt._warned.clear()
    q = rn(1, 2, 4, 8).double()
    with lt.patch(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        F.scaled_dot_product_attention(q, q, q)
        F.scaled_dot_product_attention(q, q, q)
    msgs = [str(x.message) for x in w if "libsdpa" in str(x.message)]
    assert len(msgs) == 1 and "float64" in msgs[0]


def test_diagonal_offset_with_autograd():
    """libsdpa.torch.attention(diagonal_offset=) through the custom op: O and the
    gradients equal those of the same mask given as a bool mask."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(1, 2, 7, 8, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 11, 8, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 11, 8, generator=g, requires_grad=True)
    m = torch.arange(11)[None, :] <= torch.arange(7)[:, None] + 3
    o1 = lt.attention(q, k, v, causal=True, diagonal_offset=3)
    g1 = torch.autograd.grad(o1.sum(), (q, k, v))
    o2 = lt.attention(q, k, v, mask=m)
    g2 = torch.autograd.grad(o2.sum(), (q, k, v))
    torch.testing.assert_close(o1, o2, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        lt.attention(q, k, v, causal=True, diagonal_offset=2**49)


# Regressions of an adversarial review (session 30).

def test_patch_blocks_overlapping_across_threads_restore_torch():
    """Thread A enters patch(), B enters, A leaves, B leaves: torch's function is back.
    Before, B saved the patched function at entry and restored it: every later call in
    the process went through libsdpa with no block open."""
    import threading
    orig = F.scaled_dot_product_attention
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with lt.patch():
            a_in.set()
            b_in.wait()
        a_out.set()

    def b():
        a_in.wait()
        with lt.patch():
            b_in.set()
            a_out.wait()
            seen["inside_after_a"] = F.scaled_dot_product_attention is lt._patched

    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert seen["inside_after_a"], "B's block lost the patch when A's ended"
    assert F.scaled_dot_product_attention is orig
    with lt.patch():
        with lt.patch():
            pass
        assert F.scaled_dot_product_attention is lt._patched
    assert F.scaled_dot_product_attention is orig


def test_bfloat16_sinks_and_slopes():
    """Sinks and ALiBi slopes in bfloat16 (gpt-oss keeps its sinks so): widened exactly,
    the same O and sink gradient as their float32 values. Before: TypeError from .numpy()."""
    g = torch.Generator().manual_seed(30)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g) for _ in range(3))
    s16 = torch.tensor([0.5, -1.25], dtype=torch.bfloat16, requires_grad=True)
    a16 = torch.tensor([0.25, 0.5], dtype=torch.bfloat16)
    s32 = s16.detach().float().requires_grad_()
    o16 = lt.attention(q, k, v, sinks=s16, alibi_slopes=a16)
    o32 = lt.attention(q, k, v, sinks=s32, alibi_slopes=a16.float())
    assert torch.equal(o16, o32)
    (g16,) = torch.autograd.grad(o16.sum(), (s16,))
    (g32,) = torch.autograd.grad(o32.sum(), (s32,))
    assert g16.dtype == torch.bfloat16 and torch.equal(g16, g32.to(torch.bfloat16))


def test_forward_mode_ad_is_refused_not_zero():
    """torch.func.jvp and forward_ad through the custom op gave a tangent of zeros without
    a word; now NotImplementedError (under patch(): PyTorch's own function takes the call)."""
    import torch.autograd.forward_ad as fwAD
    q, k, v = rn(1, 2, 4, 8), rn(1, 2, 6, 8), rn(1, 2, 6, 8)
    for f in (lambda x: lt.scaled_dot_product_attention(x, k, v),
              lambda x: lt.attention(x, k, v, causal=True)):
        with pytest.raises(NotImplementedError):
            torch.func.jvp(f, (q,), (torch.ones_like(q),))
        with fwAD.dual_level(), pytest.raises(NotImplementedError):
            f(fwAD.make_dual(q, torch.ones_like(q)))
    # a forward-AD level whose tangents are elsewhere does not concern the call
    with fwAD.dual_level():
        fwAD.make_dual(rn(3), rn(3))
        torch.testing.assert_close(lt.attention(q, k, v), lt.attention(q, k, v))
    lt._warned.clear()
    with lt.patch(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _, t = torch.func.jvp(lambda x: F.scaled_dot_product_attention(x, k, v), (q,),
                                  (torch.ones_like(q),))
        except NotImplementedError:
            pass   # PyTorch's own refusal
        else:
            assert t.abs().sum() > 0, "a zero tangent under patch()"


def test_torch_keywords_are_checked_like_the_numpy_api():
    """attention()'s keywords: the NumPy API's checks and errors (before: a misspelled
    window_align became top-left silently, window=(1.5, 0) was truncated, window=[3]
    raised IndexError, scale="0.5" and softcap="2" were accepted, a NaN scale became the
    default scale, causal=np.True_ and 'none' were refused)."""
    q = rn(1, 2, 4, 8)
    bad = [dict(window=(1, 1), window_align="bottom_rigth"), dict(window=(1, 1), window_align=True),
           dict(window=(1.5, 0)), dict(window=(True, 0)), dict(window=(1, 2, 3)), dict(window=[3]),
           dict(window=5), dict(scale="0.5"), dict(softcap="2"), dict(softcap=1e-46),
           dict(causal=1), dict(causal="bottom-rigth")]
    for kw in bad:
        with pytest.raises(ValueError):
            lt.attention(q, q, q, **kw)
    with pytest.raises(lt._api.SdpaError) as e:
        lt.attention(q, q, q, scale=float("nan"))
    assert e.value.name == "SDPA_ERR_BAD_SCALE"
    with pytest.raises(lt._api.SdpaError):
        lt.scaled_dot_product_attention(q, q, q, scale=float("nan"))
    torch.testing.assert_close(lt.attention(q, q, q, causal=np.True_), lt.attention(q, q, q, causal=True))
    torch.testing.assert_close(lt.attention(q, q, q, causal="none"), lt.attention(q, q, q))
    torch.testing.assert_close(lt.attention(q, q, q, window=(np.int64(1), None), window_align="bottom_right"),
                               lt.attention(q, q, q, window=(1, None), window_align="bottom-right"))


# Regressions of a training-stack user trial (session 32).

def test_patch_compile_fullgraph_16bit_autograd_in_a_fresh_process():
    """torch.compile(fullgraph=True) of a patched SDPA call on bfloat16 tensors that want
    gradients, in a process where no 16-bit call ran before: the probe of the library's
    16-bit backward ran inside dynamo's trace and called the C extension ("Attempted to
    call function marked as skipped")."""
    code = textwrap.dedent("""
        import torch, torch.nn.functional as F, libsdpa.torch as lt
        torch.manual_seed(0)
        q, k, v = [torch.randn(1, 2, 16, 8, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        with lt.patch():
            f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                              fullgraph=True, backend="aot_eager")
            o = f(q, k, v)
        o.float().sum().backward()
        print("ok", q.grad is not None and bool(torch.isfinite(q.grad.float()).all()))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ok True" in r.stdout, r.stdout[-500:] + r.stderr[-3000:]


def test_torch_func_grad_falls_back_under_patch_and_is_refused_directly():
    """torch.func.grad (and vjp, jacrev) over SDPA: the custom op's autograd formula is
    torch.autograd's only, and the transform failed with a RuntimeError about
    autograd.Function and setup_context; patch() now hands such calls to PyTorch (one
    warning), and a direct call says what is not supported."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))

    def f(x):
        return F.scaled_dot_product_attention(x, k, v, is_causal=True).sum()
    ref = torch.func.grad(f)(q)
    lt._warned.clear()
    with lt.patch(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = torch.func.grad(f)(q)
        # outside a transform the same block still runs libsdpa
        assert lt._unsupported(q, k, v, None, 0.0, True, None, False) is None
    torch.testing.assert_close(got, ref)
    assert any("torch.func" in str(x.message) for x in w), [str(x.message) for x in w]
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.grad(lambda x: lt.scaled_dot_product_attention(x, k, v, is_causal=True).sum())(q)
    with pytest.raises(NotImplementedError, match="torch.func"):
        torch.func.jacrev(lambda x: lt.attention(x, k, v))(q)
    # attention over constants inside such a transform is no differentiation of it: fine
    c = torch.tensor(2.0)
    got = torch.func.grad(lambda x: lt.attention(q, k, v).sum() * x)(c)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v).sum())
    # vmap alone runs libsdpa
    vm = torch.vmap(lambda x: lt.scaled_dot_product_attention(x, k[0], v[0]))(q)
    torch.testing.assert_close(vm, F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=1e-5)


def test_attention_refuses_bias_and_slopes_that_want_gradients():
    """attention(bias=, alibi_slopes=) with tensors that require grad returned no gradient
    for them, silently (scaled_dot_product_attention already refused a float attn_mask
    that requires grad)."""
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    bias = torch.randn(1, 2, 5, 5, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], requires_grad=True)
    with pytest.raises(ValueError, match="bias"):
        lt.attention(q, q, q, bias=bias)
    with pytest.raises(ValueError, match="alibi_slopes"):
        lt.attention(q, q, q, alibi_slopes=slopes, causal=True)
    # no gradient wanted: accepted
    o1 = lt.attention(q, q, q, bias=bias.detach())
    with torch.no_grad():
        o2 = lt.attention(q, q, q, bias=bias)
        lt.attention(q, q, q, alibi_slopes=slopes, causal=True)
    torch.testing.assert_close(o1.detach(), o2)


def test_patch_head_dim_zero_with_the_default_scale_falls_back():
    """head_dim 0 with the default scale (1/sqrt(0)): libsdpa refuses it (SdpaError), and
    patch() did not hand it to PyTorch."""
    q, k, v = torch.randn(1, 1, 3, 0), torch.randn(1, 1, 4, 0), torch.randn(1, 1, 4, 5)
    ref = F.scaled_dot_product_attention(q, k, v)
    lt._warned.clear()
    with lt.patch(), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        got = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(got, ref, equal_nan=True)
    # a 0-d query still gets PyTorch's own error (the head_dim check comes after the ranks)
    with lt.patch(), pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(torch.tensor(1.0), k, v)


def test_patch_leaves_a_mask_that_does_not_broadcast_to_pytorch():
    """Under patch() a mask that does not broadcast raised libsdpa's ValueError where
    PyTorch raises RuntimeError (code catching PyTorch's error missed it; session 32
    trial): such a call now goes to PyTorch, which raises its own."""
    q = torch.randn(1, 2, 4, 8)
    lt._warned.clear()
    with lt.patch(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 5, dtype=torch.bool))
        # one that broadcasts still runs libsdpa
        assert lt._unsupported(q, q, q, torch.ones(4, 1, dtype=torch.bool), 0.0, False, None, False) is None
