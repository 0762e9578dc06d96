/* SPDX-License-Identifier: MIT */
/* backward.c - sdpa_backward: validation, the gradients' zeroing, D = rowsum(dO *
 * O), and the schedule of the (query tile, key tile) pairs (backward_tile.c) on
 * the team: whole heads per thread, or anti-diagonal waves. Pair (r, c) adds to
 * dQ[r] and to dK[c], dV[c]; every tile receives its contributions in a fixed
 * order, so the result is bitwise identical for any thread count. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backward.h"
#include "view_copy.h"

/* Zeroes the rows of heads [h0, h1) of a gradient of type t (heads numbered b *
 * n[1] + h); +0 is all zero bits in fp32, bf16 and fp16 alike. */
static void zero_heads_t(void *data, sdpa_dtype t, const int64_t n[3], const int64_t s[3], int64_t len, int64_t h0,
                         int64_t h1)
{
    if (!data || len == 0 || n[2] == 0)
        return;
    for (int64_t bh = h0; bh < h1; bh++)
        for (int64_t z = 0; z < n[2]; z++)
            memset((void *)elem_at(data, (bh / n[1]) * s[0] + (bh % n[1]) * s[1] + z * s[2], t), 0,
                   (size_t)len * dtype_bytes(t));
}

static void zero_heads(void *data, const int64_t n[3], const int64_t s[3], int64_t len, int64_t h0, int64_t h1)
{
    zero_heads_t(data, SDPA_DTYPE_F32, n, s, len, h0, h1);
}

/* dQ, dK, dV (dQ only unless with_kv) = 0 for the heads [part * H / parts,
 * (part + 1) * H / parts) of each (H = its batch x heads), so that the threads
 * of a team share the work. */
static void zero_grads(const plan *pl, const sdpa_tensor_out *dq, const sdpa_tensor_out *dk,
                       const sdpa_tensor_out *dv, int part, int parts, int with_kv)
{
    const int64_t nq3[3] = {pl->B, pl->Hq, pl->Tq}, nk3[3] = {pl->B, pl->Hkv, pl->Tk};
    const int64_t sdq[3] = {dq->batch_stride, dq->head_stride, dq->seq_stride};
    const int64_t sdk[3] = {dk->batch_stride, dk->head_stride, dk->seq_stride};
    const int64_t sdv[3] = {dv->batch_stride, dv->head_stride, dv->seq_stride};
    const int64_t hq = pl->B * pl->Hq, hk = pl->B * pl->Hkv;
    zero_heads_t(dq->data, pl->q_dtype, nq3, sdq, pl->Dk, hq * part / parts, hq * (part + 1) / parts);
    if (!with_kv)
        return;
    zero_heads_t(dk->data, pl->kv_dtype, nk3, sdk, pl->Dk, hk * part / parts, hk * (part + 1) / parts);
    zero_heads_t(dv->data, pl->kv_dtype, nk3, sdv, pl->Dv, hk * part / parts, hk * (part + 1) / parts);
}

/* D = rowsum(dO * O) for the rows [r0, r1) of all (batch, query head, row);
 * nt: with gemm_nt, as dP^T in few-column tiles. */
static void bwd_rows_D(const plan *pl, const sdpa_tensor *o, const sdpa_tensor *dout, float *D, int64_t r0,
                       int64_t r1, int nt)
{
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i = r % pl->Tq, bh = r / pl->Tq, b = bh / pl->Hq, h = bh % pl->Hq;
        const float *orow = row_in(o, b, h, i);
        const float *drow = row_in(dout, b, h, i);
        /* With the kernel that computes dP = dO . V for this shape, so that D
         * rounds exactly like it (when P is one-hot, O = V and dP - D must
         * cancel exactly). */
        if (pl->Dv > 0 && nt)
            pl->kt->gemm_nt(1, 1, (int)pl->Dv, 1.0f, drow, pl->Dv, orow, pl->Dv, &D[r], 1, 1);
        else if (pl->Dv > 0)
            pl->kt->gemm(1, 1, (int)pl->Dv, 1.0f, drow, 0, 1, orow, 1, &D[r], 1, 0, NULL);
        else
            D[r] = 0.0f;
    }
}

