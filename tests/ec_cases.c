/* SPDX-License-Identifier: MIT */
/* tests/ec_cases.c - the edge cases EC-01 .. EC-13 of tests/data/edge_cases.json
 * (see tests/data/edge-cases.md and ec_cases.h), forward and backward, on one ISA.
 * Plain C (cJSON, no Criterion): used by the Criterion suite and by conformance.
 *
 * The JSON is read at run time with cJSON. Each case becomes a problem
 * descriptor (scale null = default, causal, window, kv_len, mask / bias nested
 * lists [B or 1][Hq or 1][Tq][Tk] -> broadcast strides) and inputs (the arrays,
 * or the stated formula evaluated in float64 and rounded once to fp32; where both
 * exist they must agree bit for bit). Outputs are compared elementwise with the
 * case's atol / rtol (gradients: atol_grad / rtol_grad), bit for bit for the
 * arrays listed in `exact`; a row whose expected LSE is -inf must give exactly 0
 * in O and dQ; NaN never passes. `expect_error` cases must fail with a negative
 * status and leave every output untouched. Cases of level "recommended" are run
 * and required like the others. Messages name the sub-case, the variant and the
 * ISA. */
#include "ec_cases.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#if defined(__GNUC__)
#define EC_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define EC_PRINTF(f, a)
#endif

/* ------------------------------------------------------------ reporting -- */

typedef struct rep {
    ec_report_fn fn;
    void *ctx;
    int failed;
} rep;

static void vsay(rep *R, ec_event ev, const char *fmt, va_list ap)
{
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (ev == EC_FAIL)
        R->failed++;
    if (R->fn)
        R->fn(R->ctx, ev, msg);
}

/* One check: passed if ok. */
static EC_PRINTF(3, 4) int check(rep *R, int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(R, ok ? EC_PASS : EC_FAIL, fmt, ap);
    va_end(ap);
    return ok;
}

static EC_PRINTF(2, 3) void note(rep *R, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay(R, EC_INFO, fmt, ap);
    va_end(ap);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "ec_cases: out of memory (%zu bytes)\n", n);
        abort(); /* test code only */
    }
    return p;
}

/* ---------------------------------------------------------------- JSON -- */

struct ec_suite {
    cJSON *root;
};

ec_suite *ec_suite_load(const char *json_path, char *err, size_t errlen)
{
    size_t len = 0;
    char *text = util_read_file(json_path, &len);
    if (!text) {
        snprintf(err, errlen, "cannot read %s", json_path);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) {
        snprintf(err, errlen, "cannot parse %s", json_path);
        return NULL;
    }
    if (!cJSON_IsArray(root)) {
        snprintf(err, errlen, "%s: not a JSON array", json_path);
        cJSON_Delete(root);
        return NULL;
    }
    ec_suite *s = xmalloc(sizeof *s);
    s->root = root;
    return s;
}

void ec_suite_free(ec_suite *s)
{
    if (s) {
        cJSON_Delete(s->root);
        free(s);
    }
}

int ec_suite_size(const ec_suite *s)
{
    return cJSON_GetArraySize(s->root);
}

static const char *case_id(const cJSON *c)
{
    const cJSON *cid = cJSON_GetObjectItemCaseSensitive(c, "id");
    return cJSON_IsString(cid) ? cid->valuestring : "";
}

static const cJSON *find_case(const cJSON *root, const char *id)
{
    const cJSON *c;
    cJSON_ArrayForEach(c, root)
    {
        if (strcmp(case_id(c), id) == 0)
            return c;
    }
    return NULL;
}

/* Loading errors: the first one is kept (a malformed file fails the case). */
typedef struct loader {
    int bad;
    char msg[300];
} loader;

static EC_PRINTF(2, 3) void lfail(loader *L, const char *fmt, ...)
{
    if (L->bad)
        return;
    L->bad = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->msg, sizeof L->msg, fmt, ap);
    va_end(ap);
}

static double json_number(loader *L, const cJSON *x)
{
    if (cJSON_IsNumber(x))
        return x->valuedouble;
    if (cJSON_IsString(x)) {
        if (!strcmp(x->valuestring, "nan"))
            return NAN;
        if (!strcmp(x->valuestring, "inf"))
            return INFINITY;
        if (!strcmp(x->valuestring, "-inf"))
            return -INFINITY;
    }
    if (cJSON_IsBool(x))
        return cJSON_IsTrue(x) ? 1.0 : 0.0;
    lfail(L, "unexpected JSON value (type %d)", x ? x->type : -1);
    return 0.0;
}

/* Flattens nested lists into out[0..cap) in row-major order; returns the count. */
static size_t flatten_rec(loader *L, const cJSON *x, double *out, size_t cap, size_t n)
{
    if (cJSON_IsArray(x)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, x) n = flatten_rec(L, e, out, cap, n);
        return n;
    }
    if (n < cap && out)
        out[n] = json_number(L, x);
    return n + 1;
}

/* The array `name` of object `obj` as a malloc'd double array of exactly n
 * elements; NULL if absent or null, or (with L->bad set) malformed. */
static double *json_doubles(loader *L, const cJSON *obj, const char *name, size_t n)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!a || cJSON_IsNull(a))
        return NULL;
    double *out = xmalloc(sizeof(double) * n);
    const size_t got = flatten_rec(L, a, out, n, 0);
    if (got != n)
        lfail(L, "array %s has %zu numbers, expected %zu", name, got, n);
    if (L->bad) {
        free(out);
        return NULL;
    }
    return out;
}

/* Sizes of the leading dimensions of a nested list (up to 4). */
static void json_dims(const cJSON *a, int64_t dims[4])
{
    for (int d = 0; d < 4; d++) {
        dims[d] = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : 0;
        a = cJSON_IsArray(a) ? a->child : NULL;
    }
}

static int64_t json_int(loader *L, const cJSON *obj, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(x)) {
        lfail(L, "field %s missing", name);
        return 0;
    }
    return (int64_t)x->valuedouble;
}

static double json_real(loader *L, const cJSON *obj, const char *name)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsNumber(x)) {
        lfail(L, "field %s missing", name);
        return 0.0;
    }
    return x->valuedouble;
}

static int in_list(const cJSON *list, const char *name)
{
    const cJSON *x;
    cJSON_ArrayForEach(x, list) if (cJSON_IsString(x) && !strcmp(x->valuestring, name)) return 1;
    return 0;
}

/* ------------------------------------------------------------- a case -- */

typedef struct ec {
    char id[16];
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    sdpa_problem p;
    size_t nq, nk, nv, no, nl;
    float *q, *k, *v, *dout; /* contiguous logical tensors; dout NULL: forward only */
    uint8_t *mask;
    int64_t mask_dims[4];
    float *bias;
    int32_t kvlen[16];
    double *e_o, *e_lse, *e_dq, *e_dk, *e_dv;
    double atol, rtol, atol_g, rtol_g;
    int exact_o, exact_lse, exact_dq, exact_dk, exact_dv;
    int expect_error;
    int recommended;
} ec;

