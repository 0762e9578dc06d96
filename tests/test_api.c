/* SPDX-License-Identifier: MIT */
/* tests/test_api.c - the public API contract: every invalid argument gets its own
 * status and leaves every buffer untouched; status strings; version; zero-sized
 * problems; legal corner values (scale 0 / negative, block sizes, NULL data with
 * empty extents).
 *
 * sdpa.h is included first, before any other header, to prove it is
 * self-contained. */
#include "sdpa.h"

#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

/* ------------------------------------------------------------- fixture -- */

/* A small valid GQA problem with every operand present, plus the exact pointers
 * each call receives, so a case can knock out any one of them. */
enum { FB = 2, FHQ = 4, FHKV = 2, FTQ = 5, FTK = 7, FDK = 8, FDV = 6 };

enum { BUF_Q, BUF_K, BUF_V, BUF_OIN, BUF_LSEIN, BUF_DO, BUF_O, BUF_LSE, BUF_DQ, BUF_DK, BUF_DV,
       BUF_BIAS, NBUF };

typedef struct fx {
    sdpa_problem p;
    int32_t kvl[FB];
    uint8_t mask[FB * FHQ * FTQ * FTK];
    float *buf[NBUF];
    float *snap[NBUF]; /* copies of each buffer, guard zones included */
    int32_t kvl_snap[FB];
    uint8_t mask_snap[sizeof(uint8_t) * FB * FHQ * FTQ * FTK];
    sdpa_tensor tq, tk, tv, toin, tlsein, tdo;
    sdpa_tensor_out to, tlse, tdq, tdk, tdv;
    /* what the calls are given */
    const sdpa_problem *pp;
    const sdpa_tensor *q, *k, *v, *oin, *lsein, *dout;
    const sdpa_tensor_out *o, *lse, *dq, *dk, *dv;
} fx;

static const size_t buf_len[NBUF] = {
    FB * FHQ * FTQ * FDK,  FB * FHKV * FTK * FDK, FB * FHKV * FTK * FDV, FB * FHQ * FTQ * FDV,
    FB * FHQ * FTQ,        FB * FHQ * FTQ * FDV,  FB * FHQ * FTQ * FDV,  FB * FHQ * FTQ,
    FB * FHQ * FTQ * FDK,  FB * FHKV * FTK * FDK, FB * FHKV * FTK * FDV, FB * FHQ * FTQ * FTK};
static const char *buf_name[NBUF] = {"Q", "K", "V", "O(in)", "LSE(in)", "dO", "O", "LSE", "dQ", "dK",
                                     "dV", "bias"};

static void fx_init(fx *f)
{
    memset(f, 0, sizeof *f);
    util_rng r;
    util_rng_init(&r, 0x5eed);
    for (int i = 0; i < NBUF; i++) {
        f->buf[i] = util_galloc(buf_len[i]);
        if (i <= BUF_DO || i == BUF_BIAS)
            util_fill_uniform(&r, f->buf[i], buf_len[i], -1.0f, 1.0f);
    }
    for (size_t i = 0; i < buf_len[BUF_LSEIN]; i++)
        f->buf[BUF_LSEIN][i] = 2.0f; /* any finite LSE */
    for (int b = 0; b < FB; b++)
        f->kvl[b] = FTK - b;
    for (size_t i = 0; i < sizeof f->mask; i++)
        f->mask[i] = (uint8_t)((i * 7) % 5 != 0);
    f->p = util_problem(FB, FHQ, FHKV, FTQ, FTK, FDK, FDV);
    f->p.num_threads = 1;
    f->tq = util_cview(f->buf[BUF_Q], FHQ, FTQ, FDK);
    f->tk = util_cview(f->buf[BUF_K], FHKV, FTK, FDK);
    f->tv = util_cview(f->buf[BUF_V], FHKV, FTK, FDV);
    f->toin = util_cview(f->buf[BUF_OIN], FHQ, FTQ, FDV);
    f->tlsein = util_lse_view(f->buf[BUF_LSEIN], FHQ, FTQ);
    f->tdo = util_cview(f->buf[BUF_DO], FHQ, FTQ, FDV);
    f->to = util_cview_out(f->buf[BUF_O], FHQ, FTQ, FDV);
    f->tlse = util_lse_view_out(f->buf[BUF_LSE], FHQ, FTQ);
    f->tdq = util_cview_out(f->buf[BUF_DQ], FHQ, FTQ, FDK);
    f->tdk = util_cview_out(f->buf[BUF_DK], FHKV, FTK, FDK);
    f->tdv = util_cview_out(f->buf[BUF_DV], FHKV, FTK, FDV);
    f->pp = &f->p;
    f->q = &f->tq;
    f->k = &f->tk;
    f->v = &f->tv;
    f->oin = &f->toin;
    f->lsein = &f->tlsein;
    f->dout = &f->tdo;
    f->o = &f->to;
    f->lse = &f->tlse;
    f->dq = &f->tdq;
    f->dk = &f->tdk;
    f->dv = &f->tdv;
}

/* Enables every optional mask operand (so that aliasing/stride cases on them
 * are reachable). */
static void fx_masks(fx *f)
{
    f->p.kv_lengths = f->kvl;
    f->p.bool_mask.data = f->mask;
    f->p.bool_mask.batch_stride = FHQ * FTQ * FTK;
    f->p.bool_mask.head_stride = FTQ * FTK;
    f->p.bool_mask.query_stride = FTK;
    f->p.bool_mask.key_stride = 1;
    f->p.bias.data = f->buf[BUF_BIAS];
    f->p.bias.batch_stride = FHQ * FTQ * FTK;
    f->p.bias.head_stride = FTQ * FTK;
    f->p.bias.query_stride = FTK;
    f->p.bias.key_stride = 1;
}

static void fx_snapshot(fx *f)
{
    for (int i = 0; i < NBUF; i++) {
        const size_t n = buf_len[i] + 2 * UTIL_GUARD_FLOATS;
        f->snap[i] = malloc(n * sizeof(float));
        cr_assert_not_null(f->snap[i]);
        memcpy(f->snap[i], f->buf[i] - UTIL_GUARD_FLOATS, n * sizeof(float));
    }
    memcpy(f->kvl_snap, f->kvl, sizeof f->kvl);
    memcpy(f->mask_snap, f->mask, sizeof f->mask);
}

/* 1 if no byte of any buffer (guard zones included) changed since the snapshot. */
static int fx_untouched(const fx *f, const char *what)
{
    int ok = 1;
    for (int i = 0; i < NBUF; i++) {
        const size_t n = buf_len[i] + 2 * UTIL_GUARD_FLOATS;
        if (memcmp(f->snap[i], f->buf[i] - UTIL_GUARD_FLOATS, n * sizeof(float)) != 0) {
            cr_log_error("%s: buffer %s was modified by a failing call", what, buf_name[i]);
            ok = 0;
        }
    }
    if (memcmp(f->kvl_snap, f->kvl, sizeof f->kvl) || memcmp(f->mask_snap, f->mask, sizeof f->mask)) {
        cr_log_error("%s: kv_lengths or the boolean mask was modified", what);
        ok = 0;
    }
    return ok;
}

