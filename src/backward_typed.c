/* SPDX-License-Identifier: MIT */
/* backward_typed.c - the backward of a problem with a bf16 or fp16 tensor.
 *
 * One (batch, kv head) group at a time: the group's rows of Q, O, dO (its G query
 * heads) and of K, V are widened into fp32 buffers (exactly: every bf16 and fp16
 * value is an fp32 value), the fp32 backward runs on them as a problem of one
 * batch, G query heads and one kv head (sdpa_bwd_run, on the whole team, with the
 * group's slices of kv_lengths, the masks, the slopes and the sinks), and dQ, dK,
 * dV are narrowed into their tensors (round to nearest even). The buffers hold
 * one group's rows, O(G Tq D + Tk D) floats: never the whole tensor, never a Tq x
 * Tk matrix. The results are those of the fp32 backward on the rounded inputs,
 * rounded once, bitwise the same for any thread count. */
#include <string.h>

#include "backward.h"

/* The floats of one group's buffers: Q and dQ, O and dO, K and dK, V and dV. */
typedef struct group_bufs {
    size_t q, o, k, v;
} group_bufs;

static group_bufs bufs_of(const plan *pl)
{
    group_bufs g;
    g.q = round_floats((size_t)(pl->G * pl->Tq * pl->Dk));
    g.o = round_floats((size_t)(pl->G * pl->Tq * pl->Dv));
    g.k = round_floats((size_t)(pl->Tk * pl->Dk));
    g.v = round_floats((size_t)(pl->Tk * pl->Dv));
    return g;
}

/* The fp32 problem of group (b, hk): one batch, the G query heads h0 = hk G.., one
 * kv head, and every per-batch or per-head operand moved to them. */
static void group_plan(const plan *pl, int64_t b, int64_t hk, plan *gp)
{
    const int64_t h0 = hk * pl->G;
    *gp = *pl;
    gp->B = 1;
    gp->Hq = pl->G;
    gp->Hkv = 1;
    gp->kv_lengths = pl->kv_lengths ? pl->kv_lengths + b : NULL;
    if (pl->bm.data)
        gp->bm.data = pl->bm.data + b * pl->bm.batch_stride + h0 * pl->bm.head_stride;
    if (pl->bias.data)
        gp->bias.data = pl->bias.data + b * pl->bias.batch_stride + h0 * pl->bias.head_stride;
    gp->slopes = pl->slopes ? pl->slopes + h0 : NULL;
    gp->sinks = pl->sinks ? pl->sinks + h0 : NULL;
    gp->q_dtype = gp->kv_dtype = gp->o_dtype = SDPA_DTYPE_F32;
    gp->reduced = 0;
}

sdpa_status sdpa_bwd_typed_floats(const plan *pl, size_t *floats)
{
    plan gp;
    size_t f, nr;
    group_plan(pl, 0, 0, &gp);
    sdpa_status st = sdpa_bwd_workspace_floats(&gp, &f, &nr);
    if (st != SDPA_OK)
        return st;
    const group_bufs g = bufs_of(pl);
    size_t total = round_floats(f);
    const size_t parts[4] = {g.q, g.o, g.k, g.v};
    for (int i = 0; i < 4; i++)
        if (__builtin_add_overflow(total, 2 * parts[i], &total) || parts[i] > SIZE_MAX / 4)
            return SDPA_ERR_SIZE_OVERFLOW;
    *floats = total;
    return SDPA_OK;
}

/* Row src of type t (len elements) widened into dst. */
static void widen_row(const plan *pl, sdpa_dtype t, const void *src, int64_t len, float *dst)
{
    if (len == 0)
        return;
    if (t == SDPA_DTYPE_F32)
        memcpy(dst, src, (size_t)len * sizeof(float));
    else
        (t == SDPA_DTYPE_BF16 ? pl->kt->widen_bf16 : pl->kt->widen_f16)(1, (int)len, src, 1, dst, len);
}