/* Inputs from the case's formula (float64, rounded once). Returns 1 if this
 * case has a formula implemented here. */
static int formula_inputs(const ec *e, float *q, float *k, float *v, float *dout)
{
    const int64_t B = e->B, Hq = e->Hq, Hkv = e->Hkv, Tq = e->Tq, Tk = e->Tk, Dk = e->Dk, Dv = e->Dv;
    const char *id = e->id;
#define QI(b, h, t, c) q[(((b)*Hq + (h)) * Tq + (t)) * Dk + (c)]
#define KI(b, h, t, c) k[(((b)*Hkv + (h)) * Tk + (t)) * Dk + (c)]
#define VI(b, h, t, c) v[(((b)*Hkv + (h)) * Tk + (t)) * Dv + (c)]
#define DI(b, h, t, c) dout[(((b)*Hq + (h)) * Tq + (t)) * Dv + (c)]
    if (!strcmp(id, "EC-02b") || !strcmp(id, "EC-02c")) {
        for (int64_t t = 0; t < Tq; t++)
            for (int64_t c = 0; c < Dk; c++) {
                QI(0, 0, t, c) = (float)sin(0.37 * t + 1.3 * c);
                KI(0, 0, t, c) = (float)cos(0.23 * t - 0.7 * c);
                VI(0, 0, t, c) = (float)sin(0.11 * t + 0.5 * c + 1);
                DI(0, 0, t, c) = 1.0f;
            }
        return 1;
    }
    if (!strncmp(id, "EC-05", 5) && id[5] >= 'd' && id[5] <= 'q') {
        for (int64_t i = 0; i < Tq; i++) {
            QI(0, 0, i, 0) = 120.0f;
            QI(0, 0, i, 1) = (float)(1 + 0.25 * (double)(i % 4));
            DI(0, 0, i, 0) = (float)(1 + 0.5 * (double)(i % 3));
            DI(0, 0, i, 1) = (float)(-1 + 0.25 * (double)(i % 5));
        }
        for (int64_t j = 0; j < Tk; j++) {
            KI(0, 0, j, 0) = -1.0f;
            KI(0, 0, j, 1) = (float)(-0.5 * (double)(j % 7));
            VI(0, 0, j, 0) = (float)((j % 5) - 2);
            VI(0, 0, j, 1) = 1.0f;
        }
        return 1;
    }
    if (!strncmp(id, "EC-08", 5)) {
        const int bcast = id[5] == 'b';
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t t = 0; t < Tq; t++)
                    for (int64_t c = 0; c < Dk; c++) {
                        const double x = (double)(b + 2 * h + 3 * t + 5 * c);
                        const double xk = bcast ? (double)(b + 3 * t + 5 * c) : x;
                        QI(b, h, t, c) = (float)sin(1 + x);
                        KI(b, h, t, c) = (float)cos(1 + xk);
                        VI(b, h, t, c) = (float)sin(2 + xk);
                        DI(b, h, t, c) = (float)cos(0.5 + (double)(b + h + t + c));
                    }
        return 1;
    }
    if (!strncmp(id, "EC-09", 5)) {
        for (size_t i = 0; i < e->nq; i++)
            q[i] = 1.0f;
        for (size_t i = 0; i < e->nk; i++)
            k[i] = 0.0f;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hkv; h++)
                for (int64_t j = 0; j < Tk; j++)
                    VI(b, h, j, 0) = (float)(100 * b + 10 * h + j);
        return 1;
    }
    if (!strncmp(id, "EC-12", 5)) {
        const int64_t D = Dk;
        memset(q, 0, e->nq * sizeof(float));
        memset(k, 0, e->nk * sizeof(float));
        memset(v, 0, e->nv * sizeof(float));
        for (size_t i = 0; i < e->no; i++)
            dout[i] = 1.0f;
        if (!strcmp(id, "EC-12b")) {
            for (int64_t c = 64; c < D; c++) {
                QI(0, 0, 0, c) = 0.25f;
                KI(0, 0, 0, c) = 0.25f;
                KI(0, 0, 1, c) = -0.25f;
            }
            for (int64_t c = 0; c < D; c++) {
                VI(0, 0, 0, c) = 1.0f;
                VI(0, 0, 1, c) = -1.0f;
            }
        } else { /* EC-12a (D = 9) and the sweep EC-12c..u: the signal in component D-1 */
            QI(0, 0, 0, D - 1) = 1.0f;
            for (int64_t j = 0; j < Tk; j++) {
                KI(0, 0, j, D - 1) = (float)j;
                if (D == 1) {
                    VI(0, 0, j, 0) = (float)(j + 1);
                } else {
                    VI(0, 0, j, 0) = 1.0f;
                    VI(0, 0, j, D - 1) = (float)(j + 1);
                }
            }
        }
        return 1;
    }
#undef QI
#undef KI
#undef VI
#undef DI
    return 0;
}

static void ec_free(ec *e)
{
    free(e->q);
    free(e->k);
    free(e->v);
    free(e->dout);
    free(e->mask);
    free(e->bias);
    free(e->e_o);
    free(e->e_lse);
    free(e->e_dq);
    free(e->e_dk);
    free(e->e_dv);
    memset(e, 0, sizeof *e);
}

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond))                                                                               \
            lfail(&L, __VA_ARGS__);                                                                \
        if (L.bad)                                                                                 \
            goto fail;                                                                             \
    } while (0)

/* Builds the problem, inputs, masks and expected values of case c. Returns 0,
 * or -1 (reported as a failed check) if the case is malformed. */
