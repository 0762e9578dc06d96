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
 * rounded once, bitwise the same for any thread count. An fp32 Q that the forward
 * read rounded to bf16 (sdpa_rounds_q_bf16) is rounded the same way as it is widened.
 *
 * A group of one query tile (decode: every key tile meets all of the group's
 * query rows in one pair) runs over its keys in chunks of about
 * BWD_KV_CHUNK_BYTES of fp32 K, V, dK and dV, so that the copies stay in the
 * core's cache instead of making three more passes over memory: each chunk's
 * keys are widened, the fp32 backward runs on them as a problem of those keys
 * (its mask geometry moved to them: the aligned diagonal made explicit, the
 * key length clipped, mask and bias columns offset), its dK and dV rows are
 * narrowed at once, and dQ sums the chunks' dQ in chunk order. A key tile's
 * dK and dV come from the same single pair either way, so they are the
 * unchunked backward's bits; dQ is summed in another grouping. Groups with
 * ALiBi, sinks, or a row whose LSE needs the statistics pass (its max and sum
 * recomputed over all of the keys) run unchunked.
 *
 * Decode groups over a bf16 / fp16 K/V take the fused path instead where they can
 * (plan_fused, group_fused: at most bwd_rows_max_rows rows sharing one key range, no
 * softcap, ALiBi, boolean mask, bias or sinks, every LSE finite and exact): the
 * table's bwd_rows (simd/bwd_rows.h) reads each K and V row once, widened in
 * registers, and writes its dK and dV rows once, narrowed, with nothing widened into
 * buffers but the group's few query rows. Its key chunks (fused_chunk, from Tk alone)
 * each give a dQ summed from zero; the chunks' dQ are added in chunk order, on one
 * thread or after the team has shared the chunks: the same bits either way. */
#include <string.h>

#include "backward.h"

/* The floats of one group's buffers: Q and dQ (and dQ's chunk sum), O and dO,
 * K and dK, V and dV. */
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
    gp->bwd_pairs = sdpa_bwd_bf16_pairs(pl); /* cleared per group or chunk with a non-finite operand */
    const sdpa_kernels *kt = pl->kt;
    /* the pair products' own blocks (amx), unless given; problems with wide tiles only (a
     * decode-sized problem's tiles keep the fp32 products and the table's blocks) */
    if (gp->bwd_pairs && kt->bwd_pairs_block_q && sdpa_wide_problem(pl)) {
        if (!pl->bq_given)
            gp->bq = kt->bwd_pairs_block_q;
        if (!pl->bk_given)
            gp->bk = kt->bwd_pairs_block_k;
        gp->ld = plan_ld(gp->bq, kt);
    }
    gp->q_dtype = gp->kv_dtype = gp->o_dtype = SDPA_DTYPE_F32;
    gp->reduced = 0;
}

/* Whole groups per thread (each group's backward on one thread) when there are
 * enough of them; otherwise one group at a time on the whole team. Either way a
 * group's results are the fp32 backward's, which are the same for any thread
 * count, so the choice changes no bit. */
static int groups_per_thread(const plan *pl)
{
    return pl->nthreads > 1 && pl->B * pl->Hkv >= 2 * (int64_t)pl->nthreads;
}

/* ------------------------------------------------- the fused few-row path */

/* The kernel of the fused path for K/V's type, or NULL: 16-bit K/V only (on fp32 K/V
 * the fp32 backward's tiles are faster than bwd_rows_f32: docs/perf-notes.md). */
static sdpa_bwd_rows_fn bwd_rows_of(const plan *pl)
{
    const sdpa_kernels *kt = pl->kt;
    return pl->kv_dtype == SDPA_DTYPE_BF16 ? kt->bwd_rows_bf16
           : pl->kv_dtype == SDPA_DTYPE_F16 ? kt->bwd_rows_f16
                                            : NULL;
}

/* Whether the plan's groups may take the fused path (group_fused says whether one
 * does): an ISA with bwd_rows for K/V's type, a group of at most bwd_rows_max_rows
 * rows in few-column tiles, scores that are scale Q K^T alone (no softcap, ALiBi,
 * boolean mask or bias) and no sinks. */