/* Row src (len floats) narrowed into dst of type t. */
static void narrow_row(const plan *pl, sdpa_dtype t, const float *src, int64_t len, void *dst)
{
    if (len == 0)
        return;
    if (t == SDPA_DTYPE_F32)
        memcpy(dst, src, (size_t)len * sizeof(float));
    else
        (t == SDPA_DTYPE_BF16 ? pl->kt->narrow_bf16 : pl->kt->narrow_f16)(1, (int)len, src, len, dst, 1);
}

void sdpa_bwd_typed(const plan *pl, const bwd_views *x, float *ws, double *dsinks_acc)
{
    plan gp;
    size_t gf, nr;
    group_plan(pl, 0, 0, &gp);
    sdpa_bwd_workspace_floats(&gp, &gf, &nr);
    const group_bufs gb = bufs_of(pl);
    float *base = ws + round_floats(gf);
    float *q = carve(&base, gb.q), *dq = carve(&base, gb.q), *o = carve(&base, gb.o), *dout = carve(&base, gb.o);
    float *k = carve(&base, gb.k), *dk = carve(&base, gb.k), *v = carve(&base, gb.v), *dv = base;
    const int64_t G = pl->G, Tq = pl->Tq, Tk = pl->Tk, Dk = pl->Dk, Dv = pl->Dv;
    const sdpa_tensor tq = {q, G * Tq * Dk, Tq * Dk, Dk}, to = {o, G * Tq * Dv, Tq * Dv, Dv},
                      tdo = {dout, G * Tq * Dv, Tq * Dv, Dv}, tk = {k, Tk * Dk, Tk * Dk, Dk},
                      tv = {v, Tk * Dv, Tk * Dv, Dv};
    const sdpa_tensor_out tdq = {dq, G * Tq * Dk, Tq * Dk, Dk}, tdk = {dk, Tk * Dk, Tk * Dk, Dk},
                          tdv = {dv, Tk * Dv, Tk * Dv, Dv};
    for (int64_t b = 0; b < pl->B; b++)
        for (int64_t hk = 0; hk < pl->Hkv; hk++) {
            const int64_t h0 = hk * G;
            group_plan(pl, b, hk, &gp);
            for (int64_t g = 0; g < G; g++)
                for (int64_t i = 0; i < Tq; i++) {
                    const size_t r = (size_t)(g * Tq + i);
                    widen_row(pl, pl->q_dtype, row_in_t(x->q, pl->q_dtype, b, h0 + g, i), Dk, q + r * Dk);
                    widen_row(pl, pl->o_dtype, row_in_t(x->o, pl->o_dtype, b, h0 + g, i), Dv, o + r * Dv);
                    widen_row(pl, pl->o_dtype, row_in_t(x->dout, pl->o_dtype, b, h0 + g, i), Dv, dout + r * Dv);
                }
            for (int64_t j = 0; j < Tk; j++) {
                widen_row(pl, pl->kv_dtype, row_in_t(x->k, pl->kv_dtype, b, hk, j), Dk, k + (size_t)j * Dk);
                widen_row(pl, pl->kv_dtype, row_in_t(x->v, pl->kv_dtype, b, hk, j), Dv, v + (size_t)j * Dv);
            }
            const sdpa_tensor lse = {row_in(x->lse, b, h0, 0), x->lse->batch_stride, x->lse->head_stride,
                                     x->lse->seq_stride};
            const bwd_views gx = {&tq, &tk, &tv, &to, &lse, &tdo, &tdq, &tdk, &tdv};
            sdpa_bwd_run(&gp, &gx, ws, nr, dsinks_acc ? dsinks_acc + h0 : NULL);
            for (int64_t g = 0; g < G; g++)
                for (int64_t i = 0; i < Tq; i++)
                    narrow_row(pl, pl->q_dtype, dq + (size_t)(g * Tq + i) * Dk, Dk,
                               row_out_t(x->dq, pl->q_dtype, b, h0 + g, i));
            for (int64_t j = 0; j < Tk; j++) {
                narrow_row(pl, pl->kv_dtype, dk + (size_t)j * Dk, Dk, row_out_t(x->dk, pl->kv_dtype, b, hk, j));
                narrow_row(pl, pl->kv_dtype, dv + (size_t)j * Dv, Dv, row_out_t(x->dv, pl->kv_dtype, b, hk, j));
            }
        }
}