static void fx_free(fx *f)
{
    for (int i = 0; i < NBUF; i++) {
        util_gfree(f->buf[i]);
        free(f->snap[i]);
    }
}

static sdpa_status fx_forward(const fx *f)
{
    return sdpa_forward(f->pp, f->q, f->k, f->v, f->o, f->lse);
}

static sdpa_status fx_backward(const fx *f)
{
    return sdpa_backward(f->pp, f->q, f->k, f->v, f->oin, f->lsein, f->dout, f->dq, f->dk, f->dv);
}

/* -------------------------------------------------------------- cases -- */

enum { FWD = 1, BWD = 2, BOTH = 3 };

typedef void (*mutator)(fx *f);

typedef struct api_case {
    const char *name;
    mutator mutate;
    int which;
    sdpa_status expect;
} api_case;

/* Runs one case on the forward and/or the backward: the status must be exactly
 * `expect`; for an error, no buffer may have changed. */
static void run_case(const api_case *c)
{
    for (int pass = FWD; pass <= BWD; pass <<= 1) {
        if (!(c->which & pass))
            continue;
        fx f;
        fx_init(&f);
        c->mutate(&f);
        fx_snapshot(&f);
        const sdpa_status st = pass == FWD ? fx_forward(&f) : fx_backward(&f);
        const char *fn = pass == FWD ? "sdpa_forward" : "sdpa_backward";
        cr_expect_eq(st, c->expect, "%s, case \"%s\": status %d (%s), expected %d (%s)", fn, c->name,
                     (int)st, sdpa_status_string(st), (int)c->expect, sdpa_status_string(c->expect));
        if (c->expect != SDPA_OK) {
            char what[160];
            snprintf(what, sizeof what, "%s, case \"%s\"", fn, c->name);
            cr_expect(fx_untouched(&f, what), "%s: outputs or inputs written on error", what);
        }
        fx_free(&f);
    }
}

static void run_cases(const api_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        run_case(&cases[i]);
}

#define MUT(name, body)                                                                            \
    static void mut_##name(fx *f)                                                                  \
    {                                                                                              \
        body;                                                                                      \
    }

/* --- NULL arguments --- */
MUT(null_problem, f->pp = NULL)
MUT(null_q, f->q = NULL)
MUT(null_k, f->k = NULL)
MUT(null_v, f->v = NULL)
MUT(null_o, f->o = NULL)
MUT(null_oin, f->oin = NULL)
MUT(null_lsein, f->lsein = NULL)
MUT(null_dout, f->dout = NULL)
MUT(null_dq, f->dq = NULL)
MUT(null_dk, f->dk = NULL)
MUT(null_dv, f->dv = NULL)
MUT(null_q_data, f->tq.data = NULL)
MUT(null_k_data, f->tk.data = NULL)
MUT(null_v_data, f->tv.data = NULL)
MUT(null_o_data, f->to.data = NULL)
MUT(null_oin_data, f->toin.data = NULL)
MUT(null_lsein_data, f->tlsein.data = NULL)
MUT(null_dout_data, f->tdo.data = NULL)
MUT(null_dq_data, f->tdq.data = NULL)
MUT(null_dk_data, f->tdk.data = NULL)
MUT(null_dv_data, f->tdv.data = NULL)
/* LSE is optional in the forward: a NULL view or a NULL data pointer. */
MUT(fwd_no_lse, f->lse = NULL)
MUT(fwd_lse_data_null, f->tlse.data = NULL)

