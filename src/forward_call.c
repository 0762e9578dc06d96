/* SPDX-License-Identifier: MIT */
/* forward_call.c - the forward's entry points: validation, the workspace, and one
 * team over the work items of every problem of the call. A dense call is one
 * problem; a call over packed sequences (sdpa_seqs) is one problem per sequence,
 * each with its own plan and tile layout (sdpa_seq_plan), so that a sequence's
 * bits depend only on its own inputs and lengths, whatever else shares the call
 * (batch invariance), while the team takes the items of all of them at once
 * (decode rows split their keys, prefill chunks their query tiles) and merges
 * the split-KV partials after. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "view_copy.h"

/* One problem of the call and its views. */
typedef struct fwd_unit {
    plan pl;
    fwd_args a;
    sdpa_tensor q, k, v; /* one sequence's views (packed calls) */
    sdpa_tensor_out o, lse;
    int64_t items; /* tiles * nsplit */
} fwd_unit;

/* The call: its problems, where each one's items and merges start, the workspaces. */
typedef struct fwd_job {
    fwd_unit *u;
    int64_t n;
    int64_t *item_end;  /* n: cumulative items */
    int64_t *merge_end; /* n: cumulative tiles of the problems with nsplit > 1 */
    float *ws;          /* nthreads workspaces of `per` floats */
    size_t per;
} fwd_job;

typedef struct fwd_thread {
    const fwd_job *job;
    float *base;  /* this thread's `per` floats */
    int64_t unit; /* the problem w is carved for (problems may differ in block sizes), or -1 */
    fwd_ws w;
} fwd_thread;

/* The thread's workspace laid out for problem ui (kept while the problem stays). */
static const fwd_unit *thread_unit(fwd_thread *th, int64_t ui)
{
    const fwd_unit *u = &th->job->u[ui];
    if (th->unit != ui) {
        th->w = sdpa_fwd_ws_carve(&u->pl, th->base);
        th->unit = ui;
    }
    return u;
}

/* The problem whose cumulative count first exceeds it (binary search), and it
 * made local. */
static int64_t unit_of(const int64_t *end, int64_t n, int64_t *it)
{
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (end[mid] > *it)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (lo > 0)
        *it -= end[lo - 1];
    return lo;
}

static void fwd_item_of(void *arg, int64_t it)
{
    fwd_thread *th = arg;
    const fwd_unit *u = thread_unit(th, unit_of(th->job->item_end, th->job->n, &it));
    const tile_layout *L = &u->a.L;
    /* Within a head, last row tiles first: under causal masks they are the longest. */
    const int64_t split = it % L->nsplit, tile = it / L->nsplit;
    int64_t t = (tile / L->nrt) * L->nrt + (L->nrt - 1 - tile % L->nrt);
    if (sdpa_fwd_reuses_tiles(&u->pl)) {
        /* a mask the same for every head: per batch, each row tile (last first)
         * for every head in turn, so that a thread's next item is most often the
         * same rows of another head, whose key tiles it has classified already
         * (fwd_ws.cls_kind); t numbers tiles as sdpa_tile_coords reads them */
        const int64_t heads = u->pl.Hkv * L->ngt, per_b = L->nrt * heads;
        const int64_t b = tile / per_b, rt = L->nrt - 1 - (tile % per_b) / heads, hg = tile % heads;
        t = (b * heads + hg) * L->nrt + rt;
    }
    sdpa_fwd_item(&u->pl, &th->w, &u->a, t, split);
}

static void fwd_merge_of(void *arg, int64_t tile)
{
    fwd_thread *th = arg;
    const fwd_unit *u = thread_unit(th, unit_of(th->job->merge_end, th->job->n, &tile));
    sdpa_fwd_merge(&u->pl, &th->w, &u->a, tile);
}

static void fwd_team_body(void *ctx, int tid, int team)
{
    const fwd_job *job = ctx;
    fwd_thread th;
    th.job = job;
    th.base = job->ws + (size_t)tid * job->per;
    th.unit = -1;
    const sdpa_kernels *kt = job->u[0].pl.kt;
    const int tiles = kt->tiles_begin && sdpa_fwd_bf16_pairs(&job->u[0].pl); /* one table and type per call */
    if (tiles)
        kt->tiles_begin();
    sdpa_for_dynamic(team, job->item_end[job->n - 1], fwd_item_of, &th, 0);
    if (job->merge_end[job->n - 1] > 0)
        sdpa_for_dynamic(team, job->merge_end[job->n - 1], fwd_merge_of, &th, 0);
    if (tiles)
        kt->tiles_end();
}

/* ------------------------------------------------------------- the problems */

/* Problem u of the call (a sequence's, or the dense one) and its layout. */
static void unit_plan(const plan *pl, int64_t u, plan *out)
{
    if (pl->seqs)
        sdpa_seq_plan(pl, u, out);
    else
        *out = *pl;
    sdpa_fwd_pairs_blocks(out); /* per problem: a packed sequence's bits are its dense call's */
    sdpa_page_tiles(out);       /* the pair products' block_k too (amx: 128) within a page */
}

