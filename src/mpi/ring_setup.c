/* SPDX-License-Identifier: MIT */
/* src/mpi/ring_setup.c - ring attention's plan and checks (include/sdpa_mpi.h): the
 * split of the sequence over the ranks, the local calls of each step and their
 * descriptors (causal, windows, ALiBi and unequal lengths on global positions through
 * diagonal_offset), this rank's checks, the agreement of every rank on one status,
 * the workspace, and the backward's frame for large logits. The forward and backward
 * themselves are in ring.c. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"

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
int sdpa_ring_plan_calls(const ring *R, int src, sub_call out[4])
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
sdpa_problem sdpa_ring_call_problem(ring *R, int src, const sub_call *c)
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

/* This rank's own checks of what the ring needs (the library checks the rest). */
static sdpa_status ring_local_checks(ring *R, const sdpa_problem *p, sdpa_ring_layout layout, int backward)
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
    if (p->q_len > SDPA_MAX_SEQ_LEN || p->kv_len > SDPA_MAX_SEQ_LEN)
        return SDPA_ERR_SIZE_OVERFLOW; /* as sdpa_forward (the slices alone would pass) */
    if (p->window_left < SDPA_WINDOW_UNBOUNDED || p->window_right < SDPA_WINDOW_UNBOUNDED)
        return SDPA_ERR_BAD_WINDOW;
    /* a block pair's diagonal_offset reaches Tq + Tk: beyond SDPA_MAX_DIAGONAL_OFFSET its
       calls would be refused (BAD_WINDOW); only empty outputs can be that long */
    if (p->q_len + p->kv_len > SDPA_MAX_DIAGONAL_OFFSET)
        return SDPA_ERR_UNSUPPORTED;
    /* the enums as the library checks them (the ring rewrites both fields of its calls) */
    if ((unsigned)p->causal > SDPA_CAUSAL_BOTTOM_RIGHT || (unsigned)p->window_alignment > SDPA_ALIGN_BOTTOM_RIGHT ||
        (unsigned)p->q_dtype > SDPA_DTYPE_F16 || (unsigned)p->kv_dtype > SDPA_DTYPE_F16 ||
        (unsigned)p->o_dtype > SDPA_DTYPE_F16)
        return SDPA_ERR_BAD_DESCRIPTOR; /* a type the library does not know */
    /* the global diagonal: bottom-right is Tk - Tq (one value for every batch: key
     * lengths would move it per batch, refused with a diagonal that matters) */
    const int bottom_right = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                             (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    const int diagonal_used = p->causal != SDPA_CAUSAL_NONE || p->window_left != SDPA_WINDOW_UNBOUNDED ||
                              p->window_right != SDPA_WINDOW_UNBOUNDED || p->alibi_slopes;
    if (p->diagonal_offset != 0 || p->seqs || p->bool_mask.data || p->bias.data ||
        (bottom_right && diagonal_used && p->kv_lengths) || sdpa_ring_local_len(p->q_len, R->P, layout) < 0 ||
        sdpa_ring_local_len(p->kv_len, R->P, layout) < 0)
        return SDPA_ERR_UNSUPPORTED;
    if ((uintptr_t)p->kv_lengths % 4 || (uintptr_t)p->alibi_slopes % 4 || (uintptr_t)p->sinks % 4)
        return SDPA_ERR_MISALIGNED; /* as the library: the ring reads them as int32 / float (dsinks: the
                                       backward's probe checks it, the forward ignores it) */
    uintptr_t kvl_end; /* key lengths running past the top of memory (a garbage pointer): as the library */
    if (p->kv_lengths && p->batch > 0 &&
        ((uint64_t)p->batch > (uint64_t)PTRDIFF_MAX / sizeof(int32_t) ||
         __builtin_add_overflow((uintptr_t)p->kv_lengths, (uintptr_t)p->batch * sizeof(int32_t), &kvl_end)))
        return SDPA_ERR_SIZE_OVERFLOW;
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
    R->dsinks = backward ? p->dsinks : NULL; /* the forward ignores dsinks, as sdpa_forward */
    R->q_dtype = p->q_dtype;
    R->kv_dtype = p->kv_dtype;
    R->o_dtype = p->o_dtype;
    R->base = *p;
    /* the calls run in fp32: ring.c widens 16-bit tensors as it copies them and narrows
       the outputs at the end */
    R->base.q_dtype = R->base.kv_dtype = R->base.o_dtype = SDPA_DTYPE_F32;
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
sdpa_problem sdpa_ring_slice_problem(ring *R)
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
    p.q_dtype = R->q_dtype; /* the caller's views, in the caller's types */
    p.kv_dtype = R->kv_dtype;
    p.o_dtype = R->o_dtype;
    p.sinks = R->sinks; /* validated with the slice's tensors (dsinks: aliasing) */
    p.dsinks = R->dsinks;
    return p;
}

/* Whether bytes [p, p + n) overlap the memory of a valid output view [B, H, T, D] of
 * es-byte elements (non-negative strides: the library's probe has checked them). The
 * probe sees the ring's own copy of the key lengths, so the caller's array is checked here. */
int sdpa_ring_overlaps(const void *p, size_t n, const sdpa_tensor_out *t, int64_t B, int64_t H, int64_t T, int64_t D,
                       size_t es)
{
    if (!p || !n || !t || !t->data || B <= 0 || H <= 0 || T <= 0 || D <= 0)
        return 0;
    const uintptr_t a = (uintptr_t)p, lo = (uintptr_t)t->data;
    const uintptr_t hi = lo + (uintptr_t)((B - 1) * t->batch_stride + (H - 1) * t->head_stride +
                                          (T - 1) * t->seq_stride + D) * es;
    return a < hi && lo < a + n;
}

