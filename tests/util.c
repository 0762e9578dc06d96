/* SPDX-License-Identifier: MIT */
/* tests/util.c - shared helpers of the Criterion suite (see util.h). */
#include "util.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SDPA_TEST_DATA_DIR
#define SDPA_TEST_DATA_DIR "tests/data"
#endif

/* ------------------------------------------------------------------ RNG -- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t util_seed(const char *who, uint64_t fallback)
{
    uint64_t seed = fallback;
    const char *env = getenv("SDPA_TEST_SEED");
    if (env && *env) {
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(env, &end, 0);
        if (errno == 0 && end && *end == '\0')
            seed = (uint64_t)v;
    }
    cr_log_info("%s: seed = %" PRIu64 " (set SDPA_TEST_SEED=%" PRIu64 " to reproduce)",
                who ? who : "test", seed, seed);
    return seed;
}

void util_rng_init(util_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

void util_rng_seed(util_rng *r, const char *who, uint64_t fallback)
{
    util_rng_init(r, util_seed(who, fallback));
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t util_rng_u64(util_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double util_rng_double(util_rng *r)
{
    return (double)(util_rng_u64(r) >> 11) * 0x1.0p-53;
}

int64_t util_rng_int(util_rng *r, int64_t lo, int64_t hi)
{
    if (hi <= lo)
        return lo;
    const uint64_t span = (uint64_t)(hi - lo) + 1;
    return lo + (int64_t)(util_rng_u64(r) % span);
}

double util_rng_normal(util_rng *r)
{
    double u1 = util_rng_double(r);
    const double u2 = util_rng_double(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

void util_fill_uniform(util_rng *r, float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)lo + ((double)hi - (double)lo) * util_rng_double(r));
}

void util_fill_normal(util_rng *r, float *x, size_t n, float sigma)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)sigma * util_rng_normal(r));
}

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
        cr_assert_fail("util_galloc: out of memory (%zu floats)", n);
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

int util_gintact(const float *p, const char *what)
{
    if (!p)
        return 1;
    const guard_header *h = header_of(p);
    if (h->magic != GUARD_MAGIC) {
        cr_log_error("%s: guard header damaged (buffer underrun far before the data?)", what);
        return 0;
    }
    for (size_t i = 1; i <= UTIL_GUARD_FLOATS; i++)
        if (!util_is_sentinel(p[-(ptrdiff_t)i])) {
            cr_log_error("%s: front guard zone written at offset -%zu", what, i);
            return 0;
        }
    for (size_t i = 0; i < UTIL_GUARD_FLOATS; i++)
        if (!util_is_sentinel(p[h->n + i])) {
            cr_log_error("%s: back guard zone written at offset n+%zu (n = %zu)", what, i, h->n);
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

void util_pack(const util_layout *l, float *dst, const float *src)
{
    size_t i = 0;
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t h = 0; h < l->H; h++)
            for (int64_t t = 0; t < l->T; t++)
                for (int64_t d = 0; d < l->D; d++)
                    dst[util_offset(l, b, h, t, d)] = src[i++];
}

void util_unpack(const util_layout *l, float *dst, const float *src)
{
    size_t i = 0;
    for (int64_t b = 0; b < l->B; b++)
        for (int64_t h = 0; h < l->H; h++)
            for (int64_t t = 0; t < l->T; t++)
                for (int64_t d = 0; d < l->D; d++)
                    dst[i++] = src[util_offset(l, b, h, t, d)];
}

int util_gaps_intact(const util_layout *l, const float *buf, size_t n, const char *what)
{
    unsigned char *in_view = calloc(n ? n : 1, 1);
    cr_assert_not_null(in_view);
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
            cr_log_error("%s: gap element at offset %zu was written (%g)", what, i, (double)buf[i]);
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

/* --------------------------------------------------------------- ISAs -- */

int util_isas(sdpa_isa out[SDPA_ISA_COUNT])
{
    static int logged = 0;
    static const sdpa_isa all[SDPA_ISA_COUNT] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512,
                                                 SDPA_ISA_NEON};
    int n = 0;
    for (int i = 0; i < SDPA_ISA_COUNT; i++) {
        if (sdpa_isa_supported(all[i]))
            out[n++] = all[i];
        else if (!logged)
            cr_log_info("ISA %s not tested here: %s", sdpa_isa_name(all[i]),
                        sdpa_isa_compiled(all[i]) ? "compiled in but not supported by this CPU/OS"
                                                  : "not compiled in");
    }
    logged = 1;
    return n;
}

/* ---------------------------------------------------------- tolerances -- */

