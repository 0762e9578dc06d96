# SPDX-License-Identifier: MIT
"""float64 NumPy reference of attention and its gradients (every mask and variant of
include/sdpa.h), on rank-4 arrays [B, H, T, D]."""
import numpy as np


def to4(a):
    a = np.asarray(a)
    while a.ndim < 4:
        a = a[None]
    return a


def allowed_and_logits(q, k, *, scale=None, causal=None, window=None, window_align=None,
                       kv_lengths=None, mask=None, bias=None, softcap=None, alibi_slopes=None):
    """q [B, Hq, Tq, Dk], k [B, Hkv, Tk, Dk] (float64, rank 4, B broadcast). Returns
    (x, pre, allowed, group): x the final logits (-inf masked), pre the scaled logits
    before softcap (for its derivative)."""
    B = max(q.shape[0], k.shape[0])
    q = np.broadcast_to(q, (B,) + q.shape[1:]).astype(np.float64)
    k = np.broadcast_to(k, (B,) + k.shape[1:]).astype(np.float64)
    _, Hq, Tq, Dk = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kr = np.repeat(k, g, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(Dk)
    scale = float(np.float32(scale))
    pre = scale * np.einsum("bhid,bhjd->bhij", q, kr)
    x = pre.copy()
    if softcap:
        c = float(np.float32(softcap))
        x = c * np.tanh(x / c)
    kvl = np.full(B, Tk) if kv_lengths is None else np.asarray(kv_lengths).astype(np.int64)
    cz = {None: 0, False: 0, True: 1, "top-left": 1, "bottom-right": 2}[causal]
    bottom = (cz == 2) or (cz == 0 and window_align == "bottom-right")
    i = np.arange(Tq)[:, None]
    j = np.arange(Tk)[None, :]
    allowed = np.ones((B, Hq, Tq, Tk), dtype=bool)
    for b in range(B):
        d = (kvl[b] - Tq) if bottom else 0
        a = j < kvl[b]
        if cz:
            a = a & (j <= i + d)
        if window is not None:
            left, right = window
            if left is not None and left >= 0:
                a = a & (j >= i + d - left)
            if right is not None and right >= 0:
                a = a & (j <= i + d + right)
        allowed[b] &= a
        if alibi_slopes is not None:
            sl = np.asarray(alibi_slopes, dtype=np.float32).astype(np.float64)
            x[b] -= sl[:, None, None] * np.abs(j - (i + d))[None]
    if mask is not None:
        m = np.asarray(mask)
        allowed &= np.broadcast_to(to4(m != 0), allowed.shape)
    if bias is not None:
        bb = np.broadcast_to(to4(np.asarray(bias, dtype=np.float64)), allowed.shape)
        x = x + bb
        allowed &= bb != -np.inf
    x = np.where(allowed, x, -np.inf)
    return x, pre, allowed, g, scale


def forward(q, k, v, *, sinks=None, **kw):
    """(O, LSE) float64 [B, Hq, Tq, Dv], [B, Hq, Tq]."""
    q4, k4, v4 = to4(q), to4(k), to4(v)
    x, _, allowed, g, _ = allowed_and_logits(q4, k4, **kw)
    B = x.shape[0]
    vr = np.repeat(np.broadcast_to(v4, (B,) + v4.shape[1:]).astype(np.float64), g, axis=1)
    m = x.max(axis=-1, keepdims=True)
    if sinks is not None:
        s = np.asarray(sinks, dtype=np.float32).astype(np.float64)[None, :, None, None]
        m = np.maximum(m, s)
    msafe = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - msafe)
    tot = e.sum(-1, keepdims=True)
    if sinks is not None:
        tot = tot + np.exp(s - msafe)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(tot > 0, msafe + np.log(tot), -np.inf)
        p = np.where(tot > 0, e / tot, 0.0)
    o = np.einsum("bhij,bhjd->bhid", p, vr)
    return o, lse[..., 0]


def backward(q, k, v, do, *, sinks=None, **kw):
    """(dq, dk, dv[, dsinks]) float64, rank 4, dk/dv summed over each GQA group and
    over a broadcast batch of 1."""
    q4, k4, v4, do4 = to4(q), to4(k), to4(v), to4(do).astype(np.float64)
    x, pre, allowed, g, scale = allowed_and_logits(q4, k4, **kw)
    B = x.shape[0]
    qb = np.broadcast_to(q4, (B,) + q4.shape[1:]).astype(np.float64)
    kr = np.repeat(np.broadcast_to(k4, (B,) + k4.shape[1:]).astype(np.float64), g, axis=1)
    vr = np.repeat(np.broadcast_to(v4, (B,) + v4.shape[1:]).astype(np.float64), g, axis=1)
    o, lse = forward(q, k, v, sinks=sinks, **kw)
    with np.errstate(invalid="ignore"):
        p = np.where(allowed, np.exp(x - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    dvr = np.einsum("bhij,bhid->bhjd", p, do4)
    dp = np.einsum("bhid,bhjd->bhij", do4, vr)
    D = (do4 * o).sum(-1, keepdims=True)
    ds = p * (dp - D)
    if kw.get("softcap"):
        c = float(np.float32(kw["softcap"]))
        ds = ds * (1 - np.tanh(pre / c) ** 2)
    dq = scale * np.einsum("bhij,bhjd->bhid", ds, kr)
    dkr = scale * np.einsum("bhij,bhid->bhjd", ds, qb)
    Hkv = k4.shape[1]

    def group(t):
        return t.reshape(B, Hkv, g, *t.shape[2:]).sum(2)

    dk, dv = group(dkr), group(dvr)
    if q4.shape[0] == 1 and B > 1:
        dq = dq.sum(0, keepdims=True)
    if k4.shape[0] == 1 and B > 1:
        dk = dk.sum(0, keepdims=True)
    if v4.shape[0] == 1 and B > 1:
        dv = dv.sum(0, keepdims=True)
    if sinks is None:
        return dq, dk, dv
    s = np.asarray(sinks, dtype=np.float32).astype(np.float64)[None, :, None]
    with np.errstate(invalid="ignore"):
        w = np.where(np.isfinite(lse), np.exp(s - lse), 0.0)
    dsinks = -(w * D[..., 0]).sum(axis=(0, 2))
    return dq, dk, dv, dsinks
