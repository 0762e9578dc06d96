/* SPDX-License-Identifier: MIT */
/* tests/ref.c - float64 reference and naive fp32 attention, forward and backward. */
#include "ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double ref_scale(const sdpa_problem *p)
{
    return p->use_default_scale ? 1.0 / sqrt((double)p->head_dim_qk) : (double)p->scale;
}

int ref_allowed(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t tk = p->kv_lengths ? p->kv_lengths[b] : p->kv_len;
    if (j >= tk)
        return 0;
    int br = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
             (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    const int64_t diag = i + (br ? tk - p->q_len : 0); /* the aligned diagonal key of row i */
    if (p->causal != SDPA_CAUSAL_NONE && j > diag)
        return 0;
    if (p->window_left != SDPA_WINDOW_UNBOUNDED && j < diag - p->window_left)
        return 0;
    if (p->window_right != SDPA_WINDOW_UNBOUNDED && j > diag + p->window_right)
        return 0;
    const sdpa_bool_mask *m = &p->bool_mask;
    if (m->data && !m->data[b * m->batch_stride + h * m->head_stride + i * m->query_stride +
                            j * m->key_stride])
        return 0;
    const sdpa_bias *bi = &p->bias;
    if (bi->data && bi->data[b * bi->batch_stride + h * bi->head_stride + i * bi->query_stride +
                             j * bi->key_stride] == -INFINITY)
        return 0;
    return 1;
}

static double bias_at(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const sdpa_bias *bi = &p->bias;
    if (!bi->data)
        return 0.0;
    return bi->data[b * bi->batch_stride + h * bi->head_stride + i * bi->query_stride + j * bi->key_stride];
}

/* Row of probabilities in double: returns lse, fills prob[Tk] (0 where masked). */
static double ref_row(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, const float *qrow,
                      const float *kh, double *prob)
{
    const int64_t Tk = p->kv_len, Dk = p->head_dim_qk;
    const double scale = ref_scale(p);
    double mx = -INFINITY;
    for (int64_t j = 0; j < Tk; j++) {
        if (!ref_allowed(p, b, h, i, j)) {
            prob[j] = -INFINITY;
            continue;
        }
        double s = 0.0;
        for (int64_t c = 0; c < Dk; c++)
            s += (double)qrow[c] * (double)kh[j * Dk + c];
        s = s * scale + bias_at(p, b, h, i, j);
        prob[j] = s;
        if (s > mx)
            mx = s;
    }
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < Tk; j++)
            prob[j] = 0.0;
        return -INFINITY;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < Tk; j++) {
        prob[j] = prob[j] == -INFINITY ? 0.0 : exp(prob[j] - mx);
        sum += prob[j];
    }
    for (int64_t j = 0; j < Tk; j++)
        prob[j] /= sum;
    return mx + log(sum);
}

void ref_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, double *o,
                 double *lse)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    double *prob = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            const float *kh = k + (b * Hkv + hk) * Tk * Dk;
            const float *vh = v + (b * Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qrow = q + ((b * Hq + h) * Tq + i) * Dk;
                const double l = ref_row(p, b, h, i, qrow, kh, prob);
                double *orow = o + ((b * Hq + h) * Tq + i) * Dv;
                for (int64_t c = 0; c < Dv; c++) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < Tk; j++)
                        if (prob[j] != 0.0)
                            acc += prob[j] * (double)vh[j * Dv + c];
                    orow[c] = acc;
                }
                if (lse)
                    lse[(b * Hq + h) * Tq + i] = l;
            }
        }
    free(prob);
}

void ref_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                  const float *dout, double *dq, double *dk, double *dv)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const double scale = ref_scale(p);
    memset(dq, 0, sizeof(double) * (size_t)(B * Hq * Tq * Dk));
    memset(dk, 0, sizeof(double) * (size_t)(B * Hkv * Tk * Dk));
    memset(dv, 0, sizeof(double) * (size_t)(B * Hkv * Tk * Dv));
    double *prob = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    double *dp = malloc(sizeof(double) * (size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            const float *kh = k + (b * Hkv + hk) * Tk * Dk;
            const float *vh = v + (b * Hkv + hk) * Tk * Dv;
            double *dkh = dk + (b * Hkv + hk) * Tk * Dk;
            double *dvh = dv + (b * Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qrow = q + ((b * Hq + h) * Tq + i) * Dk;
                const float *dorow = dout + ((b * Hq + h) * Tq + i) * Dv;
                double *dqrow = dq + ((b * Hq + h) * Tq + i) * Dk;
                if (ref_row(p, b, h, i, qrow, kh, prob) == -INFINITY)
                    continue; /* fully masked row: contributes nothing */
                /* dP_j = dO . V_j ; D = sum_j P_j dP_j (= dO . O) */
                double D = 0.0;
                for (int64_t j = 0; j < Tk; j++) {
                    dp[j] = 0.0;
                    if (prob[j] == 0.0)
                        continue;
                    for (int64_t c = 0; c < Dv; c++)
                        dp[j] += (double)dorow[c] * (double)vh[j * Dv + c];
                    D += prob[j] * dp[j];
                }
                for (int64_t j = 0; j < Tk; j++) {
                    if (prob[j] == 0.0)
                        continue;
                    const double ds = prob[j] * (dp[j] - D);
                    for (int64_t c = 0; c < Dv; c++)
                        dvh[j * Dv + c] += prob[j] * (double)dorow[c];
                    for (int64_t c = 0; c < Dk; c++) {
                        dqrow[c] += scale * ds * (double)kh[j * Dk + c];
                        dkh[j * Dk + c] += scale * ds * (double)qrow[c];
                    }
                }
            }
        }
    free(prob);
    free(dp);
}