util_err util_fa_compare(const float *got, const float *naive, const double *ref, size_t n,
                         double factor)
{
    return util_fa_compare_slack(got, naive, ref, n, factor, 1e-6, 1e-7);
}

util_err util_fa_compare_slack(const float *got, const float *naive, const double *ref, size_t n,
                               double factor, double rel_slack, double abs_slack)
{
    util_err e;
    memset(&e, 0, sizeof e);
    e.first_bad = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        const double r = ref[i], g = got[i];
        if (isnan(r)) {
            if (!isnan(g) && e.nonfinite_bad++ == 0)
                e.first_bad = i;
            continue;
        }
        if (isinf(r)) {
            if (g != r && e.nonfinite_bad++ == 0)
                e.first_bad = i;
            continue;
        }
        if (!isfinite(g)) {
            if (e.nonfinite_bad++ == 0)
                e.first_bad = i;
            continue;
        }
        const double err = fabs(g - r);
        if (err > e.err) {
            e.err = err;
            e.worst = i;
        }
        if (fabs(r) > e.ref_max)
            e.ref_max = fabs(r);
        if (naive && isfinite(naive[i])) {
            const double ne = fabs((double)naive[i] - r);
            if (ne > e.naive_err)
                e.naive_err = ne;
        }
    }
    e.bound = factor * e.naive_err + rel_slack * e.ref_max + abs_slack;
    e.ok = e.nonfinite_bad == 0 && e.err <= e.bound;
    return e;
}

int util_fa_expect(const char *what, const float *got, const float *naive, const double *ref,
                   size_t n, double factor)
{
    return util_fa_expect_slack(what, got, naive, ref, n, factor, 1e-6, 1e-7);
}

int util_fa_expect_slack(const char *what, const float *got, const float *naive, const double *ref,
                         size_t n, double factor, double rel_slack, double abs_slack)
{
    const util_err e = util_fa_compare_slack(got, naive, ref, n, factor, rel_slack, abs_slack);
    if (!e.ok) {
        if (e.nonfinite_bad)
            cr_log_error("%s: %zu element(s) with wrong inf/NaN status, first at %zu: got %g, ref %g",
                         what, e.nonfinite_bad, e.first_bad, (double)got[e.first_bad],
                         ref[e.first_bad]);
        else
            cr_log_error("%s: max err %.3g at %zu (got %.9g, ref %.9g) > bound %.3g (naive fp32 err "
                         "%.3g, max|ref| %.3g)",
                         what, e.err, e.worst, (double)got[e.worst], ref[e.worst], e.bound,
                         e.naive_err, e.ref_max);
    }
    cr_expect(e.ok, "%s: FlashAttention tolerance rule violated (err %.3g, bound %.3g, %zu "
                    "non-finite mismatches)",
              what, e.err, e.bound, e.nonfinite_bad);
    return e.ok;
}

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

size_t util_expect_close(const char *what, const float *got, const double *ref, size_t n,
                         double atol, double rtol, int exact)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        int ok;
        if (exact) {
            const float rf = (float)ref[i];
            ok = (isnan(rf) && isnan(got[i])) || got[i] == rf; /* == accepts 0 == -0 */
            if (ok && got[i] == 0.0f && rf != 0.0f)
                ok = 0;
        } else {
            ok = util_close((double)got[i], ref[i], atol, rtol);
        }
        if (!ok) {
            if (bad < 5)
                cr_log_error("%s[%zu]: got %.9g, expected %.17g (%s, atol %g, rtol %g)", what, i,
                             (double)got[i], ref[i], exact ? "exact" : "tolerance", atol, rtol);
            bad++;
        }
    }
    cr_expect(bad == 0, "%s: %zu of %zu element(s) out of tolerance", what, bad, n);
    return bad;
}

int util_has_nan(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]))
            return 1;
    return 0;
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

/* ---------------------------------------------------------------- .npy -- */

float util_half_to_float(uint16_t h)
{
    const int sign = (h >> 15) & 1, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (ex == 0)
        v = ldexp((double)man, -24);
    else if (ex == 31)
        v = man ? NAN : INFINITY;
    else
        v = ldexp((double)(man | 0x400), ex - 25);
    return (float)(sign ? -v : v);
}

static size_t npy_elem_size(util_npy_type t)
{
    switch (t) {
    case UTIL_NPY_F32: return 4;
    case UTIL_NPY_F16: return 2;
    case UTIL_NPY_F64: return 8;
    case UTIL_NPY_BOOL: return 1;
    case UTIL_NPY_I64: return 8;
    case UTIL_NPY_I32: return 4;
    case UTIL_NPY_U8: return 1;
    }
    return 0;
}