static int ec_load(const cJSON *root, const cJSON *c, ec *e, rep *R)
{
    loader L;
    memset(&L, 0, sizeof L);
    memset(e, 0, sizeof *e);
    snprintf(e->id, sizeof e->id, "%s", case_id(c));
    e->B = json_int(&L, c, "B");
    e->Hq = json_int(&L, c, "Hq");
    e->Hkv = json_int(&L, c, "Hkv");
    e->Tq = json_int(&L, c, "Tq");
    e->Tk = json_int(&L, c, "Tk");
    e->Dk = json_int(&L, c, "Dk");
    e->Dv = json_int(&L, c, "Dv");
    REQUIRE(e->B >= 0 && e->Hq >= 0 && e->Hkv >= 0 && e->Tq >= 0 && e->Tk >= 0 && e->Dk >= 0 &&
                e->Dv >= 0,
            "negative size");
    e->nq = (size_t)(e->B * e->Hq * e->Tq * e->Dk);
    e->nk = (size_t)(e->B * e->Hkv * e->Tk * e->Dk);
    e->nv = (size_t)(e->B * e->Hkv * e->Tk * e->Dv);
    e->no = (size_t)(e->B * e->Hq * e->Tq * e->Dv);
    e->nl = (size_t)(e->B * e->Hq * e->Tq);

    sdpa_problem *p = &e->p;
    *p = util_problem(e->B, e->Hq, e->Hkv, e->Tq, e->Tk, e->Dk, e->Dv);
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(c, "scale");
    if (cJSON_IsNumber(scale)) {
        p->use_default_scale = 0;
        p->scale = (float)scale->valuedouble;
    }
    const cJSON *causal = cJSON_GetObjectItemCaseSensitive(c, "causal");
    if (cJSON_IsString(causal)) {
        if (!strcmp(causal->valuestring, "top-left"))
            p->causal = SDPA_CAUSAL_TOP_LEFT;
        else if (!strcmp(causal->valuestring, "bottom-right"))
            p->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
        else
            REQUIRE(!strcmp(causal->valuestring, "none"), "unknown causal value %s", causal->valuestring);
    }
    const cJSON *wl = cJSON_GetObjectItemCaseSensitive(c, "window_left");
    const cJSON *wr = cJSON_GetObjectItemCaseSensitive(c, "window_right");
    if (cJSON_IsNumber(wl))
        p->window_left = (int64_t)wl->valuedouble;
    if (cJSON_IsNumber(wr))
        p->window_right = (int64_t)wr->valuedouble;
    const cJSON *kvl = cJSON_GetObjectItemCaseSensitive(c, "kv_len");
    if (cJSON_IsArray(kvl)) {
        REQUIRE(e->B <= 16 && cJSON_GetArraySize(kvl) == e->B, "kv_len");
        int b = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, kvl) e->kvlen[b++] = (int32_t)x->valuedouble;
        p->kv_lengths = e->kvlen;
    }

    /* inputs; dO is kept only if used (see below) */
    e->q = xmalloc(sizeof(float) * e->nq);
    e->k = xmalloc(sizeof(float) * e->nk);
    e->v = xmalloc(sizeof(float) * e->nv);
    e->dout = xmalloc(sizeof(float) * e->no);
    const int has_formula = formula_inputs(e, e->q, e->k, e->v, e->dout);
    const char *names[4] = {"q", "k", "v", "do"};
    float *dst[4] = {e->q, e->k, e->v, e->dout};
    const size_t counts[4] = {e->nq, e->nk, e->nv, e->no};
    int json_do = 0;
    for (int t = 0; t < 4; t++) {
        double *d = json_doubles(&L, c, names[t], counts[t]);
        REQUIRE(d || has_formula || t == 3, "no %s array and no formula implemented", names[t]);
        if (!d)
            continue;
        if (t == 3)
            json_do = 1;
        if (has_formula) { /* the formula must reproduce the listed fp32 values exactly */
            size_t diff = 0;
            for (size_t i = 0; i < counts[t]; i++)
                diff += memcmp(&(float){(float)d[i]}, &dst[t][i], sizeof(float)) != 0;
            check(R, diff == 0, "%s: formula and JSON array %s differ in %zu of %zu values", e->id,
                  names[t], diff, counts[t]);
        }
        for (size_t i = 0; i < counts[t]; i++)
            dst[t][i] = (float)d[i];
        free(d);
    }

    /* masks */
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(c, "mask");
    const cJSON *mf = cJSON_GetObjectItemCaseSensitive(c, "mask_formula");
    if (cJSON_IsArray(m)) {
        json_dims(m, e->mask_dims);
        const int64_t *md = e->mask_dims;
        REQUIRE((md[0] == 1 || md[0] == e->B) && (md[1] == 1 || md[1] == e->Hq) && md[2] == e->Tq &&
                    md[3] == e->Tk,
                "mask dims [%ld,%ld,%ld,%ld]", (long)md[0], (long)md[1], (long)md[2], (long)md[3]);
        const size_t n = (size_t)(md[0] * md[1] * md[2] * md[3]);
        double *d = json_doubles(&L, c, "mask", n);
        REQUIRE(d || n == 0, "mask");
        e->mask = xmalloc(n);
        for (size_t i = 0; i < n; i++)
            e->mask[i] = d[i] != 0.0;
        free(d);
        p->bool_mask = (sdpa_bool_mask){e->mask, md[0] == 1 ? 0 : md[1] * md[2] * md[3],
                                        md[1] == 1 ? 0 : md[2] * md[3], md[3], 1};
    } else if (cJSON_IsString(mf)) {
        /* EC-02c: keep iff i - 9 <= j <= i, as a dense [1,1,Tq,Tk] mask */
        REQUIRE(!strcmp(mf->valuestring, "keep iff i - 9 <= j <= i"), "unknown mask formula %s",
                mf->valuestring);
        e->mask = xmalloc((size_t)(e->Tq * e->Tk));
        for (int64_t i = 0; i < e->Tq; i++)
            for (int64_t j = 0; j < e->Tk; j++)
                e->mask[i * e->Tk + j] = i - 9 <= j && j <= i;
        e->mask_dims[0] = e->mask_dims[1] = 1;
        e->mask_dims[2] = e->Tq;
        e->mask_dims[3] = e->Tk;
        p->bool_mask = (sdpa_bool_mask){e->mask, 0, 0, e->Tk, 1};
    }
    const cJSON *bj = cJSON_GetObjectItemCaseSensitive(c, "bias");
    if (cJSON_IsArray(bj)) {
        int64_t bd[4];
        json_dims(bj, bd);
        REQUIRE((bd[0] == 1 || bd[0] == e->B) && (bd[1] == 1 || bd[1] == e->Hq) && bd[2] == e->Tq &&
                    bd[3] == e->Tk,
                "bias dims");
        const size_t n = (size_t)(bd[0] * bd[1] * bd[2] * bd[3]);
        double *d = json_doubles(&L, c, "bias", n);
        REQUIRE(d || n == 0, "bias");
        e->bias = xmalloc(sizeof(float) * n);
        for (size_t i = 0; i < n; i++)
            e->bias[i] = (float)d[i];
        free(d);
        p->bias = (sdpa_bias){e->bias, bd[0] == 1 ? 0 : bd[1] * bd[2] * bd[3],
                              bd[1] == 1 ? 0 : bd[2] * bd[3], bd[3], 1};
    }

    /* expectations */
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(c, "expect_error");
    e->expect_error = err && !cJSON_IsNull(err);
    const cJSON *lvl = cJSON_GetObjectItemCaseSensitive(c, "level");
    e->recommended = cJSON_IsString(lvl) && !strcmp(lvl->valuestring, "recommended");
    const cJSON *same = cJSON_GetObjectItemCaseSensitive(c, "expected_same_as");
    const cJSON *src = c;
    if (cJSON_IsString(same)) {
        src = find_case(root, same->valuestring);
        REQUIRE(src, "expected_same_as %s not found", same->valuestring);
    }
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(src, "expected");
    /* dO: the listed array, or the formula's when the expected values include
     * gradients (EC-02c: formula only, expected values of EC-02b) */
    if (!(json_do || (has_formula && cJSON_IsObject(ex) && cJSON_GetObjectItemCaseSensitive(ex, "dq")))) {
        free(e->dout);
        e->dout = NULL;
    }
    if (!e->expect_error) {
        REQUIRE(cJSON_IsObject(ex), "no expected values");
        e->e_o = json_doubles(&L, ex, "o", e->no);
        e->e_lse = json_doubles(&L, ex, "lse", e->nl);
        e->e_dq = json_doubles(&L, ex, "dq", e->nq);
        e->e_dk = json_doubles(&L, ex, "dk", e->nk);
        e->e_dv = json_doubles(&L, ex, "dv", e->nv);
        REQUIRE(e->e_o && e->e_lse, "expected o / lse missing");
        REQUIRE(!e->dout || (e->e_dq && e->e_dk && e->e_dv), "dO given but expected gradients missing");
    }
    e->atol = json_real(&L, c, "atol");
    e->rtol = json_real(&L, c, "rtol");
    e->atol_g = json_real(&L, c, "atol_grad");
    e->rtol_g = json_real(&L, c, "rtol_grad");
    if (L.bad)
        goto fail;
    const cJSON *exact = cJSON_GetObjectItemCaseSensitive(c, "exact");
    e->exact_o = in_list(exact, "o");
    e->exact_lse = in_list(exact, "lse");
    e->exact_dq = in_list(exact, "dq");
    e->exact_dk = in_list(exact, "dk");
    e->exact_dv = in_list(exact, "dv");
    return 0;
