/* SPDX-License-Identifier: MIT */
/* tests/test_onnx.c - the ONNX `Attention` backend node tests (tests/data/onnx/,
 * Apache-2.0, see its README.md) run through libsdpa's forward pass.
 *
 * Each case folder holds case.json and one .npy per input/output. A case the
 * API can express is mapped onto one sdpa_problem:
 *   - 3-D inputs (B, T, H*D) become strided views (head stride D, seq stride
 *     H*D), the 3-D output Y likewise;
 *   - past_key / past_value are concatenated in front of K / V along T (host
 *     side; the concatenation must equal present_key / present_value);
 *   - attn_mask: bool -> boolean mask, float (fp32 or fp16) -> additive bias,
 *     broadcast NumPy-style (right-aligned) to [B, Hq, Tq, Tk] with stride-0
 *     dimensions; a mask shorter than the total key length is padded with
 *     False / -inf (the ONNX reference does the same);
 *   - nonpad_kv_seqlen -> kv_lengths, and the causal / window offset
 *     nonpad_kv_seqlen[b] - Tq is bottom-right alignment on that length;
 *   - a past of length P puts the diagonal at offset P: bottom-right when
 *     P + Tq = Tk; when P + Tq > Tk, K/V get masked padding keys up to P + Tq;
 *     when P + Tq < Tk with causal masking, kv_lengths = P + Tq (the keys cut
 *     off are causally masked anyway);
 *   - left/right_window_size (opset 25, measured from the same offset, applied
 *     even without is_causal) -> window_left / window_right.
 *   - softcap -> sdpa_problem.softcap (ONNX applies it before the mask, as the
 *     library does: a -inf mask entry still masks).
 * Not expressible (the test is skipped with the reason, never passed): none of
 * the 87 today (inexpressible() keeps the rules for cases added later).
 * qk_matmul_output (any qk_matmul_output_mode) is an extra output the API does
 * not produce: those cases check Y only.
 * fp16 cases: the inputs are exact in fp32; the fp16 golden Y is compared with a
 * tolerance of a few fp16 rounding steps (the golden's own arithmetic is fp16).
 *
 * Tolerances: fp32 goldens max(1e-5, 1e-5*|Y|) elementwise, for the library and
 * for the float64 reference (which checks this file's mapping); and the
 * FlashAttention rule (2x the naive fp32 error) against the float64 reference. */
#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

#define ONNX_CASES 87
#define MAX_CASES 128

typedef struct onnx_param {
    char name[120];
} onnx_param;

static int cmp_names(const void *a, const void *b)
{
    return strcmp(((const onnx_param *)a)->name, ((const onnx_param *)b)->name);
}

/* Case folder names, sorted. Runs in Criterion's parent: plain file system work. */
static size_t list_cases(onnx_param *out, size_t cap)
{
    char dir[1024];
    util_data_path(dir, sizeof dir, "onnx");
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL && n < cap) {
        if (strncmp(ent->d_name, "test_attention", 14) != 0)
            continue;
        snprintf(out[n].name, sizeof out[n].name, "%.119s", ent->d_name);
        n++;
    }
    closedir(d);
    qsort(out, n, sizeof *out, cmp_names);
    return n;
}

/* ------------------------------------------------------------ a case -- */

typedef struct oc {
    char name[120];
    cJSON *json;
    int layout3d, fp16;
    int64_t B, Hq, Hkv, Tq, Tnew, Tpast, Ttot, Dk, Dv;
    int causal, scale_default;
    double scale, softcap;
    int qkm;
    int64_t wl, wr; /* -1 unbounded */
    util_npy Q, K, V, mask, pk, pv, nonpad, Y, prk, prv;
    int has_mask, has_past, has_nonpad, has_prk, has_prv, has_qk_out;
} oc;

static void oc_free(oc *c)
{
    util_npy *a[] = {&c->Q, &c->K, &c->V, &c->mask, &c->pk, &c->pv, &c->nonpad, &c->Y, &c->prk, &c->prv};
    for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
        util_npy_free(a[i]);
    cJSON_Delete(c->json);
}

static const cJSON *obj(const cJSON *o, const char *k)
{
    return cJSON_GetObjectItemCaseSensitive(o, k);
}