/* Before the pairs of (batch, kv head) bh when one thread runs them all:
 * dK, dV of the kv head and dQ of its query heads = 0, and their rows' D.
 * Done by the thread that then accumulates into them (the lines are in its
 * cache), with no barrier between the threads. */
static void bwd_head_prologue(const plan *pl, const bwd_args *a, int64_t bh)
{
    const int64_t b = bh / pl->Hkv, hk = bh % pl->Hkv, q0 = b * pl->Hq + hk * pl->G;
    const int64_t nq3[3] = {pl->B, pl->Hq, pl->Tq}, nk3[3] = {pl->B, pl->Hkv, pl->Tk};
    const int64_t sdq[3] = {a->dq->batch_stride, a->dq->head_stride, a->dq->seq_stride};
    const int64_t sdk[3] = {a->dk->batch_stride, a->dk->head_stride, a->dk->seq_stride};
    const int64_t sdv[3] = {a->dv->batch_stride, a->dv->head_stride, a->dv->seq_stride};
    zero_heads(a->dq->data, nq3, sdq, pl->Dk, q0, q0 + pl->G);
    if (!a->kv_once) {
        zero_heads(a->dk->data, nk3, sdk, pl->Dk, bh, bh + 1);
        zero_heads(a->dv->data, nk3, sdv, pl->Dv, bh, bh + 1);
    }
    bwd_rows_D(pl, a->o, a->dout, a->D, q0 * pl->Tq, (q0 + pl->G) * pl->Tq, a->nt);
}

/* d loss / d sinks[h] = -sum over batch and rows of exp(s_h - LSE) * D (the sink's
 * P times dS = P (0 - D)), in float64, added to acc[h] in a fixed order (the
 * caller writes dsinks = -acc); D of the rows whose LSE the statistics pass
 * replaced is D + D_rest. */
static void bwd_dsinks(const plan *pl, const sdpa_tensor *lse, const float *D, const float *D_rest, double *acc)
{
    for (int64_t h = 0; h < pl->Hq; h++) {
        const double s = pl->sinks[h];
        for (int64_t b = 0; b < pl->B && s != -INFINITY; b++)
            for (int64_t i = 0; i < pl->Tq; i++) {
                const float lv = *row_in(lse, b, h, i);
                const int64_t r = (b * pl->Hq + h) * pl->Tq + i;
                const double d = (double)D[r] + (lse_needs_stats(lv) ? (double)D_rest[r] : 0.0);
                acc[h] += exp(s - (double)lv) * d;
            }
    }
}

/* What every thread of the backward's team shares, and one thread's own part. */
typedef struct bwd_team {
    const plan *pl;
    const bwd_args *a;
    const tile_layout *L;
    float *ws; /* nthreads workspaces of `per` floats */
    size_t per;
    int nthreads;
    int64_t BH, R, nkt, kchunk; /* (batch, kv head) pairs, query tiles per pair, key tiles, per pass */
} bwd_team;

typedef struct bwd_thread {
    const bwd_team *tm;
    bwd_ws w;
    int64_t d, rmin, cnt; /* the current wave: pairs (rmin + i, d - rmin - i), i < cnt */
} bwd_thread;

/* One whole (batch, kv head) on one thread: zero its gradients and compute its
 * D first (bwd_head_prologue), its statistics pass, then passes over kchunk key
 * tiles, each pass row by row (query tile r outer, key tile c of the pass
 * inner). Every dQ tile still receives its contributions in increasing c and
 * every dK/dV tile in increasing r, exactly as in the waves, so the bits are
 * the same. A pass keeps its K, V, dK and dV rows in cache while the query
 * tiles stream by (one pass over all key tiles would re-read the whole head's
 * K, V, dK, dV for every query tile). */
