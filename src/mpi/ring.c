/* SPDX-License-Identifier: MIT */
/* src/mpi/ring.c - ring attention over MPI (include/sdpa_mpi.h): forward and backward.
 *
 * Uses the public API of libsdpa only (sdpa_forward_with_workspace,
 * sdpa_backward_with_workspace, sdpa_merge_states).
 *
 * Step s of P: rank r holds the K/V block of rank src = r - s (mod P), packed
 * contiguously [B, Hkv, Tkl, Dk] then [B, Hkv, Tkl, Dv]. It posts the send of that
 * block to r + 1 and the receive of the next one from r - 1, runs the local calls
 * of its query chunks against the key chunks of src (plan_calls: skipped,
 * causal on the diagonal, unmasked), merges or accumulates, then waits. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_mpi.h"

enum { MASK_SKIP = 0, MASK_FULL = 1, MASK_DIAG = 2 };
enum { TAG_KV = 100, TAG_DKV = 200 };
#define MSG_FLOATS ((int64_t)1 << 28) /* a message's element count stays an int */
#define MAX_MSGS 64

typedef struct sub_call {
    int64_t q0, nq, k0, nk; /* local rows of the query slice and of the K/V block */
    int diag;               /* causal top-left on the block (diagonal chunk) */
    int64_t wl, wr;         /* the call's top-left window (SDPA_WINDOW_UNBOUNDED: none) */
    int64_t off;            /* its diagonal_offset */
} sub_call;

typedef struct ring {
    MPI_Comm comm;
    int P, r, nc; /* ranks, this rank, chunks per rank (1 contiguous, 2 zig-zag) */
    sdpa_ring_layout layout;
    int64_t B, Hq, Hkv, Dk, Dv;
    int64_t Tq, Tk;       /* the whole sequence's query and key lengths */
    int64_t Cq, Ck;       /* rows of a query / key chunk */
    int64_t Tql, Tkl;     /* this rank's query / key rows: nc * Cq, nc * Ck */
    int64_t dglob;        /* the global diagonal: Tk - Tq bottom-right, else 0 */
    int causal;
    int per_pair;         /* a bounded window or ALiBi: one call per (query chunk, key chunk) pair */
    int64_t wl, wr;       /* the global window (wr = 0 with causal), SDPA_WINDOW_UNBOUNDED */
    const float *sinks;   /* Hq sink logits, merged in after the ring (forward), or NULL */
    float *frame_bias;    /* backward, rows with |LSE| >= 256 present: -LSE per row [B, Hq, Tql] */
    float *frame_lse;     /* and the LSE the calls get: 0 (-inf for a row with no key) */
    float *dsinks;        /* backward: Hq gradients, summed over every rank's rows, or NULL */
    const int32_t *kvlen; /* global key lengths, or NULL */
    sdpa_problem base;
    int32_t *kvbuf; /* B local key lengths of one call */
} ring;

/* ----------------------------------------------------------- layout */

int64_t sdpa_ring_local_len(int64_t T, int P, sdpa_ring_layout layout)
{
    if (T < 0 || P < 1 || (layout != SDPA_RING_CONTIGUOUS && layout != SDPA_RING_ZIGZAG))
        return -1;
    const int64_t parts = layout == SDPA_RING_ZIGZAG ? 2 * (int64_t)P : P;
    if (T % parts != 0)
        return -1;
    return T / P;
}

/* Global chunk index of local chunk c of rank r. */
static int chunk_id(int P, int r, int nc, int c)
{
    return nc == 1 ? r : c == 0 ? r : 2 * P - 1 - r;
}

int64_t sdpa_ring_global_row(int64_t T, int P, int rank, sdpa_ring_layout layout, int64_t row)
{
    const int64_t tl = sdpa_ring_local_len(T, P, layout);
    if (tl < 0 || rank < 0 || rank >= P || row < 0 || row >= tl)
        return -1;
    const int nc = layout == SDPA_RING_ZIGZAG ? 2 : 1;
    const int64_t C = tl / nc;
    return (int64_t)chunk_id(P, rank, nc, (int)(row / C)) * C + row % C;
}

/* The calls of step `src` with a bounded window, ALiBi, or query and key lengths that
 * differ: one per (query chunk, key chunk) pair, whose diagonal_offset is delta = the
 * global diagonal + (global start of the query chunk) - (that of the key chunk): the
 * library then applies causal masking (wr = 0), the window and ALiBi on global
 * positions. A pair no query of which may see a key of (a + delta - wl <= b <= a +
 * delta + wr for rows a in [0, Cq), b in [0, Ck)) is skipped. */
static int plan_pair_calls(const ring *R, int src, sub_call out[4])
{
    const int64_t Cq = R->Cq, Ck = R->Ck, UNB = SDPA_WINDOW_UNBOUNDED;
    int n = 0;
    for (int i = 0; i < R->nc; i++)
        for (int j = 0; j < R->nc; j++) {
            const int64_t delta = R->dglob + (int64_t)chunk_id(R->P, R->r, R->nc, i) * Cq -
                                  (int64_t)chunk_id(R->P, src, R->nc, j) * Ck;
            if ((R->wr != UNB && delta + R->wr + Cq - 1 < 0) || (R->wl != UNB && delta - R->wl > Ck - 1))
                continue;
            out[n++] = (sub_call){i * Cq, Cq, j * Ck, Ck, 0, R->wl, R->wr, delta};
        }
    return n;
}

/* The calls of step `src` (the K/V block of rank src), in a fixed order: the
 * diagonal chunks first, then the unmasked rectangle(s). Returns their number. */