static int64_t num(const cJSON *o, const char *k, int64_t dflt)
{
    const cJSON *x = obj(o, k);
    return cJSON_IsNumber(x) ? (int64_t)x->valuedouble : dflt;
}

/* Loads the .npy of slot `slot` (from the case's input/output lists); 0 if absent. */
static int load_slot(const oc *c, const char *list, const char *slot, util_npy *out)
{
    const cJSON *l = obj(c->json, list), *x;
    cJSON_ArrayForEach(x, l)
    {
        const cJSON *s = obj(x, "slot");
        if (!cJSON_IsString(s) || strcmp(s->valuestring, slot) != 0)
            continue;
        char rel[512], path[1024], err[512];
        snprintf(rel, sizeof rel, "onnx/%s/%s", c->name, obj(x, "npy")->valuestring);
        util_data_path(path, sizeof path, rel);
        cr_assert_eq(util_npy_load(path, out, err, sizeof err), 0, "%s", err);
        return 1;
    }
    return 0;
}

static void oc_load(oc *c, const char *name)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    char rel[512], path[1024];
    snprintf(rel, sizeof rel, "onnx/%s/case.json", name);
    util_data_path(path, sizeof path, rel);
    size_t len = 0;
    char *text = util_read_file(path, &len);
    cr_assert_not_null(text, "cannot read %s", path);
    c->json = cJSON_ParseWithLength(text, len);
    free(text);
    cr_assert_not_null(c->json, "cannot parse %s", path);
    const cJSON *dims = obj(c->json, "dims"), *attr = obj(c->json, "attributes_effective");
    cr_assert(cJSON_IsObject(dims) && cJSON_IsObject(attr), "%s: case.json lacks dims/attributes", name);
    c->layout3d = !strcmp(obj(dims, "layout")->valuestring, "3-D");
    c->B = num(dims, "B", 0);
    c->Hq = num(dims, "q_heads", 0);
    c->Hkv = num(dims, "kv_heads", 0);
    c->Tq = num(dims, "T_q", 0);
    c->Tnew = num(dims, "T_kv_new", 0);
    c->Tpast = num(dims, "T_past", 0);
    c->Ttot = num(dims, "T_kv_total", 0);
    c->Dk = num(dims, "d_k", 0);
    c->Dv = num(dims, "d_v", 0);
    c->causal = num(attr, "is_causal", 0) != 0;
    c->scale = obj(attr, "scale")->valuedouble;
    c->scale_default = cJSON_IsTrue(obj(attr, "scale_is_default"));
    c->softcap = cJSON_IsNumber(obj(attr, "softcap")) ? obj(attr, "softcap")->valuedouble : 0.0;
    c->qkm = (int)num(attr, "qk_matmul_output_mode", 0);
    c->wl = num(attr, "left_window_size", -1);
    c->wr = num(attr, "right_window_size", -1);
    cr_assert(load_slot(c, "inputs", "Q", &c->Q) && load_slot(c, "inputs", "K", &c->K) &&
                  load_slot(c, "inputs", "V", &c->V),
              "%s: Q, K, V missing", name);
    cr_assert(load_slot(c, "outputs", "Y", &c->Y), "%s: Y missing", name);
    c->has_mask = load_slot(c, "inputs", "attn_mask", &c->mask);
    c->has_past = load_slot(c, "inputs", "past_key", &c->pk);
    if (c->has_past)
        cr_assert(load_slot(c, "inputs", "past_value", &c->pv), "%s: past_value missing", name);
    c->has_nonpad = load_slot(c, "inputs", "nonpad_kv_seqlen", &c->nonpad);
    c->has_prk = load_slot(c, "outputs", "present_key", &c->prk);
    c->has_prv = load_slot(c, "outputs", "present_value", &c->prv);
    const cJSON *x;
    cJSON_ArrayForEach(x, obj(c->json, "outputs"))
    {
        const cJSON *s = obj(x, "slot");
        c->has_qk_out |= cJSON_IsString(s) && !strcmp(s->valuestring, "qk_matmul_output");
    }
    c->fp16 = c->Q.type == UTIL_NPY_F16;
    cr_assert(c->Ttot == c->Tpast + c->Tnew, "%s: T_kv_total", name);
}

