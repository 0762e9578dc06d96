/* SPDX-License-Identifier: MIT */
/* tests/ref.c - the float64 reference and the naive fp32 yardstick (see ref.h): the
 * mask predicate and the score here, the loops once in ref_tmpl.h. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ref_scale(const sdpa_problem *p)
{
    return p->use_default_scale ? 1.0 / sqrt((double)p->head_dim_qk) : (double)p->scale;
}

/* 1 if the problem's diagonal is bottom-right aligned (causal's alignment, or the
 * window's without causal). */
static int bottom_right(const sdpa_problem *p)
{
    return p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
           (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
}

int64_t ref_diagonal(const sdpa_problem *p, int64_t b, int64_t i)
{
    const int64_t tk = p->kv_lengths ? p->kv_lengths[b] : p->kv_len;
    return i + (bottom_right(p) ? tk - p->q_len : 0) + p->diagonal_offset;
}

/* 128-bit arithmetic so that windows near INT64_MAX are exact. */
int ref_allowed_nobias(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t tk = p->kv_lengths ? p->kv_lengths[b] : p->kv_len;
    if (j >= tk)
        return 0;
    const int br = bottom_right(p);
    /* the aligned diagonal key of row i */
    const __int128 diag = (__int128)i + (br ? (__int128)tk - p->q_len : 0) + p->diagonal_offset;
    if (p->causal != SDPA_CAUSAL_NONE && (__int128)j > diag)
        return 0;
    if (p->window_left != SDPA_WINDOW_UNBOUNDED && (__int128)j < diag - p->window_left)
        return 0;
    if (p->window_right != SDPA_WINDOW_UNBOUNDED && (__int128)j > diag + p->window_right)
        return 0;
    const sdpa_bool_mask *m = &p->bool_mask;
    if (m->data && !m->data[b * m->batch_stride + h * m->head_stride + i * m->query_stride +
                            j * m->key_stride])
        return 0;
    return 1;
}

double ref_bias(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const sdpa_bias *bi = &p->bias;
    if (!bi->data)
        return 0.0;
    return bi->data[b * bi->batch_stride + h * bi->head_stride + i * bi->query_stride + j * bi->key_stride];
}

int ref_allowed(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return ref_allowed_nobias(p, b, h, i, j) && ref_bias(p, b, h, i, j) != -INFINITY;
}

static const float *row_of(const sdpa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    return (const float *)t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
}

double ref_score(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, int64_t b,
                 int64_t h, int64_t i, int64_t j)
{
    const int64_t hk = h / (p->q_heads / p->kv_heads);
    const float *qr = row_of(q, b, h, i), *kr = row_of(k, b, hk, j);
    double s = 0.0;
    for (int64_t c = 0; c < p->head_dim_qk; c++)
        s += (double)qr[c] * (double)kr[c];
    s *= ref_scale(p);
    if (p->softcap != 0.0f)
        s = (double)p->softcap * tanh(s / (double)p->softcap);
    if (p->alibi_slopes) {
        const int64_t d = ref_diagonal(p, b, i);
        s += -(double)p->alibi_slopes[h] * (double)(j > d ? j - d : d - j);
    }
    return s + ref_bias(p, b, h, i, j);
}

#define RT double
#define REXP exp
#define RLOG log
#define RTANH tanh
#define RN(name) ref64_##name
#include "ref_tmpl.h"
#undef RT
#undef REXP
#undef RLOG
#undef RTANH
#undef RN

#define RT float
#define REXP expf
#define RLOG logf
#define RTANH tanhf
#define RN(name) naive32_##name##_views
#include "ref_tmpl.h"
#undef RT
#undef REXP
#undef RLOG
#undef RTANH
#undef RN

void ref_forward_row(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                     const sdpa_tensor *v, int64_t b, int64_t h, int64_t i, double *o, double *lse)
{
    const int64_t Tk = p->kv_len, Dv = p->head_dim_v, hk = h / (p->q_heads / p->kv_heads);
    double *prob = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    unsigned char *ok = malloc((size_t)(Tk ? Tk : 1));
    *lse = ref64_row(p, q, k, b, h, i, prob, ok, NULL);
    for (int64_t c = 0; c < Dv; c++) {
        double acc = 0.0;
        for (int64_t j = 0; j < Tk; j++)
            if (ok[j])
                acc += prob[j] * (double)row_of(v, b, hk, j)[c];
        o[c] = acc;
    }
    free(prob);
    free(ok);
}

void ref_forward_views(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                       const sdpa_tensor *v, double *o, double *lse)
{
    ref64_forward(p, q, k, v, o, lse, 0);
}

void ref_backward_views(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, const sdpa_tensor *dout, double *dq, double *dk,
                        double *dv)
{
    ref64_backward(p, q, k, v, dout, dq, dk, dv, NULL, NULL, 0);
}

/* Contiguous [B, H, T, D] views of the problem's arrays. */
typedef struct views {
    sdpa_tensor q, k, v, dout;
} views;

static views contiguous(const sdpa_problem *p, const float *q, const float *k, const float *v,
                        const float *dout)
{
    const int64_t Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    views w = {{q, Hq * Tq * Dk, Tq * Dk, Dk},
               {k, Hkv * Tk * Dk, Tk * Dk, Dk},
               {v, Hkv * Tk * Dv, Tk * Dv, Dv},
               {dout, Hq * Tq * Dv, Tq * Dv, Dv}};
    return w;
}

void ref_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, double *o,
                 double *lse)
{
    const views w = contiguous(p, q, k, v, NULL);
    ref64_forward(p, &w.q, &w.k, &w.v, o, lse, 0);
}

void ref_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                  const float *dout, double *dq, double *dk, double *dv)
{
    ref_backward_dsinks(p, q, k, v, dout, dq, dk, dv, NULL);
}

