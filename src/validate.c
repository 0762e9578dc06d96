/* SPDX-License-Identifier: MIT */
/* validate.c - everything checked before anything is written: the descriptor
 * (sizes, enums, scale, windows, threads, block sizes, key lengths) becomes a
 * plan; every tensor view is checked for NULL data, negative strides, extents
 * that overflow the address space, outputs that overlap themselves, and
 * outputs that overlap an input, another output or a mask operand (with an
 * exact test for interleaved views of one buffer). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "driver.h"

static int extent_wraps(const void *data, int64_t n, size_t elem);

/* [lo, hi) byte span of a tensor of n[0..3] rows of len contiguous floats. */
typedef struct span {
    uintptr_t lo, hi;
} span;

static int tensor_span(const void *data, size_t elem, const int64_t n[3], const int64_t s[3],
                       int64_t len, span *out)
{
    out->lo = out->hi = 0;
    if (n[0] == 0 || n[1] == 0 || n[2] == 0 || len == 0)
        return 0;
    int64_t ext = len, t;
    for (int i = 0; i < 3; i++) {
        if (__builtin_mul_overflow(n[i] - 1, s[i], &t) || __builtin_add_overflow(ext, t, &ext))
            return -1;
    }
    int64_t bytes;
    if (__builtin_mul_overflow(ext, (int64_t)elem, &bytes) || bytes > PTRDIFF_MAX)
        return -1;
    out->lo = (uintptr_t)data;
    /* an extent past the top of the address space (a garbage pointer) wraps */
    if (__builtin_add_overflow((uintptr_t)data, (uintptr_t)bytes, &out->hi))
        return -1;
    return 0;
}