fail:
    check(R, 0, "%s: malformed case: %s", e->id[0] ? e->id : "(no id)", L.msg);
    ec_free(e);
    return -1;
}
#undef REQUIRE

/* ------------------------------------------------------------ running -- */

enum {
    LAY_CONTIG = 0,
    LAY_BTHD = 1,          /* Q, K, V, dO stored [B,T,H,D] (permuted views) */
    LAY_PACKED_GAPS = 2,   /* Q, K, V from one [B,T,3,H,D] buffer; dO every other batch of a
                              [2B,H,T,D] buffer; outputs with gaps between rows */
    LAY_BTHD_GAPS = 3      /* [B,T,H,D] inputs and outputs with gaps between rows */
};
static const char *const lay_names[] = {"contiguous", "[B,T,H,D] views",
                                        "packed QKV + strided dO + gapped outputs",
                                        "[B,T,H,D] views + gapped outputs"};

typedef struct ec_opts {
    int bq, bk;
    int layout;
    int kv_head_bcast; /* K, V stored once per batch entry, head stride 0 */
    int mask_q_bcast;  /* bool mask passed with query stride 0 (row 0 of each batch) */
    int threads;
} ec_opts;

/* 1 if both arrays hold the same n floats bit for bit (or are both absent). */
static int same_bits(const float *a, const float *b, size_t n)
{
    if (!a || !b)
        return a == b;
    return util_same_bits(a, b, n);
}

static int same_results(const ec *e, const util_outputs *a, const util_outputs *b)
{
    return same_bits(a->o, b->o, e->no) && same_bits(a->lse, b->lse, e->nl) &&
           same_bits(a->dq, b->dq, e->nq) && same_bits(a->dk, b->dk, e->nk) &&
           same_bits(a->dv, b->dv, e->nv);
}

static int all_sentinel(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!util_is_sentinel(p[i]))
            return 0;
    return 1;
}

/* Guard zones of the named buffers (NULL name ends the list); on damage the
 * first one is described in msg. */
static int guards_intact(char *msg, size_t len, const float *a, const char *an, const float *b,
                         const char *bn, const float *c, const char *cn)
{
    const float *bufs[3] = {a, b, c};
    const char *names[3] = {an, bn, cn};
    char m[160];
    for (int i = 0; i < 3 && names[i]; i++)
        if (!util_gcheck(bufs[i], m, sizeof m)) {
            snprintf(msg, len, ": %s: %s", names[i], m);
            return 0;
        }
    msg[0] = '\0';
    return 1;
}

static int gaps_intact(char *msg, size_t len, const util_layout *l, const float *buf, size_t n,
                       const char *what)
{
    char m[160];
    if (util_gaps_check(l, buf, n, m, sizeof m))
        return 1;
    snprintf(msg, len, ": %s: %s", what, m);
    return 0;
}

/* The elementwise rule on one array (see util_close_elem); the first failures
 * are listed in the message. */
static void expect_close(rep *R, const char *what, const float *got, const double *ref, size_t n,
                         double atol, double rtol, int exact)
{
    size_t bad = 0, dl = 0;
    char detail[640];
    detail[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!util_close_elem(got[i], ref[i], atol, rtol, exact)) {
            if (bad < 5 && dl < sizeof detail) {
                const int w = snprintf(detail + dl, sizeof detail - dl,
                                       "\n    [%zu]: got %.9g, expected %.17g", i, (double)got[i], ref[i]);
                dl += w > 0 ? (size_t)w : 0;
            }
            bad++;
        }
    check(R, bad == 0, "%s: %zu of %zu element(s) out of tolerance (%s, atol %g, rtol %g)%s", what, bad,
          n, exact ? "exact" : "tolerance", atol, rtol, detail);
}

/* Checks every expectation of the case on the contiguous results. */
static void check_results(const ec *e, const util_outputs *r, const char *tag, rep *R)
{
    char what[256];
    snprintf(what, sizeof what, "%s O", tag);
    expect_close(R, what, r->o, e->e_o, e->no, e->atol, e->rtol, e->exact_o);
    snprintf(what, sizeof what, "%s LSE", tag);
    expect_close(R, what, r->lse, e->e_lse, e->nl, e->atol, e->rtol, e->exact_lse);
    size_t zero_bad = 0;
    for (size_t row = 0; row < e->nl; row++)
        if (e->e_lse[row] == -INFINITY) {
            for (int64_t c = 0; c < e->Dv; c++)
                zero_bad += r->o[row * (size_t)e->Dv + (size_t)c] != 0.0f;
            if (r->dq)
                for (int64_t c = 0; c < e->Dk; c++)
                    zero_bad += r->dq[row * (size_t)e->Dk + (size_t)c] != 0.0f;
        }
    check(R, zero_bad == 0, "%s: %zu nonzero O/dQ element(s) in fully masked rows", tag, zero_bad);
    if (!r->dq)
        return;
    snprintf(what, sizeof what, "%s dQ", tag);
    expect_close(R, what, r->dq, e->e_dq, e->nq, e->atol_g, e->rtol_g, e->exact_dq);
    snprintf(what, sizeof what, "%s dK", tag);
    expect_close(R, what, r->dk, e->e_dk, e->nk, e->atol_g, e->rtol_g, e->exact_dk);
    snprintf(what, sizeof what, "%s dV", tag);
    expect_close(R, what, r->dv, e->e_dv, e->nv, e->atol_g, e->rtol_g, e->exact_dv);
}

