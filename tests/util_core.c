/* SPDX-License-Identifier: MIT */
/* tests/util_core.c - the Criterion-free part of the test helpers (see util.h): guarded
 * buffers, layouts and views, the elementwise edge-case rule, the data directory. Linked
 * into the Criterion suite and into the plain-C programs (tests/conformance.c). */
#include "util.h"
#include "ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SDPA_TEST_DATA_DIR
#define SDPA_TEST_DATA_DIR "tests/data"
#endif

/* ------------------------------------------------------ guarded buffers -- */

#define GUARD_MAGIC 0x53445041475244ull /* "SDPAGRD" */
#define HEADER_BYTES 64

typedef struct guard_header {
    uint64_t magic;
    size_t n;
} guard_header;

float util_sentinel(void)
{
    const uint32_t bits = UTIL_SENTINEL_BITS;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int util_is_sentinel(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits == UTIL_SENTINEL_BITS;
}

static guard_header *header_of(const float *p)
{
    return (guard_header *)(void *)((char *)(uintptr_t)p - UTIL_GUARD_FLOATS * sizeof(float) -
                                    HEADER_BYTES);
}

float *util_galloc_fill(size_t n, float value)
{
    const size_t bytes = HEADER_BYTES + (2 * (size_t)UTIL_GUARD_FLOATS + n) * sizeof(float);
    char *base = malloc(bytes);
    if (!base)
    {
        fprintf(stderr, "util_galloc: out of memory (%zu floats)\n", n);
        abort(); /* test code only: the library itself never aborts */
    }
    guard_header *h = (guard_header *)(void *)base;
    h->magic = GUARD_MAGIC;
    h->n = n;
    float *front = (float *)(void *)(base + HEADER_BYTES);
    float *data = front + UTIL_GUARD_FLOATS;
    const float s = util_sentinel();
    for (size_t i = 0; i < UTIL_GUARD_FLOATS; i++) {
        front[i] = s;
        data[n + i] = s;
    }
    for (size_t i = 0; i < n; i++)
        data[i] = value;
    return data;
}

float *util_galloc(size_t n)
{
    return util_galloc_fill(n, util_sentinel());
}

size_t util_glen(const float *p)
{
    return p ? header_of(p)->n : 0;
}

int util_gcheck(const float *p, char *msg, size_t len)
{
    if (!p)
        return 1;
    const guard_header *h = header_of(p);
    if (h->magic != GUARD_MAGIC) {
        snprintf(msg, len, "guard header damaged (buffer underrun far before the data?)");
        return 0;
    }
    for (size_t i = 1; i <= UTIL_GUARD_FLOATS; i++)
        if (!util_is_sentinel(p[-(ptrdiff_t)i])) {
            snprintf(msg, len, "front guard zone written at offset -%zu", i);
            return 0;
        }
    for (size_t i = 0; i < UTIL_GUARD_FLOATS; i++)
        if (!util_is_sentinel(p[h->n + i])) {
            snprintf(msg, len, "back guard zone written at offset n+%zu (n = %zu)", i, h->n);
            return 0;
        }
    return 1;
}

void util_gfree(float *p)
{
    if (p)
        free(header_of(p));
}

float *util_gdup(const float *src, size_t n)
{
    float *p = util_galloc(n);
    if (n)
        memcpy(p, src, n * sizeof(float));
    return p;
}

/* ------------------------------------------------------------- layouts -- */

util_layout util_contig(int64_t B, int64_t H, int64_t T, int64_t D)
{
    util_layout l = {B, H, T, D, H * T * D, T * D, D};
    return l;
}

util_layout util_bthd(int64_t B, int64_t H, int64_t T, int64_t D)
{
    util_layout l = {B, H, T, D, T * H * D, D, H * D};
    return l;
}

util_layout util_padded(int64_t B, int64_t H, int64_t T, int64_t D, int64_t row_stride)
{
    util_layout l = {B, H, T, D, H * T * row_stride, T * row_stride, row_stride};
    return l;
}

util_layout util_lse_layout(int64_t B, int64_t H, int64_t T)
{
    util_layout l = {B, H, T, 1, H * T, T, 1};
    return l;
}

size_t util_numel(const util_layout *l)
{
    return (size_t)(l->B * l->H * l->T * l->D);
}

size_t util_extent(const util_layout *l)
{
    if (util_numel(l) == 0)
        return 0;
    return (size_t)((l->B - 1) * l->sb + (l->H - 1) * l->sh + (l->T - 1) * l->st + l->D);
}

int64_t util_offset(const util_layout *l, int64_t b, int64_t h, int64_t t, int64_t d)
{
    return b * l->sb + h * l->sh + t * l->st + d;
}

/* Every element of the view l in order b, h, t, d: pack != 0 stores the
 * contiguous src into dst at the view's offsets, pack == 0 gathers them back. */
static void copy_view(const util_layout *l, float *dst, const float *src, int pack)
{
    size_t i = 0;
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t h = 0; h < l->H; h++)
            for (int64_t t = 0; t < l->T; t++)
                for (int64_t d = 0; d < l->D; d++, i++) {
                    const int64_t off = util_offset(l, b, h, t, d);
                    if (pack)
                        dst[off] = src[i];
                    else
                        dst[i] = src[off];
                }
}

