/* SPDX-License-Identifier: MIT */
/* merge.c - merging partial attention states over disjoint key sets: the
 * forward's split-KV merge and the public sdpa_merge_states / _n (prefix caching,
 * cascade attention, context parallelism) use the same row merge.
 *
 * A state of one row is (m, l, O): the online softmax's max, sum and
 * unnormalised output; a normalised state (O, LSE) is (LSE, 1, O) (LSE = -inf:
 * no key, weight 0). Natural log throughout (FlashAttention-2, Dao 2023;
 * mixing a base-2 LSE in would corrupt the merge). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

float sdpa_merge_row(int n, const float *m, const float *l, const float *const *o, int64_t dv, float *out,
                     float *M_out, float *alpha)
{
    float M = -INFINITY, L = 0.0f;
    for (int s = 0; s < n; s++)
        M = fmaxf(M, m[s]);
    for (int s = 0; s < n; s++) {
        /* a state that saw nothing (m_s = -inf) has l_s = 0 and O_s = 0: weight 0 */
        alpha[s] = m[s] == -INFINITY ? 0.0f : expf(m[s] - M);
        L += (l ? l[s] : 1.0f) * alpha[s];
    }
    /* element by element, every part read before out[d] is written: in place
     * (out = one of the parts) is safe */
    for (int64_t d = 0; d < dv; d++) {
        float acc = 0.0f;
        for (int s = 0; s < n; s++)
            if (l || m[s] != -INFINITY) /* a caller's empty state: its O is never read */
                acc += o[s][d] * alpha[s];
        out[d] = acc;
    }
    *M_out = M;
    return L;
}

/* The shapes of a merge and its views: row (b, h, i) of every state. */
typedef struct merge_job {
    int n;
    int64_t B, H, T, Dv;
    sdpa_dtype parts_dtype, o_dtype;
    const sdpa_tensor *o_parts, *lse_parts;
    const sdpa_tensor_out *o, *lse;
} merge_job;

/* Every view of the merge, checked like the attention's tensors: outputs may
 * be exactly one of the inputs (in place: same data, strides and type), and must
 * not otherwise overlap an input or each other. */
static sdpa_status merge_check(const merge_job *j)
{
    if (j->n < 1 || !j->o_parts || !j->lse_parts || !j->o || !j->lse)
        return j->n < 1 ? SDPA_ERR_NEGATIVE_SIZE : SDPA_ERR_NULL_ARGUMENT;
    if ((unsigned)j->parts_dtype > SDPA_DTYPE_F16 || (unsigned)j->o_dtype > SDPA_DTYPE_F16)
        return SDPA_ERR_BAD_DESCRIPTOR;
    const size_t pe = dtype_bytes(j->parts_dtype), oe = dtype_bytes(j->o_dtype);
    if (j->B < 0 || j->H < 0 || j->T < 0 || j->Dv < 0)
        return SDPA_ERR_NEGATIVE_SIZE;
    int64_t rows;
    if (__builtin_mul_overflow(j->B, j->H, &rows) || __builtin_mul_overflow(rows, j->T, &rows) ||
        j->Dv > INT32_MAX)
        return SDPA_ERR_SIZE_OVERFLOW;
    plan pl;
    memset(&pl, 0, sizeof pl);
    const int64_t so[3] = {j->o->batch_stride, j->o->head_stride, j->o->seq_stride};
    const int64_t sl[3] = {j->lse->batch_stride, j->lse->head_stride, j->lse->seq_stride};
    tensor_desc out[2] = {{j->o->data, so, {j->B, j->H, j->T}, j->Dv, oe, 1, 1},
                          {j->lse->data, sl, {j->B, j->H, j->T}, 1, 4, 1, 1}};
    sdpa_status st = sdpa_check_tensors(&pl, out, 2, NULL, 0);
    if (st != SDPA_OK)
        return st;
    for (int s = 0; s < j->n; s++) {
        const sdpa_tensor *po = &j->o_parts[s], *pls = &j->lse_parts[s];
        const int64_t spo[3] = {po->batch_stride, po->head_stride, po->seq_stride};
        const int64_t spl[3] = {pls->batch_stride, pls->head_stride, pls->seq_stride};
        const int same_o = po->data == j->o->data && memcmp(spo, so, sizeof so) == 0 &&
                           j->parts_dtype == j->o_dtype;
        const int same_l = pls->data == j->lse->data && memcmp(spl, sl, sizeof sl) == 0;
        /* an input that is not the output itself must not overlap either output */
        tensor_desc t[4] = {out[0], out[1], {po->data, spo, {j->B, j->H, j->T}, j->Dv, pe, 0, !same_o},
                            {pls->data, spl, {j->B, j->H, j->T}, 1, 4, 0, !same_l}};
        if ((st = sdpa_check_tensors(&pl, t, 4, NULL, 0)) != SDPA_OK)
            return st;
    }
    return SDPA_OK;
}

/* The rows of the merge, one at a time (each output row is written after all of
 * its inputs were read, so in place is safe). scratch: n pointers, 2n floats (m,
 * alpha), and with a 16-bit type n + 1 rows of Dv floats (the parts widened, the
 * merged row before it is rounded). */