static int plan_calls(const ring *R, int src, sub_call out[4])
{
    int m[2][2], n = 0;
    if (R->Cq == 0 || R->Ck == 0)
        return 0;
    if (R->per_pair)
        return plan_pair_calls(R, src, out);
    const int64_t C = R->Cq; /* = Ck here (per_pair otherwise) */
    for (int i = 0; i < R->nc; i++)
        for (int j = 0; j < R->nc; j++) {
            const int cq = chunk_id(R->P, R->r, R->nc, i), ck = chunk_id(R->P, src, R->nc, j);
            m[i][j] = !R->causal ? MASK_FULL : ck > cq ? MASK_SKIP : ck == cq ? MASK_DIAG : MASK_FULL;
        }
    const int64_t UNB = SDPA_WINDOW_UNBOUNDED;
    for (int i = 0; i < R->nc; i++)
        for (int j = 0; j < R->nc; j++)
            if (m[i][j] == MASK_DIAG)
                out[n++] = (sub_call){i * C, C, j * C, C, 1, UNB, UNB, 0};
    /* unmasked key chunks of each query chunk: a run of local chunks [lo, hi) */
    int lo[2] = {0, 0}, hi[2] = {0, 0};
    for (int i = 0; i < R->nc; i++) {
        int a = -1, b = -1;
        for (int j = 0; j < R->nc; j++)
            if (m[i][j] == MASK_FULL) {
                if (a < 0)
                    a = j;
                b = j + 1;
            }
        if (a >= 0) {
            lo[i] = a;
            hi[i] = b;
        }
        for (int j = lo[i]; j < hi[i]; j++) /* the run is all unmasked (by the split); */
            if (m[i][j] != MASK_FULL)       /* were it not, the pair calls are right anyway */
                return plan_pair_calls(R, src, out);
    }
    if (R->nc == 2 && hi[0] > lo[0] && lo[0] == lo[1] && hi[0] == hi[1])
        out[n++] = (sub_call){0, 2 * C, lo[0] * C, (hi[0] - lo[0]) * C, 0, UNB, UNB, 0};
    else
        for (int i = 0; i < R->nc; i++)
            if (hi[i] > lo[i])
                out[n++] = (sub_call){i * C, C, lo[i] * C, (hi[i] - lo[i]) * C, 0, UNB, UNB, 0};
    return n;
}

/* Descriptor of one call; its key lengths (global, if any) mapped onto the local
 * key rows [k0, k0 + nk) of block src. The local chunks of a block are in
 * increasing global order, so the allowed keys stay a prefix. */
static sdpa_problem call_problem(ring *R, int src, const sub_call *c)
{
    sdpa_problem p = R->base;
    p.q_len = c->nq;
    p.kv_len = c->nk;
    p.causal = c->diag ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_NONE;
    p.window_alignment = SDPA_ALIGN_TOP_LEFT;
    p.window_left = c->wl;
    p.window_right = c->wr;
    p.diagonal_offset = c->off;
    if (R->frame_bias) /* every row's logits less its global LSE: see frame_rows */
        p.bias = (sdpa_bias){R->frame_bias + c->q0, R->Hq * R->Tql, R->Tql, 1, 0};
    if (R->kvlen) {
        for (int64_t b = 0; b < R->B; b++) {
            int64_t len = 0;
            for (int64_t j0 = c->k0; j0 < c->k0 + c->nk;) {
                const int64_t Ck = R->Ck, off = j0 % Ck, m = Ck - off < c->k0 + c->nk - j0 ? Ck - off : c->k0 + c->nk - j0;
                const int64_t g = (int64_t)chunk_id(R->P, src, R->nc, (int)(j0 / Ck)) * Ck + off;
                int64_t x = R->kvlen[b] - g;
                len += x < 0 ? 0 : x > m ? m : x;
                j0 += m;
            }
            R->kvbuf[b] = (int32_t)len;
        }
        p.kv_lengths = R->kvbuf;
    }
    return p;
}

/* ----------------------------------------------------------- validation */

static sdpa_tensor tv(const float *d, int64_t bs, int64_t hs, int64_t ss)
{
    return (sdpa_tensor){d, bs, hs, ss};
}

/* Row offset of a view (rows are the seq dimension). */
static sdpa_tensor rows_in(const sdpa_tensor *t, int64_t r0)
{
    return tv(t->data ? (const float *)t->data + r0 * t->seq_stride : NULL, t->batch_stride, t->head_stride, t->seq_stride);
}
static sdpa_tensor_out rows_out(const sdpa_tensor_out *t, int64_t r0)
{
    return (sdpa_tensor_out){t->data ? (float *)t->data + r0 * t->seq_stride : NULL, t->batch_stride, t->head_stride,
                             t->seq_stride};
}