static void bwd_head_of(void *arg, int64_t bh)
{
    bwd_thread *th = arg;
    const bwd_team *tm = th->tm;
    bwd_head_prologue(tm->pl, tm->a, bh);
    for (int64_t r = 0; r < tm->R; r++)
        sdpa_bwd_tile_stats(tm->pl, &th->w, tm->a, tm->L, bh, r);
    for (int64_t c0 = 0; c0 < tm->nkt; c0 += tm->kchunk)
        for (int64_t r = 0; r < tm->R; r++)
            for (int64_t c = c0; c < tm->nkt && c < c0 + tm->kchunk; c++)
                sdpa_bwd_pair(tm->pl, &th->w, tm->a, tm->L, bh, r, c);
}

static void bwd_D_of(void *arg, int64_t r)
{
    const bwd_thread *th = arg;
    const bwd_args *a = th->tm->a;
    bwd_rows_D(th->tm->pl, a->o, a->dout, a->D, r, r + 1, a->nt);
}

static void bwd_stats_of(void *arg, int64_t it)
{
    bwd_thread *th = arg;
    sdpa_bwd_tile_stats(th->tm->pl, &th->w, th->tm->a, th->tm->L, it / th->tm->R, it % th->tm->R);
}

static void bwd_wave_of(void *arg, int64_t it)
{
    bwd_thread *th = arg;
    const int64_t r = th->rmin + it % th->cnt;
    sdpa_bwd_pair(th->tm->pl, &th->w, th->tm->a, th->tm->L, it / th->cnt, r, th->d - r);
}

/* With enough (batch, kv head) pairs to keep every thread busy, or one thread,
 * each thread runs whole heads (bwd_head_of, no barrier: a thread that finishes a head
 * takes the next one). Otherwise the team zeroes the gradients, computes D and
 * the statistics, then runs the pairs in anti-diagonal waves d = r + c: the
 * pairs of one wave touch distinct dQ and dK/dV tiles, so they run in parallel
 * without atomics, and every tile receives its contributions in increasing
 * order of the other index. Either way the bits do not depend on the threads. */
static void bwd_team_work(const bwd_team *tm, int tid, int team)
{
    const bwd_args *a = tm->a;
    bwd_thread th = {tm, sdpa_bwd_ws_carve(tm->pl, tm->ws + (size_t)tid * tm->per), 0, 0, 0};
    if (tm->BH >= 2 * (int64_t)tm->nthreads || tm->nthreads == 1) { /* (one thread: its own head order) */
        sdpa_for_dynamic(team, tm->BH, bwd_head_of, &th, 1);
        return;
    }
    zero_grads(tm->pl, a->dq, a->dk, a->dv, tid, team, !a->kv_once);
    const plan *pl = tm->pl;
    sdpa_for_static(team, pl->B * pl->Hq * pl->Tq, bwd_D_of, &th); /* its barrier also covers the zeroing */
    sdpa_for_dynamic(team, tm->BH * tm->R, bwd_stats_of, &th, 0);  /* before any pair */
    const int64_t ndiag = (tm->R > 0 && tm->nkt > 0) ? tm->R + tm->nkt - 1 : 0;
    for (int64_t d = 0; d < ndiag; d++) {
        th.d = d;
        th.rmin = d - tm->nkt + 1 > 0 ? d - tm->nkt + 1 : 0;
        th.cnt = (d < tm->R - 1 ? d : tm->R - 1) - th.rmin + 1;
        sdpa_for_dynamic(team, tm->BH * th.cnt, bwd_wave_of, &th, 0);
    }
}

static void bwd_team_body(void *ctx, int tid, int team)
{
    const bwd_team *tm = ctx;
    const sdpa_kernels *kt = tm->pl->kt;
    const int tiles = tm->a->pairs && kt->tiles_begin; /* the pair products on AMX tiles */
    if (tiles)
        kt->tiles_begin();
    bwd_team_work(tm, tid, team);
    if (tiles)
        kt->tiles_end();
}