/* Why the case cannot be expressed, or NULL. */
static const char *inexpressible(const oc *c)
{
    if (c->softcap < 0.0 || (float)c->softcap != c->softcap)
        return "softcap negative or not an fp32 value";
    if (c->has_nonpad && c->has_past)
        return "nonpad_kv_seqlen together with past_key (two cache conventions at once)";
    const int offset_used = c->causal || c->wl >= 0 || c->wr >= 0;
    if (offset_used && c->has_past && c->Tpast + c->Tq < c->Ttot && !c->causal && c->wr != 0)
        return "diagonal offset past_len with keys right of the window end (no causal, T_q < T_kv_new)";
    if (c->has_mask) {
        if (c->mask.ndim > 4)
            return "attn_mask of rank > 4";
        const int64_t target[4] = {c->B, c->Hq, c->Tq, c->Ttot};
        for (int d = 0; d < c->mask.ndim; d++) {
            const int64_t s = c->mask.shape[c->mask.ndim - 1 - d], t = target[3 - d];
            if (d == 0 ? s > t : (s != 1 && s != t))
                return "attn_mask not broadcastable to [B, Hq, T_q, T_total]";
        }
    }
    return NULL;
}

/* ------------------------------------------------------------ mapping -- */

typedef struct mapped {
    sdpa_problem p;
    int64_t Tk; /* keys passed to the library (T_total plus masked padding) */
    float *q, *k, *v;         /* logical contiguous [B,H,T,D] */
    float *q_raw, *k_raw, *v_raw; /* the inputs in their file layout (3-D: strided views) */
    sdpa_tensor tq, tk, tv;
    util_layout lo;           /* layout of Y / O as stored in the file */
    uint8_t *bmask;
    float *bias;
    int32_t kvlen[64];
    double *y;                /* golden Y in file layout */
    size_t ny;
} mapped;

static float *npy_floats(const util_npy *a)
{
    float *f = malloc(sizeof(float) * (a->count ? a->count : 1));
    cr_assert_not_null(f);
    for (size_t i = 0; i < a->count; i++)
        f[i] = (float)util_npy_get(a, i);
    return f;
}

/* The first c->Ttot of the Tk rows of each of the BH heads of x (rows of D)
 * equal the golden present tensor `pr`; `msg` names a difference. */
static void expect_present(const oc *c, const util_npy *pr_npy, const float *x, int64_t BH, int64_t Tk, int64_t D,
                           const char *msg)
{
    float *pr = npy_floats(pr_npy);
    size_t diff = 0;
    for (int64_t bh = 0; bh < BH; bh++)
        diff += memcmp(pr + bh * c->Ttot * D, x + bh * Tk * D, sizeof(float) * (size_t)(c->Ttot * D)) != 0;
    cr_expect_eq(diff, 0, "%s: %s", c->name, msg);
    free(pr);
}