/* What the workspace holds, in floats: the problems, their cumulative counts,
 * nthreads per-thread workspaces (of the largest), and every split-KV partial. */
typedef struct fwd_sizes {
    int64_t n, items;
    size_t units, per, partials, total;
    int nthreads;
} fwd_sizes;

static sdpa_status fwd_sizes_of(const plan *pl, fwd_sizes *s)
{
    memset(s, 0, sizeof *s);
    s->n = pl->seqs ? pl->B : 1;
    for (int64_t u = 0; u < s->n; u++) {
        plan up;
        unit_plan(pl, u, &up);
        const tile_layout L = sdpa_tile_layout(&up);
        const size_t per = sdpa_fwd_ws_floats(&up);
        s->per = per > s->per ? per : s->per;
        s->items += L.tiles * L.nsplit;
        if (L.nsplit > 1)
            s->partials += (size_t)(L.tiles * L.nsplit) * sdpa_fwd_partial_floats(&up, &L);
    }
    s->nthreads = pl->nthreads > s->items ? (int)(s->items > 0 ? s->items : 1) : pl->nthreads;
    s->units = round_floats(((size_t)s->n * sizeof(fwd_unit) + sizeof(float) - 1) / sizeof(float)) +
               2 * round_floats(2 * (size_t)s->n);
    size_t t;
    if (__builtin_mul_overflow((size_t)s->nthreads, s->per, &t) || __builtin_add_overflow(t, s->units, &t) ||
        __builtin_add_overflow(t, s->partials, &s->total))
        return SDPA_ERR_SIZE_OVERFLOW;
    return SDPA_OK;
}

/* Sets up the problems in the workspace. */
static void fwd_job_init(const plan *pl, const fwd_args *a, const fwd_sizes *s, float *ws, fwd_job *job)
{
    float *base = ws;
    job->u = (fwd_unit *)(void *)carve(&base, (s->n * sizeof(fwd_unit) + sizeof(float) - 1) / sizeof(float));
    job->item_end = carve_i64(&base, (size_t)s->n);
    job->merge_end = carve_i64(&base, (size_t)s->n);
    job->n = s->n;
    job->per = s->per;
    job->ws = ws + s->units;
    float *partials = job->ws + (size_t)s->nthreads * s->per;
    int64_t items = 0, merges = 0;
    for (int64_t i = 0; i < s->n; i++) {
        fwd_unit *u = &job->u[i];
        unit_plan(pl, i, &u->pl);
        u->a = *a;
        if (pl->seqs) { /* the sequence's rows and keys: views offset to its first token */
            const sdpa_seqs *sq = pl->seqs;
            const int64_t t0 = sq->cu_seqlens_q[i], k0 = sq->cu_seqlens_k ? sq->cu_seqlens_k[i] : 0;
            u->q = *a->q, u->k = *a->k, u->v = *a->v, u->o = *a->o;
            u->lse = a->lse ? *a->lse : (sdpa_tensor_out){0};
            if (u->q.data)
                u->q.data = elem_at(u->q.data, t0 * u->q.seq_stride, pl->q_dtype);
            if (u->o.data)
                u->o.data = (void *)elem_at(u->o.data, t0 * u->o.seq_stride, pl->o_dtype);
            if (u->lse.data)
                u->lse.data = (float *)u->lse.data + t0 * u->lse.seq_stride;
            if (u->k.data && sq->cu_seqlens_k)
                u->k.data = elem_at(u->k.data, k0 * u->k.seq_stride, pl->kv_dtype);
            if (u->v.data && sq->cu_seqlens_k)
                u->v.data = elem_at(u->v.data, k0 * u->v.seq_stride, pl->kv_dtype);
            u->a.q = &u->q, u->a.k = &u->k, u->a.v = &u->v, u->a.o = &u->o;
            u->a.lse = a->lse ? &u->lse : NULL;
        }
        u->a.L = sdpa_tile_layout(&u->pl);
        u->items = u->a.L.tiles * u->a.L.nsplit;
        u->a.partials = u->a.L.nsplit > 1 ? partials : NULL;
        if (u->a.L.nsplit > 1) {
            partials += (size_t)u->items * sdpa_fwd_partial_floats(&u->pl, &u->a.L);
            merges += u->a.L.tiles;
        }
        items += u->items;
        job->item_end[i] = items;
        job->merge_end[i] = merges;
    }
}

/* ----------------------------------------------------------- entry points */

/* Validation of a call and its tensors; *nothing = 1 when there is nothing to
 * compute (no rows, or Dv = 0 without LSE). */