/* ---- naive fp32: what a straightforward float implementation gets ---- */

static float naive_row(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, const float *qrow,
                       const float *kh, float *prob)
{
    const int64_t Tk = p->kv_len, Dk = p->head_dim_qk;
    const float scale = (float)ref_scale(p);
    float mx = -INFINITY;
    for (int64_t j = 0; j < Tk; j++) {
        if (!ref_allowed(p, b, h, i, j)) {
            prob[j] = -INFINITY;
            continue;
        }
        float s = 0.0f;
        for (int64_t c = 0; c < Dk; c++)
            s += qrow[c] * kh[j * Dk + c];
        s = s * scale + (float)bias_at(p, b, h, i, j);
        prob[j] = s;
        if (s > mx)
            mx = s;
    }
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < Tk; j++)
            prob[j] = 0.0f;
        return -INFINITY;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < Tk; j++) {
        prob[j] = prob[j] == -INFINITY ? 0.0f : expf(prob[j] - mx);
        sum += prob[j];
    }
    for (int64_t j = 0; j < Tk; j++)
        prob[j] /= sum;
    return mx + logf(sum);
}

void naive32_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                     float *lse)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    float *prob = malloc(sizeof(float) * (size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            const float *kh = k + (b * Hkv + hk) * Tk * Dk;
            const float *vh = v + (b * Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qrow = q + ((b * Hq + h) * Tq + i) * Dk;
                const float l = naive_row(p, b, h, i, qrow, kh, prob);
                float *orow = o + ((b * Hq + h) * Tq + i) * Dv;
                for (int64_t c = 0; c < Dv; c++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < Tk; j++)
                        if (prob[j] != 0.0f)
                            acc += prob[j] * vh[j * Dv + c];
                    orow[c] = acc;
                }
                if (lse)
                    lse[(b * Hq + h) * Tq + i] = l;
            }
        }
    free(prob);
}

void naive32_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                      const float *dout, float *dq, float *dk, float *dv)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const int64_t Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const float scale = (float)ref_scale(p);
    memset(dq, 0, sizeof(float) * (size_t)(B * Hq * Tq * Dk));
    memset(dk, 0, sizeof(float) * (size_t)(B * Hkv * Tk * Dk));
    memset(dv, 0, sizeof(float) * (size_t)(B * Hkv * Tk * Dv));
    float *prob = malloc(sizeof(float) * (size_t)(Tk ? Tk : 1));
    float *dp = malloc(sizeof(float) * (size_t)(Tk ? Tk : 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            const float *kh = k + (b * Hkv + hk) * Tk * Dk;
            const float *vh = v + (b * Hkv + hk) * Tk * Dv;
            float *dkh = dk + (b * Hkv + hk) * Tk * Dk;
            float *dvh = dv + (b * Hkv + hk) * Tk * Dv;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qrow = q + ((b * Hq + h) * Tq + i) * Dk;
                const float *dorow = dout + ((b * Hq + h) * Tq + i) * Dv;
                float *dqrow = dq + ((b * Hq + h) * Tq + i) * Dk;
                if (naive_row(p, b, h, i, qrow, kh, prob) == -INFINITY)
                    continue;
                float D = 0.0f;
                for (int64_t j = 0; j < Tk; j++) {
                    dp[j] = 0.0f;
                    if (prob[j] == 0.0f)
                        continue;
                    for (int64_t c = 0; c < Dv; c++)
                        dp[j] += dorow[c] * vh[j * Dv + c];
                    D += prob[j] * dp[j];
                }
                for (int64_t j = 0; j < Tk; j++) {
                    if (prob[j] == 0.0f)
                        continue;
                    const float ds = prob[j] * (dp[j] - D);
                    for (int64_t c = 0; c < Dv; c++)
                        dvh[j * Dv + c] += prob[j] * dorow[c];
                    for (int64_t c = 0; c < Dk; c++) {
                        dqrow[c] += scale * ds * kh[j * Dk + c];
                        dkh[j * Dk + c] += scale * ds * qrow[c];
                    }
                }
            }
        }
    free(prob);
    free(dp);
}
