/* SPDX-License-Identifier: MIT */
/* tests/ref.h - independent float64 reference (and a naive fp32 one) for the tests.
 *
 * Plain loops over the full score matrix, written from the math contract
 * (design.md section 1), sharing no code with the library: the kernel is never
 * its own oracle. Inputs are contiguous [B, H, T, D] float arrays; the problem
 * descriptor is only read for sizes, scale and the mask description (its mask
 * strides are honoured). */
#ifndef SDPA_TEST_REF_H
#define SDPA_TEST_REF_H

#include <stdint.h>

#include "sdpa.h"

/* 1 if key j is allowed for query i of (b, h) under every mask of p (bias -inf
 * counts as disallowed). */
int ref_allowed(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);

/* The scale the problem asks for (default 1/sqrt(Dk) in double). */
double ref_scale(const sdpa_problem *p);

/* Forward in float64: o [B,Hq,Tq,Dv], lse [B,Hq,Tq] (may be NULL). Fully masked
 * rows: o = 0, lse = -inf. */
void ref_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, double *o,
                 double *lse);

/* Backward in float64 (recomputes everything from q, k, v, dout):
 * dq [B,Hq,Tq,Dk], dk [B,Hkv,Tk,Dk], dv [B,Hkv,Tk,Dv]. */
void ref_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                  const float *dout, double *dq, double *dk, double *dv);

/* The same computations done the naive way in fp32 (materialised S, softmax with
 * max subtraction, float accumulation in natural order): the yardstick of the
 * FlashAttention tolerance rule. Outputs float. */
void naive32_forward(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                     float *lse);
void naive32_backward(const sdpa_problem *p, const float *q, const float *k, const float *v,
                      const float *dout, float *dq, float *dk, float *dv);

#endif