/* This rank's own checks of what the ring needs (the library checks the rest). */
static sdpa_status ring_local_checks(ring *R, const sdpa_problem *p, sdpa_ring_layout layout)
{
    if (!p)
        return SDPA_ERR_NULL_ARGUMENT;
    sdpa_problem ref;
    sdpa_problem_init(&ref);
    if (p->struct_size != ref.struct_size)
        return SDPA_ERR_BAD_DESCRIPTOR;
    if (layout != SDPA_RING_CONTIGUOUS && layout != SDPA_RING_ZIGZAG)
        return SDPA_ERR_BAD_DESCRIPTOR;
    if (p->batch < 0 || p->q_heads < 0 || p->kv_heads < 0 || p->q_len < 0 || p->kv_len < 0 ||
        p->head_dim_qk < 0 || p->head_dim_v < 0)
        return SDPA_ERR_NEGATIVE_SIZE;
    if (p->window_left < SDPA_WINDOW_UNBOUNDED || p->window_right < SDPA_WINDOW_UNBOUNDED)
        return SDPA_ERR_BAD_WINDOW;
    /* the enums as the library checks them (the ring rewrites both fields of its calls) */
    if ((unsigned)p->causal > SDPA_CAUSAL_BOTTOM_RIGHT || (unsigned)p->window_alignment > SDPA_ALIGN_BOTTOM_RIGHT)
        return SDPA_ERR_BAD_DESCRIPTOR;
    /* the global diagonal: bottom-right is Tk - Tq (one value for every batch: key
     * lengths would move it per batch, refused with a diagonal that matters) */
    const int bottom_right = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                             (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    const int diagonal_used = p->causal != SDPA_CAUSAL_NONE || p->window_left != SDPA_WINDOW_UNBOUNDED ||
                              p->window_right != SDPA_WINDOW_UNBOUNDED || p->alibi_slopes;
    if (p->diagonal_offset != 0 || p->seqs || p->bool_mask.data || p->bias.data ||
        p->q_dtype != SDPA_DTYPE_F32 || p->kv_dtype != SDPA_DTYPE_F32 || p->o_dtype != SDPA_DTYPE_F32 ||
        (bottom_right && diagonal_used && p->kv_lengths) || sdpa_ring_local_len(p->q_len, R->P, layout) < 0 ||
        sdpa_ring_local_len(p->kv_len, R->P, layout) < 0)
        return SDPA_ERR_UNSUPPORTED;
    if (p->kv_lengths)
        for (int64_t b = 0; b < p->batch; b++)
            if (p->kv_lengths[b] < 0 || p->kv_lengths[b] > p->kv_len)
                return SDPA_ERR_BAD_KV_LENGTH;
    if (p->batch > INT32_MAX)
        return SDPA_ERR_SIZE_OVERFLOW;
    R->layout = layout;
    R->nc = layout == SDPA_RING_ZIGZAG ? 2 : 1;
    R->B = p->batch;
    R->Hq = p->q_heads;
    R->Hkv = p->kv_heads;
    R->Tq = p->q_len;
    R->Tk = p->kv_len;
    R->Dk = p->head_dim_qk;
    R->Dv = p->head_dim_v;
    R->Tql = p->q_len / R->P;
    R->Tkl = p->kv_len / R->P;
    R->Cq = R->Tql / R->nc;
    R->Ck = R->Tkl / R->nc;
    R->dglob = bottom_right ? R->Tk - R->Tq : 0;
    R->causal = p->causal != SDPA_CAUSAL_NONE;
    /* a bound wider than both sequences limits nothing: unbounded (this also keeps
     * delta +- bound + C in plan_pair_calls from overflowing, |delta| <= Tq + Tk) */
    const int64_t wl = p->window_left, wr = p->window_right;
    R->wl = wl > R->Tq && wl - R->Tq > R->Tk ? SDPA_WINDOW_UNBOUNDED : wl;
    R->wr = R->causal ? 0 : wr > R->Tq && wr - R->Tq > R->Tk ? SDPA_WINDOW_UNBOUNDED : wr;
    R->per_pair = R->wl != SDPA_WINDOW_UNBOUNDED || (!R->causal && R->wr != SDPA_WINDOW_UNBOUNDED) ||
                  p->alibi_slopes != NULL || R->Tq != R->Tk;
    R->kvlen = p->kv_lengths;
    R->sinks = p->sinks;
    R->dsinks = p->dsinks;
    R->base = *p;
    R->base.kv_lengths = NULL;
    R->base.sinks = NULL; /* the ring merges the sinks in itself */
    R->base.dsinks = NULL;
    R->base.causal = SDPA_CAUSAL_NONE;
    R->base.window_left = R->base.window_right = SDPA_WINDOW_UNBOUNDED;
    R->base.window_alignment = SDPA_ALIGN_TOP_LEFT;
    return SDPA_OK;
}

/* The whole-slice descriptor the library validates the local views against
 * (key lengths clamped to the slice: their global range was checked above). */
static sdpa_problem slice_problem(ring *R)
{
    sdpa_problem p = R->base;
    p.q_len = R->Tql;
    p.kv_len = R->Tkl;
    p.causal = R->causal && R->Tql == R->Tkl ? SDPA_CAUSAL_TOP_LEFT : SDPA_CAUSAL_NONE;
    if (R->kvlen) {
        for (int64_t b = 0; b < R->B; b++)
            R->kvbuf[b] = (int32_t)(R->kvlen[b] < R->Tkl ? R->kvlen[b] : R->Tkl);
        p.kv_lengths = R->kvbuf;
    }
    p.sinks = R->sinks; /* validated with the slice's tensors (dsinks: aliasing) */
    p.dsinks = R->dsinks;
    return p;
}

/* Whether bytes [p, p + n) overlap the memory of a valid output view [B, H, T, D]
 * (non-negative strides: the library's probe has checked them). The probe sees the
 * ring's own copy of the key lengths, so the caller's array is checked here. */
static int overlaps(const void *p, size_t n, const sdpa_tensor_out *t, int64_t B, int64_t H, int64_t T, int64_t D)
{
    if (!p || !n || !t || !t->data || B <= 0 || H <= 0 || T <= 0 || D <= 0)
        return 0;
    const uintptr_t a = (uintptr_t)p, lo = (uintptr_t)t->data;
    const uintptr_t hi = lo + (uintptr_t)((B - 1) * t->batch_stride + (H - 1) * t->head_stride +
                                          (T - 1) * t->seq_stride + D) * sizeof(float);
    return a < hi && lo < a + n;
}

/* A library call with a workspace too small to run validates everything and writes nothing. */
static sdpa_status probe_status(sdpa_status st)
{
    return st == SDPA_ERR_WORKSPACE_TOO_SMALL ? SDPA_OK : st;
}

/* The agreement: every rank's status and the global sizes, with one MPI_Allreduce
 * (MIN over the values and their negations). */
static sdpa_status ring_agree(ring *R, sdpa_status st, const sdpa_problem *p, sdpa_ring_layout layout)
{
    enum { NF = 14 };
    int64_t f[NF] = {0};
    if (p && st == SDPA_OK) {
        uint32_t sc, cap;
        memcpy(&sc, &p->scale, 4);
        memcpy(&cap, &p->softcap, 4);
        const int64_t v[NF] = {p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, p->head_dim_qk,
                               p->head_dim_v, R->causal, (int64_t)layout, p->use_default_scale, (int64_t)sc * 2 + 0,
                               (int64_t)cap * 2 + (p->kv_lengths != NULL), R->wl, R->wr};
        memcpy(f, v, sizeof f);
    }
    int64_t in[1 + 2 * NF], out[1 + 2 * NF];
    in[0] = st;
    for (int i = 0; i < NF; i++) {
        in[1 + i] = f[i];
        in[1 + NF + i] = -f[i];
    }
    MPI_Allreduce(in, out, 1 + 2 * NF, MPI_INT64_T, MPI_MIN, R->comm);
    if (out[0] < 0)
        return (sdpa_status)out[0];
    for (int i = 0; i < NF; i++)
        if (out[1 + i] != -out[1 + NF + i])
            return SDPA_ERR_BAD_DESCRIPTOR;
    /* the key lengths, ALiBi slopes and sinks too (their presence and a hash of their
     * values; every rank has B and Hq by now) */
    uint64_t s = (uint64_t)(R->kvlen != NULL) | (uint64_t)(p->alibi_slopes != NULL) << 1 |
                 (uint64_t)(R->sinks != NULL) << 2 | (uint64_t)(R->dsinks != NULL) << 3;
    for (int64_t b = 0; R->kvlen && b < R->B; b++)
        s = s * 1000003u + (uint32_t)R->kvlen[b];
    for (int a = 0; a < 2; a++) {
        const float *x = a == 0 ? p->alibi_slopes : R->sinks;
        for (int64_t h = 0; x && h < R->Hq; h++) {
            uint32_t u;
            memcpy(&u, &x[h], 4);
            s = s * 1000003u + u;
        }
    }
    const int64_t hs = (int64_t)(s & (uint64_t)INT64_MAX);
    int64_t mm[2] = {hs, -hs}, rr[2];
    MPI_Allreduce(mm, rr, 2, MPI_INT64_T, MPI_MIN, R->comm);
    if (rr[0] != -rr[1])
        return SDPA_ERR_BAD_DESCRIPTOR;
    return SDPA_OK;
}

static sdpa_status ring_init(ring *R, MPI_Comm comm)
{
    memset(R, 0, sizeof *R);
    R->comm = comm;
    MPI_Comm_size(comm, &R->P);
    MPI_Comm_rank(comm, &R->r);
    return SDPA_OK;
}

/* ----------------------------------------------------------- messages */

typedef struct msgs {
    MPI_Request req[MAX_MSGS];
    int n;
} msgs;

static void post(msgs *m, int send, float *buf, int64_t count, int peer, int tag, MPI_Comm comm)
{
    for (int64_t off = 0; off < count || (off == 0 && count == 0); off += MSG_FLOATS) {
        const int64_t n = count - off < MSG_FLOATS ? count - off : MSG_FLOATS;
        if (send)
            MPI_Isend(buf + off, (int)n, MPI_FLOAT, peer, tag, comm, &m->req[m->n++]);
        else
            MPI_Irecv(buf + off, (int)n, MPI_FLOAT, peer, tag, comm, &m->req[m->n++]);
        if (count == 0)
            break;
    }
}

static void wait_all(msgs *m)
{
    if (m->n)
        MPI_Waitall(m->n, m->req, MPI_STATUSES_IGNORE);
    m->n = 0;
}

/* Packs a [B, H, Tl, D] view into dst (contiguous). */
static void pack(float *dst, const sdpa_tensor *t, int64_t B, int64_t H, int64_t Tl, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++) {
                float *d = dst + ((b * H + h) * Tl + i) * D;
                if (D)
                    memcpy(d, (const float *)t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride,
                           (size_t)D * sizeof(float));
            }
}