static int plan_fused(const plan *pl)
{
    return bwd_rows_of(pl) && !sdpa_wide_problem(pl) && pl->G * pl->Tq <= pl->kt->bwd_rows_max_rows &&
           pl->Tq > 0 && pl->Dk > 0 && pl->Dv > 0 && !pl->logit_variants && !pl->elem_mask && !pl->slopes &&
           !pl->sinks && !pl->dsinks && !pl->pages;
}

/* Keys per chunk of the fused path: a multiple of nt_step from Tk alone (never from
 * the threads), at least FUSED_MIN_CHUNK, at most FUSED_MAX_CHUNKS chunks. Each
 * chunk's dQ is summed on its own, then the chunks' in order. */
#define FUSED_MIN_CHUNK 256
#define FUSED_MAX_CHUNKS 64
static int64_t fused_chunk(const plan *pl)
{
    const int64_t st = pl->kt->nt_step > 0 ? pl->kt->nt_step : 1;
    int64_t c = (pl->Tk + FUSED_MAX_CHUNKS - 1) / FUSED_MAX_CHUNKS;
    c = (c + st - 1) / st * st;
    return c < FUSED_MIN_CHUNK ? FUSED_MIN_CHUNK : c;
}

/* The fused path's floats for a group run on nthreads threads: per thread the kernel's
 * scratch and the rows' LSE, and with more than one thread each chunk's dQ. */
static size_t fused_floats(const plan *pl, int nthreads)
{
    if (!plan_fused(pl))
        return 0;
    const size_t M = (size_t)(pl->G * pl->Tq);
    size_t f = (size_t)nthreads * round_floats((size_t)pl->kt->bwd_rows_scratch + M);
    if (nthreads > 1) {
        const int64_t c = fused_chunk(pl);
        f += (size_t)((pl->Tk + c - 1) / c) * round_floats(M * (size_t)pl->Dk);
    }
    return f;
}