static void map_case(const oc *c, mapped *m)
{
    memset(m, 0, sizeof *m);
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, Tq = c->Tq, Dk = c->Dk, Dv = c->Dv;
    const int offset_used = c->causal || c->wl >= 0 || c->wr >= 0;

    /* key count and alignment */
    int64_t Tk = c->Ttot;
    int bottom_right = 0, kvlen_cut = 0;
    if (offset_used && c->has_nonpad) {
        bottom_right = 1; /* offset nonpad[b] - Tq on kv_lengths[b] */
    } else if (offset_used && c->has_past && c->Tpast > 0) {
        const int64_t want = c->Tpast + Tq;
        bottom_right = 1;
        if (want > Tk)
            Tk = want; /* masked padding keys */
        else if (want < Tk)
            kvlen_cut = 1; /* causal masks the keys past want anyway */
    }
    m->Tk = Tk;

    sdpa_problem *p = &m->p;
    *p = util_problem(B, Hq, Hkv, Tq, Tk, Dk, Dv);
    if (!c->scale_default) {
        p->use_default_scale = 0;
        p->scale = (float)c->scale;
    }
    p->softcap = (float)c->softcap; /* 0: off */
    if (c->causal)
        p->causal = bottom_right ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_TOP_LEFT;
    else
        p->window_alignment = bottom_right ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
    p->window_left = c->wl >= 0 ? c->wl : SDPA_WINDOW_UNBOUNDED;
    p->window_right = c->wr >= 0 ? c->wr : SDPA_WINDOW_UNBOUNDED;
    cr_assert(B <= 64);
    if (c->has_nonpad) {
        cr_assert_eq((int64_t)c->nonpad.count, B);
        for (int64_t b = 0; b < B; b++)
            m->kvlen[b] = (int32_t)util_npy_get(&c->nonpad, (size_t)b);
        p->kv_lengths = m->kvlen;
    } else if (kvlen_cut) {
        for (int64_t b = 0; b < B; b++)
            m->kvlen[b] = (int32_t)(c->Tpast + Tq);
        p->kv_lengths = m->kvlen;
    }

    /* Q: file layout and logical copy */
    m->q_raw = npy_floats(&c->Q);
    const util_layout lq = c->layout3d ? util_bthd(B, Hq, Tq, Dk) : util_contig(B, Hq, Tq, Dk);
    m->q = malloc(sizeof(float) * (size_t)(B * Hq * Tq * Dk + 1));
    util_unpack(&lq, m->q, m->q_raw);
    m->tq = util_view(&lq, m->q_raw);

    /* K, V: past ++ new ++ zero padding, logical [B, Hkv, Tk, D] */
    m->k_raw = npy_floats(&c->K);
    m->v_raw = npy_floats(&c->V);
    const util_layout lkn = c->layout3d ? util_bthd(B, Hkv, c->Tnew, Dk) : util_contig(B, Hkv, c->Tnew, Dk);
    const util_layout lvn = c->layout3d ? util_bthd(B, Hkv, c->Tnew, Dv) : util_contig(B, Hkv, c->Tnew, Dv);
    float *kn = malloc(sizeof(float) * (size_t)(B * Hkv * c->Tnew * Dk + 1));
    float *vn = malloc(sizeof(float) * (size_t)(B * Hkv * c->Tnew * Dv + 1));
    util_unpack(&lkn, kn, m->k_raw);
    util_unpack(&lvn, vn, m->v_raw);
    float *pk = c->has_past ? npy_floats(&c->pk) : NULL, *pv = c->has_past ? npy_floats(&c->pv) : NULL;
    m->k = calloc((size_t)(B * Hkv * Tk * Dk + 1), sizeof(float));
    m->v = calloc((size_t)(B * Hkv * Tk * Dv + 1), sizeof(float));
    for (int64_t bh = 0; bh < B * Hkv; bh++) {
        if (c->has_past) {
            memcpy(m->k + bh * Tk * Dk, pk + bh * c->Tpast * Dk, sizeof(float) * (size_t)(c->Tpast * Dk));
            memcpy(m->v + bh * Tk * Dv, pv + bh * c->Tpast * Dv, sizeof(float) * (size_t)(c->Tpast * Dv));
        }
        memcpy(m->k + (bh * Tk + c->Tpast) * Dk, kn + bh * c->Tnew * Dk, sizeof(float) * (size_t)(c->Tnew * Dk));
        memcpy(m->v + (bh * Tk + c->Tpast) * Dv, vn + bh * c->Tnew * Dv, sizeof(float) * (size_t)(c->Tnew * Dv));
    }
    /* the concatenation is what ONNX calls present_key / present_value */
    if (c->has_prk)
        expect_present(c, &c->prk, m->k, B * Hkv, Tk, Dk, "past_key ++ K differs from present_key");
    if (c->has_prv)
        expect_present(c, &c->prv, m->v, B * Hkv, Tk, Dv, "past_value ++ V differs from present_value");
    if (c->layout3d && !c->has_past && Tk == c->Ttot) {
        /* pass the 3-D tensors as strided views, no copy */
        m->tk = util_view(&lkn, m->k_raw);
        m->tv = util_view(&lvn, m->v_raw);
    } else {
        m->tk = util_cview(m->k, Hkv, Tk, Dk);
        m->tv = util_cview(m->v, Hkv, Tk, Dv);
    }
    free(kn);
    free(vn);
    free(pk);
    free(pv);

    /* attn_mask: right-aligned broadcast to [B, Hq, Tq, Tk], last dim padded */
    int64_t md[4] = {1, 1, 1, 1};
    if (c->has_mask)
        for (int d = 0; d < c->mask.ndim; d++)
            md[4 - c->mask.ndim + d] = c->mask.shape[d];
    const int64_t mw = md[3]; /* the mask's own key width (<= T_total) */
    const size_t nm = (size_t)(md[0] * md[1] * md[2] * Tk);
    const int bool_mask = c->has_mask && c->mask.type == UTIL_NPY_BOOL;
    const int float_mask = c->has_mask && !bool_mask;
    if (bool_mask || (!c->has_mask && Tk > c->Ttot)) {
        m->bmask = calloc(nm ? nm : 1, 1);
        for (int64_t r = 0; r < md[0] * md[1] * md[2]; r++)
            for (int64_t j = 0; j < Tk; j++)
                m->bmask[r * Tk + j] = bool_mask ? (j < mw && util_npy_get(&c->mask, (size_t)(r * mw + j)) != 0.0)
                                                 : j < c->Ttot;
        p->bool_mask = (sdpa_bool_mask){m->bmask, md[0] == 1 ? 0 : md[1] * md[2] * Tk,
                                        md[1] == 1 ? 0 : md[2] * Tk, md[2] == 1 ? 0 : Tk, 1};
    }
    if (float_mask) {
        m->bias = malloc(sizeof(float) * (nm ? nm : 1));
        for (int64_t r = 0; r < md[0] * md[1] * md[2]; r++)
            for (int64_t j = 0; j < Tk; j++)
                m->bias[r * Tk + j] = j < mw ? (float)util_npy_get(&c->mask, (size_t)(r * mw + j)) : -INFINITY;
        p->bias = (sdpa_bias){m->bias, md[0] == 1 ? 0 : md[1] * md[2] * Tk, md[1] == 1 ? 0 : md[2] * Tk,
                              md[2] == 1 ? 0 : Tk, 1};
    }

    /* golden Y in its file layout */
    m->lo = c->layout3d ? util_bthd(B, Hq, Tq, Dv) : util_contig(B, Hq, Tq, Dv);
    m->ny = c->Y.count;
    cr_assert_eq(m->ny, (size_t)(B * Hq * Tq * Dv), "%s: Y has %zu elements", c->name, m->ny);
    m->y = malloc(sizeof(double) * (m->ny + 1));
    for (size_t i = 0; i < m->ny; i++)
        m->y[i] = util_npy_get(&c->Y, i);
}