int util_npy_load(const char *path, util_npy *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    size_t len = 0;
    unsigned char *buf = (unsigned char *)util_read_file(path, &len);
    if (!buf) {
        snprintf(err, errlen, "%s: cannot read", path);
        return -1;
    }
    int rc = -1;
    if (len < 10 || memcmp(buf, "\x93NUMPY", 6) != 0) {
        snprintf(err, errlen, "%s: not a .npy file", path);
        goto done;
    }
    const int major = buf[6];
    size_t hlen, hoff;
    if (major == 1) {
        hlen = (size_t)buf[8] | ((size_t)buf[9] << 8);
        hoff = 10;
    } else if ((major == 2 || major == 3) && len >= 12) {
        hlen = (size_t)buf[8] | ((size_t)buf[9] << 8) | ((size_t)buf[10] << 16) |
               ((size_t)buf[11] << 24);
        hoff = 12;
    } else {
        snprintf(err, errlen, "%s: unsupported .npy version %d", path, major);
        goto done;
    }
    if (hoff + hlen > len) {
        snprintf(err, errlen, "%s: truncated header", path);
        goto done;
    }
    char header[1024];
    if (hlen >= sizeof header) {
        snprintf(err, errlen, "%s: header too long", path);
        goto done;
    }
    memcpy(header, buf + hoff, hlen);
    header[hlen] = '\0';

    const char *d = strstr(header, "'descr'");
    const char *fo = strstr(header, "'fortran_order'");
    const char *sh = strstr(header, "'shape'");
    if (!d || !fo || !sh) {
        snprintf(err, errlen, "%s: malformed header: %s", path, header);
        goto done;
    }
    d = strchr(d + 7, '\'');
    if (!d) {
        snprintf(err, errlen, "%s: malformed descr", path);
        goto done;
    }
    d++;
    if (!strncmp(d, "<f4'", 4))
        out->type = UTIL_NPY_F32;
    else if (!strncmp(d, "<f2'", 4))
        out->type = UTIL_NPY_F16;
    else if (!strncmp(d, "<f8'", 4))
        out->type = UTIL_NPY_F64;
    else if (!strncmp(d, "|b1'", 4))
        out->type = UTIL_NPY_BOOL;
    else if (!strncmp(d, "<i8'", 4))
        out->type = UTIL_NPY_I64;
    else if (!strncmp(d, "<i4'", 4))
        out->type = UTIL_NPY_I32;
    else if (!strncmp(d, "|u1'", 4))
        out->type = UTIL_NPY_U8;
    else {
        snprintf(err, errlen, "%s: unsupported dtype %.6s", path, d);
        goto done;
    }
    const char *fv = strchr(fo + 15, ':');
    while (fv && (*fv == ':' || *fv == ' '))
        fv++;
    if (!fv || strncmp(fv, "False", 5) != 0) {
        snprintf(err, errlen, "%s: Fortran order not supported", path);
        goto done;
    }
    const char *s = strchr(sh, '(');
    if (!s) {
        snprintf(err, errlen, "%s: malformed shape", path);
        goto done;
    }
    s++;
    out->ndim = 0;
    out->count = 1;
    while (*s && *s != ')') {
        while (*s == ' ' || *s == ',')
            s++;
        if (*s == ')')
            break;
        char *end;
        const long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || out->ndim >= 8) {
            snprintf(err, errlen, "%s: malformed shape", path);
            goto done;
        }
        out->shape[out->ndim++] = v;
        out->count *= (size_t)v;
        s = end;
    }
    const size_t es = npy_elem_size(out->type);
    const size_t bytes = out->count * es;
    if (hoff + hlen + bytes > len) {
        snprintf(err, errlen, "%s: truncated data (%zu bytes expected)", path, bytes);
        goto done;
    }
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto done;
    }
    if (bytes)
        memcpy(out->data, buf + hoff + hlen, bytes);
    rc = 0;
done:
    free(buf);
    return rc;
}

void util_npy_free(util_npy *a)
{
    if (a) {
        free(a->data);
        a->data = NULL;
    }
}

double util_npy_get(const util_npy *a, size_t i)
{
    const unsigned char *p = (const unsigned char *)a->data;
    switch (a->type) {
    case UTIL_NPY_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case UTIL_NPY_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return util_half_to_float(h);
    }
    case UTIL_NPY_F64: {
        double f;
        memcpy(&f, p + 8 * i, 8);
        return f;
    }
    case UTIL_NPY_BOOL:
    case UTIL_NPY_U8: return p[i];
    case UTIL_NPY_I64: {
        int64_t v;
        memcpy(&v, p + 8 * i, 8);
        return (double)v;
    }
    case UTIL_NPY_I32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    }
    return 0.0;
}