/* Validation of a call and its tensors. */
static sdpa_status bwd_check(const bwd_views *x, const plan *pl, const void *workspace, size_t workspace_bytes)
{
    if (!x->q || !x->k || !x->v || !x->o || !x->lse || !x->dout || !x->dq || !x->dk || !x->dv)
        return SDPA_ERR_NULL_ARGUMENT;
#define STR3(t) {x->t->batch_stride, x->t->head_stride, x->t->seq_stride}
    const int64_t sq[3] = STR3(q), sk[3] = STR3(k), sv[3] = STR3(v), so[3] = STR3(o), sl[3] = STR3(lse),
                  sdo[3] = STR3(dout), sdq[3] = STR3(dq), sdk[3] = STR3(dk), sdv[3] = STR3(dv);
#undef STR3
    int64_t nq[3], nk[3];
    sdpa_view_rows(pl, nq, nk);
    const int64_t B = nq[0], Hq = nq[1], Tq = nq[2], Bk = nk[0], Hkv = nk[1], Tk = nk[2];
    static const int64_t s_vec[3] = {0, 0, 1}; /* dsinks: Hq contiguous floats */
    const size_t eq = dtype_bytes(pl->q_dtype), ekv = dtype_bytes(pl->kv_dtype), eo = dtype_bytes(pl->o_dtype);
    tensor_desc t[10] = {
        {x->q->data, sq, {B, Hq, Tq}, pl->Dk, eq, 0, 1},      {x->k->data, sk, {Bk, Hkv, Tk}, pl->Dk, ekv, 0, 1},
        {x->v->data, sv, {Bk, Hkv, Tk}, pl->Dv, ekv, 0, 1},   {x->o->data, so, {B, Hq, Tq}, pl->Dv, eo, 0, 1},
        {x->lse->data, sl, {B, Hq, Tq}, 1, 4, 0, 1},          {x->dout->data, sdo, {B, Hq, Tq}, pl->Dv, eo, 0, 1},
        {x->dq->data, sdq, {B, Hq, Tq}, pl->Dk, eq, 1, 1},    {x->dk->data, sdk, {Bk, Hkv, Tk}, pl->Dk, ekv, 1, 1},
        {x->dv->data, sdv, {Bk, Hkv, Tk}, pl->Dv, ekv, 1, 1}, {pl->dsinks, s_vec, {1, 1, pl->Hq}, 1, 4, 1, pl->dsinks != NULL},
    };
    return sdpa_check_tensors(pl, t, 10, workspace, workspace_bytes);
}

/* With Dv = 0 nothing flows back (dS = P * (0 - 0) = 0): the gradients are
 * zero. With Dk = Dv = 0, or no query or key rows, there is nothing else to
 * compute either; this also keeps empty problems of huge B x H instant. */
int sdpa_bwd_trivial(const plan *pl)
{
    return pl->Dv == 0 || pl->B == 0 || pl->Hq == 0 || pl->Tq == 0 || pl->Tk == 0;
}

/* The workspace of a call: nthreads per-thread parts, then D, row_max,
 * row_logsum, row_dlo of B*Hq*Tq floats each (rounded to the alignment). */
