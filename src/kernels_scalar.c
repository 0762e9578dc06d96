/* SPDX-License-Identifier: MIT */
/* kernels_scalar.c - portable C micro-kernels: the table's defaults on every ISA.
 *
 * Plain loops in the order documented in kernels.h; libm exp2f, so this path is
 * independent of SLEEF (exp(x) is 2^(x log2 e) as in the SIMD kernels, see
 * simd_tmpl.h, so that every ISA rounds the same argument). Built for the
 * baseline ISA with no -m flags. */
#include <assert.h>
#include <math.h>

#include "dtype.h"
#include "kernels.h"

static void gemm_scalar(int M, int N, int K, float alpha, const float *A, ptrdiff_t rs_a,
                        ptrdiff_t cs_a, const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc,
                        int flags, const float *c_row_scale)
{
    assert(M >= 0 && N >= 0 && K >= 0);
    enum { NB = 64 };
    const int skip_a = flags & SDPA_GEMM_SKIP_ZERO_A;
    const int skip_b = flags & SDPA_GEMM_SKIP_ZERO_B;
    float acc[NB];
    for (int m = 0; m < M; m++) {
        float *c = C + (ptrdiff_t)m * ldc;
        /* n in chunks of NB so that the k loop streams rows of B; every (m, n)
         * still sums its terms in increasing k. Plain a * b + acc, not fmaf:
         * without -mfma fmaf is a libm call. */
        for (int n0 = 0; n0 < N; n0 += NB) {
            const int nb = N - n0 < NB ? N - n0 : NB;
            for (int n = 0; n < nb; n++)
                acc[n] = 0.0f;
            for (int k = 0; k < K; k++) {
                const float a = A[(ptrdiff_t)m * rs_a + (ptrdiff_t)k * cs_a];
                if (skip_a && sdpa_is_masked_sentinel(a))
                    continue;
                const float *b = B + (ptrdiff_t)k * ldb + n0;
                if (skip_b) {
                    for (int n = 0; n < nb; n++)
                        if (!sdpa_is_masked_sentinel(b[n]))
                            acc[n] += a * b[n];
                } else {
                    for (int n = 0; n < nb; n++)
                        acc[n] += a * b[n];
                }
            }
            if ((flags & SDPA_GEMM_ACCUMULATE) && c_row_scale)
                for (int n = 0; n < nb; n++)
                    c[n0 + n] = c[n0 + n] * c_row_scale[m] + alpha * acc[n];
            else if (flags & SDPA_GEMM_ACCUMULATE)
                for (int n = 0; n < nb; n++)
                    c[n0 + n] += alpha * acc[n];
            else
                for (int n = 0; n < nb; n++)
                    c[n0 + n] = alpha * acc[n];
        }
    }
}

/* e^x as every ISA computes it: 2^y of y = x log2(e) rounded to float, with the
 * same cut-off as the SIMD kernels (kernels.h): y < SDPA_EXP_CUTOFF_LOG2 gives
 * exactly +0 (so -inf gives +0; NaN stays NaN). */
static inline float exp_via_exp2(float x)
{
    const float y = x * 0x1.715476p+0f;
    return y < SDPA_EXP_CUTOFF_LOG2 ? 0.0f : exp2f(y);
}

static void online_softmax_scalar(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                  float *alpha)
{
    for (int n = 0; n < N; n++) {
        float mx = m[n];
        for (int k = 0; k < M; k++)
            mx = fmaxf(mx, S[(ptrdiff_t)k * lds + n]);
        const float mu = (mx == -INFINITY) ? 0.0f : mx;
        const float a = exp_via_exp2(m[n] - mu);
        float sum = 0.0f;
        for (int k = 0; k < M; k++) {
            float *s = &S[(ptrdiff_t)k * lds + n];
            *s = *s == -INFINITY ? SDPA_MASKED_SENTINEL : exp_via_exp2(*s - mu); /* masked: the sentinel */
            sum += *s;
        }
        alpha[n] = a;
        l[n] = l[n] * a + sum;
        m[n] = mx;
    }
}