static void unpack(const sdpa_tensor_out *t, const float *src, int64_t B, int64_t H, int64_t Tl, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++)
                if (D)
                    memcpy((float *)t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride,
                           src + ((b * H + h) * Tl + i) * D, (size_t)D * sizeof(float));
}

/* acc[B, H, Tl, D] rows [r0, r0 + n) += part[B, H, n, D] */
static void add_rows(float *acc, const float *part, int64_t B, int64_t H, int64_t Tl, int64_t r0, int64_t n,
                     int64_t D)
{
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *a = acc + (bh * Tl + r0) * D;
        const float *x = part + bh * n * D;
        for (int64_t e = 0; e < n * D; e++)
            a[e] += x[e];
    }
}

/* The state of rows [r0, r0 + n) of every (batch, head) that has seen no key yet:
 * O = 0, LSE = -inf (what the library writes for a row with no allowed key). */
static void empty_state(const sdpa_tensor_out *o, const sdpa_tensor_out *lse, int64_t B, int64_t H, int64_t r0,
                        int64_t n, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = r0; t < r0 + n; t++) {
                float *orow = (float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                for (int64_t d = 0; d < D; d++)
                    orow[d] = 0.0f;
                ((float *)lse->data)[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride] = -INFINITY;
            }
}

/* The sinks joined to the rows' states (gpt-oss; vLLM s_aux): the sink of head h is one
 * more logit s_h in every row's softmax, carrying no value, so the merged state is
 * LSE' = log(exp(LSE) + exp(s_h)), O' = O exp(LSE - LSE') (computed in double). A row
 * with no allowed key (LSE = -inf) gets O = 0, LSE = s_h; s_h = -inf changes nothing. */