static sdpa_status fwd_prepare(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                               const sdpa_tensor *v, const sdpa_tensor_out *o, const sdpa_tensor_out *lse,
                               const void *workspace, size_t workspace_bytes, plan *pl, fwd_args *a, int *nothing)
{
    sdpa_status st = sdpa_make_plan(p, pl, 0);
    if (st != SDPA_OK)
        return st;
    if (!q || !k || !v || !o)
        return SDPA_ERR_NULL_ARGUMENT;
    int64_t nq[3], nk[3];
    sdpa_view_rows(pl, nq, nk);
    const int64_t sq[3] = {q->batch_stride, q->head_stride, q->seq_stride};
    const int64_t sk[3] = {k->batch_stride, k->head_stride, k->seq_stride};
    const int64_t sv[3] = {v->batch_stride, v->head_stride, v->seq_stride};
    const int64_t so[3] = {o->batch_stride, o->head_stride, o->seq_stride};
    const int64_t sl[3] = {lse ? lse->batch_stride : 0, lse ? lse->head_stride : 0, lse ? lse->seq_stride : 0};
    tensor_desc t[5] = {
        {q->data, sq, {nq[0], nq[1], nq[2]}, pl->Dk, dtype_bytes(pl->q_dtype), 0, 1},
        {k->data, sk, {nk[0], nk[1], nk[2]}, pl->Dk, dtype_bytes(pl->kv_dtype), 0, 1},
        {v->data, sv, {nk[0], nk[1], nk[2]}, pl->Dv, dtype_bytes(pl->kv_dtype), 0, 1},
        {o->data, so, {nq[0], nq[1], nq[2]}, pl->Dv, dtype_bytes(pl->o_dtype), 1, 1},
        {lse ? lse->data : NULL, sl, {nq[0], nq[1], nq[2]}, 1, 4, 1, lse && lse->data},
    };
    if ((st = sdpa_check_tensors(pl, t, 5, workspace, workspace_bytes)) != SDPA_OK)
        return st;
    const fwd_args args = {q, k, v, o, lse, {0}, NULL};
    *a = args;
    *nothing = pl->Dv == 0 && !(lse && lse->data);
    return SDPA_OK;
}

/* Runs a prepared call on the workspace ws (fwd_sizes_of's total floats). */
static void fwd_run(const plan *pl, const fwd_args *a, const fwd_sizes *s, float *ws)
{
    if (s->items == 0)
        return;
    fwd_job job;
    fwd_job_init(pl, a, s, ws, &job);
    sdpa_parallel(s->nthreads, fwd_team_body, &job);
}

/* The call on the caller's workspace, or (own: sdpa_forward) on one it allocates. */
static sdpa_status fwd_call(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                            const sdpa_tensor_out *o, const sdpa_tensor_out *lse, void *workspace,
                            size_t workspace_bytes, int own)
{
    plan pl;
    fwd_args a;
    fwd_sizes s;
    int nothing;
    /* the caller's view structs, copied before anything is written: an output may
     * overlap them (they are no operand of the aliasing rule), and the call reads its
     * copies only (session 32 review: a view inside O was read back corrupted) */
    sdpa_view_copies vc;
    sdpa_copy_views(&vc, (const sdpa_tensor **const[]){&q, &k, &v}, 3, (const sdpa_tensor_out **const[]){&o, &lse}, 2);
    sdpa_status st = fwd_prepare(p, q, k, v, o, lse, workspace, workspace_bytes, &pl, &a, &nothing);
    if (st != SDPA_OK || nothing)
        return st;
    if ((st = fwd_sizes_of(&pl, &s)) != SDPA_OK || s.items == 0)
        return st;
    float *ws = NULL;
    if ((st = sdpa_workspace_acquire(own, workspace, workspace_bytes, s.total, &ws)) != SDPA_OK)
        return st;
    fwd_run(&pl, &a, &s, ws);
    if (own)
        free(ws);
    return SDPA_OK;
}

sdpa_status sdpa_forward(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                         const sdpa_tensor *v, const sdpa_tensor_out *o, const sdpa_tensor_out *lse)
{
    return fwd_call(p, q, k, v, o, lse, NULL, 0, 1);
}

sdpa_status sdpa_forward_workspace_size(const sdpa_problem *p, size_t *bytes)
{
    plan pl;
    fwd_sizes s;
    sdpa_status st = sdpa_make_plan(p, &pl, 0);
    if (st != SDPA_OK)
        return st;
    if (!bytes)
        return SDPA_ERR_NULL_ARGUMENT;
    if ((st = fwd_sizes_of(&pl, &s)) != SDPA_OK)
        return st;
    return sdpa_workspace_bytes(s.items ? s.total : 0, bytes);
}

sdpa_status sdpa_forward_with_workspace(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                                        const sdpa_tensor *v, const sdpa_tensor_out *o, const sdpa_tensor_out *lse,
                                        void *workspace, size_t workspace_bytes)
{
    return fwd_call(p, q, k, v, o, lse, workspace, workspace_bytes, 0);
}