/* Runs the case (forward, then backward when dO is given) on one ISA in one
 * layout; checks status, guard zones, gaps, and (check_exp != 0) the
 * expectations. Fills *res with contiguous copies of the outputs when res !=
 * NULL. Returns 1 if every call that had to succeed succeeded (then *res is
 * complete), else 0 (*res empty). */
static int ec_run(const ec *e, sdpa_isa isa, const ec_opts *opt, int check_exp, util_outputs *res, rep *R)
{
    const int64_t B = e->B, Hq = e->Hq, Tq = e->Tq, Tk = e->Tk, Dk = e->Dk, Dv = e->Dv;
    const int64_t Hkv = e->Hkv;
    char tag[200], gm[240], pm[240];
    snprintf(tag, sizeof tag, "%s [%s, %s%s%s, tiles %dx%d, threads %d]", e->id, sdpa_isa_name(isa),
             lay_names[opt->layout], opt->kv_head_bcast ? ", K/V head stride 0" : "",
             opt->mask_q_bcast ? ", mask [B,1,1,Tk]" : "", opt->bq, opt->bk, opt->threads);
    if (res)
        memset(res, 0, sizeof *res);

    sdpa_problem p = e->p;
    p.isa = isa;
    p.block_q = opt->bq;
    p.block_k = opt->bk;
    p.num_threads = opt->threads;
    if (opt->mask_q_bcast)
        p.bool_mask.query_stride = 0;

    const float *k = e->k, *v = e->v;

    /* input layouts */
    util_layout lq, lk, lv, ldo;
    float *qbuf = NULL, *kbuf = NULL, *vbuf = NULL, *dobuf = NULL;
    sdpa_tensor tq, tk, tv, tdo;
    const int bthd = opt->layout == LAY_BTHD || opt->layout == LAY_BTHD_GAPS;
    if (opt->layout == LAY_PACKED_GAPS) {
        if (!check(R, Tq == Tk && Hq == Hkv && Dk == Dv && !opt->kv_head_bcast,
                   "%s: packed QKV needs Tq = Tk, Hq = Hkv, Dk = Dv", tag))
            return 0;
        const int64_t H = Hq, T = Tq, D = Dk;
        lq = lk = lv = (util_layout){B, H, T, D, T * 3 * H * D, D, 3 * H * D};
        qbuf = util_galloc((size_t)(B * T * 3 * H * D));
        util_pack(&lq, qbuf, e->q);
        util_pack(&lq, qbuf + H * D, k);
        util_pack(&lq, qbuf + 2 * H * D, v);
        tq = util_view(&lq, qbuf);
        tk = util_view(&lq, qbuf + H * D);
        tv = util_view(&lq, qbuf + 2 * H * D);
        ldo = (util_layout){B, Hq, Tq, Dv, 2 * Hq * Tq * Dv, Tq * Dv, Dv};
    } else {
        lq = bthd ? util_bthd(B, Hq, Tq, Dk) : util_contig(B, Hq, Tq, Dk);
        qbuf = util_gpack(&lq, e->q);
        tq = util_view(&lq, qbuf);
        if (opt->kv_head_bcast) {
            /* K, V identical across heads: store head 0 once, head stride 0 */
            const util_layout k1l = util_contig(B, 1, Tk, Dk), v1l = util_contig(B, 1, Tk, Dv);
            float *kh = xmalloc(sizeof(float) * (size_t)(B * Tk * Dk + 1));
            float *vh = xmalloc(sizeof(float) * (size_t)(B * Tk * Dv + 1));
            for (int64_t b = 0; b < B; b++) {
                memcpy(kh + b * Tk * Dk, k + b * Hkv * Tk * Dk, sizeof(float) * (size_t)(Tk * Dk));
                memcpy(vh + b * Tk * Dv, v + b * Hkv * Tk * Dv, sizeof(float) * (size_t)(Tk * Dv));
            }
            kbuf = util_gpack(&k1l, kh);
            vbuf = util_gpack(&v1l, vh);
            free(kh);
            free(vh);
            lk = util_contig(B, Hkv, Tk, Dk);
            lv = util_contig(B, Hkv, Tk, Dv);
            lk.sh = lv.sh = 0;
            lk.sb = Tk * Dk;
            lv.sb = Tk * Dv;
        } else {
            lk = bthd ? util_bthd(B, Hkv, Tk, Dk) : util_contig(B, Hkv, Tk, Dk);
            lv = bthd ? util_bthd(B, Hkv, Tk, Dv) : util_contig(B, Hkv, Tk, Dv);
            kbuf = util_gpack(&lk, k);
            vbuf = util_gpack(&lv, v);
        }
        tk = util_view(&lk, kbuf);
        tv = util_view(&lv, vbuf);
        ldo = bthd ? util_bthd(B, Hq, Tq, Dv) : util_contig(B, Hq, Tq, Dv);
    }
    if (e->dout) {
        dobuf = util_galloc(util_extent(&ldo));
        util_pack(&ldo, dobuf, e->dout);
        tdo = util_view(&ldo, dobuf);
    }

    /* output layouts (gaps pre-filled with the sentinel NaN pattern) */
    const int gaps = opt->layout == LAY_PACKED_GAPS || opt->layout == LAY_BTHD_GAPS;
    util_layout lo, ll, ldq, ldk, ldv;
    if (opt->layout == LAY_BTHD_GAPS) {
        lo = util_bthd(B, Hq, Tq, Dv);
        ldq = util_bthd(B, Hq, Tq, Dk);
        ldk = util_bthd(B, Hkv, Tk, Dk);
        ldv = util_bthd(B, Hkv, Tk, Dv);
        /* widen the token stride to leave a gap after every token's heads */
        lo.st += 3;
        lo.sb = Tq * lo.st;
        ldq.st += 1;
        ldq.sb = Tq * ldq.st;
        ldk.st += 2;
        ldk.sb = Tk * ldk.st;
        ldv.st += 5;
        ldv.sb = Tk * ldv.st;
    } else if (gaps) {
        lo = util_padded(B, Hq, Tq, Dv, Dv + 3);
        ldq = util_padded(B, Hq, Tq, Dk, Dk + 1);
        ldk = util_padded(B, Hkv, Tk, Dk, Dk + 2);
        ldv = util_padded(B, Hkv, Tk, Dv, Dv + 5);
    } else {
        lo = util_contig(B, Hq, Tq, Dv);
        ldq = util_contig(B, Hq, Tq, Dk);
        ldk = util_contig(B, Hkv, Tk, Dk);
        ldv = util_contig(B, Hkv, Tk, Dv);
    }
    ll = gaps ? (util_layout){B, Hq, Tq, 1, Hq * Tq * 2, Tq * 2, 2} : util_lse_layout(B, Hq, Tq);
    const size_t no_buf = util_extent(&lo), nl_buf = util_extent(&ll);
    float *obuf = util_galloc(no_buf), *lbuf = util_galloc(nl_buf);
    const sdpa_tensor_out to = util_view_out(&lo, obuf), tl = util_view_out(&ll, lbuf);
    int complete = 0;

    if (e->expect_error) {
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        check(R, (int)st < 0, "%s: forward must fail, returned %s", tag, sdpa_status_string(st));
        const int fw_clean = all_sentinel(obuf, no_buf) && all_sentinel(lbuf, nl_buf) &&
                             guards_intact(gm, sizeof gm, obuf, "O", lbuf, "LSE", NULL, NULL);
        check(R, fw_clean, "%s: a failing forward wrote to its outputs", tag);
        /* the backward with the same descriptor must fail the same way */
        const size_t nq_l = (size_t)(B * Hq * Tq * Dk), nk_l = (size_t)(B * Hkv * Tk * Dk),
                     nv_l = (size_t)(B * Hkv * Tk * Dv);
        float *zo = util_galloc_fill(no_buf, 0.0f), *zl = util_galloc_fill(nl_buf, 0.0f);
        float *zdo = util_galloc_fill(no_buf, 1.0f);
        float *dq = util_galloc(nq_l), *dk = util_galloc(nk_l), *dv = util_galloc(nv_l);
        const sdpa_tensor so = util_view(&lo, zo), sl = util_view(&ll, zl), sdo = util_view(&lo, zdo);
        const util_layout cq = util_contig(B, Hq, Tq, Dk), ck = util_contig(B, Hkv, Tk, Dk),
                          cv = util_contig(B, Hkv, Tk, Dv);
        const sdpa_tensor_out tdq = util_view_out(&cq, dq), tdk = util_view_out(&ck, dk),
                              tdv = util_view_out(&cv, dv);
        const sdpa_status sb = sdpa_backward(&p, &tq, &tk, &tv, &so, &sl, &sdo, &tdq, &tdk, &tdv);
        check(R, (int)sb < 0, "%s: backward must fail, returned %s", tag, sdpa_status_string(sb));
        const int bw_clean = all_sentinel(dq, nq_l) && all_sentinel(dk, nk_l) && all_sentinel(dv, nv_l) &&
                             guards_intact(gm, sizeof gm, dq, "dQ", dk, "dK", dv, "dV");
        check(R, bw_clean, "%s: a failing backward wrote to its outputs", tag);
        util_gfree(zo);
        util_gfree(zl);
        util_gfree(zdo);
        util_gfree(dq);
        util_gfree(dk);
        util_gfree(dv);
        complete = 1;
    } else {
        util_outputs r;
        memset(&r, 0, sizeof r);
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        if (!check(R, st == SDPA_OK, "%s: forward returned %s", tag, sdpa_status_string(st)))
            goto done;
        check(R, guards_intact(gm, sizeof gm, obuf, "O", lbuf, "LSE", NULL, NULL),
              "%s: forward guard zone%s", tag, gm);
        pm[0] = '\0';
        check(R, gaps_intact(pm, sizeof pm, &lo, obuf, no_buf, "O gaps") &&
                     gaps_intact(pm, sizeof pm, &ll, lbuf, nl_buf, "LSE gaps"),
              "%s: forward wrote into the gaps between rows%s", tag, pm);
        r.o = xmalloc(sizeof(float) * (e->no + 1));
        r.lse = xmalloc(sizeof(float) * (e->nl + 1));
        util_unpack(&lo, r.o, obuf);
        util_unpack(&ll, r.lse, lbuf);
        if (e->dout) {
            const size_t nq_b = util_extent(&ldq), nk_b = util_extent(&ldk), nv_b = util_extent(&ldv);
            float *dq = util_galloc(nq_b), *dk = util_galloc(nk_b), *dv = util_galloc(nv_b);
            const sdpa_tensor so = util_view(&lo, obuf), sl = util_view(&ll, lbuf);
            const sdpa_tensor_out tdq = util_view_out(&ldq, dq), tdk = util_view_out(&ldk, dk),
                                  tdv = util_view_out(&ldv, dv);
            const sdpa_status sb = sdpa_backward(&p, &tq, &tk, &tv, &so, &sl, &tdo, &tdq, &tdk, &tdv);
            const int bw_ok =
                check(R, sb == SDPA_OK, "%s: backward returned %s", tag, sdpa_status_string(sb));
            if (bw_ok) {
                check(R, guards_intact(gm, sizeof gm, dq, "dQ", dk, "dK", dv, "dV"),
                      "%s: backward guard zone%s", tag, gm);
                pm[0] = '\0';
                check(R, gaps_intact(pm, sizeof pm, &ldq, dq, nq_b, "dQ gaps") &&
                             gaps_intact(pm, sizeof pm, &ldk, dk, nk_b, "dK gaps") &&
                             gaps_intact(pm, sizeof pm, &ldv, dv, nv_b, "dV gaps"),
                      "%s: backward wrote into the gaps between rows%s", tag, pm);
                r.dq = xmalloc(sizeof(float) * (util_numel(&ldq) + 1));
                r.dk = xmalloc(sizeof(float) * (util_numel(&ldk) + 1));
                r.dv = xmalloc(sizeof(float) * (util_numel(&ldv) + 1));
                util_unpack(&ldq, r.dq, dq);
                util_unpack(&ldk, r.dk, dk);
                util_unpack(&ldv, r.dv, dv);
            }
            util_gfree(dq);
            util_gfree(dk);
            util_gfree(dv);
            if (!bw_ok) {
                util_outputs_free(&r);
                goto done;
            }
        }
        if (check_exp)
            check_results(e, &r, tag, R);
        complete = 1;
        if (res)
            *res = r;
        else
            util_outputs_free(&r);
    }
done:
    util_gfree(obuf);
    util_gfree(lbuf);
    util_gfree(qbuf);
    util_gfree(kbuf);
    util_gfree(vbuf);
    util_gfree(dobuf);
    return complete;
}