static void merge_sinks(const float *sinks, const sdpa_tensor_out *o, const sdpa_tensor_out *lse, int64_t B,
                        int64_t H, int64_t Tl, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const double s = sinks[h];
            if (s == -INFINITY)
                continue;
            for (int64_t t = 0; t < Tl; t++) {
                float *l = (float *)lse->data + b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride;
                float *orow = (float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                const double L = *l, m = L > s ? L : s;
                const double nl = m + log(exp(L - m) + exp(s - m)), w = exp(L - nl);
                for (int64_t d = 0; d < D; d++)
                    orow[d] = (float)((double)orow[d] * w);
                *l = (float)nl;
            }
        }
}

/* This rank's part of d loss / d sinks[h] = -sum over batch and rows of
 * exp(s_h - LSE) * rowsum(dO * O) (sdpa_backward's dsinks), in double, into part[H]. */
static void dsinks_part(const float *sinks, const sdpa_tensor *o, const sdpa_tensor *lse, const sdpa_tensor *dout,
                        int64_t B, int64_t H, int64_t Tl, int64_t D, double *part)
{
    for (int64_t h = 0; h < H; h++) {
        double acc = 0;
        const double s = sinks[h];
        for (int64_t b = 0; b < B && s != -INFINITY; b++)
            for (int64_t t = 0; t < Tl; t++) {
                const double L = ((const float *)lse->data)[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride];
                if (L == -INFINITY)
                    continue;
                const float *orow = (const float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                const float *grow = (const float *)dout->data + b * dout->batch_stride + h * dout->head_stride +
                                    t * dout->seq_stride;
                double dsum = 0;
                for (int64_t d = 0; d < D; d++)
                    dsum += (double)grow[d] * (double)orow[d];
                acc -= exp(s - L) * dsum;
            }
        part[h] = acc;
    }
}

static void *alloc_f(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) - 16)
        return NULL;
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* The final agreement on a status after the data moved (only an allocation
 * inside sdpa_merge_states can fail there). */
static sdpa_status agree_final(MPI_Comm comm, sdpa_status st)
{
    int in = st, out;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
    return (sdpa_status)out;
}

/* Agrees on an allocation failure before any data moves. */
static sdpa_status agree_alloc(MPI_Comm comm, int ok)
{
    return agree_final(comm, ok ? SDPA_OK : SDPA_ERR_OUT_OF_MEMORY);
}

/* Largest workspace of the calls this rank makes (every step's shapes). */
static sdpa_status max_workspace(ring *R, int backward, size_t *bytes)
{
    *bytes = 0;
    for (int s = 0; s < R->P; s++) {
        sub_call c[4];
        const int src = (R->r - s + R->P) % R->P, n = plan_calls(R, src, c);
        for (int i = 0; i < n; i++) {
            sdpa_problem p = call_problem(R, src, &c[i]);
            size_t b;
            sdpa_status st = backward ? sdpa_backward_workspace_size(&p, &b) : sdpa_forward_workspace_size(&p, &b);
            if (st != SDPA_OK)
                return st;
            if (b > *bytes)
                *bytes = b;
        }
    }
    return SDPA_OK;
}

/* The start of both entry points: this rank's own checks, and the buffer of the
 * key lengths. */
static sdpa_status ring_begin(ring *R, MPI_Comm comm, const sdpa_problem *problem, sdpa_ring_layout layout)
{
    ring_init(R, comm);
    sdpa_status st = ring_local_checks(R, problem, layout);
    if (st == SDPA_OK && R->kvlen && !(R->kvbuf = malloc((size_t)(R->B > 0 ? R->B : 1) * sizeof(int32_t))))
        st = SDPA_ERR_OUT_OF_MEMORY;
    return st;
}

/* After this rank's checks (st): the workspace the blocks need, then every rank's
 * agreement (one status for all). On an error the key-length buffer is freed. */
static sdpa_status ring_checked(ring *R, sdpa_status st, int backward, const sdpa_problem *problem,
                                sdpa_ring_layout layout, size_t *ws_bytes)
{
    *ws_bytes = 0;
    if (st == SDPA_OK)
        st = max_workspace(R, backward, ws_bytes);
    st = ring_agree(R, st, problem, layout);
    if (st != SDPA_OK)
        free(R->kvbuf);
    return st;
}

/* ----------------------------------------------------------- forward */