/* One worker's floats: the group backward's workspace, then the group buffers. */
static sdpa_status worker_floats(const plan *pl, int nthreads, size_t *floats, size_t *gf, size_t *nr)
{
    plan gp;
    group_plan(pl, 0, 0, &gp);
    gp.nthreads = nthreads;
    sdpa_status st = sdpa_bwd_workspace_floats(&gp, gf, nr);
    if (st != SDPA_OK)
        return st;
    const group_bufs g = bufs_of(pl);
    size_t total = round_floats(*gf);
    const size_t parts[4] = {g.q, g.o, g.k, g.v};
    for (int i = 0; i < 4; i++)
        if (parts[i] > SIZE_MAX / 4 || __builtin_add_overflow(total, 2 * parts[i], &total))
            return SDPA_ERR_SIZE_OVERFLOW;
    if (__builtin_add_overflow(total, g.q, &total)) /* dQ's chunk sum */
        return SDPA_ERR_SIZE_OVERFLOW;
    if (__builtin_add_overflow(total, fused_floats(pl, nthreads), &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    *floats = total;
    return SDPA_OK;
}

sdpa_status sdpa_bwd_typed_floats(const plan *pl, size_t *floats)
{
    const int per_thread = groups_per_thread(pl);
    size_t f, gf, nr, total;
    sdpa_status st = worker_floats(pl, per_thread ? 1 : pl->nthreads, &f, &gf, &nr);
    if (st != SDPA_OK)
        return st;
    if (__builtin_mul_overflow(f, (size_t)(per_thread ? pl->nthreads : 1), &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    /* dsinks: one partial sum per (batch, query head), added in batch order after */
    if (pl->dsinks && __builtin_add_overflow(total, round_floats(2 * (size_t)(pl->B * pl->Hq)), &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    *floats = total;
    return SDPA_OK;
}

/* n rows of type t at stride lds (elements) widened into dst (n x len, dense). */
static void widen_rows(const plan *pl, sdpa_dtype t, const void *src, ptrdiff_t lds, int64_t n, int64_t len,
                       float *dst)
{
    if (len == 0 || n == 0)
        return;
    if (t == SDPA_DTYPE_F32) {
        for (int64_t j = 0; j < n; j++)
            memcpy(dst + j * len, (const float *)src + j * lds, (size_t)len * sizeof(float));
        return;
    }
    (t == SDPA_DTYPE_BF16 ? pl->kt->widen_bf16 : pl->kt->widen_f16)((int)n, (int)len, src, lds, dst, len);
}

/* n dense rows (n x len floats) narrowed into rows of type t at stride ldd. */
static void narrow_rows(const plan *pl, sdpa_dtype t, const float *src, int64_t n, int64_t len, void *dst,
                        ptrdiff_t ldd)
{
    if (len == 0 || n == 0)
        return;
    if (t == SDPA_DTYPE_F32) {
        for (int64_t j = 0; j < n; j++)
            memcpy((float *)dst + j * ldd, src + j * len, (size_t)len * sizeof(float));
        return;
    }
    (t == SDPA_DTYPE_BF16 ? pl->kt->narrow_bf16 : pl->kt->narrow_f16)((int)n, (int)len, src, len, dst, ldd);
}

/* What the workers share, and one worker's buffers. */
typedef struct typed_job {
    const plan *pl;
    const bwd_views *x;
    float *ws;           /* the workers' parts, `per` floats each */
    size_t per, gf, nr;  /* floats per worker; of its group workspace; the per-row array length */
    int nthreads;        /* of each group's backward */
    double *dsinks_part; /* [B][Hq] or NULL */
} typed_job;

typedef struct typed_worker {
    const typed_job *job;
    float *ws, *q, *dq, *o, *dout, *k, *dk, *v, *dv, *dq_sum;
    float *fused; /* the fused path's floats (fused_floats) */
} typed_worker;

static typed_worker worker_of(const typed_job *job, int tid)
{
    const group_bufs gb = bufs_of(job->pl);
    typed_worker w;
    w.job = job;
    w.ws = job->ws + (size_t)tid * job->per;
    float *base = w.ws + round_floats(job->gf);
    w.q = carve(&base, gb.q), w.dq = carve(&base, gb.q), w.o = carve(&base, gb.o), w.dout = carve(&base, gb.o);
    w.k = carve(&base, gb.k), w.dk = carve(&base, gb.k), w.v = carve(&base, gb.v), w.dv = carve(&base, gb.v);
    w.dq_sum = carve(&base, gb.q);
    w.fused = base;
    return w;
}

/* Keys per chunk of a chunked group: a multiple of the key tile, about
 * BWD_KV_CHUNK_BYTES of fp32 K, V, dK and dV rows (at least one key tile). */
static int64_t chunk_keys(const plan *pl)
{
    const int64_t row = (int64_t)sizeof(float) * 2 * (pl->Dk + pl->Dv);
    int64_t c = row > 0 ? BWD_KV_CHUNK_BYTES / row : 0;
    c = c / pl->bk * pl->bk;
    return c > 0 ? c : pl->bk;
}

/* Whether group gp (of batch b, query heads h0..) runs over its keys in chunks
 * of c keys (see the top of this file). */
static int group_chunked(const plan *pl, const plan *gp, const bwd_views *x, int64_t b, int64_t h0, int64_t c)
{
    if (pl->slopes || pl->sinks || pl->dsinks || gp->Tk <= c || gp->Tq == 0)
        return 0;
    const tile_layout L = sdpa_tile_layout(gp);
    if (L.ngt * L.nrt != 1)
        return 0;
    for (int64_t g = 0; g < gp->Hq; g++)
        for (int64_t i = 0; i < gp->Tq; i++)
            if (lse_needs_stats(row_in(x->lse, b, h0 + g, 0)[i * x->lse->seq_stride]))
                return 0;
    return 1;
}

/* The fp32 problem of keys [j0, j0 + n) of group gp: the same rows and masks,
 * with the aligned diagonal d made explicit (top-left, diagonal_offset d - j0),
 * the key length clipped to the chunk (*kvl), and the mask and bias columns
 * offset by j0. Row i then allows key j0 + j' exactly when gp allows it. */
static void chunk_plan(const plan *gp, int64_t j0, int64_t n, int32_t *kvl, plan *cp)
{
    const int64_t tkb = keys_of_batch(gp, 0);
    const int64_t d = (gp->bottom_right ? tkb - gp->Tq : 0) + gp->diag_offset;
    *cp = *gp;
    cp->Tk = n;
    cp->bottom_right = 0;
    cp->diag_offset = d - j0;
    if (gp->kv_lengths) {
        const int64_t left = tkb - j0;
        *kvl = (int32_t)(left < 0 ? 0 : left > n ? n : left);
        cp->kv_lengths = kvl;
    }
    if (gp->bm.data)
        cp->bm.data += j0 * gp->bm.key_stride;
    if (gp->bias.data)
        cp->bias.data += j0 * gp->bias.key_stride;
}

/* Whether the n floats are all finite (bf16 values: the pair products need finite
 * operands, where the fp32 kernels skip a zero probability's products). */
static int all_finite(const float *x, size_t n)
{
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        any |= (u & 0x7F800000u) == 0x7F800000u;
    }
    return !any;
}

/* Keys [j0, j0 + n) of group (b, hk) under plan kp (the group's, or a chunk's):
 * their K and V rows widened, the fp32 backward on them (dQ of the group's rows
 * into w->dq), their dK and dV rows narrowed into the gradients. */
static void typed_keys(const typed_worker *w, const plan *kp, const sdpa_tensor *lse, int64_t b, int64_t hk,
                       int64_t j0, int64_t n, double *dsinks)
{
    const plan *pl = w->job->pl;
    const bwd_views *x = w->job->x;
    const int64_t G = pl->G, Tq = pl->Tq, Dk = pl->Dk, Dv = pl->Dv;
    widen_rows(pl, pl->kv_dtype, row_in_t(x->k, pl->kv_dtype, b, hk, j0), x->k->seq_stride, n, Dk, w->k);
    widen_rows(pl, pl->kv_dtype, row_in_t(x->v, pl->kv_dtype, b, hk, j0), x->v->seq_stride, n, Dv, w->v);
    const sdpa_tensor tq = {w->q, G * Tq * Dk, Tq * Dk, Dk}, to = {w->o, G * Tq * Dv, Tq * Dv, Dv},
                      tdo = {w->dout, G * Tq * Dv, Tq * Dv, Dv}, tk = {w->k, n * Dk, n * Dk, Dk},
                      tv = {w->v, n * Dv, n * Dv, Dv};
    const sdpa_tensor_out tdq = {w->dq, G * Tq * Dk, Tq * Dk, Dk}, tdk = {w->dk, n * Dk, n * Dk, Dk},
                          tdv = {w->dv, n * Dv, n * Dv, Dv};
    const bwd_views gx = {&tq,  &tk, &tv, &to, lse, &tdo, &tdq, &tdk, &tdv,
                          row_in_t(x->k, pl->kv_dtype, b, hk, j0), row_in_t(x->v, pl->kv_dtype, b, hk, j0),
                          x->k->seq_stride, x->v->seq_stride};
    plan cp = *kp;
    cp.bwd_pairs = kp->bwd_pairs && all_finite(w->k, (size_t)(n * Dk)) && all_finite(w->v, (size_t)(n * Dv));
    sdpa_bwd_run(&cp, &gx, w->ws, w->job->nr, dsinks);
    narrow_rows(pl, pl->kv_dtype, w->dk, n, Dk, row_out_t(x->dk, pl->kv_dtype, b, hk, j0), x->dk->seq_stride);
    narrow_rows(pl, pl->kv_dtype, w->dv, n, Dv, row_out_t(x->dv, pl->kv_dtype, b, hk, j0), x->dv->seq_stride);
}

/* Whether group gp (of batch b, query heads h0..) runs on the fused path, and the keys
 * [*lo, *hi) it runs over: every row of the group allows exactly those keys (one
 * query row per head, or rows under no window), at least one, and every row's LSE is
 * finite and needs no statistics pass. */
static int group_fused(const plan *pl, const plan *gp, const bwd_views *x, int64_t b, int64_t h0, int64_t *lo,
                       int64_t *hi)
{
    if (!plan_fused(pl))
        return 0;
    const int64_t tkb = keys_of_batch(gp, 0);
    int64_t l0, z0;
    row_range(gp, tkb, 0, &l0, &z0);
    for (int64_t i = 1; i < gp->Tq; i++) {
        int64_t l, z;
        row_range(gp, tkb, i, &l, &z);
        if (l != l0 || z != z0)
            return 0;
    }
    if (l0 > z0)
        return 0;
    for (int64_t g = 0; g < gp->Hq; g++)
        for (int64_t i = 0; i < gp->Tq; i++) {
            const float v = row_in(x->lse, b, h0 + g, 0)[i * x->lse->seq_stride];
            if (!isfinite(v) || lse_needs_stats(v))
                return 0;
        }
    *lo = l0;
    *hi = z0 + 1;
    return 1;
}

/* One fused group: its rows (widened in the worker's buffers), its keys, chunks. */
typedef struct fused_group {
    const typed_worker *w;
    int64_t b, hk, lo, hi, chunk;
    const float *lse; /* the group's G Tq rows' LSE, contiguous */
    float *partials;  /* with a team: each chunk's dQ */
    size_t per_thread; /* floats of a thread's part of w->fused */
} fused_group;

/* Chunk ci of the group's keys on the kernel: dK, dV of its keys into the gradients,
 * its dQ (the group's rows, fp32) into dq. */
static void fused_run_chunk(const fused_group *fg, int64_t ci, float *scratch, float *dq)
{
    const plan *pl = fg->w->job->pl;
    const bwd_views *x = fg->w->job->x;
    const int64_t j0 = fg->lo + ci * fg->chunk, n = fg->hi - j0 < fg->chunk ? fg->hi - j0 : fg->chunk;
    const sdpa_dtype t = pl->kv_dtype;
    const int M = (int)(pl->G * pl->Tq);
    bwd_rows_of(pl)(M, (int)n, (int)pl->Dk, (int)pl->Dv, pl->scale, fg->w->q, pl->Dk, fg->w->o, pl->Dv, fg->w->dout,
                    pl->Dv, fg->lse, row_in_t(x->k, t, fg->b, fg->hk, j0), x->k->seq_stride,
                    row_in_t(x->v, t, fg->b, fg->hk, j0), x->v->seq_stride, dq, pl->Dk,
                    row_out_t(x->dk, t, fg->b, fg->hk, j0), x->dk->seq_stride, row_out_t(x->dv, t, fg->b, fg->hk, j0),
                    x->dv->seq_stride, scratch);
}

typedef struct fused_item {
    const fused_group *fg;
    float *scratch;
} fused_item;

static void fused_chunk_of(void *arg, int64_t ci)
{
    const fused_item *it = arg;
    const plan *pl = it->fg->w->job->pl;
    fused_run_chunk(it->fg, ci, it->scratch, it->fg->partials + (size_t)ci * round_floats((size_t)(pl->G * pl->Tq * pl->Dk)));
}

static void fused_team_body(void *ctx, int tid, int team)
{
    const fused_group *fg = ctx;
    fused_item it = {fg, fg->w->fused + (size_t)tid * fg->per_thread};
    const int64_t nc = (fg->hi - fg->lo + fg->chunk - 1) / fg->chunk;
    sdpa_for_dynamic(team, nc, fused_chunk_of, &it, 0);
}

/* Dense n rows of len elements of type t at stride ld set to zero. */
static void zero_rows_t(void *dst, sdpa_dtype t, int64_t n, int64_t len, ptrdiff_t ld)
{
    for (int64_t j = 0; j < n; j++)
        memset((char *)dst + (size_t)(j * ld) * dtype_bytes(t), 0, (size_t)len * dtype_bytes(t));
}

/* Group (b, hk) on the fused path over keys [lo, hi) (group_fused): the kernel chunk by
 * chunk (on one thread, or the chunks shared by the team), dQ = the chunks' dQ summed
 * in chunk order into w->dq_sum (the same bits either way), and dK = dV = 0 for the
 * keys outside. */
static void fused_group_run(const typed_worker *w, int64_t b, int64_t hk, int64_t lo, int64_t hi)
{
    const typed_job *job = w->job;
    const plan *pl = job->pl;
    const bwd_views *x = job->x;
    const int64_t h0 = hk * pl->G, M = pl->G * pl->Tq;
    const size_t nq = (size_t)(M * pl->Dk);
    fused_group fg = {w, b, hk, lo, hi, fused_chunk(pl), NULL, NULL, round_floats((size_t)pl->kt->bwd_rows_scratch + (size_t)M)};
    float *lse = w->fused + pl->kt->bwd_rows_scratch; /* in thread 0's part */
    for (int64_t g = 0; g < pl->G; g++)
        for (int64_t i = 0; i < pl->Tq; i++)
            lse[g * pl->Tq + i] = row_in(x->lse, b, h0 + g, 0)[i * x->lse->seq_stride];
    fg.lse = lse;
    const int64_t nc = (hi - lo + fg.chunk - 1) / fg.chunk;
    memset(w->dq_sum, 0, nq * sizeof(float));
    if (job->nthreads > 1) {
        fg.partials = w->fused + (size_t)job->nthreads * fg.per_thread;
        sdpa_parallel(job->nthreads, fused_team_body, &fg);
        for (int64_t ci = 0; ci < nc; ci++) {
            const float *part = fg.partials + (size_t)ci * round_floats(nq);
            for (size_t e = 0; e < nq; e++)
                w->dq_sum[e] += part[e];
        }
    } else {
        for (int64_t ci = 0; ci < nc; ci++) {
            fused_run_chunk(&fg, ci, w->fused, w->dq);
            for (size_t e = 0; e < nq; e++) /* chunk order: as the team's sum */
                w->dq_sum[e] += w->dq[e];
        }
    }
    const sdpa_dtype t = pl->kv_dtype;
    zero_rows_t(row_out_t(x->dk, t, b, hk, 0), t, lo, pl->Dk, x->dk->seq_stride);
    zero_rows_t(row_out_t(x->dv, t, b, hk, 0), t, lo, pl->Dv, x->dv->seq_stride);
    zero_rows_t(row_out_t(x->dk, t, b, hk, hi), t, pl->Tk - hi, pl->Dk, x->dk->seq_stride);
    zero_rows_t(row_out_t(x->dv, t, b, hk, hi), t, pl->Tk - hi, pl->Dv, x->dv->seq_stride);
}

/* Group (b, hk) = item: widen its rows, the fp32 backward, narrow its gradients
 * (over all of its keys at once, or chunk by chunk). */
static void typed_group(void *arg, int64_t item)
{
    const typed_worker *w = arg;
    const typed_job *job = w->job;
    const plan *pl = job->pl;
    const bwd_views *x = job->x;
    const int64_t b = item / pl->Hkv, hk = item % pl->Hkv, h0 = hk * pl->G;
    const int64_t G = pl->G, Tq = pl->Tq, Tk = pl->Tk, Dk = pl->Dk, Dv = pl->Dv;
    plan gp;
    group_plan(pl, b, hk, &gp);
    gp.nthreads = job->nthreads;
    for (int64_t g = 0; g < G; g++) {
        const size_t r = (size_t)(g * Tq);
        widen_rows(pl, pl->q_dtype, row_in_t(x->q, pl->q_dtype, b, h0 + g, 0), x->q->seq_stride, Tq, Dk,
                   w->q + r * Dk);
        widen_rows(pl, pl->o_dtype, row_in_t(x->o, pl->o_dtype, b, h0 + g, 0), x->o->seq_stride, Tq, Dv,
                   w->o + r * Dv);
        widen_rows(pl, pl->o_dtype, row_in_t(x->dout, pl->o_dtype, b, h0 + g, 0), x->dout->seq_stride, Tq, Dv,
                   w->dout + r * Dv);
    }
    if (sdpa_rounds_q_bf16(pl)) /* the Q of the forward's LSE (its wide tiles round it) */
        sdpa_round_q_bf16(w->q, (size_t)(G * Tq * Dk));
    gp.bwd_pairs = gp.bwd_pairs && all_finite(w->q, (size_t)(G * Tq * Dk)) && all_finite(w->dout, (size_t)(G * Tq * Dv));
    const sdpa_tensor lse = {row_in(x->lse, b, h0, 0), x->lse->batch_stride, x->lse->head_stride,
                             x->lse->seq_stride};
    const int64_t c = chunk_keys(&gp); /* a multiple of the group plan's key tile */
    const float *dq = w->dq;
    int64_t lo, hi;
    if (group_fused(pl, &gp, x, b, h0, &lo, &hi)) {
        fused_group_run(w, b, hk, lo, hi);
        dq = w->dq_sum;
    } else if (group_chunked(pl, &gp, x, b, h0, c)) {
        const size_t nq = (size_t)(G * Tq * Dk);
        memset(w->dq_sum, 0, nq * sizeof(float));
        for (int64_t j0 = 0; j0 < Tk; j0 += c) {
            const int64_t n = Tk - j0 < c ? Tk - j0 : c;
            plan cp;
            int32_t kvl = 0;
            chunk_plan(&gp, j0, n, &kvl, &cp);
            typed_keys(w, &cp, &lse, b, hk, j0, n, NULL);
            for (size_t e = 0; e < nq; e++) /* chunk order: the same sum for any thread count */
                w->dq_sum[e] += w->dq[e];
        }
        dq = w->dq_sum;
    } else {
        typed_keys(w, &gp, &lse, b, hk, 0, Tk, job->dsinks_part ? job->dsinks_part + b * pl->Hq + h0 : NULL);
    }
    for (int64_t g = 0; g < G; g++)
        narrow_rows(pl, pl->q_dtype, dq + (size_t)(g * Tq) * Dk, Tq, Dk, row_out_t(x->dq, pl->q_dtype, b, h0 + g, 0),
                    x->dq->seq_stride);
}

static void typed_team_body(void *ctx, int tid, int team)
{
    const typed_job *job = ctx;
    typed_worker w = worker_of(job, tid);
    sdpa_for_dynamic(team, job->pl->B * job->pl->Hkv, typed_group, &w, 0);
}

void sdpa_bwd_typed(const plan *pl, const bwd_views *x, float *ws, double *dsinks_acc)
{
    const int per_thread = groups_per_thread(pl);
    typed_job job;
    job.pl = pl;
    job.x = x;
    job.ws = ws;
    job.nthreads = per_thread ? 1 : pl->nthreads;
    worker_floats(pl, job.nthreads, &job.per, &job.gf, &job.nr);
    const int workers = per_thread ? pl->nthreads : 1;
    job.dsinks_part = NULL;
    if (dsinks_acc) {
        job.dsinks_part = (double *)(void *)(ws + (size_t)workers * job.per);
        for (int64_t i = 0; i < pl->B * pl->Hq; i++)
            job.dsinks_part[i] = 0.0;
    }
    if (per_thread) {
        sdpa_parallel(workers, typed_team_body, &job);
    } else { /* one group at a time, each on the whole team */
        typed_worker w = worker_of(&job, 0);
        for (int64_t item = 0; item < pl->B * pl->Hkv; item++)
            typed_group(&w, item);
    }
    for (int64_t h = 0; dsinks_acc && h < pl->Hq; h++) /* in batch order, whatever ran where */
        for (int64_t b = 0; b < pl->B; b++)
            dsinks_acc[h] += job.dsinks_part[b * pl->Hq + h];
}