static void unmap(mapped *m)
{
    free(m->q);
    free(m->k);
    free(m->v);
    free(m->q_raw);
    free(m->k_raw);
    free(m->v_raw);
    free(m->bmask);
    free(m->bias);
    free(m->y);
}

/* Elementwise |got - Y| <= max(atol, rtol*|Y|); fp16 goldens: a few fp16 steps. */
static size_t compare_golden(const oc *c, const char *what, const float *got, const double *y, size_t n)
{
    const double atol = c->fp16 ? 1e-3 : 1e-5, rtol = c->fp16 ? 0x1p-9 : 1e-5;
    return util_expect_close(what, got, y, n, atol, rtol, 0);
}

/* ------------------------------------------------------------- the test -- */

static onnx_param onnx_params[MAX_CASES];

ParameterizedTestParameters(onnx, node)
{
    const size_t n = list_cases(onnx_params, MAX_CASES);
    return cr_make_param_array(onnx_param, onnx_params, n);
}

ParameterizedTest(onnx_param *prm, onnx, node)
{
    oc c;
    oc_load(&c, prm->name);
    const char *why = inexpressible(&c);
    if (why) {
        cr_log_info("%s: not expressible: %s", c.name, why);
        oc_free(&c);
        cr_skip_test("%s: not expressible: %s", prm->name, why);
    }
    mapped m;
    map_case(&c, &m);
    const int64_t B = c.B, Hq = c.Hq, Tq = c.Tq, Dv = c.Dv;
    const size_t no = (size_t)(B * Hq * Tq * Dv), nl = (size_t)(B * Hq * Tq);
    if (c.has_qk_out)
        cr_log_info("%s: Y only (qk_matmul_output, mode %d, is an extra output the API does not "
                    "produce)",
                    c.name, c.qkm);
    if (c.fp16)
        cr_log_info("%s: fp16 inputs (exact in fp32), fp16 golden: tolerance max(1e-3, 2^-9 |Y|)", c.name);

    /* float64 reference on the mapped problem: checks the mapping itself */
    double *ref = malloc(sizeof(double) * (no + 1)), *ref_lse = malloc(sizeof(double) * (nl + 1));
    float *nv = malloc(sizeof(float) * (no + 1)), *nv_lse = malloc(sizeof(float) * (nl + 1));
    ref_forward(&m.p, m.q, m.k, m.v, ref, ref_lse);
    naive32_forward(&m.p, m.q, m.k, m.v, nv, nv_lse);
    float *y_logical = malloc(sizeof(float) * (no + 1)), *ref_f = malloc(sizeof(float) * (no + 1));
    {
        float *yf = malloc(sizeof(float) * (no + 1));
        for (size_t i = 0; i < no; i++)
            yf[i] = (float)m.y[i];
        util_unpack(&m.lo, y_logical, yf);
        free(yf);
    }
    double *y_log_d = malloc(sizeof(double) * (no + 1));
    for (size_t i = 0; i < no; i++) {
        y_log_d[i] = y_logical[i];
        ref_f[i] = (float)ref[i];
    }
    char what[256];
    snprintf(what, sizeof what, "%s: float64 reference vs golden Y (mapping)", c.name);
    compare_golden(&c, what, ref_f, y_log_d, no);

    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        sdpa_problem p = m.p;
        p.isa = isas[ii];
        float *obuf = util_galloc(util_extent(&m.lo)), *lbuf = util_galloc(nl);
        const sdpa_tensor_out to = util_view_out(&m.lo, obuf), tl = util_lse_view_out(lbuf, Hq, Tq);
        const sdpa_status st = sdpa_forward(&p, &m.tq, &m.tk, &m.tv, &to, &tl);
        cr_assert_eq(st, SDPA_OK, "%s [%s]: sdpa_forward returned %s", c.name, sdpa_isa_name(isas[ii]),
                     sdpa_status_string(st));
        cr_expect(util_gintact(obuf, "Y") && util_gintact(lbuf, "LSE"), "%s [%s]: guard zone", c.name,
                  sdpa_isa_name(isas[ii]));
        snprintf(what, sizeof what, "%s [%s]: Y", c.name, sdpa_isa_name(isas[ii]));
        compare_golden(&c, what, obuf, m.y, no); /* same layout as the file */
        float *o = malloc(sizeof(float) * (no + 1));
        util_unpack(&m.lo, o, obuf);
        snprintf(what, sizeof what, "%s [%s]: O vs float64 (FlashAttention rule)", c.name,
                 sdpa_isa_name(isas[ii]));
        util_fa_expect(what, o, nv, ref, no, 2.0);
        snprintf(what, sizeof what, "%s [%s]: LSE vs float64", c.name, sdpa_isa_name(isas[ii]));
        util_fa_expect(what, lbuf, nv_lse, ref_lse, nl, 2.0);
        free(o);
        util_gfree(obuf);
        util_gfree(lbuf);
    }
    free(ref);
    free(ref_lse);
    free(nv);
    free(nv_lse);
    free(y_logical);
    free(y_log_d);
    free(ref_f);
    unmap(&m);
    oc_free(&c);
}

/* Lists every case as expressed or not expressible (with the reason), and
 * checks that all 87 cases are present. */
Test(onnx, coverage)
{
    static onnx_param names[MAX_CASES];
    const size_t n = list_cases(names, MAX_CASES);
    cr_expect_eq(n, ONNX_CASES, "tests/data/onnx holds %zu cases, expected %d", n, ONNX_CASES);
    int expressed = 0, skipped = 0, fp16 = 0, y_only = 0;
    for (size_t i = 0; i < n; i++) {
        oc c;
        oc_load(&c, names[i].name);
        const char *why = inexpressible(&c);
        if (why) {
            skipped++;
            cr_log_info("not expressible: %s (%s)", c.name, why);
        } else {
            expressed++;
            fp16 += c.fp16;
            y_only += c.has_qk_out;
        }
        oc_free(&c);
    }
    cr_log_info("ONNX cases: %d expressed (%d with fp16 goldens, %d without their qk_matmul_output), "
                "%d not expressible",
                expressed, fp16, y_only, skipped);
    cr_expect_eq(expressed + skipped, (int)n);
    cr_expect_eq(skipped, 0, "%d of %zu ONNX cases are not expressible", skipped, n);
}