sdpa_status sdpa_ring_forward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                              const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                              const sdpa_tensor_out *o, const sdpa_tensor_out *lse)
{
    ring R;
    sdpa_status st = ring_begin(&R, comm, problem, layout);
    if (st == SDPA_OK) {
        if (!q || !k || !v || !o)
            st = SDPA_ERR_NULL_ARGUMENT;
        else {
            sdpa_problem sp = slice_problem(&R);
            char dummy[1];
            st = probe_status(sdpa_forward_with_workspace(&sp, q, k, v, o, lse, dummy, 1));
            const size_t kb = R.kvlen ? (size_t)R.B * sizeof(int32_t) : 0;
            if (st == SDPA_OK && (overlaps(R.kvlen, kb, o, R.B, R.Hq, R.Tql, R.Dv) ||
                                  overlaps(R.kvlen, kb, lse, R.B, R.Hq, R.Tql, 1)))
                st = SDPA_ERR_ALIASING;
        }
    }
    size_t ws_bytes;
    if ((st = ring_checked(&R, st, 0, problem, layout, &ws_bytes)) != SDPA_OK)
        return st;
    const int64_t B = R.B, Hq = R.Hq, Hkv = R.Hkv, Tql = R.Tql, Tkl = R.Tkl, Dk = R.Dk, Dv = R.Dv;
    const int64_t kvn = B * Hkv * Tkl * (Dk + Dv);
    const int own_lse = !(lse && lse->data);
    float *kv[2] = {alloc_f(kvn), alloc_f(kvn)};
    float *ot = alloc_f(B * Hq * Tql * Dv), *lt = alloc_f(B * Hq * Tql), *la = own_lse ? alloc_f(B * Hq * Tql) : NULL;
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    st = agree_alloc(comm, kv[0] && kv[1] && ot && lt && (!own_lse || la) && ws);
    if (st == SDPA_OK) {
        pack(kv[0], k, B, Hkv, Tkl, Dk);
        pack(kv[0] + B * Hkv * Tkl * Dk, v, B, Hkv, Tkl, Dv);
        const sdpa_tensor_out lacc = own_lse ? (sdpa_tensor_out){la, Hq * Tql, Tql, 1} : *lse;
        int inited[2] = {0, 0}, sunk[2] = {0, 0}, cur = 0;
        for (int s = 0; s < R.P; s++) {
            const int src = (R.r - s + R.P) % R.P;
            msgs m = {.n = 0};
            if (s < R.P - 1) {
                post(&m, 0, kv[1 - cur], kvn, (R.r - 1 + R.P) % R.P, TAG_KV, comm);
                post(&m, 1, kv[cur], kvn, (R.r + 1) % R.P, TAG_KV, comm);
            }
            sub_call c[4];
            const int n = plan_calls(&R, src, c);
            for (int i = 0; i < n && st == SDPA_OK; i++) {
                const sdpa_problem p = call_problem(&R, src, &c[i]);
                const float *kb = kv[cur], *vb = kv[cur] + B * Hkv * Tkl * Dk;
                const sdpa_tensor kk = tv(kb + c[i].k0 * Dk, Hkv * Tkl * Dk, Tkl * Dk, Dk);
                const sdpa_tensor vv = tv(vb + c[i].k0 * Dv, Hkv * Tkl * Dv, Tkl * Dv, Dv);
                const sdpa_tensor qq = rows_in(q, c[i].q0);
                const sdpa_tensor_out oa = rows_out(o, c[i].q0), lsa = rows_out(&lacc, c[i].q0);
                const int c0 = (int)(c[i].q0 / R.Cq), c1 = (int)((c[i].q0 + c[i].nq - 1) / R.Cq);
                int any = 0, all = 1;
                for (int cc = c0; cc <= c1; cc++) {
                    any |= inited[cc];
                    all &= inited[cc];
                }
                if (!any) { /* the first state of these rows: straight into the accumulator,
                               with the sinks in the softmax as one call would have them */
                    sdpa_problem ps = p;
                    ps.sinks = R.sinks;
                    st = sdpa_forward_with_workspace(&ps, &qq, &kk, &vv, &oa, &lsa, ws, ws_bytes);
                    for (int cc = c0; cc <= c1; cc++)
                        sunk[cc] = 1;
                } else {
                    if (!all) /* a chunk without a state yet: an empty state (O = 0, LSE = -inf) */
                        for (int cc = c0; cc <= c1; cc++)
                            if (!inited[cc])
                                empty_state(o, &lacc, B, Hq, cc * R.Cq, R.Cq, Dv);
                    const int64_t nq = c[i].nq;
                    const sdpa_tensor_out op = {ot, Hq * nq * Dv, nq * Dv, Dv}, lp = {lt, Hq * nq, nq, 1};
                    st = sdpa_forward_with_workspace(&p, &qq, &kk, &vv, &op, &lp, ws, ws_bytes);
                    if (st == SDPA_OK) {
                        const sdpa_tensor a_o = tv(oa.data, oa.batch_stride, oa.head_stride, oa.seq_stride);
                        const sdpa_tensor a_l = tv(lsa.data, lsa.batch_stride, lsa.head_stride, lsa.seq_stride);
                        const sdpa_tensor b_o = tv(ot, op.batch_stride, op.head_stride, op.seq_stride);
                        const sdpa_tensor b_l = tv(lt, lp.batch_stride, lp.head_stride, lp.seq_stride);
                        st = sdpa_merge_states(B, Hq, nq, Dv, &a_o, &a_l, &b_o, &b_l, &oa, &lsa);
                    }
                }
                for (int cc = c0; cc <= c1; cc++)
                    inited[cc] = 1;
            }
            wait_all(&m);
            cur = 1 - cur;
        }
        /* chunks that met no key (queries before every key: Tq > Tk bottom-right) */
        for (int cc = 0; cc < R.nc && st == SDPA_OK; cc++)
            if (!inited[cc])
                empty_state(o, &lacc, B, Hq, cc * R.Cq, R.Cq, Dv);
        /* chunks whose first state was a merge into an empty state, or that met no key:
         * the sinks now (a row with no key gets O = 0, LSE = s_h) */
        for (int cc = 0; cc < R.nc && st == SDPA_OK && R.sinks; cc++)
            if (!sunk[cc]) {
                const sdpa_tensor_out oc = rows_out(o, cc * R.Cq), lc = rows_out(&lacc, cc * R.Cq);
                merge_sinks(R.sinks, &oc, &lc, B, Hq, R.Cq, Dv);
            }
        st = agree_final(comm, st);
    }
    free(kv[0]);
    free(kv[1]);
    free(ot);
    free(lt);
    free(la);
    free(ws);
    free(R.kvbuf);
    return st;
}