/* ------------------------------------------------------------- groups -- */

static const ec_opts contig_default = {0, 0, LAY_CONTIG, 0, 0, 0};

static int has_prefix(const char *id, const char *prefix)
{
    return strncmp(id, prefix, strlen(prefix)) == 0;
}

/* Loads case `id` (a failed check if it is missing or malformed). */
static int load_id(const ec_suite *s, const char *id, ec *e, rep *R)
{
    const cJSON *c = find_case(s->root, id);
    if (!check(R, c != NULL, "%s: case missing from edge_cases.json", id))
        return -1;
    return ec_load(s->root, c, e, R);
}

/* How a group runs one of its sub-cases (the default: contiguous, default tiles). */
typedef void (*case_fn)(const ec_suite *s, ec *e, sdpa_isa isa, rep *R);

static void run_default(const ec_suite *s, ec *e, sdpa_isa isa, rep *R)
{
    ec_run(e, isa, &contig_default, 1, NULL, R);
}

/* Runs every sub-case whose id starts with `prefix` with fn on one ISA and checks
 * how many there are. */
static void run_prefix(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, case_fn fn, rep *R)
{
    int ran = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, s->root)
    {
        if (!has_prefix(case_id(c), prefix))
            continue;
        ec e;
        if (ec_load(s->root, c, &e, R) != 0)
            continue;
        if (e.recommended)
            note(R, "%s: level 'recommended' (run and required here)", e.id);
        fn(s, &e, isa, R);
        ec_free(&e);
        ran++;
    }
    check(R, ran == expected, "%s: %d sub-case(s) run on %s, %d expected", prefix, ran, sdpa_isa_name(isa),
          expected);
}