void ref_backward_dsinks(const sdpa_problem *p, const float *q, const float *k, const float *v,
                         const float *dout, double *dq, double *dk, double *dv, double *dsinks)
{
    const views w = contiguous(p, q, k, v, dout);
    ref64_backward(p, &w.q, &w.k, &w.v, &w.dout, dq, dk, dv, dsinks, NULL, 0);
}

void naive32_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                     float *lse)
{
    const views w = contiguous(p, q, k, v, NULL);
    naive32_forward_views(p, &w.q, &w.k, &w.v, o, lse, 0);
}

void naive32_forward_bf16_p(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                            float *lse)
{
    const views w = contiguous(p, q, k, v, NULL);
    naive32_forward_views(p, &w.q, &w.k, &w.v, o, lse, 1);
}

float ref_round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7F800000u) == 0x7F800000u) /* inf stays, NaN stays NaN */
        return x;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u; /* to nearest, ties to even */
    memcpy(&x, &u, sizeof x);
    return x;
}

void naive32_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                      const float *dout, float *dq, float *dk, float *dv)
{
    naive32_backward_dsinks(p, q, k, v, dout, dq, dk, dv, NULL);
}

void naive32_backward_dsinks(const sdpa_problem *p, const float *q, const float *k, const float *v,
                             const float *dout, float *dq, float *dk, float *dv, float *dsinks)
{
    const views w = contiguous(p, q, k, v, dout);
    naive32_backward_views(p, &w.q, &w.k, &w.v, &w.dout, dq, dk, dv, dsinks, NULL, 0);
}

void naive32_backward_o(const sdpa_problem *p, const float *q, const float *k, const float *v, const float *o,
                        const float *dout, float *dq, float *dk, float *dv)
{
    const views w = contiguous(p, q, k, v, dout);
    naive32_backward_views(p, &w.q, &w.k, &w.v, &w.dout, dq, dk, dv, NULL, o, 0);
}

void naive32_backward_o_bf16_p(const sdpa_problem *p, const float *q, const float *k, const float *v,
                               const float *o, const float *dout, float *dq, float *dk, float *dv)
{
    const views w = contiguous(p, q, k, v, dout);
    naive32_backward_views(p, &w.q, &w.k, &w.v, &w.dout, dq, dk, dv, NULL, o, 1);
}

/* Per element of O: a first-order bound on what the fp32 rounding of the logits alone
 * can do to it, in any order of summation. Higham, "Accuracy and Stability of
 * Numerical Algorithms" (2002), eq. 3.5: an fp32 dot product of n terms errs by at most
 * gamma_n sum |q_c k_c|, gamma_n = n u / (1 - n u), u = 2^-24; the scale, the softcap,
 * ALiBi and the bias add a rounding each (gamma_{Dk+4} over the terms' magnitudes).
 * Logit errors delta_j move O_c = sum_j P_j V_jc by sum_j P_j (delta_j - sum_i P_i delta_i)
 * (V_jc - O_c) to first order, whose magnitude is at most
 * sum_j P_j (Delta_j + Delta_bar) |V_jc - O_c| (+ the sink's P_s Delta_bar |O_c|), with
 * Delta_bar = sum_j P_j Delta_j. Near-tied logits in the thousands make this large
 * (the output is ill-conditioned there: two keys' fp32 logits a few ulp apart); a
 * one-hot row keeps it 0. gamma_n is the worst case (typical errors are about sqrt(n)
 * u), so rows whose largest |logit| is at most min_logit get 0: the caller's own rule
 * holds there. */
void ref_forward_logit_bound(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                             const sdpa_tensor *v, double min_logit, double *bound)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const double u = ldexp(1.0, -24), n = (double)Dk + 4.0, gamma = n * u / (1.0 - n * u);
    const double scale = fabs(ref_scale(p));
    double *prob = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    double *delta = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    unsigned char *ok = malloc((size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            for (int64_t i = 0; i < Tq; i++) {
                const float *qr = row_of(q, b, h, i);
                const double lse = ref64_row(p, q, k, b, h, i, prob, ok, NULL);
                double *brow = bound + ((b * Hq + h) * Tq + i) * Dv;
                double dbar = 0.0, top = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    delta[j] = 0.0;
                    if (!ok[j])
                        continue;
                    top = fmax(top, fabs(ref_score(p, q, k, b, h, i, j)));
                    const float *kr = row_of(k, b, hk, j);
                    double mag = 0.0;
                    for (int64_t c = 0; c < Dk; c++)
                        mag += fabs((double)qr[c] * (double)kr[c]);
                    mag *= scale;
                    if (p->alibi_slopes) {
                        const int64_t d = ref_diagonal(p, b, i);
                        mag += fabs((double)p->alibi_slopes[h]) * (double)(j > d ? j - d : d - j);
                    }
                    mag += fabs(ref_bias(p, b, h, i, j)) + fabs((double)p->softcap);
                    delta[j] = gamma * mag;
                    dbar += prob[j] * delta[j];
                }
                const double psink = p->sinks && isfinite(lse) ? exp((double)p->sinks[h] - lse) : 0.0;
                for (int64_t c = 0; c < Dv; c++) {
                    double o = 0.0, s = 0.0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (ok[j])
                            o += prob[j] * (double)row_of(v, b, hk, j)[c];
                    for (int64_t j = 0; j < Tk; j++)
                        if (ok[j])
                            s += prob[j] * (delta[j] + dbar) * fabs((double)row_of(v, b, hk, j)[c] - o);
                    brow[c] = isfinite(s) && top > min_logit ? s + psink * dbar * fabs(o) : 0.0;
                }
            }
        }
    free(prob);
    free(delta);
    free(ok);
}