void util_pack(const util_layout *l, float *dst, const float *src)
{
    copy_view(l, dst, src, 1);
}

float *util_gpack(const util_layout *l, const float *src)
{
    float *g = util_galloc(util_extent(l));
    util_pack(l, g, src);
    return g;
}

void util_unpack(const util_layout *l, float *dst, const float *src)
{
    copy_view(l, dst, src, 0);
}

int util_gaps_check(const util_layout *l, const float *buf, size_t n, char *msg, size_t len)
{
    unsigned char *in_view = calloc(n ? n : 1, 1);
    if (!in_view) {
        snprintf(msg, len, "out of memory");
        return 0;
    }
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t h = 0; h < l->H; h++)
            for (int64_t t = 0; t < l->T; t++)
                for (int64_t d = 0; d < l->D; d++) {
                    const int64_t o = util_offset(l, b, h, t, d);
                    if (o >= 0 && (size_t)o < n)
                        in_view[o] = 1;
                }
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        if (!in_view[i] && !util_is_sentinel(buf[i])) {
            snprintf(msg, len, "gap element at offset %zu was written (%g)", i, (double)buf[i]);
            ok = 0;
            break;
        }
    free(in_view);
    return ok;
}

sdpa_tensor util_view(const util_layout *l, const float *data)
{
    sdpa_tensor t = {data, l->sb, l->sh, l->st};
    return t;
}

sdpa_tensor_out util_view_out(const util_layout *l, float *data)
{
    sdpa_tensor_out t = {data, l->sb, l->sh, l->st};
    return t;
}

sdpa_tensor util_cview(const float *data, int64_t H, int64_t T, int64_t D)
{
    sdpa_tensor t = {data, H * T * D, T * D, D};
    return t;
}

sdpa_tensor_out util_cview_out(float *data, int64_t H, int64_t T, int64_t D)
{
    sdpa_tensor_out t = {data, H * T * D, T * D, D};
    return t;
}

sdpa_tensor util_lse_view(const float *data, int64_t H, int64_t T)
{
    sdpa_tensor t = {data, H * T, T, 1};
    return t;
}

sdpa_tensor_out util_lse_view_out(float *data, int64_t H, int64_t T)
{
    sdpa_tensor_out t = {data, H * T, T, 1};
    return t;
}

sdpa_problem util_problem(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dk,
                          int64_t Dv)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B;
    p.q_heads = Hq;
    p.kv_heads = Hkv;
    p.q_len = Tq;
    p.kv_len = Tk;
    p.head_dim_qk = Dk;
    p.head_dim_v = Dv;
    return p;
}

/* ---------------------------------------------------------- tolerances -- */

int util_close(double got, double ref, double atol, double rtol)
{
    if (isnan(ref))
        return isnan(got);
    if (isnan(got))
        return 0;
    if (isinf(ref) || isinf(got))
        return got == ref;
    const double tol = fmax(atol, rtol * fabs(ref));
    return fabs(got - ref) <= tol;
}

int util_close_elem(float got, double ref, double atol, double rtol, int exact)
{
    if (!exact)
        return util_close((double)got, ref, atol, rtol);
    const float rf = (float)ref;
    int ok = (isnan(rf) && isnan(got)) || got == rf; /* == accepts 0 == -0 */
    if (ok && got == 0.0f && rf != 0.0f)
        ok = 0;
    return ok;
}

/* ------------------------------------------------------------ data dir -- */

const char *util_data_path(char *buf, size_t len, const char *rel)
{
    snprintf(buf, len, "%s/%s", SDPA_TEST_DATA_DIR, rel);
    return buf;
}

char *util_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    const long sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    char *buf = malloc((size_t)sz + 1);
    if (!buf) {
        fclose(f);
        return NULL;
    }
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[sz] = '\0';
    if (len)
        *len = (size_t)sz;
    return buf;
}