static void group_plain(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    run_prefix(s, prefix, expected, isa, run_default, R);
}

/* EC-02: EC-02a with every tile size pair from {1, 2, 4, 8, 16, 64} (and the
 * default); EC-02b and EC-02c (formula, 600 tokens) with the default tiles and a
 * few small ones; then the summary values of the document, as an independent
 * check of EC-02b. */
static void ec02_case(const ec_suite *s, ec *e, sdpa_isa isa, rep *R)
{
    if (!strcmp(e->id, "EC-02a")) {
        static const int blocks[] = {0, 1, 2, 4, 8, 16, 64};
        const int nb = (int)(sizeof blocks / sizeof blocks[0]);
        for (int a = 0; a < nb; a++)
            for (int b = 0; b < nb; b++) {
                if ((blocks[a] == 0) != (blocks[b] == 0))
                    continue;
                const ec_opts opt = {blocks[a], blocks[b], LAY_CONTIG, 0, 0, 0};
                ec_run(e, isa, &opt, 1, NULL, R);
            }
        return;
    }
    static const int big_blocks[][2] = {{0, 0}, {8, 8}, {16, 64}, {64, 16}, {3, 5}};
    for (int bi = 0; bi < 5; bi++) {
        const ec_opts opt = {big_blocks[bi][0], big_blocks[bi][1], LAY_CONTIG, 0, 0, 0};
        ec_run(e, isa, &opt, 1, NULL, R);
    }
}

static void group_ec02(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    run_prefix(s, prefix, expected, isa, ec02_case, R);
    ec e;
    if (load_id(s, "EC-02b", &e, R) != 0)
        return;
    util_outputs r;
    if (ec_run(&e, isa, &contig_default, 0, &r, R) &&
        check(R, r.dk && r.dv, "EC-02b [%s]: backward results missing", sdpa_isa_name(isa))) {
        double sum_o = 0, sum_dv = 0, sum_dk = 0;
        for (size_t i = 0; i < e.no; i++)
            sum_o += r.o[i];
        for (size_t i = 0; i < e.nv; i++)
            sum_dv += r.dv[i];
        for (size_t i = 0; i < e.nk; i++)
            sum_dk += r.dk[i];
        check(R, fabs(sum_o - (-44.4844631)) < 1e-3, "[%s] EC-02b sum(O) = %.7f", sdpa_isa_name(isa), sum_o);
        check(R, fabs(sum_dv - 4800.0) < 1e-2, "[%s] EC-02b sum(dV) = %.5f", sdpa_isa_name(isa), sum_dv);
        check(R, fabs(sum_dk) < 1e-3, "[%s] EC-02b sum(dK) = %.7f", sdpa_isa_name(isa), sum_dk);
    }
    util_outputs_free(&r);
    ec_free(&e);
}

/* EC-05: default tiles, then a few small and odd tile sizes on the tail sweep. */
static void group_ec05(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    run_prefix(s, prefix, expected, isa, run_default, R);
    const char *ids[] = {"EC-05a", "EC-05b", "EC-05g", "EC-05i", "EC-05m", "EC-05o"};
    static const int tiles[][2] = {{4, 4}, {8, 8}, {7, 3}, {16, 128}};
    for (size_t t = 0; t < sizeof ids / sizeof ids[0]; t++) {
        ec e;
        if (load_id(s, ids[t], &e, R) != 0)
            continue;
        for (int bi = 0; bi < 4; bi++) {
            const ec_opts opt = {tiles[bi][0], tiles[bi][1], LAY_CONTIG, 0, 0, 0};
            ec_run(&e, isa, &opt, 1, NULL, R);
        }
        ec_free(&e);
    }
}

/* EC-08b as Hkv = 1: same O, dK and dV = sum over the two heads. */
static void ec08b_one_kv_head(const ec *e, sdpa_isa isa, rep *R)
{
    if (!check(R, e->Hkv == 2 && e->dout, "%s: expected Hkv = 2 and a backward", e->id))
        return;
    ec e1 = *e;
    e1.Hkv = 1;
    e1.p.kv_heads = 1;
    e1.nk = e->nk / 2;
    e1.nv = e->nv / 2;
    double *dk1 = xmalloc(sizeof(double) * e1.nk), *dv1 = xmalloc(sizeof(double) * e1.nv);
    float *k1 = xmalloc(sizeof(float) * e1.nk), *v1 = xmalloc(sizeof(float) * e1.nv);
    const int64_t Tk = e->Tk, Dk = e->Dk, Dv = e->Dv;
    for (int64_t b = 0; b < e->B; b++) { /* kv head 0 of each batch entry */
        memcpy(k1 + b * Tk * Dk, e->k + b * 2 * Tk * Dk, sizeof(float) * (size_t)(Tk * Dk));
        memcpy(v1 + b * Tk * Dv, e->v + b * 2 * Tk * Dv, sizeof(float) * (size_t)(Tk * Dv));
    }
    e1.k = k1;
    e1.v = v1;
    for (int64_t b = 0; b < e->B; b++) {
        for (int64_t x = 0; x < Tk * Dk; x++)
            dk1[b * Tk * Dk + x] = e->e_dk[(b * 2 + 0) * Tk * Dk + x] + e->e_dk[(b * 2 + 1) * Tk * Dk + x];
        for (int64_t x = 0; x < Tk * Dv; x++)
            dv1[b * Tk * Dv + x] = e->e_dv[(b * 2 + 0) * Tk * Dv + x] + e->e_dv[(b * 2 + 1) * Tk * Dv + x];
    }
    e1.e_dk = dk1;
    e1.e_dv = dv1;
    snprintf(e1.id, sizeof e1.id, "EC-08b/Hkv=1");
    ec_run(&e1, isa, &contig_default, 1, NULL, R);
    const ec_opts opt2 = {0, 0, LAY_BTHD_GAPS, 0, 0, 0};
    ec_run(&e1, isa, &opt2, 1, NULL, R);
    free(dk1);
    free(dv1);
    free(k1);
    free(v1);
}