static int spans_overlap(span a, span b)
{
    return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

/* The dimensions of more than one row as (stride, count) pairs, sorted by
 * stride; returns how many. */
static int dims_by_stride(const int64_t n[3], const int64_t s[3], int64_t dims[3][2])
{
    int nd = 0;
    for (int i = 0; i < 3; i++)
        if (n[i] > 1) {
            dims[nd][0] = s[i];
            dims[nd][1] = n[i];
            nd++;
        }
    for (int i = 1; i < nd; i++) /* insertion sort by stride */
        for (int j = i; j > 0 && dims[j][0] < dims[j - 1][0]; j--) {
            int64_t t0 = dims[j][0], t1 = dims[j][1];
            dims[j][0] = dims[j - 1][0];
            dims[j][1] = dims[j - 1][1];
            dims[j - 1][0] = t0;
            dims[j - 1][1] = t1;
        }
    return nd;
}

/* An output must not overlap itself: sorting its nontrivial dimensions by
 * stride, each stride must step over everything the smaller ones cover. */
static int output_self_overlaps(const int64_t n[3], const int64_t s[3], int64_t len)
{
    int64_t dims[3][2];
    const int nd = dims_by_stride(n, s, dims);
    int64_t covered = len; /* elements spanned by the inner dimensions */
    for (int i = 0; i < nd; i++) {
        if (dims[i][0] < covered)
            return 1;
        covered = dims[i][0] * (dims[i][1] - 1) + covered;
    }
    return 0;
}

static sdpa_status check_tensor(const tensor_desc *t, span *sp)
{
    const int64_t *s = t->strides;
    if (s[0] < 0 || s[1] < 0 || s[2] < 0)
        return SDPA_ERR_BAD_STRIDE;
    const int empty = t->n[0] == 0 || t->n[1] == 0 || t->n[2] == 0 || t->len == 0;
    if (!empty && !t->data)
        return SDPA_ERR_NULL_ARGUMENT;
    if (!empty && (uintptr_t)t->data % t->elem)
        return SDPA_ERR_MISALIGNED;
    if (tensor_span(t->data, t->elem, t->n, s, t->len, sp))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (t->is_output && !empty && output_self_overlaps(t->n, s, t->len))
        return SDPA_ERR_BAD_STRIDE;
    return SDPA_OK;
}

/* The attention variants: softcap 0 or finite > 0; Hq finite slopes; Hq sinks
 * finite or -inf; dsinks only with sinks. */
static sdpa_status check_variants(const sdpa_problem *p)
{
    if (p->softcap != 0.0f && !(isfinite(p->softcap) && p->softcap > 0.0f))
        return SDPA_ERR_BAD_SOFTCAP;
    if (p->alibi_slopes)
        for (int64_t h = 0; h < p->q_heads; h++)
            if (!isfinite(p->alibi_slopes[h]))
                return SDPA_ERR_BAD_ALIBI;
    if (p->dsinks && !p->sinks)
        return SDPA_ERR_BAD_SINKS;
    if (p->sinks)
        for (int64_t h = 0; h < p->q_heads; h++)
            if (isnan(p->sinks[h]) || p->sinks[h] == INFINITY)
                return SDPA_ERR_BAD_SINKS;
    return SDPA_OK;
}

/* The window of the plan's own Tq, Tk from the descriptor's: |i + d| <= Tq + Tk +
 * |diagonal_offset|, so a wider window limits nothing and is unbounded (this also
 * keeps i + d +- window from overflowing); causal is window_right = 0 (or tighter). */
static void plan_windows(plan *pl)
{
    const int64_t off = pl->diag_offset < 0 ? -pl->diag_offset : pl->diag_offset;
    pl->wl = pl->wl_raw;
    pl->wr = pl->wr_raw;
    if (pl->wl > pl->Tq && pl->wl - pl->Tq > pl->Tk && pl->wl - pl->Tq - pl->Tk > off)
        pl->wl = SDPA_WINDOW_UNBOUNDED;
    if (pl->wr > pl->Tq && pl->wr - pl->Tq > pl->Tk && pl->wr - pl->Tq - pl->Tk > off)
        pl->wr = SDPA_WINDOW_UNBOUNDED;
    if (pl->causal)
        pl->wr = (pl->wr == SDPA_WINDOW_UNBOUNDED || pl->wr > 0) ? 0 : pl->wr;
}

/* Packed sequences: cu_seqlens (0, nondecreasing, last = total), or a paged
 * cache (sizes, seq_lens_k within the block table rows, the page ids each
 * sequence uses); the element masks and kv_lengths are not taken with them. */
static sdpa_status check_cu(const int32_t *cu, int64_t B, int64_t total)
{
    if (cu[0] != 0)
        return SDPA_ERR_BAD_SEQLENS;
    for (int64_t b = 0; b < B; b++)
        if (cu[b + 1] < cu[b])
            return SDPA_ERR_BAD_SEQLENS;
    return cu[B] == total ? SDPA_OK : SDPA_ERR_BAD_SEQLENS;
}

/* Pages sequence b of a paged cache uses (its block table entries read). */
static int64_t pages_used(const sdpa_seqs *s, int64_t b)
{
    return (s->seq_lens_k[b] + s->block_size - 1) / s->block_size;
}

static sdpa_status check_pages(const sdpa_problem *p, const sdpa_seqs *s)
{
    if (!s->block_table || !s->seq_lens_k)
        return SDPA_ERR_NULL_ARGUMENT;
    if (s->block_size < 1 || s->max_blocks_per_seq < 0 || s->num_blocks < 0 || s->num_blocks > INT32_MAX ||
        s->block_size > INT32_MAX)
        return SDPA_ERR_BAD_BLOCK_TABLE;
    int64_t cap, rows;
    if (__builtin_mul_overflow(s->max_blocks_per_seq, s->block_size, &cap) ||
        __builtin_mul_overflow(p->batch, s->max_blocks_per_seq, &rows))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (p->kv_len != 0)
        return SDPA_ERR_BAD_SEQLENS;
    for (int64_t b = 0; b < p->batch; b++) {
        if (s->seq_lens_k[b] < 0 || s->seq_lens_k[b] > cap)
            return SDPA_ERR_BAD_SEQLENS;
        const int64_t used = pages_used(s, b);
        if (extent_wraps(s->block_table, b * s->max_blocks_per_seq + used, sizeof(int32_t)))
            return SDPA_ERR_SIZE_OVERFLOW; /* (b + 1) * M <= B * M: no overflow */
        for (int64_t j = 0; j < used; j++) {
            const int32_t page = s->block_table[b * s->max_blocks_per_seq + j];
            if (page < 0 || page >= s->num_blocks)
                return SDPA_ERR_BAD_BLOCK_TABLE;
        }
    }
    return SDPA_OK;
}

static sdpa_status check_seqs(const sdpa_problem *p)
{
    const sdpa_seqs *s = p->seqs;
    if (!s)
        return SDPA_OK;
    if (p->kv_lengths || p->bool_mask.data || p->bias.data)
        return SDPA_ERR_UNSUPPORTED;
    if (!s->cu_seqlens_q)
        return SDPA_ERR_NULL_ARGUMENT;
    sdpa_status st = check_cu(s->cu_seqlens_q, p->batch, p->q_len);
    if (st != SDPA_OK)
        return st;
    if (s->cu_seqlens_k)
        return s->block_table ? SDPA_ERR_BAD_BLOCK_TABLE : check_cu(s->cu_seqlens_k, p->batch, p->kv_len);
    return check_pages(p, s);
}

void sdpa_seq_plan(const plan *pl, int64_t b, plan *sub)
{
    const sdpa_seqs *s = pl->seqs;
    *sub = *pl;
    sub->seqs = NULL;
    sub->B = 1;
    sub->Tq = s->cu_seqlens_q[b + 1] - s->cu_seqlens_q[b];
    sub->Tk = s->cu_seqlens_k ? s->cu_seqlens_k[b + 1] - s->cu_seqlens_k[b] : s->seq_lens_k[b];
    plan_windows(sub);
    if (!s->cu_seqlens_k) { /* paged */
        sub->pages = s->block_table + b * s->max_blocks_per_seq;
        sub->page_size = s->block_size;
        sdpa_page_tiles(sub);
    }
}

void sdpa_page_tiles(plan *pl)
{
    if (!pl->pages)
        return;
    int bk = pl->bk;
    while (pl->page_size % bk)
        bk--;
    pl->bk = bk;
}

void sdpa_view_rows(const plan *pl, int64_t nq[3], int64_t nk[3])
{
    const sdpa_seqs *s = pl->seqs;
    nq[0] = pl->B, nq[1] = pl->Hq, nq[2] = pl->Tq;
    nk[0] = pl->B, nk[1] = pl->Hkv, nk[2] = pl->Tk;
    if (!s)
        return;
    nq[0] = 1; /* token lists: [total_q, Hq, D] */
    nk[0] = 1;
    if (!s->cu_seqlens_k) { /* pages: [num_blocks, Hkv, block_size, D] through strides */
        nk[0] = s->num_blocks;
        nk[2] = s->block_size;
    }
}

/* 1 if an operand array the descriptor points to is not aligned to its element
 * (4 bytes: kv_lengths, bias, alibi_slopes, sinks, dsinks and the seqs arrays; the
 * bool mask is bytes): the kernels read them as int32 / float. */
static int operands_misaligned(const sdpa_problem *p)
{
    const void *a[] = {p->kv_lengths, p->bias.data, p->alibi_slopes, p->sinks, p->dsinks,
                       p->seqs ? (const void *)p->seqs->cu_seqlens_q : NULL,
                       p->seqs ? (const void *)p->seqs->cu_seqlens_k : NULL,
                       p->seqs ? (const void *)p->seqs->block_table : NULL,
                       p->seqs ? (const void *)p->seqs->seq_lens_k : NULL};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        if ((uintptr_t)a[i] % 4)
            return 1;
    return 0;
}

/* 1 if n elements of elem bytes at data would run past the top of the address space
 * (a garbage pointer; the byte count itself fits): checked before the descriptor's own
 * arrays are read. */
static int extent_wraps(const void *data, int64_t n, size_t elem)
{
    uintptr_t end;
    return data && n > 0 &&
           ((uint64_t)n > (uint64_t)PTRDIFF_MAX / elem ||
            __builtin_add_overflow((uintptr_t)data, (uintptr_t)n * elem, &end));
}

/* extent_wraps for the arrays check_descriptor reads: kv_lengths [B], alibi_slopes,
 * sinks and dsinks [Hq], the seqs arrays but the block table (check_pages: up to the
 * entries a sequence uses, the only ones read); the seqs struct itself first, by the
 * caller. */
static int operands_wrap(const sdpa_problem *p)
{
    const int64_t B = p->batch, H = p->q_heads, B1 = B < INT64_MAX ? B + 1 : B;
    if (extent_wraps(p->kv_lengths, B, 4) || extent_wraps(p->alibi_slopes, H, 4) ||
        extent_wraps(p->sinks, H, 4) || extent_wraps(p->dsinks, H, 4))
        return 1;
    const sdpa_seqs *s = p->seqs;
    return s && (extent_wraps(s->cu_seqlens_q, B1, 4) || extent_wraps(s->cu_seqlens_k, B1, 4) ||
                 extent_wraps(s->seq_lens_k, B, 4));
}

/* The descriptor's own checks (no tensors, no kernels). */
static sdpa_status check_descriptor(const sdpa_problem *p)
{
    if (!p)
        return SDPA_ERR_NULL_ARGUMENT;
    if (p->struct_size != sizeof(sdpa_problem) || p->reserved0 != 0 || p->reserved1 != 0 ||
        (unsigned)p->fpmath_mode > SDPA_FPMATH_STRICT)
        return SDPA_ERR_BAD_DESCRIPTOR;
    if ((unsigned)p->causal > SDPA_CAUSAL_BOTTOM_RIGHT ||
        (unsigned)p->window_alignment > SDPA_ALIGN_BOTTOM_RIGHT ||
        (p->use_default_scale != 0 && p->use_default_scale != 1) || (int)p->isa < SDPA_ISA_AUTO ||
        (int)p->isa >= SDPA_ISA_COUNT || (unsigned)p->q_dtype > SDPA_DTYPE_F16 ||
        (unsigned)p->kv_dtype > SDPA_DTYPE_F16 || (unsigned)p->o_dtype > SDPA_DTYPE_F16)
        return SDPA_ERR_BAD_DESCRIPTOR;
    if (p->batch < 0 || p->q_heads < 0 || p->kv_heads < 0 || p->q_len < 0 || p->kv_len < 0 ||
        p->head_dim_qk < 0 || p->head_dim_v < 0)
        return SDPA_ERR_NEGATIVE_SIZE;
    /* The row counts B*Hq*Tq and B*Hkv*Tk must fit int64 even where no tensor
     * bounds them (Dk = 0 leaves Q, K, dQ, dK empty, and O, LSE, dO may be
     * stride-0 inputs): the workspace and every row index (b*Hq + h)*Tq + i
     * come from them. */
    int64_t rows;
    if (__builtin_mul_overflow(p->batch, p->q_heads, &rows) || __builtin_mul_overflow(rows, p->q_len, &rows) ||
        __builtin_mul_overflow(p->batch, p->kv_heads, &rows) || __builtin_mul_overflow(rows, p->kv_len, &rows))
        return SDPA_ERR_SIZE_OVERFLOW;
    /* Query and key positions, windows and diagonal offsets are added as int64
     * (row_range: i + d + window_right <= 2 Tq + 2 Tk + 2 |offset|, under 2^63). */
    if (p->q_len > SDPA_MAX_SEQ_LEN || p->kv_len > SDPA_MAX_SEQ_LEN)
        return SDPA_ERR_SIZE_OVERFLOW;
    /* Never divide by kv_heads before this check (Hq = Hkv = 0 is legal). */
    if ((p->kv_heads == 0 && p->q_heads > 0) || (p->kv_heads > 0 && p->q_heads % p->kv_heads))
        return SDPA_ERR_HEAD_GROUPING;
    /* With the default scale, .scale must stay 0 as sdpa_problem_init() left it:
     * a value set there while use_default_scale is still 1 would be ignored. */
    if (p->use_default_scale ? (p->head_dim_qk == 0 || p->scale != 0.0f) : !isfinite(p->scale))
        return SDPA_ERR_BAD_SCALE;
    if (p->window_left < SDPA_WINDOW_UNBOUNDED || p->window_right < SDPA_WINDOW_UNBOUNDED ||
        p->diagonal_offset < -SDPA_MAX_DIAGONAL_OFFSET || p->diagonal_offset > SDPA_MAX_DIAGONAL_OFFSET)
        return SDPA_ERR_BAD_WINDOW;
    if (p->num_threads < 0)
        return SDPA_ERR_BAD_THREADS;
    if (p->block_q < 0 || p->block_q > SDPA_MAX_BLOCK || p->block_k < 0 || p->block_k > SDPA_MAX_BLOCK)
        return SDPA_ERR_BAD_BLOCK_SIZE;
    if (p->head_dim_qk > INT32_MAX || p->head_dim_v > INT32_MAX)
        return SDPA_ERR_SIZE_OVERFLOW;
    if (p->bool_mask.data && (p->bool_mask.batch_stride < 0 || p->bool_mask.head_stride < 0 ||
                              p->bool_mask.query_stride < 0 || p->bool_mask.key_stride < 0))
        return SDPA_ERR_BAD_STRIDE;
    if (p->bias.data && (p->bias.batch_stride < 0 || p->bias.head_stride < 0 ||
                         p->bias.query_stride < 0 || p->bias.key_stride < 0))
        return SDPA_ERR_BAD_STRIDE;
    if (extent_wraps(p->seqs, 1, sizeof *p->seqs))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (operands_misaligned(p))
        return SDPA_ERR_MISALIGNED;
    if (operands_wrap(p))
        return SDPA_ERR_SIZE_OVERFLOW;
    if (p->kv_lengths && !p->seqs) /* with seqs: refused below, whatever the values */
        for (int64_t b = 0; b < p->batch; b++)
            if (p->kv_lengths[b] < 0 || p->kv_lengths[b] > p->kv_len)
                return SDPA_ERR_BAD_KV_LENGTH;
    const sdpa_status st = check_variants(p);
    return st != SDPA_OK ? st : check_seqs(p);
}

sdpa_status sdpa_make_plan(const sdpa_problem *p, plan *pl, int backward)
{
    sdpa_problem own;
    if (!backward && p && p->struct_size == sizeof *p && p->dsinks) { /* the forward ignores dsinks */
        own = *p;
        own.dsinks = NULL;
        p = &own;
    }
    const sdpa_status st = check_descriptor(p);
    if (st != SDPA_OK)
        return st;
    const sdpa_kernels *kt = sdpa_kernels_get(p->isa);
    if (!kt)
        return SDPA_ERR_ISA_UNAVAILABLE;

    memset(pl, 0, sizeof *pl);
    pl->B = p->batch;
    pl->Hq = p->q_heads;
    pl->Hkv = p->kv_heads;
    pl->G = p->kv_heads ? p->q_heads / p->kv_heads : 0;
    pl->Tq = p->q_len;
    pl->Tk = p->kv_len;
    pl->Dk = p->head_dim_qk;
    pl->Dv = p->head_dim_v;
    pl->q_dtype = p->q_dtype;
    pl->kv_dtype = p->kv_dtype;
    pl->o_dtype = p->o_dtype;
    pl->strict = p->fpmath_mode == SDPA_FPMATH_STRICT;
    pl->reduced = p->q_dtype != SDPA_DTYPE_F32 || p->kv_dtype != SDPA_DTYPE_F32 || p->o_dtype != SDPA_DTYPE_F32;
    pl->scale = p->use_default_scale ? (float)(1.0 / sqrt((double)p->head_dim_qk)) : p->scale;
    pl->bottom_right = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                       (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    pl->causal = p->causal != SDPA_CAUSAL_NONE;
    pl->diag_offset = p->diagonal_offset;
    pl->wl_raw = p->window_left;
    pl->wr_raw = p->window_right;
    plan_windows(pl);
    pl->kv_lengths = p->kv_lengths;
    pl->bm = p->bool_mask;
    pl->bias = p->bias;
    pl->elem_mask = p->bool_mask.data != NULL || p->bias.data != NULL;
    pl->softcap = p->softcap;
    pl->slopes = p->alibi_slopes;
    pl->sinks = p->sinks;
    pl->dsinks = p->dsinks;
    pl->seqs = p->seqs;
    pl->logit_variants = p->softcap != 0.0f || p->alibi_slopes != NULL;
    pl->kt = kt;
    pl->bq = p->block_q ? p->block_q : kt->block_q;
    pl->bk = p->block_k ? p->block_k : kt->block_k;
    pl->bq_given = p->block_q != 0;
    pl->bk_given = p->block_k != 0;
    pl->ld = plan_ld(pl->bq, kt);
    pl->nthreads = sdpa_threads_for_call(p->num_threads);
    return SDPA_OK;
}

/* Mask, variant and sequence operands as byte spans, for overflow and aliasing checks. */
#define N_OPERAND_SPANS 10

/* The byte span of n elements of elem bytes at data (empty for NULL or n = 0; one
 * that would run past the top of the address space has hi < lo: span_wraps). */
static span array_span(const void *data, int64_t n, size_t elem)
{
    span s = {0, 0};
    if (data && n > 0) {
        s.lo = (uintptr_t)data;
        if (__builtin_add_overflow(s.lo, (uintptr_t)n * elem, &s.hi))
            s.hi = 0;
    }
    return s;
}

static int span_wraps(span s)
{
    return s.hi < s.lo;
}

/* The sequence operands (sdpa_seqs: the struct itself, read during the call, and its
 * arrays: cu_seqlens_q, cu_seqlens_k, seq_lens_k, and the block table up to the last
 * entry a sequence uses) into sp[0..4]; already validated by check_seqs. */
static sdpa_status seqs_spans(const plan *pl, span sp[5])
{
    const sdpa_seqs *s = pl->seqs;
    if (!s)
        return SDPA_OK;
    sp[0] = array_span(s, 1, sizeof *s);
    sp[1] = array_span(s->cu_seqlens_q, pl->B + 1, sizeof(int32_t));
    if (s->cu_seqlens_k) {
        sp[2] = array_span(s->cu_seqlens_k, pl->B + 1, sizeof(int32_t));
        return SDPA_OK;
    }
    sp[3] = array_span(s->seq_lens_k, pl->B, sizeof(int32_t));
    int64_t end = 0; /* entries up to the last one read: b * M + pages used by b, B * M at most */
    for (int64_t b = 0; b < pl->B; b++) {
        const int64_t used = pages_used(s, b);
        if (used > 0 && b * s->max_blocks_per_seq + used > end)
            end = b * s->max_blocks_per_seq + used;
    }
    if (end > PTRDIFF_MAX / (int64_t)sizeof(int32_t))
        return SDPA_ERR_SIZE_OVERFLOW;
    sp[4] = array_span(s->block_table, end, sizeof(int32_t));
    return SDPA_OK;
}

/* The mask, variant and sequence operands (kv_lengths, bool_mask, bias,
 * alibi_slopes, sinks, seqs_spans'), for overflow and aliasing checks. */
static sdpa_status operand_spans(const plan *pl, span sp[N_OPERAND_SPANS])
{
    memset(sp, 0, N_OPERAND_SPANS * sizeof(span));
    sp[0] = array_span(pl->kv_lengths, pl->B, sizeof(int32_t));
    sp[3] = array_span(pl->slopes, pl->Hq, sizeof(float));
    sp[4] = array_span(pl->sinks, pl->Hq, sizeof(float));
    const sdpa_status st = seqs_spans(pl, sp + 5);
    if (st != SDPA_OK)
        return st;
    const int64_t n4[4] = {pl->B, pl->Hq, pl->Tq, pl->Tk};
    for (int which = 0; which < 2; which++) {
        const void *data = which ? (const void *)pl->bias.data : (const void *)pl->bm.data;
        if (!data)
            continue;
        const int64_t s4[4] = {
            which ? pl->bias.batch_stride : pl->bm.batch_stride,
            which ? pl->bias.head_stride : pl->bm.head_stride,
            which ? pl->bias.query_stride : pl->bm.query_stride,
            which ? pl->bias.key_stride : pl->bm.key_stride};
        if (n4[0] == 0 || n4[1] == 0 || n4[2] == 0 || n4[3] == 0)
            continue;
        int64_t ext = 1, t;
        for (int i = 0; i < 4; i++)
            if (__builtin_mul_overflow(n4[i] - 1, s4[i], &t) || __builtin_add_overflow(ext, t, &ext))
                return SDPA_ERR_SIZE_OVERFLOW;
        const size_t elem = which ? sizeof(float) : 1;
        if (ext > PTRDIFF_MAX / (int64_t)elem)
            return SDPA_ERR_SIZE_OVERFLOW;
        sp[1 + which].lo = (uintptr_t)data;
        if (__builtin_add_overflow((uintptr_t)data, (uintptr_t)ext * elem, &sp[1 + which].hi))
            return SDPA_ERR_SIZE_OVERFLOW;
    }
    for (int i = 0; i < N_OPERAND_SPANS; i++)
        if (span_wraps(sp[i]))
            return SDPA_ERR_SIZE_OVERFLOW;
    return SDPA_OK;
}

/* 1 if delta (elements) = sum_k d_k s_k + e with |d_k| <= n_k - 1 over the
 * dimensions [0, k] (sorted by stride, each stride stepping over everything the
 * smaller ones cover) and |e| < len: i.e. two rows of the layout, one shifted
 * by delta, share an element. Only d_k in {floor, floor + 1} of delta / s_k can
 * leave a remainder the smaller dimensions can reach, so this visits at most
 * 2^3 paths. */
static int layout_reaches(int64_t delta, const int64_t (*dims)[2], int k, int64_t len)
{
    if (k < 0)
        return delta > -len && delta < len;
    const int64_t st = dims[k][0], n = dims[k][1];
    int64_t q = delta / st;
    if (delta % st != 0 && delta < 0)
        q--; /* floor */
    for (int64_t d = q; d <= q + 1; d++)
        if (d >= -(n - 1) && d <= n - 1 && layout_reaches(delta - d * st, dims, k - 1, len))
            return 1;
    return 0;
}

/* Exact test for two views with the same sizes, strides and row length whose
 * byte spans overlap, e.g. dQ, dK, dV interleaved in one packed [B,T,3,H,D]
 * buffer: 1 if they share no element. Views of different layouts are not
 * analysed (0: treated as overlapping). */
static int interleaved_disjoint(const tensor_desc *x, const tensor_desc *y)
{
    if (!x->present || !y->present || x->elem != y->elem || x->len != y->len)
        return 0;
    for (int i = 0; i < 3; i++)
        if (x->n[i] != y->n[i] || (x->n[i] > 1 && x->strides[i] != y->strides[i]))
            return 0;
    const intptr_t bytes = (intptr_t)((const char *)y->data - (const char *)x->data);
    if (bytes % (intptr_t)x->elem)
        return 0; /* misaligned relative offset: not analysed */
    int64_t dims[3][2];
    const int nd = dims_by_stride(x->n, x->strides, dims);
    for (int i = 0; i < nd; i++)
        if (dims[i][0] <= 0)
            return 0;
    return !layout_reaches((int64_t)(bytes / (intptr_t)x->elem), (const int64_t(*)[2])dims, nd - 1, x->len);
}

sdpa_status sdpa_check_tensors(const plan *pl, tensor_desc *t, int nt, const void *workspace,
                               size_t workspace_bytes)
{
    span sp[16];
    sdpa_status st;
    for (int i = 0; i < nt; i++) {
        if (!t[i].present) {
            sp[i].lo = sp[i].hi = 0;
            continue;
        }
        if ((st = check_tensor(&t[i], &sp[i])) != SDPA_OK)
            return st;
    }
    span ms[N_OPERAND_SPANS];
    if ((st = operand_spans(pl, ms)) != SDPA_OK)
        return st;
    /* A caller's workspace is written during the call: it must not overlap any
     * tensor or operand (as an output must not). */
    const span ws = array_span(workspace, (int64_t)(workspace_bytes > PTRDIFF_MAX ? PTRDIFF_MAX : workspace_bytes), 1);
    if (span_wraps(ws))
        return SDPA_ERR_SIZE_OVERFLOW;
    for (int i = 0; i < nt; i++)
        if (spans_overlap(ws, sp[i]))
            return SDPA_ERR_ALIASING;
    for (int j = 0; j < N_OPERAND_SPANS; j++)
        if (spans_overlap(ws, ms[j]))
            return SDPA_ERR_ALIASING;
    for (int i = 0; i < nt; i++) {
        if (!t[i].is_output)
            continue;
        for (int j = 0; j < nt; j++)
            if (j != i && spans_overlap(sp[i], sp[j]) && !interleaved_disjoint(&t[i], &t[j]))
                return SDPA_ERR_ALIASING;
        for (int j = 0; j < N_OPERAND_SPANS; j++)
            if (spans_overlap(sp[i], ms[j]))
                return SDPA_ERR_ALIASING;
    }
    return SDPA_OK;
}