sdpa_status sdpa_bwd_workspace_floats(const plan *pl, size_t *floats, size_t *nD_round)
{
    const size_t nD = (size_t)(pl->B * pl->Hq * pl->Tq), nr = round_floats(nD);
    size_t total;
    *floats = *nD_round = 0;
    if (sdpa_bwd_trivial(pl)) /* nothing is allocated */
        return SDPA_OK;
    if (nr < nD || nr > SIZE_MAX / 4 || __builtin_mul_overflow((size_t)pl->nthreads, sdpa_bwd_ws_floats(pl), &total) ||
        __builtin_add_overflow(total, 4 * nr, &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    *floats = total;
    *nD_round = nr;
    return SDPA_OK;
}

/* Runs a validated, non-trivial call on the workspace ws. From here on the
 * outputs are written (zeroed first, by the team). */
void sdpa_bwd_run(const plan *pl, const bwd_views *x, float *ws, size_t nD_round, double *dsinks_acc)
{
    /* Query tiles as in the forward (several heads of a group per tile when Tq
     * is short); the wavefront's rows are (head tile, row tile). */
    const tile_layout L = sdpa_tile_layout(pl);
    const int64_t R = L.ngt * L.nrt;
    const size_t per = sdpa_bwd_ws_floats(pl);
    float *D = ws + (size_t)pl->nthreads * per;
    float *row_max = D + nD_round, *row_logsum = row_max + nD_round, *row_dlo = row_logsum + nD_round;
    /* Few-column tiles (decode-sized Tq): S^T and dP^T as dot products along
     * head_dim (gemm_nt) instead of a gemm whose vectors would hold a handful
     * of query columns. Chosen from the tile width, which depends on the shape
     * only, so D (which must round like dP) is computed the same way. */
    const int nt = tile_cols(&L) <= pl->kt->nt_max_cols;
    const double kv_bytes =
        (double)pl->B * (double)pl->Hkv * (double)pl->Tk * (double)(pl->Dk + pl->Dv) * sizeof(float);
    const bwd_args a = {x->q,       x->k,    x->v, x->o,   x->lse, x->dout, x->dq, x->dk, x->dv, D, row_max,
                        row_logsum, row_dlo, nt,   R == 1, R == 1 && kv_bytes >= (double)BWD_STREAM_KV_BYTES,
                        pl->bwd_pairs && !nt, x->k16, x->v16, x->ldk16, x->ldv16};
    /* Key tiles per pass of the per-head order: as many as BWD_KV_CHUNK_BYTES of
     * their K, V, dK and dV rows (bwd_head_of). */
    int64_t kchunk = BWD_KV_CHUNK_BYTES / ((int64_t)pl->bk * (int64_t)sizeof(float) * (2 * pl->Dk + 2 * pl->Dv));
    if (kchunk < 1)
        kchunk = 1;
    const bwd_team tm = {pl, &a, &L, ws, per, pl->nthreads, pl->B * pl->Hkv, R, L.nkt, kchunk};
    sdpa_parallel(pl->nthreads, bwd_team_body, (void *)&tm);
    if (pl->dsinks)
        bwd_dsinks(pl, x->lse, D, row_dlo, dsinks_acc);
}

/* Problem u of the call: the dense one, or sequence u of a packed call with its
 * views offset to its first token (query-like views) and first key. */
static void bwd_unit(const plan *pl, const bwd_views *x, int64_t u, plan *up, bwd_views *ux, sdpa_tensor t[6],
                     sdpa_tensor_out g[3])
{
    *ux = *x;
    if (!pl->seqs) {
        *up = *pl;
        return;
    }
    sdpa_seq_plan(pl, u, up);
    const int64_t t0 = pl->seqs->cu_seqlens_q[u], k0 = pl->seqs->cu_seqlens_k[u];
    const sdpa_tensor *in[6] = {x->q, x->k, x->v, x->o, x->lse, x->dout};
    const sdpa_tensor_out *out[3] = {x->dq, x->dk, x->dv};
    const sdpa_dtype tin[6] = {pl->q_dtype, pl->kv_dtype, pl->kv_dtype, pl->o_dtype, SDPA_DTYPE_F32, pl->o_dtype};
    const sdpa_dtype tout[3] = {pl->q_dtype, pl->kv_dtype, pl->kv_dtype};
    for (int i = 0; i < 6; i++) {
        t[i] = *in[i];
        t[i].data = elem_at(t[i].data, (i == 1 || i == 2 ? k0 : t0) * t[i].seq_stride, tin[i]);
    }
    for (int i = 0; i < 3; i++) {
        g[i] = *out[i];
        g[i].data = (void *)elem_at(g[i].data, (i ? k0 : t0) * g[i].seq_stride, tout[i]);
    }
    const bwd_views v = {&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &g[0], &g[1], &g[2], NULL, NULL, 0, 0};
    *ux = v;
}

/* A packed call with at least two sequences per thread runs whole sequences per
 * thread, each sequence's backward on one thread (many short sequences would
 * otherwise each start and stop the whole team); else one sequence after another,
 * each on the whole team. A sequence's results are the same either way (the
 * backward's bits do not depend on its threads). */
static int units_per_thread(const plan *pl)
{
    return pl->seqs && pl->nthreads > 1 && pl->B >= 2 * (int64_t)pl->nthreads;
}

/* The workspace of one problem of the call (0 for a trivial one). */
static sdpa_status unit_floats(const plan *up, size_t *f)
{
    size_t nr;
    if (sdpa_bwd_trivial(up)) {
        *f = 0;
        return SDPA_OK;
    }
    return up->reduced ? sdpa_bwd_typed_floats(up, f) : sdpa_bwd_workspace_floats(up, f, &nr);
}

/* What the workers share. */
typedef struct bwd_calljob {
    const plan *pl;
    const bwd_views *x;
    float *ws;      /* workers' parts, `per` floats each */
    size_t per;
    int per_thread; /* units_per_thread */
    double *part;   /* dsinks: [units][Hq] partial sums, or NULL */
} bwd_calljob;

/* The workspace: per worker the largest problem's, then with dsinks one partial
 * sum per (problem, query head) in float64. */
static sdpa_status bwd_call_floats(const plan *pl, size_t *floats)
{
    *floats = 0;
    const int64_t n = pl->seqs ? pl->B : 1;
    const int per_thread = units_per_thread(pl);
    size_t per = 0;
    for (int64_t u = 0; u < n; u++) {
        plan up;
        size_t f;
        if (pl->seqs)
            sdpa_seq_plan(pl, u, &up);
        else
            up = *pl;
        if (per_thread)
            up.nthreads = 1;
        const sdpa_status st = unit_floats(&up, &f);
        if (st != SDPA_OK)
            return st;
        per = f > per ? f : per;
    }
    size_t total;
    if (__builtin_mul_overflow(round_floats(per), (size_t)(per_thread ? pl->nthreads : 1), &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (pl->dsinks && __builtin_add_overflow(total, round_floats(2 * (size_t)(n * pl->Hq)), &total))
        return SDPA_ERR_SIZE_OVERFLOW;
    *floats = total;
    return SDPA_OK;
}

/* Problem u of the call on the workspace ws (its worker's part). */
static void bwd_unit_run(const bwd_calljob *c, int64_t u, float *ws)
{
    plan up;
    bwd_views ux;
    sdpa_tensor t[6];
    sdpa_tensor_out g[3];
    bwd_unit(c->pl, c->x, u, &up, &ux, t, g);
    if (c->per_thread)
        up.nthreads = 1;
    double *acc = c->part ? c->part + u * c->pl->Hq : NULL;
    size_t f, nr;
    sdpa_bwd_workspace_floats(&up, &f, &nr);
    if (sdpa_bwd_trivial(&up))
        zero_grads(&up, ux.dq, ux.dk, ux.dv, 0, 1, 1); /* nothing flows back; dsinks gain 0 */
    else if (up.reduced)
        sdpa_bwd_typed(&up, &ux, ws, acc);
    else
        sdpa_bwd_run(&up, &ux, ws, nr, acc);
}

typedef struct bwd_callworker {
    const bwd_calljob *job;
    float *ws;
} bwd_callworker;

static void bwd_unit_of(void *arg, int64_t u)
{
    const bwd_callworker *w = arg;
    bwd_unit_run(w->job, u, w->ws);
}

static void bwd_call_body(void *ctx, int tid, int team)
{
    const bwd_calljob *job = ctx;
    bwd_callworker w = {job, job->ws ? job->ws + (size_t)tid * job->per : NULL};
    sdpa_for_dynamic(team, job->pl->B, bwd_unit_of, &w, 0);
}

/* Every problem of the call (whole sequences per thread, or each on the whole
 * team in turn), then dsinks = -(sum over problems, in order, of their partial
 * sums). */
static void bwd_call(const plan *pl, const bwd_views *x, float *ws, size_t floats)
{
    const int64_t n = pl->seqs ? pl->B : 1;
    bwd_calljob job = {pl, x, ws, 0, units_per_thread(pl), NULL};
    if (pl->dsinks) {
        job.part = (double *)(void *)(ws + floats - round_floats(2 * (size_t)(n * pl->Hq)));
        for (int64_t i = 0; i < n * pl->Hq; i++)
            job.part[i] = 0.0;
    }
    const size_t part_floats = pl->dsinks ? round_floats(2 * (size_t)(n * pl->Hq)) : 0;
    job.per = job.per_thread ? (floats - part_floats) / (size_t)pl->nthreads : floats - part_floats;
    if (job.per_thread) {
        sdpa_parallel(pl->nthreads, bwd_call_body, &job);
    } else {
        for (int64_t u = 0; u < n; u++)
            bwd_unit_run(&job, u, ws);
    }
    for (int64_t h = 0; pl->dsinks && h < pl->Hq; h++) {
        double acc = 0.0;
        for (int64_t u = 0; u < n; u++)
            acc += job.part[u * pl->Hq + h];
        pl->dsinks[h] = (float)-acc;
    }
}

/* The call on the caller's workspace, or (own: sdpa_backward) on one it allocates. */
static sdpa_status bwd_entry(const sdpa_problem *p, const bwd_views *xv, void *workspace, size_t workspace_bytes,
                             int own)
{
    /* the caller's view structs, copied before anything is written (as the forward's:
     * an output may overlap them) */
    bwd_views own_views = *xv, *x = &own_views;
    sdpa_view_copies vc;
    sdpa_copy_views(&vc, (const sdpa_tensor **const[]){&x->q, &x->k, &x->v, &x->o, &x->lse, &x->dout}, 6,
                    (const sdpa_tensor_out **const[]){&x->dq, &x->dk, &x->dv}, 3);
    plan pl;
    sdpa_status st = sdpa_make_plan(p, &pl, 1);
    if (st != SDPA_OK)
        return st;
    if (pl.seqs && !pl.seqs->cu_seqlens_k)
        return SDPA_ERR_UNSUPPORTED; /* no paged backward */
    size_t floats;
    if ((st = bwd_check(x, &pl, workspace, workspace_bytes)) != SDPA_OK ||
        (st = bwd_call_floats(&pl, &floats)) != SDPA_OK)
        return st;
    if (floats == 0) { /* every problem trivial, no dsinks */
        bwd_call(&pl, x, NULL, 0);
        return SDPA_OK;
    }
    float *ws = NULL;
    if ((st = sdpa_workspace_acquire(own, workspace, workspace_bytes, floats, &ws)) != SDPA_OK)
        return st;
    bwd_call(&pl, x, ws, floats);
    if (own)
        free(ws);
    return SDPA_OK;
}

sdpa_status sdpa_backward(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                          const sdpa_tensor *v, const sdpa_tensor *o, const sdpa_tensor *lse,
                          const sdpa_tensor *dout, const sdpa_tensor_out *dq, const sdpa_tensor_out *dk,
                          const sdpa_tensor_out *dv)
{
    const bwd_views x = {q, k, v, o, lse, dout, dq, dk, dv, NULL, NULL, 0, 0};
    return bwd_entry(p, &x, NULL, 0, 1);
}

sdpa_status sdpa_backward_workspace_size(const sdpa_problem *p, size_t *bytes)
{
    plan pl;
    sdpa_status st = sdpa_make_plan(p, &pl, 1);
    if (st != SDPA_OK)
        return st;
    if (!bytes)
        return SDPA_ERR_NULL_ARGUMENT;
    if (pl.seqs && !pl.seqs->cu_seqlens_k)
        return SDPA_ERR_UNSUPPORTED; /* as sdpa_backward: no paged backward */
    size_t floats;
    if ((st = bwd_call_floats(&pl, &floats)) != SDPA_OK)
        return st;
    return sdpa_workspace_bytes(floats, bytes);
}

sdpa_status sdpa_backward_with_workspace(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                                         const sdpa_tensor *v, const sdpa_tensor *o, const sdpa_tensor *lse,
                                         const sdpa_tensor *dout, const sdpa_tensor_out *dq,
                                         const sdpa_tensor_out *dk, const sdpa_tensor_out *dv, void *workspace,
                                         size_t workspace_bytes)
{
    const bwd_views x = {q, k, v, o, lse, dout, dq, dk, dv, NULL, NULL, 0, 0};
    return bwd_entry(p, &x, workspace, workspace_bytes, 0);
}