Test(api, null_arguments)
{
    const api_case cases[] = {
        {"problem NULL", mut_null_problem, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"q view NULL", mut_null_q, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"k view NULL", mut_null_k, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"v view NULL", mut_null_v, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"o view NULL", mut_null_o, FWD, SDPA_ERR_NULL_ARGUMENT},
        {"o (input) view NULL", mut_null_oin, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"lse view NULL (required by backward)", mut_null_lsein, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dout view NULL", mut_null_dout, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dq view NULL", mut_null_dq, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dk view NULL", mut_null_dk, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dv view NULL", mut_null_dv, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"q data NULL", mut_null_q_data, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"k data NULL", mut_null_k_data, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"v data NULL", mut_null_v_data, BOTH, SDPA_ERR_NULL_ARGUMENT},
        {"o data NULL", mut_null_o_data, FWD, SDPA_ERR_NULL_ARGUMENT},
        {"o (input) data NULL", mut_null_oin_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"lse (input) data NULL", mut_null_lsein_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dout data NULL", mut_null_dout_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dq data NULL", mut_null_dq_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dk data NULL", mut_null_dk_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"dv data NULL", mut_null_dv_data, BWD, SDPA_ERR_NULL_ARGUMENT},
        {"forward without lse view", mut_fwd_no_lse, FWD, SDPA_OK},
        {"forward with lse data NULL", mut_fwd_lse_data_null, FWD, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- descriptor --- */
MUT(struct_size_small, f->p.struct_size = (uint32_t)sizeof(sdpa_problem) - 8)
MUT(struct_size_big, f->p.struct_size = (uint32_t)sizeof(sdpa_problem) + 8)
MUT(struct_size_zero, f->p.struct_size = 0)
MUT(reserved0, f->p.reserved0 = 1)
MUT(diag_offset_big, f->p.diagonal_offset = SDPA_MAX_DIAGONAL_OFFSET + 1)
MUT(diag_offset_min, f->p.diagonal_offset = INT64_MIN)
MUT(fpmath_mode, f->p.fpmath_mode = (sdpa_fpmath_mode)2)
MUT(q_dtype_3, f->p.q_dtype = (sdpa_dtype)3)
MUT(kv_dtype_neg, f->p.kv_dtype = (sdpa_dtype)-1)
MUT(o_dtype_big, f->p.o_dtype = (sdpa_dtype)1000)
MUT(reserved1, f->p.reserved1 = 1)
MUT(causal_3, f->p.causal = (sdpa_causal)3)
MUT(causal_neg, f->p.causal = (sdpa_causal)-1)
MUT(align_2, f->p.window_alignment = (sdpa_alignment)2)
MUT(align_neg, f->p.window_alignment = (sdpa_alignment)-1)
MUT(default_scale_2, f->p.use_default_scale = 2)
MUT(default_scale_neg, f->p.use_default_scale = -1)
MUT(isa_count, f->p.isa = (sdpa_isa)SDPA_ISA_COUNT)
MUT(isa_minus2, f->p.isa = (sdpa_isa)-2)
MUT(isa_big, f->p.isa = (sdpa_isa)1000)

Test(api, bad_descriptor)
{
    const api_case cases[] = {
        {"struct_size too small", mut_struct_size_small, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"struct_size too big", mut_struct_size_big, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"struct_size 0 (not initialised)", mut_struct_size_zero, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"reserved0 nonzero", mut_reserved0, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"diagonal_offset above the limit", mut_diag_offset_big, BOTH, SDPA_ERR_BAD_WINDOW},
        {"diagonal_offset INT64_MIN", mut_diag_offset_min, BOTH, SDPA_ERR_BAD_WINDOW},
        {"fpmath_mode 2", mut_fpmath_mode, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"q_dtype = 3", mut_q_dtype_3, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"kv_dtype = -1", mut_kv_dtype_neg, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"o_dtype = 1000", mut_o_dtype_big, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"reserved1 nonzero", mut_reserved1, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"causal = 3", mut_causal_3, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"causal = -1", mut_causal_neg, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"window_alignment = 2", mut_align_2, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"window_alignment = -1", mut_align_neg, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"use_default_scale = 2", mut_default_scale_2, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"use_default_scale = -1", mut_default_scale_neg, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"isa = SDPA_ISA_COUNT", mut_isa_count, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"isa = -2", mut_isa_minus2, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
        {"isa = 1000", mut_isa_big, BOTH, SDPA_ERR_BAD_DESCRIPTOR},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- sizes and head grouping --- */
MUT(neg_b, f->p.batch = -1)
MUT(neg_hq, f->p.q_heads = -4)
MUT(neg_hkv, f->p.kv_heads = -2)
MUT(neg_tq, f->p.q_len = -1)
MUT(neg_tk, f->p.kv_len = -1)
MUT(neg_dk, f->p.head_dim_qk = -8)
MUT(neg_dv, f->p.head_dim_v = -1)
MUT(min_tk, f->p.kv_len = INT64_MIN)
MUT(hq_not_multiple, f->p.kv_heads = 3)
MUT(hq_less_than_hkv, (f->p.q_heads = 2, f->p.kv_heads = 4))
MUT(hkv_zero, f->p.kv_heads = 0)
MUT(hq_hkv_zero, (f->p.q_heads = 0, f->p.kv_heads = 0))
MUT(mqa, f->p.kv_heads = 1)

Test(api, sizes_and_head_grouping)
{
    const api_case cases[] = {
        {"batch -1", mut_neg_b, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"q_heads -4", mut_neg_hq, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"kv_heads -2", mut_neg_hkv, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"q_len -1", mut_neg_tq, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"kv_len -1", mut_neg_tk, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"head_dim_qk -8", mut_neg_dk, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"head_dim_v -1", mut_neg_dv, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"kv_len INT64_MIN", mut_min_tk, BOTH, SDPA_ERR_NEGATIVE_SIZE},
        {"Hq = 4, Hkv = 3", mut_hq_not_multiple, BOTH, SDPA_ERR_HEAD_GROUPING},
        {"Hq = 2, Hkv = 4", mut_hq_less_than_hkv, BOTH, SDPA_ERR_HEAD_GROUPING},
        {"Hq = 4, Hkv = 0", mut_hkv_zero, BOTH, SDPA_ERR_HEAD_GROUPING},
        {"Hq = Hkv = 0", mut_hq_hkv_zero, BOTH, SDPA_OK},
        {"Hq = 4, Hkv = 1 (MQA)", mut_mqa, BOTH, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- scale --- */
MUT(scale_nan, (f->p.use_default_scale = 0, f->p.scale = NAN))
MUT(scale_inf, (f->p.use_default_scale = 0, f->p.scale = INFINITY))
MUT(scale_ninf, (f->p.use_default_scale = 0, f->p.scale = -INFINITY))
MUT(default_scale_dk0, f->p.head_dim_qk = 0)
MUT(scale_zero, (f->p.use_default_scale = 0, f->p.scale = 0.0f))
MUT(scale_negzero, (f->p.use_default_scale = 0, f->p.scale = -0.0f))
MUT(scale_negative, (f->p.use_default_scale = 0, f->p.scale = -0.75f))
MUT(scale_huge, (f->p.use_default_scale = 0, f->p.scale = 3.0e38f))
MUT(explicit_scale_dk0, (f->p.head_dim_qk = 0, f->p.use_default_scale = 0, f->p.scale = 1.0f))
MUT(default_nan_set, (f->p.use_default_scale = 1, f->p.scale = NAN))
MUT(default_with_scale_set, (f->p.use_default_scale = 1, f->p.scale = 0.01f))

Test(api, scale)
{
    const api_case cases[] = {
        {"scale NaN", mut_scale_nan, BOTH, SDPA_ERR_BAD_SCALE},
        {"scale +inf", mut_scale_inf, BOTH, SDPA_ERR_BAD_SCALE},
        {"scale -inf", mut_scale_ninf, BOTH, SDPA_ERR_BAD_SCALE},
        {"default scale with Dk = 0", mut_default_scale_dk0, BOTH, SDPA_ERR_BAD_SCALE},
        {"scale 0", mut_scale_zero, BOTH, SDPA_OK},
        {"scale -0", mut_scale_negzero, BOTH, SDPA_OK},
        {"scale -0.75", mut_scale_negative, BOTH, SDPA_OK},
        {"scale 3e38 (finite)", mut_scale_huge, BOTH, SDPA_OK},
        {"explicit scale with Dk = 0", mut_explicit_scale_dk0, BOTH, SDPA_OK},
        /* a scale set while use_default_scale is still 1 would be silently ignored: refused */
        {"default scale with a NaN in .scale", mut_default_nan_set, BOTH, SDPA_ERR_BAD_SCALE},
        {"default scale with .scale = 0.01 set", mut_default_with_scale_set, BOTH, SDPA_ERR_BAD_SCALE},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- strides (negative, self-overlapping outputs) --- */

/* Which stride of which view a generated case changes. */
typedef struct stride_target {
    const char *name;
    int which;
    size_t off; /* offset of the view inside fx */
    int is_out;
} stride_target;

#define IN_T(field, w) {#field, w, offsetof(fx, field), 0}
#define OUT_T(field, w) {#field, w, offsetof(fx, field), 1}
static const stride_target stride_targets[] = {
    IN_T(tq, BOTH),     IN_T(tk, BOTH),      IN_T(tv, BOTH),     IN_T(toin, BWD),
    IN_T(tlsein, BWD),  IN_T(tdo, BWD),      OUT_T(to, FWD),     OUT_T(tlse, FWD),
    OUT_T(tdq, BWD),    OUT_T(tdk, BWD),     OUT_T(tdv, BWD),
};

static int64_t *stride_ptr(fx *f, const stride_target *t, int dim)
{
    char *base = (char *)f + t->off;
    if (t->is_out) {
        sdpa_tensor_out *v = (sdpa_tensor_out *)(void *)base;
        return dim == 0 ? &v->batch_stride : dim == 1 ? &v->head_stride : &v->seq_stride;
    }
    sdpa_tensor *v = (sdpa_tensor *)(void *)base;
    return dim == 0 ? &v->batch_stride : dim == 1 ? &v->head_stride : &v->seq_stride;
}

static void run_stride_case(const stride_target *t, int dim, int64_t value, sdpa_status expect,
                            const char *why)
{
    for (int pass = FWD; pass <= BWD; pass <<= 1) {
        if (!(t->which & pass))
            continue;
        fx f;
        fx_init(&f);
        *stride_ptr(&f, t, dim) = value;
        fx_snapshot(&f);
        const sdpa_status st = pass == FWD ? fx_forward(&f) : fx_backward(&f);
        static const char *dn[3] = {"batch", "head", "seq"};
        char what[200];
        snprintf(what, sizeof what, "%s: %s.%s_stride = %lld (%s)",
                 pass == FWD ? "sdpa_forward" : "sdpa_backward", t->name, dn[dim], (long long)value, why);
        cr_expect_eq(st, expect, "%s: status %d (%s), expected %d", what, (int)st, sdpa_status_string(st),
                     (int)expect);
        if (expect != SDPA_OK)
            cr_expect(fx_untouched(&f, what), "%s: buffers written on error", what);
        fx_free(&f);
    }
}

Test(api, negative_strides)
{
    for (size_t i = 0; i < sizeof stride_targets / sizeof stride_targets[0]; i++)
        for (int dim = 0; dim < 3; dim++) {
            run_stride_case(&stride_targets[i], dim, -1, SDPA_ERR_BAD_STRIDE, "negative");
            run_stride_case(&stride_targets[i], dim, INT64_MIN, SDPA_ERR_BAD_STRIDE, "INT64_MIN");
        }
}

Test(api, self_overlapping_outputs)
{
    for (size_t i = 0; i < sizeof stride_targets / sizeof stride_targets[0]; i++) {
        const stride_target *t = &stride_targets[i];
        if (!t->is_out)
            continue;
        const int is_lse = strcmp(t->name, "tlse") == 0;
        /* Broadcasting an output (stride 0 on a dimension of size > 1) writes the
         * same place twice. */
        for (int dim = 0; dim < 3; dim++)
            run_stride_case(t, dim, 0, SDPA_ERR_BAD_STRIDE, "broadcast output");
        /* Rows closer than a row's length. */
        if (!is_lse)
            run_stride_case(t, 2, 1, SDPA_ERR_BAD_STRIDE, "rows overlap");
        /* Heads closer than a head's extent. */
        run_stride_case(t, 1, is_lse ? 2 : 7, SDPA_ERR_BAD_STRIDE, "heads overlap");
    }
    /* Inputs may broadcast. */
    for (size_t i = 0; i < sizeof stride_targets / sizeof stride_targets[0]; i++) {
        const stride_target *t = &stride_targets[i];
        if (t->is_out)
            continue;
        for (int dim = 0; dim < 3; dim++)
            run_stride_case(t, dim, 0, SDPA_OK, "broadcast input");
    }
}

/* Interleaved but non-overlapping outputs are fine: O stored as [B, T, H, D]. */
MUT(o_bthd, (f->to.seq_stride = FHQ * FDV, f->to.head_stride = FDV))
MUT(dq_bthd, (f->tdq.seq_stride = FHQ * FDK, f->tdq.head_stride = FDK))
/* Bool mask / bias strides. */
MUT(mask_neg_stride, (fx_masks(f), f->p.bool_mask.key_stride = -1))
MUT(mask_neg_batch_stride, (fx_masks(f), f->p.bool_mask.batch_stride = -5))
MUT(bias_neg_stride, (fx_masks(f), f->p.bias.query_stride = -1))
MUT(bias_neg_head_stride, (fx_masks(f), f->p.bias.head_stride = -1))
MUT(mask_neg_stride_no_data, (f->p.bool_mask.key_stride = -1))
MUT(masks_broadcast, (fx_masks(f), f->p.bool_mask.batch_stride = 0, f->p.bool_mask.head_stride = 0,
                      f->p.bias.query_stride = 0, f->p.bias.head_stride = 0))

Test(api, strides_misc)
{
    const api_case cases[] = {
        {"O as [B, T, H, D]", mut_o_bthd, FWD, SDPA_OK},
        {"dQ as [B, T, H, D]", mut_dq_bthd, BWD, SDPA_OK},
        {"bool mask key_stride -1", mut_mask_neg_stride, BOTH, SDPA_ERR_BAD_STRIDE},
        {"bool mask batch_stride -5", mut_mask_neg_batch_stride, BOTH, SDPA_ERR_BAD_STRIDE},
        {"bias query_stride -1", mut_bias_neg_stride, BOTH, SDPA_ERR_BAD_STRIDE},
        {"bias head_stride -1", mut_bias_neg_head_stride, BOTH, SDPA_ERR_BAD_STRIDE},
        {"bool mask stride -1 but no mask data (ignored)", mut_mask_neg_stride_no_data, BOTH, SDPA_OK},
        {"mask and bias broadcast with stride 0", mut_masks_broadcast, BOTH, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- window, kv_lengths, threads, ISA, block sizes --- */
MUT(wl_m2, f->p.window_left = -2)
MUT(wr_m2, f->p.window_right = -2)
MUT(wl_min, f->p.window_left = INT64_MIN)
MUT(wl_m2_causal, (f->p.causal = SDPA_CAUSAL_TOP_LEFT, f->p.window_left = -3))
MUT(w_zero, (f->p.window_left = 0, f->p.window_right = 0))
MUT(w_huge, (f->p.window_left = INT64_MAX, f->p.window_right = INT64_MAX))
MUT(kvl_neg, (f->p.kv_lengths = f->kvl, f->kvl[1] = -1))
MUT(kvl_big, (f->p.kv_lengths = f->kvl, f->kvl[0] = FTK + 1))
MUT(kvl_min, (f->p.kv_lengths = f->kvl, f->kvl[1] = INT32_MIN))
MUT(kvl_edges, (f->p.kv_lengths = f->kvl, f->kvl[0] = 0, f->kvl[1] = FTK))
MUT(threads_neg, f->p.num_threads = -1)
MUT(threads_min, f->p.num_threads = INT32_MIN)
MUT(threads_zero, f->p.num_threads = 0)
MUT(threads_many, f->p.num_threads = 64)
MUT(bq_neg, f->p.block_q = -1)
MUT(bk_neg, f->p.block_k = -16)
MUT(bq_big, f->p.block_q = SDPA_MAX_BLOCK + 1)
MUT(bk_big, f->p.block_k = SDPA_MAX_BLOCK + 1)
MUT(blocks_one, (f->p.block_q = 1, f->p.block_k = 1))
MUT(blocks_max, (f->p.block_q = SDPA_MAX_BLOCK, f->p.block_k = SDPA_MAX_BLOCK))
MUT(blocks_odd, (f->p.block_q = 3, f->p.block_k = 5))

Test(api, window_kvlen_threads_blocks)
{
    const api_case cases[] = {
        {"window_left -2", mut_wl_m2, BOTH, SDPA_ERR_BAD_WINDOW},
        {"window_right -2", mut_wr_m2, BOTH, SDPA_ERR_BAD_WINDOW},
        {"window_left INT64_MIN", mut_wl_min, BOTH, SDPA_ERR_BAD_WINDOW},
        {"window_left -3 with causal", mut_wl_m2_causal, BOTH, SDPA_ERR_BAD_WINDOW},
        {"window 0/0 (diagonal only)", mut_w_zero, BOTH, SDPA_OK},
        {"window INT64_MAX", mut_w_huge, BOTH, SDPA_OK},
        {"kv_lengths[1] = -1", mut_kvl_neg, BOTH, SDPA_ERR_BAD_KV_LENGTH},
        {"kv_lengths[0] = Tk + 1", mut_kvl_big, BOTH, SDPA_ERR_BAD_KV_LENGTH},
        {"kv_lengths[1] = INT32_MIN", mut_kvl_min, BOTH, SDPA_ERR_BAD_KV_LENGTH},
        {"kv_lengths {0, Tk}", mut_kvl_edges, BOTH, SDPA_OK},
        {"num_threads -1", mut_threads_neg, BOTH, SDPA_ERR_BAD_THREADS},
        {"num_threads INT32_MIN", mut_threads_min, BOTH, SDPA_ERR_BAD_THREADS},
        {"num_threads 0 (default)", mut_threads_zero, BOTH, SDPA_OK},
        {"num_threads 64", mut_threads_many, BOTH, SDPA_OK},
        {"block_q -1", mut_bq_neg, BOTH, SDPA_ERR_BAD_BLOCK_SIZE},
        {"block_k -16", mut_bk_neg, BOTH, SDPA_ERR_BAD_BLOCK_SIZE},
        {"block_q MAX+1", mut_bq_big, BOTH, SDPA_ERR_BAD_BLOCK_SIZE},
        {"block_k MAX+1", mut_bk_big, BOTH, SDPA_ERR_BAD_BLOCK_SIZE},
        {"blocks 1/1", mut_blocks_one, BOTH, SDPA_OK},
        {"blocks MAX/MAX", mut_blocks_max, BOTH, SDPA_OK},
        {"blocks 3/5", mut_blocks_odd, BOTH, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

static sdpa_isa api_case_isa;
MUT(set_isa, f->p.isa = api_case_isa)

Test(api, isa_per_call)
{
    const sdpa_isa all[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX, SDPA_ISA_NEON};
    int unsupported = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        api_case_isa = all[i];
        char name[64];
        snprintf(name, sizeof name, "isa = %s", sdpa_isa_name(all[i]));
        const int ok = sdpa_isa_supported(all[i]);
        unsupported += !ok;
        const api_case c = {name, mut_set_isa, BOTH, ok ? SDPA_OK : SDPA_ERR_ISA_UNAVAILABLE};
        run_case(&c);
    }
    /* Every build lacks the other architecture's ISA. */
    cr_expect(unsupported >= 1);
#if defined(__x86_64__)
    cr_expect(!sdpa_isa_supported(SDPA_ISA_NEON));
#endif
}

/* --- aliasing --- */
MUT(o_is_q, f->to.data = f->buf[BUF_Q])
MUT(o_in_k, f->to.data = f->buf[BUF_K] + 5)
/* O's last element on V's first: both placed in one arena so that nothing
 * outside an allocation is ever addressed. */
static float alias_arena[FB * FHQ * FTQ * FDV + FB * FHKV * FTK * FDV];
MUT(o_tail_over_v, (memcpy(alias_arena + FB * FHQ * FTQ * FDV - 1, f->buf[BUF_V],
                           sizeof(float) * FB * FHKV * FTK * FDV),
                    f->tv.data = alias_arena + FB * FHQ * FTQ * FDV - 1, f->to.data = alias_arena))
MUT(lse_in_o, f->tlse.data = f->buf[BUF_O] + FB * FHQ * FTQ * FDV - 1)
MUT(lse_is_q, f->tlse.data = f->buf[BUF_Q] + 3)
MUT(o_over_bias, (fx_masks(f), f->to.data = f->buf[BUF_BIAS]))
/* Mask operands placed inside an output buffer (copies of the real ones). */
MUT(o_over_kvl, (fx_masks(f), memcpy(f->buf[BUF_O] + 10, f->kvl, sizeof f->kvl),
                 f->p.kv_lengths = (const int32_t *)(void *)(f->buf[BUF_O] + 10)))
MUT(o_over_mask, (fx_masks(f), memcpy(f->buf[BUF_O] + 4, f->mask, sizeof f->mask),
                  f->p.bool_mask.data = (const uint8_t *)(void *)(f->buf[BUF_O] + 4)))
MUT(dq_is_q, f->tdq.data = f->buf[BUF_Q])
MUT(dk_is_dq, f->tdk.data = f->buf[BUF_DQ] + 8)
MUT(dv_is_dk, f->tdv.data = f->buf[BUF_DK])
MUT(dv_over_dout, f->tdv.data = f->buf[BUF_DO] + 1)
MUT(lse_in_dq, f->tlsein.data = f->buf[BUF_DQ] + 3)
MUT(dk_over_oin, f->tdk.data = f->buf[BUF_OIN] + 17)
MUT(v_in_dq, f->tv.data = f->buf[BUF_DQ] + 10)
MUT(dv_over_bias, (fx_masks(f), f->tdv.data = f->buf[BUF_BIAS] + 2))
MUT(dk_over_kvl, (fx_masks(f), memcpy(f->buf[BUF_DK] + 100, f->kvl, sizeof f->kvl),
                  f->p.kv_lengths = (const int32_t *)(void *)(f->buf[BUF_DK] + 100)))
/* Adjacent (touching, not overlapping) buffers are fine: O right after Q's last element. */
static float adjacent_store[FB * FHQ * FTQ * FDK + FB * FHQ * FTQ * FDV];
MUT(o_adjacent_q, (memcpy(adjacent_store, f->buf[BUF_Q], sizeof(float) * FB * FHQ * FTQ * FDK),
                   f->tq.data = adjacent_store, f->to.data = adjacent_store + FB * FHQ * FTQ * FDK))
/* Inputs may alias each other (self-attention with Q = K = V). */
MUT(qkv_same, (f->tk.data = f->buf[BUF_Q], f->tv.data = f->buf[BUF_Q], f->p.kv_heads = FHQ,
               f->p.kv_len = FTQ, f->p.head_dim_v = FDK, f->tk = f->tq, f->tv = f->tq,
               f->to.head_stride = FTQ * FDK, f->to.batch_stride = FHQ * FTQ * FDK,
               f->to.seq_stride = FDK, f->to.data = f->buf[BUF_DQ]))

Test(api, aliasing)
{
    const api_case cases[] = {
        {"O == Q", mut_o_is_q, FWD, SDPA_ERR_ALIASING},
        {"O inside K", mut_o_in_k, FWD, SDPA_ERR_ALIASING},
        {"last element of O on V[0]", mut_o_tail_over_v, FWD, SDPA_ERR_ALIASING},
        {"LSE on the last element of O", mut_lse_in_o, FWD, SDPA_ERR_ALIASING},
        {"LSE inside Q", mut_lse_is_q, FWD, SDPA_ERR_ALIASING},
        {"O over the bias", mut_o_over_bias, FWD, SDPA_ERR_ALIASING},
        {"O over kv_lengths", mut_o_over_kvl, FWD, SDPA_ERR_ALIASING},
        {"O over the bool mask", mut_o_over_mask, FWD, SDPA_ERR_ALIASING},
        {"dQ == Q", mut_dq_is_q, BWD, SDPA_ERR_ALIASING},
        {"dK inside dQ", mut_dk_is_dq, BWD, SDPA_ERR_ALIASING},
        {"dV == dK", mut_dv_is_dk, BWD, SDPA_ERR_ALIASING},
        {"dV over dO", mut_dv_over_dout, BWD, SDPA_ERR_ALIASING},
        {"LSE (input) inside dQ", mut_lse_in_dq, BWD, SDPA_ERR_ALIASING},
        {"dK over O", mut_dk_over_oin, BWD, SDPA_ERR_ALIASING},
        {"V inside dQ", mut_v_in_dq, BWD, SDPA_ERR_ALIASING},
        {"dV over the bias", mut_dv_over_bias, BWD, SDPA_ERR_ALIASING},
        {"dK over kv_lengths", mut_dk_over_kvl, BWD, SDPA_ERR_ALIASING},
        {"O directly after Q (touching)", mut_o_adjacent_q, FWD, SDPA_OK},
        {"Q = K = V (inputs may alias)", mut_qkv_same, FWD, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- extents that overflow --- */
MUT(q_batch_huge, f->tq.batch_stride = INT64_MAX / 2)
MUT(q_seq_huge, f->tq.seq_stride = INT64_MAX / 3)
MUT(k_head_bytes, f->tk.head_stride = INT64_MAX / 3) /* elements fit, bytes do not */
MUT(v_seq_max, f->tv.seq_stride = INT64_MAX)
MUT(o_head_huge, f->to.head_stride = INT64_MAX / 2)
MUT(lse_seq_huge, f->tlse.seq_stride = INT64_MAX / 4)
MUT(dq_batch_huge, f->tdq.batch_stride = INT64_MAX / 2)
MUT(dk_seq_huge, f->tdk.seq_stride = INT64_MAX / 5)
MUT(dv_head_huge, f->tdv.head_stride = INT64_MAX)
MUT(dout_seq_huge, f->tdo.seq_stride = INT64_MAX / 4)
MUT(tq_huge, f->p.q_len = INT64_MAX / 2)
MUT(tk_huge, f->p.kv_len = INT64_MAX)
MUT(b_huge, f->p.batch = ((int64_t)1 << 62))
MUT(dk_huge, (f->p.head_dim_qk = (int64_t)1 << 40, f->p.use_default_scale = 0, f->p.scale = 1.0f))
MUT(dv_huge, f->p.head_dim_v = INT64_MAX)
MUT(bias_stride_huge, (fx_masks(f), f->p.bias.key_stride = INT64_MAX / 2))
MUT(mask_stride_huge, (fx_masks(f), f->p.bool_mask.query_stride = INT64_MAX / 3))
/* Extents that run past the top of the address space (garbage pointers, aligned): the
 * byte count fits, data + bytes wraps (session 32 review: accepted, then read; ASan
 * negative-size-param, a SEGV without it). Never dereferenced when refused. */
#define TOP_OF_MEMORY(bytes_below) ((void *)(UINTPTR_MAX - (bytes_below) + 1))
MUT(q_wraps, f->tq.data = TOP_OF_MEMORY(16))
MUT(v_wraps, f->tv.data = TOP_OF_MEMORY(64))
MUT(o_wraps, f->to.data = TOP_OF_MEMORY(16))
MUT(dk_wraps, f->tdk.data = TOP_OF_MEMORY(32))
MUT(bias_wraps, (fx_masks(f), f->p.bias.data = TOP_OF_MEMORY(16)))
MUT(mask_wraps, (fx_masks(f), f->p.bool_mask.data = TOP_OF_MEMORY(2)))
MUT(kvl_wraps, (fx_masks(f), f->p.kv_lengths = TOP_OF_MEMORY(4)))
MUT(slopes_wraps, f->p.alibi_slopes = TOP_OF_MEMORY(4))
MUT(sinks_wraps, f->p.sinks = TOP_OF_MEMORY(8))

Test(api, size_overflow)
{
    const api_case cases[] = {
        {"Q batch stride INT64_MAX/2", mut_q_batch_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"Q seq stride INT64_MAX/3", mut_q_seq_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"K head stride INT64_MAX/3 (bytes overflow)", mut_k_head_bytes, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"V seq stride INT64_MAX", mut_v_seq_max, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"O head stride INT64_MAX/2", mut_o_head_huge, FWD, SDPA_ERR_SIZE_OVERFLOW},
        {"LSE seq stride INT64_MAX/4", mut_lse_seq_huge, FWD, SDPA_ERR_SIZE_OVERFLOW},
        {"dQ batch stride INT64_MAX/2", mut_dq_batch_huge, BWD, SDPA_ERR_SIZE_OVERFLOW},
        {"dK seq stride INT64_MAX/5", mut_dk_seq_huge, BWD, SDPA_ERR_SIZE_OVERFLOW},
        {"dV head stride INT64_MAX", mut_dv_head_huge, BWD, SDPA_ERR_SIZE_OVERFLOW},
        {"dO seq stride INT64_MAX/4", mut_dout_seq_huge, BWD, SDPA_ERR_SIZE_OVERFLOW},
        {"Tq INT64_MAX/2", mut_tq_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"Tk INT64_MAX", mut_tk_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"B 2^62", mut_b_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"Dk 2^40", mut_dk_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"Dv INT64_MAX", mut_dv_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"bias key stride INT64_MAX/2", mut_bias_stride_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"bool mask query stride INT64_MAX/3", mut_mask_stride_huge, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"Q ending past the top of memory", mut_q_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"V ending past the top of memory", mut_v_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"O ending past the top of memory", mut_o_wraps, FWD, SDPA_ERR_SIZE_OVERFLOW},
        {"dK ending past the top of memory", mut_dk_wraps, BWD, SDPA_ERR_SIZE_OVERFLOW},
        {"bias ending past the top of memory", mut_bias_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"bool mask ending past the top of memory", mut_mask_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"kv_lengths ending past the top of memory", mut_kvl_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"alibi_slopes ending past the top of memory", mut_slopes_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
        {"sinks ending past the top of memory", mut_sinks_wraps, BOTH, SDPA_ERR_SIZE_OVERFLOW},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* --- pointers not aligned to their element (regression, session 29: UBSan reported
 * misaligned float loads and stores; now SDPA_ERR_MISALIGNED before anything is read) --- */
static int32_t kvl_store[FB + 1];
static float slope_store[FHQ + 1];
#define BYTE_OFF(ptr, n) ((void *)((char *)(ptr) + (n)))
MUT(q_misaligned, f->tq.data = BYTE_OFF(f->buf[BUF_Q], 1))
MUT(k_misaligned, f->tk.data = BYTE_OFF(f->buf[BUF_K], 2))
MUT(v_misaligned, f->tv.data = BYTE_OFF(f->buf[BUF_V], 3))
MUT(o_misaligned, f->to.data = BYTE_OFF(f->buf[BUF_O], 1))
MUT(lse_misaligned, f->tlse.data = BYTE_OFF(f->buf[BUF_LSE], 2))
MUT(oin_misaligned, f->toin.data = BYTE_OFF(f->buf[BUF_OIN], 1))
MUT(lsein_misaligned, f->tlsein.data = BYTE_OFF(f->buf[BUF_LSEIN], 3))
MUT(dout_misaligned, f->tdo.data = BYTE_OFF(f->buf[BUF_DO], 2))
MUT(dq_misaligned, f->tdq.data = BYTE_OFF(f->buf[BUF_DQ], 1))
MUT(dk_misaligned, f->tdk.data = BYTE_OFF(f->buf[BUF_DK], 2))
MUT(dv_misaligned, f->tdv.data = BYTE_OFF(f->buf[BUF_DV], 3))
MUT(bias_misaligned, (fx_masks(f), f->p.bias.data = BYTE_OFF(f->buf[BUF_BIAS], 2)))
MUT(kvl_misaligned, (fx_masks(f), memcpy(BYTE_OFF(kvl_store, 1), f->kvl, sizeof f->kvl),
                     f->p.kv_lengths = BYTE_OFF(kvl_store, 1)))
MUT(slopes_misaligned, (memset(slope_store, 0, sizeof slope_store), f->p.alibi_slopes = BYTE_OFF(slope_store, 2)))
MUT(sinks_misaligned, (memset(slope_store, 0, sizeof slope_store), f->p.sinks = BYTE_OFF(slope_store, 1)))
/* an empty tensor's pointer is never read: any value is fine */
MUT(empty_q_misaligned, (f->p.q_len = 0, f->tq.data = BYTE_OFF(f->buf[BUF_Q], 1)))

Test(api, misaligned_pointers)
{
    const api_case cases[] = {
        {"Q one byte off", mut_q_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"K two bytes off", mut_k_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"V three bytes off", mut_v_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"O one byte off", mut_o_misaligned, FWD, SDPA_ERR_MISALIGNED},
        {"LSE two bytes off", mut_lse_misaligned, FWD, SDPA_ERR_MISALIGNED},
        {"O (input) one byte off", mut_oin_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"LSE (input) three bytes off", mut_lsein_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"dO two bytes off", mut_dout_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"dQ one byte off", mut_dq_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"dK two bytes off", mut_dk_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"dV three bytes off", mut_dv_misaligned, BWD, SDPA_ERR_MISALIGNED},
        {"bias two bytes off", mut_bias_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"kv_lengths one byte off", mut_kvl_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"alibi_slopes two bytes off", mut_slopes_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"sinks one byte off", mut_sinks_misaligned, BOTH, SDPA_ERR_MISALIGNED},
        {"empty Q one byte off", mut_empty_q_misaligned, BOTH, SDPA_OK},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* Regression (session 29): with Dk = 0 (Q, K empty) and V broadcast, nothing bounded
 * kv_len, and a window of Tk around a bottom-right diagonal overflowed int64 in the
 * row's key interval (UBSan), which came out empty: O = 0, LSE = -inf instead of the
 * last key's V. q_len, kv_len up to SDPA_MAX_SEQ_LEN (2^60) are computed; beyond is
 * SDPA_ERR_SIZE_OVERFLOW with nothing written. */
Test(api, sequence_lengths_up_to_the_limit)
{
    for (int over = 0; over <= 1; over++)
        for (int which = 0; which < 2; which++) {
            float v[1] = {2.0f}, o[1] = {-7.0f}, lse[1] = {-7.0f};
            sdpa_problem p;
            sdpa_problem_init(&p);
            p.batch = p.q_heads = p.kv_heads = 1;
            p.q_len = 1;
            p.kv_len = SDPA_MAX_SEQ_LEN + over;
            p.head_dim_qk = 0;
            p.head_dim_v = 1;
            p.use_default_scale = 0;
            p.scale = 1.0f;
            p.num_threads = 1;
            if (which == 0) { /* the last key only: window [i + d, i + d + Tk] bottom-right */
                p.window_alignment = SDPA_ALIGN_BOTTOM_RIGHT;
                p.window_left = 0;
                p.window_right = p.kv_len;
            } else { /* the same key through causal bottom-right and a window of 0 on the left */
                p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
                p.window_left = 0;
            }
            const sdpa_tensor tq = {NULL, 0, 0, 0}, tk = {NULL, 0, 0, 0}, tv = {v, 0, 0, 0};
            const sdpa_tensor_out to = {o, 0, 0, 1}, tl = {lse, 0, 0, 1};
            const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
            if (over) {
                cr_expect_eq(st, SDPA_ERR_SIZE_OVERFLOW, "kv_len 2^60 + 1 (%d): %s", which, sdpa_status_string(st));
                cr_expect(o[0] == -7.0f && lse[0] == -7.0f, "kv_len 2^60 + 1: written");
            } else {
                cr_expect_eq(st, SDPA_OK, "kv_len 2^60 (%d): %s", which, sdpa_status_string(st));
                cr_expect(o[0] == 2.0f && lse[0] == 0.0f, "kv_len 2^60 (%d): O %g LSE %g, want 2 and 0", which,
                          (double)o[0], (double)lse[0]);
            }
        }
    sdpa_problem p; /* q_len beyond the limit, everything empty */
    sdpa_problem_init(&p);
    p.batch = p.q_heads = p.kv_heads = 1;
    p.q_len = SDPA_MAX_SEQ_LEN + 1;
    p.kv_len = 1;
    p.head_dim_qk = 1;
    const sdpa_tensor t0 = {NULL, 0, 0, 0};
    const sdpa_tensor_out o0 = {NULL, 0, 0, 0};
    size_t bytes;
    cr_expect_eq(sdpa_forward(&p, &t0, &t0, &t0, &o0, NULL), SDPA_ERR_SIZE_OVERFLOW);
    cr_expect_eq(sdpa_forward_workspace_size(&p, &bytes), SDPA_ERR_SIZE_OVERFLOW);
}

/* ------------------------------------------------------ strings, version -- */

Test(api, status_strings)
{
    const int lo = SDPA_ERR_MISALIGNED; /* the most negative code */
    const char *seen[32];
    int n = 0;
    for (int s = 0; s >= lo; s--) {
        const char *str = sdpa_status_string((sdpa_status)s);
        cr_assert_not_null(str, "code %d", s);
        cr_assert(str[0] != '\0', "code %d: empty string", s);
        cr_assert_str_neq(str, "unknown status", "code %d has no description", s);
        for (int j = 0; j < n; j++)
            cr_assert_str_neq(str, seen[j], "codes %d and %d share \"%s\"", s, -j, str);
        seen[n++] = str;
    }
    const int others[] = {1, 2, lo - 1, -100, 1000, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const char *str = sdpa_status_string((sdpa_status)others[i]);
        cr_assert_not_null(str);
        cr_assert_str_eq(str, "unknown status", "code %d gives \"%s\"", others[i], str);
    }
}

Test(api, version)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", SDPA_VERSION_MAJOR, SDPA_VERSION_MINOR, SDPA_VERSION_PATCH);
    cr_assert_not_null(sdpa_version());
    cr_assert_str_eq(sdpa_version(), want);
    cr_assert_eq(sdpa_version_number(), (unsigned)SDPA_VERSION);
    cr_assert_eq(SDPA_VERSION_GET_MAJOR(sdpa_version_number()), SDPA_VERSION_MAJOR);
    cr_assert_eq(SDPA_VERSION_GET_MINOR(sdpa_version_number()), SDPA_VERSION_MINOR);
    cr_assert_eq(SDPA_VERSION_GET_PATCH(sdpa_version_number()), SDPA_VERSION_PATCH);
    cr_assert_eq(SDPA_MAKE_VERSION(1, 2, 3), 0x010203);
}

/* The value after `key` in sdpa_tuning()'s segment for isa (-1: not listed). */
static long tuning_value(sdpa_isa isa, const char *key)
{
    char seg[32];
    snprintf(seg, sizeof seg, "; %s block_q ", sdpa_isa_name(isa));
    const char *e = strstr(sdpa_tuning(), seg);
    if (!e)
        return -1;
    const char *end = strchr(e + 2, ';');
    const char *n = strstr(e + 2, key);
    return n && (!end || n < end) ? strtol(n + strlen(key), NULL, 10) : -1;
}

/* The workspace queries against sdpa.h's formulas (fp32, no mask, enough query
 * tiles that the keys are not split): at least the terms it lists, at most those
 * plus the per-call part (the forward's: under 1 KiB for one sequence; the
 * backward's: 64 bytes of alignment slack). Every buffer here is a multiple of 64
 * bytes, so no rounding hides a term. ld = block_q rounded up to 16, plus tile_pad
 * when that is a multiple of 64; the padded V / Q / dO / K rows where head_dim is
 * a multiple of 64. */
Test(api, workspace_sizes_follow_the_header)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int n = util_isas(isas);
    static const int64_t dims[][2] = {{64, 64}, {128, 128}, {40, 96}};
    static const int blocks[][2] = {{0, 0}, {48, 96}};
    for (int ii = 0; ii < n; ii++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (size_t bl = 0; bl < sizeof blocks / sizeof blocks[0]; bl++)
                for (int threads = 1; threads <= 2; threads++) {
                    const int64_t Dk = dims[d][0], Dv = dims[d][1], H = 16, T = 512;
                    sdpa_problem p = util_problem(1, H, H, T, T, Dk, Dv);
                    p.isa = isas[ii];
                    p.num_threads = threads;
                    p.block_q = blocks[bl][0];
                    p.block_k = blocks[bl][1];
                    const long bq = p.block_q ? p.block_q : tuning_value(isas[ii], " block_q ");
                    const long bk = p.block_k ? p.block_k : tuning_value(isas[ii], " block_k ");
                    const long pad = tuning_value(isas[ii], " tile_pad ");
                    cr_assert(bq > 0 && bk > 0 && pad >= 0, "%s: %s", sdpa_isa_name(isas[ii]), sdpa_tuning());
                    const long bq16 = (bq + 15) / 16 * 16, ld = bq16 % 64 == 0 ? bq16 + pad : bq16;
                    const long vpad = Dv % 64 == 0 ? pad : 0, kpad = Dk % 64 == 0 ? pad : 0;
                    const long bk16 = bk > 16 ? bk : 16;
                    size_t fwd, bwd;
                    cr_assert_eq(sdpa_forward_workspace_size(&p, &fwd), SDPA_OK);
                    cr_assert_eq(sdpa_backward_workspace_size(&p, &bwd), SDPA_OK);
                    const size_t f_lo = (size_t)threads * (size_t)(4 * ld * (Dk + Dv + bk + 9) +
                                                                   (vpad ? 4 * bk16 * (Dv + vpad) : 0));
                    const size_t b_lo = (size_t)(16 * H * T) +
                                        (size_t)threads * (size_t)(4 * ld * (2 * Dk + 2 * Dv + 2 * bk + 16) +
                                                                   4 * ld * (kpad + vpad) + (kpad ? 4 * bk * (Dk + kpad) : 0));
                    cr_expect(fwd >= f_lo && fwd <= f_lo + 1024, "%s Dk %lld Dv %lld blocks %ld x %ld threads %d: forward %zu, header %zu",
                              sdpa_isa_name(isas[ii]), (long long)Dk, (long long)Dv, bq, bk, threads, fwd, f_lo);
                    cr_expect(bwd >= b_lo && bwd <= b_lo + 64, "%s Dk %lld Dv %lld blocks %ld x %ld threads %d: backward %zu, header %zu",
                              sdpa_isa_name(isas[ii]), (long long)Dk, (long long)Dv, bq, bk, threads, bwd, b_lo);
                }
}