/* ----------------------------------------------------------- backward */

/* The backward recomputes P = exp(S - LSE) from the global LSE. For a row with
 * |LSE| >= 256 sdpa_backward would not trust the LSE it is given and recompute the
 * row's max and sum from the keys of the call, which here are one block's: wrong. If
 * this rank has such a row, every call gets the bias -LSE of its row (key stride 0,
 * added to the scaled logits) and LSE 0 instead, so that P = exp((S - LSE) - 0), the
 * same values, and no call takes that path; a row with no allowed key (LSE = -inf)
 * keeps bias 0 and LSE -inf. (Those rows then get the library's ordinary precision,
 * D = rowsum(dO * O) in float, not its float64 statistics pass.) Returns 0 when no row
 * needs it or one call covers every key, 1 when the buffers are set, -1 when they could
 * not be allocated. */
static int frame_rows(ring *R, const sdpa_tensor *lse)
{
    if (R->P == 1 && R->nc == 1) /* one call per row sees every key: the library's own path */
        return 0;
    const float *l = (const float *)lse->data;
    int need = 0;
    for (int64_t b = 0; b < R->B && !need; b++)
        for (int64_t h = 0; h < R->Hq && !need; h++)
            for (int64_t t = 0; t < R->Tql && !need; t++) {
                const float x = l[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride];
                need = isfinite(x) && fabsf(x) >= 256.0f;
            }
    if (!need)
        return 0;
    const size_t n = (size_t)(R->B * R->Hq * R->Tql);
    R->frame_bias = malloc((n ? n : 1) * sizeof(float));
    R->frame_lse = malloc((n ? n : 1) * sizeof(float));
    if (!R->frame_bias || !R->frame_lse)
        return -1;
    for (int64_t b = 0; b < R->B; b++)
        for (int64_t h = 0; h < R->Hq; h++)
            for (int64_t t = 0; t < R->Tql; t++) {
                const float x = l[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride];
                const size_t e = (size_t)((b * R->Hq + h) * R->Tql + t);
                R->frame_bias[e] = isfinite(x) ? -x : 0.0f;
                R->frame_lse[e] = isfinite(x) ? 0.0f : x;
            }
    return 1;
}