static void merge_rows(const merge_job *j, const float **o, float *m, float *alpha, float *rows)
{
    const int wide_parts = j->parts_dtype != SDPA_DTYPE_F32, wide_out = j->o_dtype != SDPA_DTYPE_F32;
    /* the active table's row conversions (every ISA gives dtype.h's bits, kernels.h) */
    const sdpa_kernels *kt = sdpa_kernels_get(SDPA_ISA_AUTO);
    const sdpa_widen_rows_fn widen = j->parts_dtype == SDPA_DTYPE_BF16 ? kt->widen_bf16 : kt->widen_f16;
    const sdpa_narrow_rows_fn narrow = j->o_dtype == SDPA_DTYPE_BF16 ? kt->narrow_bf16 : kt->narrow_f16;
    float *const merged = rows ? rows + (size_t)j->n * (size_t)j->Dv : NULL;
    for (int64_t b = 0; b < j->B; b++)
        for (int64_t h = 0; h < j->H; h++)
            for (int64_t i = 0; i < j->T; i++) {
                for (int s = 0; s < j->n; s++) {
                    m[s] = *row_in(&j->lse_parts[s], b, h, i);
                    const void *part = row_in_t(&j->o_parts[s], j->parts_dtype, b, h, i);
                    if (wide_parts && j->Dv && m[s] != -INFINITY) { /* an empty part's O is never read */
                        float *w = rows + (size_t)s * (size_t)j->Dv;
                        widen(1, (int)j->Dv, part, 0, w, 0);
                        part = w;
                    }
                    o[s] = part;
                }
                float *orow = wide_out ? merged : row_out(j->o, b, h, i), M;
                const float L = sdpa_merge_row(j->n, m, NULL, o, j->Dv, orow, &M, alpha);
                const float inv = L == 0.0f ? 0.0f : 1.0f / L;
                for (int64_t d = 0; d < j->Dv; d++)
                    orow[d] = L == 0.0f ? 0.0f : orow[d] * inv;
                if (wide_out && j->Dv)
                    narrow(1, (int)j->Dv, orow, 0, row_out_t(j->o, j->o_dtype, b, h, i), 0);
                *row_out(j->lse, b, h, i) = L == 0.0f ? -INFINITY : M + logf(L);
            }
}

sdpa_status sdpa_merge_states_typed(int n, int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v,
                                    sdpa_dtype parts_dtype, const sdpa_tensor *o_parts,
                                    const sdpa_tensor *lse_parts, sdpa_dtype o_dtype, const sdpa_tensor_out *o,
                                    const sdpa_tensor_out *lse)
{
    merge_job j = {n, batch, heads, len, head_dim_v, parts_dtype, o_dtype, o_parts, lse_parts, o, lse};
    const sdpa_status st = merge_check(&j);
    if (st != SDPA_OK)
        return st;
    /* the views, copied before anything is written: an output may overlap the caller's
     * view structs or arrays (no operand of the aliasing rule) */
    const sdpa_tensor_out oc = *o, lc = *lse;
    size_t bytes = (size_t)n * (2 * sizeof(sdpa_tensor) + sizeof(float *) + 2 * sizeof(float)), row_floats = 0;
    if ((parts_dtype != SDPA_DTYPE_F32 || o_dtype != SDPA_DTYPE_F32) && batch && heads && len && head_dim_v &&
        (__builtin_mul_overflow((size_t)n + 1, (size_t)head_dim_v, &row_floats) ||
         __builtin_mul_overflow(row_floats, sizeof(float), &row_floats) ||
         __builtin_add_overflow(bytes, row_floats, &bytes)))
        return SDPA_ERR_OUT_OF_MEMORY; /* n + 1 rows of Dv floats: more than memory holds */
    sdpa_tensor *views = malloc(bytes);
    if (!views)
        return SDPA_ERR_OUT_OF_MEMORY;
    memcpy(views, o_parts, (size_t)n * sizeof *views);
    memcpy(views + n, lse_parts, (size_t)n * sizeof *views);
    j.o_parts = views;
    j.lse_parts = views + n;
    j.o = &oc;
    j.lse = &lc;
    const float **o_rows = (const float **)(void *)(views + 2 * n);
    float *m = (float *)(void *)(o_rows + n);
    merge_rows(&j, o_rows, m, m + n, row_floats ? m + 2 * n : NULL);
    free(views);
    return SDPA_OK;
}

sdpa_status sdpa_merge_states_n(int n, int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v,
                                const sdpa_tensor *o_parts, const sdpa_tensor *lse_parts, const sdpa_tensor_out *o,
                                const sdpa_tensor_out *lse)
{
    return sdpa_merge_states_typed(n, batch, heads, len, head_dim_v, SDPA_DTYPE_F32, o_parts, lse_parts,
                                   SDPA_DTYPE_F32, o, lse);
}

sdpa_status sdpa_merge_states(int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v, const sdpa_tensor *o_a,
                              const sdpa_tensor *lse_a, const sdpa_tensor *o_b, const sdpa_tensor *lse_b,
                              const sdpa_tensor_out *o, const sdpa_tensor_out *lse)
{
    if (!o_a || !lse_a || !o_b || !lse_b)
        return SDPA_ERR_NULL_ARGUMENT;
    const sdpa_tensor op[2] = {*o_a, *o_b}, lp[2] = {*lse_a, *lse_b};
    return sdpa_merge_states_n(2, batch, heads, len, head_dim_v, op, lp, o, lse);
}
