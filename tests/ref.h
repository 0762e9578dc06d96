/* SPDX-License-Identifier: MIT */
/* tests/ref.h - the float64 reference of every test (and the naive fp32 yardstick).
 *
 * One implementation (tests/ref_tmpl.h), written from the math contract
 * (README, design.md section 1) with plain loops over the full score row of
 * every query (two passes: max, then exp and sum), sharing no code with the
 * library: the kernel is never its own oracle. Instantiated twice: in float64
 * (ref_*: the reference) and in fp32 (naive32_*: what a straightforward float
 * implementation gets, the yardstick of the FlashAttention tolerance rule).
 *
 * Semantics, identical in both: a key is allowed when every mask of the problem
 * allows it (kv_lengths, causal and window on the aligned diagonal, computed
 * without overflow for any int64 window, the boolean mask, and a bias that is not
 * -inf: a finite bias, -FLT_MAX included, never masks); GQA maps query head h to
 * kv head h / (Hq / Hkv); masked keys and bias entries are never read. A row with
 * no allowed key: O = 0, LSE = -inf, and no gradient. IEEE propagation otherwise:
 * a NaN score or a max of +-inf makes the whole row (O, LSE, its gradients) NaN,
 * and a NaN/Inf in an allowed K/V/dO element reaches the outputs even when its
 * probability underflows to 0. Backward: P = the row's softmax, dP_j = dO.V_j,
 * D = sum_j P_j dP_j, dS = P (dP - D), dQ += scale dS K, dK += scale dS^T Q,
 * dV += P^T dO (GQA heads sum into dK, dV).
 * Variants (read from the descriptor; off by default, then nothing changes): the
 * softcap x = c tanh(x / c) on scale Q.K, then ALiBi -slope[h] |j - diag| (diag:
 * ref_diagonal), then the bias; a sink s_h joins the row's denominator (a row with
 * no allowed key: O = 0, LSE = s_h); backward dS gets the softcap's 1 - tanh^2 and
 * d L / d s_h = -sum over b, i of exp(s_h - LSE) D.
 *
 * The problem descriptor is only read (sizes, scale, masks with their strides).
 * Inputs come as tensor views (any strides) or as contiguous [B, H, T, D] arrays;
 * outputs are contiguous: o [B,Hq,Tq,Dv], lse [B,Hq,Tq], dq [B,Hq,Tq,Dk],
 * dk [B,Hkv,Tk,Dk], dv [B,Hkv,Tk,Dv]. */
#ifndef SDPA_TEST_REF_H
#define SDPA_TEST_REF_H

#include <stdint.h>

#include "sdpa.h"

/* 1 if key j is allowed for query i of (b, h) under every mask of p (bias -inf
 * counts as disallowed). */
int ref_allowed(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);
/* The same without the bias (kv_lengths, causal, window, boolean mask). */
int ref_allowed_nobias(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);
/* The bias entry of (b, h, i, j) in double (0 without a bias). */
double ref_bias(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

/* The aligned diagonal key i + d of query i of batch b (d = 0 top-left, Tk_b - Tq
 * bottom-right): the diagonal of causal, the window and ALiBi. */
int64_t ref_diagonal(const sdpa_problem *p, int64_t b, int64_t i);

/* The scale the problem asks for (default 1/sqrt(Dk) in double). */
double ref_scale(const sdpa_problem *p);

/* The float64 logit of (b, h, i, j): scale * Q_i . K_j, softcapped, plus ALiBi and
 * the bias (check ref_allowed first). */
double ref_score(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, int64_t b,
                 int64_t h, int64_t i, int64_t j);

/* Forward of one row in float64: o[Dv], *lse. */
void ref_forward_row(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                     const sdpa_tensor *v, int64_t b, int64_t h, int64_t i, double *o, double *lse);

/* Forward / backward in float64 from tensor views (lse may be NULL). */
void ref_forward_views(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                       const sdpa_tensor *v, double *o, double *lse);
void ref_backward_views(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                        const sdpa_tensor *v, const sdpa_tensor *dout, double *dq, double *dk,
                        double *dv);

/* The same from contiguous [B, H, T, D] arrays (lse may be NULL). */
void ref_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, double *o,
                 double *lse);
void ref_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                  const float *dout, double *dq, double *dk, double *dv);
/* ref_backward plus dsinks[Hq] (all 0 without sinks). */
void ref_backward_dsinks(const sdpa_problem *p, const float *q, const float *k, const float *v,
                         const float *dout, double *dq, double *dk, double *dv, double *dsinks);

/* bound[B, Hq, Tq, Dv] (contiguous): per element of O, a first-order bound on how far
 * the fp32 rounding of the logits alone (any order of summation; Higham 2002, eq. 3.5)
 * can move it; 0 in a one-hot row, large where logits in the thousands nearly tie, and 0
 * in the rows whose largest |logit| is at most min_logit. */
void ref_forward_logit_bound(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k,
                             const sdpa_tensor *v, double min_logit, double *bound);

/* The same computations in fp32 (float scores, expf/logf, float accumulation in
 * natural order): the yardstick of the FlashAttention tolerance rule. */
void naive32_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                     float *lse);
/* naive32_forward with each probability rounded to bf16 before the sum with V (the
 * intermediate the bf16 pair products round: docs/design.md, "What is rounded"). */
void naive32_forward_bf16_p(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                            float *lse);
/* x rounded to bf16 (nearest, ties to even; inf and NaN as they are) and back. */
float ref_round_bf16(float x);
void naive32_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                      const float *dout, float *dq, float *dk, float *dv);
/* naive32_backward with D = rowsum(dO * O) from a given O (contiguous [B, Hq, Tq,
 * Dv]: a stored, possibly rounded, forward output), one term at a time. */
void naive32_backward_o(const sdpa_problem *p, const float *q, const float *k, const float *v, const float *o,
                        const float *dout, float *dq, float *dk, float *dv);
/* naive32_backward_o with P rounded to bf16 before P^T dO and dS before dS K and
 * dS^T Q, as the backward's bf16 pair products round them (util_rounds_bwd). */
void naive32_backward_o_bf16_p(const sdpa_problem *p, const float *q, const float *k, const float *v,
                               const float *o, const float *dout, float *dq, float *dk, float *dv);
void naive32_backward_dsinks(const sdpa_problem *p, const float *q, const float *k, const float *v,
                             const float *dout, float *dq, float *dk, float *dv, float *dsinks);

#endif