/* A library call with a workspace too small to run validates everything and writes nothing. */
sdpa_status sdpa_ring_probe_status(sdpa_status st)
{
    return st == SDPA_ERR_WORKSPACE_TOO_SMALL ? SDPA_OK : st;
}

/* The per-batch and per-head operands that are present, value by value: kv_lengths (B),
 * then alibi_slopes and sinks (Hq each) as their bits (their presence is compared
 * before, so every rank counts the same values). */
static int64_t ring_operand_count(const ring *R, const sdpa_problem *p)
{
    return (R->kvlen ? R->B : 0) + (p->alibi_slopes ? R->Hq : 0) + (R->sinks ? R->Hq : 0);
}

static int64_t ring_operand_value(const ring *R, const sdpa_problem *p, int64_t i)
{
    if (R->kvlen) {
        if (i < R->B)
            return R->kvlen[i];
        i -= R->B;
    }
    const float *x = p->alibi_slopes && i < R->Hq ? p->alibi_slopes : R->sinks;
    uint32_t u;
    memcpy(&u, &x[p->alibi_slopes && i >= R->Hq ? i - R->Hq : i], 4);
    return u;
}

/* Whether every rank holds the same operand values (ring_operand_value, as many on every
 * rank): MIN over the values and their negations, in rounds of a fixed size (no
 * allocation, so no rank can leave the collective early); 1 if all equal. */
static int ring_same_operands(const ring *R, const sdpa_problem *p)
{
    enum { ROUND = 128 };
    const int64_t n = ring_operand_count(R, p);
    int same = 1;
    for (int64_t i0 = 0; i0 < n; i0 += ROUND) {
        const int m = (int)(n - i0 < ROUND ? n - i0 : ROUND);
        int64_t in[2 * ROUND], out[2 * ROUND];
        for (int i = 0; i < m; i++) {
            in[i] = ring_operand_value(R, p, i0 + i);
            in[m + i] = -in[i]; /* the values are int32 or float bits: no overflow */
        }
        MPI_Allreduce(in, out, 2 * m, MPI_INT64_T, MPI_MIN, R->comm);
        for (int i = 0; i < m; i++)
            same &= out[i] == -out[m + i];
    }
    return same;
}

/* The agreement: every rank's status and the global sizes, with one MPI_Allreduce
 * (MIN over the values and their negations), then the operands exactly (until
 * session 29 through a hash, which chosen values could collide, and without the
 * causal corner and the window alignment). */
static sdpa_status ring_agree(ring *R, sdpa_status st, const sdpa_problem *p, sdpa_ring_layout layout)
{
    enum { NF = 20 };
    int64_t f[NF] = {0};
    if (p && st == SDPA_OK) {
        uint32_t sc, cap;
        memcpy(&sc, &p->scale, 4);
        memcpy(&cap, &p->softcap, 4);
        const int64_t present = (int64_t)(R->kvlen != NULL) | (int64_t)(p->alibi_slopes != NULL) << 1 |
                                (int64_t)(R->sinks != NULL) << 2 | (int64_t)(R->dsinks != NULL) << 3;
        const int64_t v[NF] = {p->batch, p->q_heads, p->kv_heads, p->q_len, p->kv_len, p->head_dim_qk,
                               p->head_dim_v, (int64_t)p->causal, (int64_t)layout, p->use_default_scale, (int64_t)sc,
                               (int64_t)cap, R->wl, R->wr, (int64_t)p->window_alignment, present, R->causal,
                               (int64_t)p->q_dtype, (int64_t)p->kv_dtype, (int64_t)p->o_dtype};
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
    /* the key lengths, ALiBi slopes and sinks too, value by value (every rank has the same
     * B, Hq and presence flags by now, so the same number of rounds) */
    if (!ring_same_operands(R, p))
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

/* Largest workspace of the calls this rank makes (every step's shapes). */
static sdpa_status max_workspace(ring *R, int backward, size_t *bytes)
{
    *bytes = 0;
    for (int s = 0; s < R->P; s++) {
        sub_call c[4];
        const int src = (R->r - s + R->P) % R->P, n = sdpa_ring_plan_calls(R, src, c);
        for (int i = 0; i < n; i++) {
            sdpa_problem p = sdpa_ring_call_problem(R, src, &c[i]);
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
sdpa_status sdpa_ring_begin(ring *R, MPI_Comm comm, const sdpa_problem *problem, sdpa_ring_layout layout,
                            int backward)
{
    ring_init(R, comm);
    sdpa_status st = ring_local_checks(R, problem, layout, backward);
    if (st == SDPA_OK && R->kvlen && !(R->kvbuf = malloc((size_t)(R->B > 0 ? R->B : 1) * sizeof(int32_t))))
        st = SDPA_ERR_OUT_OF_MEMORY;
    return st;
}

/* After this rank's checks (st): the workspace the blocks need, then every rank's
 * agreement (one status for all). On an error the key-length buffer is freed. */
sdpa_status sdpa_ring_checked(ring *R, sdpa_status st, int backward, const sdpa_problem *problem,
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
int sdpa_ring_frame_rows(ring *R, const sdpa_tensor *lse)
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