/* ------------------------------------------------------ small helpers -- */

double util_max_abs_finite(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

void util_outputs_free(util_outputs *r)
{
    free(r->o);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    memset(r, 0, sizeof *r);
}

int util_same_bits(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

int util_close_tol(float got, double ref, double tol)
{
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return (double)got == ref;
    return isfinite(got) && fabs((double)got - ref) <= tol;
}

tbuf tb_alloc(int64_t B, int64_t H, int64_t T, int64_t D, int64_t pad, float gap)
{
    tbuf t = {B, H, T, D, pad, NULL, 0};
    t.n = (size_t)(B * H * T * (D + pad));
    t.data = util_galloc_fill(t.n, gap);
    return t;
}

float *tb_at(const tbuf *t, int64_t b, int64_t h, int64_t i)
{
    return t->data + ((b * t->H + h) * t->T + i) * (t->D + t->pad);
}

sdpa_tensor tb_in(const tbuf *t)
{
    const int64_t st = t->D + t->pad;
    sdpa_tensor v = {t->data, t->H * t->T * st, t->T * st, st};
    return v;
}

sdpa_tensor_out tb_out(const tbuf *t)
{
    const int64_t st = t->D + t->pad;
    sdpa_tensor_out v = {t->data, t->H * t->T * st, t->T * st, st};
    return v;
}

tbuf lse_alloc(int64_t B, int64_t H, int64_t T, int64_t pad, float gap)
{
    return tb_alloc(B, H, T, 1, pad, gap);
}

int tb_gaps_are(const tbuf *t, float gap)
{
    for (int64_t b = 0; b < t->B; b++)
        for (int64_t h = 0; h < t->H; h++)
            for (int64_t i = 0; i < t->T; i++)
                for (int64_t c = 0; c < t->pad; c++)
                    if (memcmp(tb_at(t, b, h, i) + t->D + c, &gap, sizeof gap) != 0)
                        return 0;
    return 1;
}

void tb_free(tbuf *t)
{
    util_gfree(t->data);
    t->data = NULL;
}

int util_rounds_p(sdpa_isa isa, sdpa_dtype q, sdpa_dtype kv, int64_t Dk, int64_t Dv)
{
    return (q == SDPA_DTYPE_BF16 || q == SDPA_DTYPE_F32) && kv == SDPA_DTYPE_BF16 && Dk % 2 == 0 && Dk > 0 &&
           Dv > 0 && sdpa_isa_bf16_pairs(isa);
}

/* The nt_max_cols sdpa_tuning() reports for isa (-1 if it lists none). */
static long tuned_nt_max_cols(sdpa_isa isa)
{
    char key[32];
    snprintf(key, sizeof key, "; %s block_q ", sdpa_isa_name(isa));
    const char *e = strstr(sdpa_tuning(), key);
    const char *n = e ? strstr(e, " nt_max_cols ") : NULL;
    return n ? strtol(n + 13, NULL, 10) : -1;
}

int util_rounds_bwd(sdpa_isa isa, const sdpa_dtype ty[3], int64_t Dk, int64_t Dv, int64_t Tq, int64_t G)
{
    if (!(ty[0] == SDPA_DTYPE_BF16 && ty[1] == SDPA_DTYPE_BF16 && ty[2] == SDPA_DTYPE_BF16 && Dk > 0 &&
          Dk % 2 == 0 && Dv > 0 && Dv % 2 == 0 && sdpa_isa_bf16_pairs_backward(isa)))
        return 0;
    const long nt = tuned_nt_max_cols(isa);
    return nt >= 0 && Tq * G > nt; /* wider tiles than the decode path's (block_q >= 2 nt_max_cols) */
}

int util_rounds_q(sdpa_isa isa, sdpa_dtype q, sdpa_dtype kv, int64_t Dk, int64_t Dv, int64_t Tq, int64_t G)
{
    if (q != SDPA_DTYPE_F32 || !util_rounds_p(isa, q, kv, Dk, Dv))
        return 0;
    const long nt = tuned_nt_max_cols(isa);
    return nt >= 0 && G > 0 && Tq > nt / G;
}

float *util_pairs_q(const float *q, size_t n, sdpa_dtype qt)
{
    float *c = malloc((n ? n : 1) * sizeof *c);
    if (!c)
        return NULL;
    for (size_t i = 0; i < n; i++)
        c[i] = qt == SDPA_DTYPE_F32 ? ref_round_bf16(q[i]) : q[i];
    return c;
}