sdpa_status sdpa_ring_backward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                               const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                               const sdpa_tensor *o, const sdpa_tensor *lse, const sdpa_tensor *dout,
                               const sdpa_tensor_out *dq, const sdpa_tensor_out *dk, const sdpa_tensor_out *dv)
{
    ring R;
    sdpa_status st = ring_begin(&R, comm, problem, layout);
    if (st == SDPA_OK) {
        if (!q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv)
            st = SDPA_ERR_NULL_ARGUMENT;
        else {
            sdpa_problem sp = slice_problem(&R);
            char dummy[1];
            st = probe_status(sdpa_backward_with_workspace(&sp, q, k, v, o, lse, dout, dq, dk, dv, dummy, 1));
            const size_t kb = R.kvlen ? (size_t)R.B * sizeof(int32_t) : 0;
            const sdpa_tensor_out ds = {R.dsinks, 0, 0, 1};
            if (st == SDPA_OK && (overlaps(R.kvlen, kb, dq, R.B, R.Hq, R.Tql, R.Dk) ||
                                  overlaps(R.kvlen, kb, dk, R.B, R.Hkv, R.Tkl, R.Dk) ||
                                  overlaps(R.kvlen, kb, dv, R.B, R.Hkv, R.Tkl, R.Dv) ||
                                  overlaps(R.kvlen, kb, &ds, 1, 1, 1, R.Hq)))
                st = SDPA_ERR_ALIASING;
            if (R.P == 1 && R.nc == 1) /* one call sees every key: the sinks go into it, so that */
                R.base.sinks = R.sinks; /* a row with |LSE| >= 256 has them in its recomputed sum */
            if (st == SDPA_OK && frame_rows(&R, lse) < 0)
                st = SDPA_ERR_OUT_OF_MEMORY;
        }
    }
    size_t ws_bytes;
    if ((st = ring_checked(&R, st, 1, problem, layout, &ws_bytes)) != SDPA_OK) {
        free(R.frame_bias);
        free(R.frame_lse);
        return st;
    }
    const int64_t B = R.B, Hq = R.Hq, Hkv = R.Hkv, Tql = R.Tql, Tkl = R.Tkl, Dk = R.Dk, Dv = R.Dv;
    const int64_t kn = B * Hkv * Tkl * Dk, kvn = B * Hkv * Tkl * (Dk + Dv), qn = B * Hq * Tql * Dk;
    float *kv[2] = {alloc_f(kvn), alloc_f(kvn)}, *dkv[2] = {alloc_f(kvn), alloc_f(kvn)};
    float *dkv_t = alloc_f(kvn), *dkv_c = alloc_f(kvn), *dq_acc = alloc_f(qn), *dq_t = alloc_f(qn);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    double *ds = R.dsinks ? malloc(sizeof(double) * 2 * (size_t)(Hq > 0 ? Hq : 1)) : NULL;
    st = agree_alloc(comm, kv[0] && kv[1] && dkv[0] && dkv[1] && dkv_t && dkv_c && dq_acc && dq_t && ws &&
                               (!R.dsinks || ds));
    if (st == SDPA_OK) {
        pack(kv[0], k, B, Hkv, Tkl, Dk);
        pack(kv[0] + kn, v, B, Hkv, Tkl, Dv);
        memset(dq_acc, 0, (size_t)qn * sizeof(float));
        const int prev = (R.r - 1 + R.P) % R.P, next = (R.r + 1) % R.P;
        int cur = 0, a = 0;
        msgs dsend = {.n = 0}, drecv = {.n = 0};
        for (int s = 0; s < R.P; s++) {
            const int src = (R.r - s + R.P) % R.P;
            msgs m = {.n = 0};
            if (s < R.P - 1) {
                post(&m, 0, kv[1 - cur], kvn, prev, TAG_KV, comm);
                post(&m, 1, kv[cur], kvn, next, TAG_KV, comm);
            }
            /* this rank's share of dK/dV of block src (dkv_c), and of its own dQ */
            memset(dkv_c, 0, (size_t)kvn * sizeof(float));
            sub_call c[4];
            const int n = plan_calls(&R, src, c);
            for (int i = 0; i < n && st == SDPA_OK; i++) {
                const sdpa_problem p = call_problem(&R, src, &c[i]);
                const int64_t nq = c[i].nq, nk = c[i].nk;
                const float *kb = kv[cur], *vb = kv[cur] + kn;
                const sdpa_tensor kk = tv(kb + c[i].k0 * Dk, Hkv * Tkl * Dk, Tkl * Dk, Dk);
                const sdpa_tensor vv = tv(vb + c[i].k0 * Dv, Hkv * Tkl * Dv, Tkl * Dv, Dv);
                const sdpa_tensor lf = {R.frame_lse, Hq * Tql, Tql, 1};
                const sdpa_tensor qq = rows_in(q, c[i].q0), oo = rows_in(o, c[i].q0),
                                  ll = rows_in(R.frame_lse ? &lf : lse, c[i].q0), gg = rows_in(dout, c[i].q0);
                const sdpa_tensor_out dqo = {dq_t, Hq * nq * Dk, nq * Dk, Dk};
                const sdpa_tensor_out dko = {dkv_t, Hkv * nk * Dk, nk * Dk, Dk};
                const sdpa_tensor_out dvo = {dkv_t + B * Hkv * nk * Dk, Hkv * nk * Dv, nk * Dv, Dv};
                st = sdpa_backward_with_workspace(&p, &qq, &kk, &vv, &oo, &ll, &gg, &dqo, &dko, &dvo, ws, ws_bytes);
                if (st == SDPA_OK) {
                    add_rows(dq_acc, dq_t, B, Hq, Tql, c[i].q0, nq, Dk);
                    add_rows(dkv_c, dkv_t, B, Hkv, Tkl, c[i].k0, nk, Dk);
                    add_rows(dkv_c + kn, dkv_t + B * Hkv * nk * Dk, B, Hkv, Tkl, c[i].k0, nk, Dv);
                }
            }
            /* the traveling sum of block src: from rank r - 1 (or start it) */
            if (s == 0)
                memcpy(dkv[a], dkv_c, (size_t)kvn * sizeof(float));
            else {
                wait_all(&drecv);
                for (int64_t e = 0; e < kvn; e++)
                    dkv[a][e] += dkv_c[e];
            }
            if (R.P > 1) {
                wait_all(&dsend); /* dkv[1 - a] is free again */
                post(&drecv, 0, dkv[1 - a], kvn, prev, TAG_DKV, comm);
                post(&dsend, 1, dkv[a], kvn, next, TAG_DKV, comm);
                a = 1 - a;
            }
            wait_all(&m);
            cur = 1 - cur;
        }
        /* block r's sum, home after P steps */
        wait_all(&drecv);
        wait_all(&dsend);
        if (R.dsinks) { /* every rank's rows: summed over the ranks (every rank takes part) */
            dsinks_part(R.sinks, o, lse, dout, B, Hq, Tql, Dv, ds);
            MPI_Allreduce(ds, ds + Hq, (int)Hq, MPI_DOUBLE, MPI_SUM, comm);
        }
        st = agree_final(comm, st);
        if (st == SDPA_OK) {
            unpack(dq, dq_acc, B, Hq, Tql, Dk);
            unpack(dk, dkv[a], B, Hkv, Tkl, Dk);
            unpack(dv, dkv[a] + kn, B, Hkv, Tkl, Dv);
            for (int64_t h = 0; R.dsinks && h < Hq; h++)
                R.dsinks[h] = (float)ds[Hq + h];
        }
    }
    free(kv[0]);
    free(kv[1]);
    free(dkv[0]);
    free(dkv[1]);
    free(dkv_t);
    free(dkv_c);
    free(dq_acc);
    free(dq_t);
    free(ws);
    free(ds);
    free(R.frame_bias);
    free(R.frame_lse);
    free(R.kvbuf);
    return st;
}