static void online_softmax_rows_scalar(int M, int N, float *S, ptrdiff_t lds, float *m, float *l,
                                       float *alpha)
{
    for (int r = 0; r < M; r++) {
        float *s = S + (ptrdiff_t)r * lds;
        float mx = m[r];
        for (int n = 0; n < N; n++)
            mx = fmaxf(mx, s[n]);
        const float mu = (mx == -INFINITY) ? 0.0f : mx;
        const float a = exp_via_exp2(m[r] - mu);
        float sum = 0.0f;
        for (int n = 0; n < N; n++) {
            s[n] = s[n] == -INFINITY ? SDPA_MASKED_SENTINEL : exp_via_exp2(s[n] - mu); /* masked: the sentinel */
            sum += s[n];
        }
        alpha[r] = a;
        l[r] = l[r] * a + sum;
        m[r] = mx;
    }
}

static void scale_rows_scalar(int M, int N, const float *src, ptrdiff_t lds, const float *alpha, float *dst,
                              ptrdiff_t ldd)
{
    for (int m = 0; m < M; m++) {
        const float a = alpha[m], *s = src + (ptrdiff_t)m * lds;
        float *d = dst + (ptrdiff_t)m * ldd;
        if (a == 1.0f && s == d)
            continue;
        for (int n = 0; n < N; n++)
            d[n] = s[n] * a;
    }
}

static void bwd_probs_scalar(int M, int N, float *S, ptrdiff_t lds, const float *lse)
{
    for (int k = 0; k < M; k++)
        for (int n = 0; n < N; n++) {
            float *s = &S[(ptrdiff_t)k * lds + n];
            /* masked entries and fully masked rows (lse = -inf): the sentinel -0.0 */
            *s = (*s == -INFINITY || lse[n] == -INFINITY) ? SDPA_MASKED_SENTINEL : exp_via_exp2(*s - lse[n]);
        }
}

static void bwd_dscores_scalar(int M, int N, const float *P, ptrdiff_t ldp, float *dP,
                               ptrdiff_t lddp, const float *d)
{
    for (int k = 0; k < M; k++)
        for (int n = 0; n < N; n++) {
            const float p = P[(ptrdiff_t)k * ldp + n];
            float *dp = &dP[(ptrdiff_t)k * lddp + n];
            /* + 0.0f turns an arithmetic -0 into +0: -0.0 only ever marks masked */
            *dp = sdpa_is_masked_sentinel(p) ? SDPA_MASKED_SENTINEL : p * (*dp - d[n]) + 0.0f;
        }
}

static void transpose_scalar(int rows, int cols, const float *src, ptrdiff_t lds, float *dst,
                             ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(ptrdiff_t)c * ldd + r] = src[(ptrdiff_t)r * lds + c];
}

static void gemm_stream_scalar(int M, int N, int K, const float *A, ptrdiff_t lda, const float *B,
                               ptrdiff_t ldb, float *C, ptrdiff_t ldc, int skip_masked,
                               const float *row_scale)
{
    if (row_scale)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++)
                C[(ptrdiff_t)m * ldc + n] *= row_scale[m];
    gemm_scalar(M, N, K, 1.0f, A, lda, 1, B, ldb, C, ldc,
                SDPA_GEMM_ACCUMULATE | (skip_masked ? SDPA_GEMM_SKIP_ZERO_A : 0), NULL);
}

static void gemm_nt_scalar(int M, int N, int K, float alpha, const float *A, ptrdiff_t lda,
                           const float *B, ptrdiff_t ldb, float *C, ptrdiff_t rs_c, ptrdiff_t cs_c)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const float *a = A + (ptrdiff_t)m * lda, *b = B + (ptrdiff_t)n * ldb;
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += a[k] * b[k];
            C[(ptrdiff_t)m * rs_c + (ptrdiff_t)n * cs_c] = alpha * acc;
        }
}