/* EC-08: every layout of the document: [B,T,H,D] views, packed QKV, dO taken as
 * every other batch entry of a [2B,H,T,D] buffer, outputs with gaps (the gaps
 * hold a NaN pattern that must stay), K/V head stride 0 (EC-08b, also as Hkv =
 * 1), the mask passed once with batch and head strides 0 (EC-08c). Each layout
 * is compared with the expected values and with the contiguous call. */
static void ec08_case(const ec_suite *s, ec *e, sdpa_isa isa, rep *R)
{
    const int is_b = !strcmp(e->id, "EC-08b");
    util_outputs r0;
    const int ok0 = ec_run(e, isa, &contig_default, 1, &r0, R);
    for (int lay = LAY_BTHD; lay <= LAY_BTHD_GAPS; lay++)
        for (int bc = 0; bc <= is_b; bc++) {
            if (bc && lay == LAY_PACKED_GAPS)
                continue; /* a packed buffer holds every head */
            const ec_opts opt = {0, 0, lay, bc, 0, 0};
            util_outputs r;
            if (ec_run(e, isa, &opt, 1, &r, R) && ok0 && !same_results(e, &r, &r0))
                note(R, "%s [%s, %s%s]: not bitwise equal to the contiguous call (within tolerance)", e->id,
                     sdpa_isa_name(isa), lay_names[lay], bc ? ", K/V head stride 0" : "");
            util_outputs_free(&r);
        }
    util_outputs_free(&r0);
    if (is_b)
        ec08b_one_kv_head(e, isa, R);
}

static void group_ec08(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    run_prefix(s, prefix, expected, isa, ec08_case, R);
}

/* EC-09: default, then EC-09c with the padding mask broadcast over Tq too
 * ([B,1,1,Tk]). */
static void group_ec09(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    run_prefix(s, prefix, expected, isa, run_default, R);
    ec e;
    if (load_id(s, "EC-09c", &e, R) != 0)
        return;
    int rows_same = e.mask != NULL && e.mask_dims[1] == 1;
    for (int64_t b = 0; rows_same && b < e.B; b++) /* the rows of each batch entry are identical */
        for (int64_t i = 1; i < e.Tq; i++)
            rows_same &= !memcmp(e.mask + (b * e.Tq + i) * e.Tk, e.mask + b * e.Tq * e.Tk, (size_t)e.Tk);
    if (check(R, rows_same, "EC-09c: mask rows of each batch entry identical (mask [B,1,Tq,Tk])")) {
        const ec_opts opt = {0, 0, LAY_CONTIG, 0, 1, 0};
        ec_run(&e, isa, &opt, 1, NULL, R);
    }
    ec_free(&e);
}

/* Thread counts: one mid-size case must give the same bits with 1, 2 and 3 threads. */
static void group_threads(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    ec e;
    if (load_id(s, "EC-05p", &e, R) != 0)
        return;
    util_outputs r[3];
    int ok[3];
    for (int t = 0; t < 3; t++) {
        const ec_opts opt = {0, 0, LAY_CONTIG, 0, 0, t + 1};
        ok[t] = ec_run(&e, isa, &opt, t == 0, &r[t], R);
    }
    for (int t = 1; t < 3; t++)
        if (ok[0] && ok[t])
            check(R, same_results(&e, &r[t], &r[0]), "[%s] EC-05p: %d threads give the same bits as 1 thread",
                  sdpa_isa_name(isa), t + 1);
    for (int t = 0; t < 3; t++)
        util_outputs_free(&r[t]);
    ec_free(&e);
}

/* Every case of the file belongs to one of the groups EC-01 .. EC-13. */
static void group_coverage(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R)
{
    int n = 0, known = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, s->root)
    {
        const char *id = case_id(c);
        n++;
        int g = 0;
        if (sscanf(id, "EC-%d", &g) == 1 && g >= 1 && g <= 13)
            known++;
        else
            check(R, 0, "edge case '%s' belongs to no group", id);
    }
    check(R, n == expected, "edge_cases.json holds %d cases, %d expected", n, expected);
    check(R, known == n, "%d of %d cases belong to a group EC-01 .. EC-13", known, n);
}

typedef void (*group_fn)(const ec_suite *s, const char *prefix, int expected, sdpa_isa isa, rep *R);

static const struct {
    const char *name;
    int expected; /* sub-cases (coverage: cases in the file) */
    group_fn fn;
} groups[] = {
    {"EC-01", 4, group_plain},  {"EC-02", 3, group_ec02},  {"EC-03", 4, group_plain},
    {"EC-04", 6, group_plain},  {"EC-05", 17, group_ec05}, {"EC-06", 10, group_plain},
    {"EC-07", 3, group_plain},  {"EC-08", 3, group_ec08},  {"EC-09", 4, group_ec09},
    {"EC-10", 7, group_plain},  {"EC-11", 2, group_plain}, {"EC-12", 21, group_plain},
    {"EC-13", 1, group_plain},  {"threads", 0, group_threads}, {"coverage", 85, group_coverage},
};
#define NGROUPS ((int)(sizeof groups / sizeof groups[0]))

int ec_group_count(void)
{
    return NGROUPS;
}

const char *ec_group_name(int g)
{
    return g >= 0 && g < NGROUPS ? groups[g].name : NULL;
}

int ec_group_index(const char *name)
{
    for (int g = 0; g < NGROUPS; g++)
        if (!strcmp(groups[g].name, name))
            return g;
    return -1;
}

int ec_run_group(const ec_suite *s, int g, sdpa_isa isa, ec_report_fn report, void *ctx)
{
    rep R = {report, ctx, 0};
    if (!check(&R, g >= 0 && g < NGROUPS, "edge-case group %d does not exist", g))
        return R.failed;
    groups[g].fn(s, groups[g].name, groups[g].expected, isa, &R);
    return R.failed;
}

int ec_run_all(const char *json_path, sdpa_isa isa, ec_report_fn report, void *ctx)
{
    char err[1200];
    ec_suite *s = ec_suite_load(json_path, err, sizeof err);
    if (!s) {
        rep R = {report, ctx, 0};
        check(&R, 0, "%s", err);
        return R.failed;
    }
    int failed = 0;
    for (int g = 0; g < NGROUPS; g++)
        failed += ec_run_group(s, g, isa, report, ctx);
    ec_suite_free(s);
    return failed;
}