static void softcap_scalar(int M, int N, float *S, ptrdiff_t lds, float cap, float *G, ptrdiff_t ldg)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float *s = S + (ptrdiff_t)m * lds + n;
            const float t = tanhf(*s / cap);
            *s = cap * t;
            if (G)
                G[(ptrdiff_t)m * ldg + n] = 1.0f - t * t;
        }
}

static void alibi_cols_scalar(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            S[(ptrdiff_t)m * lds + n] -= slope[n] * fabsf((float)m - pos[n]);
}

static void alibi_rows_scalar(int M, int N, float *S, ptrdiff_t lds, const float *pos, const float *slope)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            S[(ptrdiff_t)m * lds + n] -= slope[m] * fabsf((float)n - pos[m]);
}

static void bwd_softcap_scalar(int M, int N, float *dS, ptrdiff_t ldd, const float *G, ptrdiff_t ldg)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float *d = dS + (ptrdiff_t)m * ldd + n;
            if (!sdpa_is_masked_sentinel(*d))
                *d = *d * G[(ptrdiff_t)m * ldg + n] + 0.0f;
        }
}

static void widen_bf16_scalar(int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[r * ldd + c] = sdpa_bf16_to_f32(src[r * lds + c]);
}

static void widen_f16_scalar(int rows, int cols, const uint16_t *src, ptrdiff_t lds, float *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[r * ldd + c] = sdpa_f16_to_f32(src[r * lds + c]);
}

static void narrow_bf16_scalar(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[r * ldd + c] = sdpa_f32_to_bf16(src[r * lds + c]);
}

static void narrow_f16_scalar(int rows, int cols, const float *src, ptrdiff_t lds, uint16_t *dst, ptrdiff_t ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[r * ldd + c] = sdpa_f32_to_f16(src[r * lds + c]);
}

void sdpa_kernels_init_scalar(sdpa_kernels *t)
{
    t->isa = SDPA_ISA_SCALAR;
    t->name = "scalar";
    t->vec_floats = 1;
    t->col_align = 16; /* as the SIMD ISAs: the same driver cut for the same shape */
    t->nt_step = 16;   /* likewise */
    t->attend_max_rows = 0;
    t->attend_max_vecs = 0;
    t->attend_scratch = 0;
    t->block_q = 32;
    t->block_k = 32;
    t->band_keys = 16;
    t->wide_prefetch = SDPA_PREFETCH_ALWAYS;
    t->tile_pad = 0;
    t->gemm = gemm_scalar;
    t->online_softmax = online_softmax_scalar;
    t->scale_rows = scale_rows_scalar;
    t->bwd_probs = bwd_probs_scalar;
    t->bwd_dscores = bwd_dscores_scalar;
    t->transpose = transpose_scalar;
    t->gemm_nt = gemm_nt_scalar;
    t->gemm_nt_rows4 = gemm_nt_scalar;
    t->gemm_stream = gemm_stream_scalar;
    t->online_softmax_rows = online_softmax_rows_scalar;
    t->attend_rows = NULL; /* the driver composes the steps from the entries above */
    t->bwd_rows_max_rows = 0;
    t->bwd_rows_scratch = 0;
    t->bwd_rows_f32 = t->bwd_rows_bf16 = t->bwd_rows_f16 = NULL; /* likewise (backward_typed.c) */
    t->softcap = softcap_scalar;
    t->alibi_cols = alibi_cols_scalar;
    t->alibi_rows = alibi_rows_scalar;
    t->bwd_softcap = bwd_softcap_scalar;
    t->widen_bf16 = widen_bf16_scalar;
    t->widen_f16 = widen_f16_scalar;
    t->narrow_bf16 = narrow_bf16_scalar;
    t->narrow_f16 = narrow_f16_scalar;
    t->nt_max_cols = 8; /* same driver path on every ISA for the same shape */
}
