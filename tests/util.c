/* SPDX-License-Identifier: MIT */
/* tests/util.c - shared helpers of the Criterion suite (see util.h): the parts that log or
 * expect through Criterion; the rest is in tests/util_core.c. */
#include "util.h"
#include "../src/dtype.h"
#include "ref.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int util_gintact(const float *p, const char *what)
{
    char msg[160];
    if (util_gcheck(p, msg, sizeof msg))
        return 1;
    cr_log_error("%s: %s", what, msg);
    return 0;
}

/* ------------------------------------------------------------- layouts -- */

int util_gaps_intact(const util_layout *l, const float *buf, size_t n, const char *what)
{
    char msg[160];
    if (util_gaps_check(l, buf, n, msg, sizeof msg))
        return 1;
    cr_log_error("%s: %s", what, msg);
    return 0;
}

/* --------------------------------------------------------------- ISAs -- */

static int isas_where(sdpa_isa out[SDPA_ISA_COUNT], int with_amx)
{
    static int logged = 0;
    static const sdpa_isa all[SDPA_ISA_COUNT] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX,
                                                 SDPA_ISA_NEON};
    int n = 0;
    for (int i = 0; i < SDPA_ISA_COUNT; i++) {
        if (all[i] == SDPA_ISA_AMX && !with_amx)
            continue;
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

int util_isas(sdpa_isa out[SDPA_ISA_COUNT])
{
    return isas_where(out, 0);
}

int util_isas_typed(sdpa_isa out[SDPA_ISA_COUNT])
{
    return isas_where(out, 1);
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


size_t util_expect_close(const char *what, const float *got, const double *ref, size_t n,
                         double atol, double rtol, int exact)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!util_close_elem(got[i], ref[i], atol, rtol, exact)) {
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

/* ------------------------------------------------------ small helpers -- */

float *util_falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    cr_assert_not_null(p);
    return p;
}

double *util_dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    cr_assert_not_null(p);
    return p;
}

void util_forward_plain(const sdpa_problem *p, const float *q, const float *k, const float *v, float *o,
                        float *lse)
{
    const int64_t Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len;
    const sdpa_tensor tq = util_cview(q, Hq, Tq, p->head_dim_qk), tk = util_cview(k, Hkv, Tk, p->head_dim_qk),
                      tv = util_cview(v, Hkv, Tk, p->head_dim_v);
    const sdpa_tensor_out to = util_cview_out(o, Hq, Tq, p->head_dim_v), tl = util_lse_view_out(lse, Hq, Tq);
    const sdpa_status st = sdpa_forward(p, &tq, &tk, &tv, &to, &tl);
    cr_assert_eq(st, SDPA_OK, "sdpa_forward: %s", sdpa_status_string(st));
}

void util_forward_contig(const sdpa_problem *p0, sdpa_isa isa, const float *q, const float *k,
                         const float *v, float *o, float *lse)
{
    sdpa_problem p = *p0;
    p.isa = isa;
    p.num_threads = 2;
    const sdpa_tensor tq = util_cview(q, p.q_heads, p.q_len, p.head_dim_qk);
    const sdpa_tensor tk = util_cview(k, p.kv_heads, p.kv_len, p.head_dim_qk);
    const sdpa_tensor tv = util_cview(v, p.kv_heads, p.kv_len, p.head_dim_v);
    const sdpa_tensor_out to = util_cview_out(o, p.q_heads, p.q_len, p.head_dim_v);
    const sdpa_tensor_out tl = util_lse_view_out(lse, p.q_heads, p.q_len);
    const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
    cr_assert_eq(st, SDPA_OK, "[%s] sdpa_forward: %s", sdpa_isa_name(isa), sdpa_status_string(st));
    cr_expect(util_gintact(o, "O") && util_gintact(lse, "LSE"));
}

void util_inputs_free(util_inputs *in)
{
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->dout);
}

util_refs util_refs_make(const sdpa_problem *p, const util_inputs *in, int dsinks)
{
    util_refs R;
    const size_t Hq = (size_t)p->q_heads;
    R.o = util_dalloc(in->no);
    R.lse = util_dalloc(in->nl);
    R.dq = util_dalloc(in->nq);
    R.dk = util_dalloc(in->nk);
    R.dv = util_dalloc(in->nv);
    R.ds = dsinks ? util_dalloc(Hq) : NULL;
    R.no = util_falloc(in->no);
    R.nlse = util_falloc(in->nl);
    R.ndq = util_falloc(in->nq);
    R.ndk = util_falloc(in->nk);
    R.ndv = util_falloc(in->nv);
    R.nds = dsinks ? util_falloc(Hq) : NULL;
    ref_forward(p, in->q, in->k, in->v, R.o, R.lse);
    ref_backward_dsinks(p, in->q, in->k, in->v, in->dout, R.dq, R.dk, R.dv, R.ds);
    naive32_forward(p, in->q, in->k, in->v, R.no, R.nlse);
    naive32_backward_dsinks(p, in->q, in->k, in->v, in->dout, R.ndq, R.ndk, R.ndv, R.nds);
    return R;
}

void util_refs_free(util_refs *R)
{
    double *d[] = {R->o, R->lse, R->dq, R->dk, R->dv, R->ds};
    float *f[] = {R->no, R->nlse, R->ndq, R->ndk, R->ndv, R->nds};
    for (int i = 0; i < 6; i++) {
        free(d[i]);
        free(f[i]);
    }
}

int util_refs_expect(const char *what, const util_outputs *res, const float *ds, const util_refs *R,
                     const util_inputs *in, size_t Hq)
{
    char w[400];
    int ok = 1;
    snprintf(w, sizeof w, "%s: O", what);
    ok &= util_fa_expect(w, res->o, R->no, R->o, in->no, 2.0);
    snprintf(w, sizeof w, "%s: LSE", what);
    ok &= util_fa_expect(w, res->lse, R->nlse, R->lse, in->nl, 2.0);
    snprintf(w, sizeof w, "%s: dQ", what);
    ok &= util_fa_expect(w, res->dq, R->ndq, R->dq, in->nq, 3.0);
    snprintf(w, sizeof w, "%s: dK", what);
    ok &= util_fa_expect(w, res->dk, R->ndk, R->dk, in->nk, 3.0);
    snprintf(w, sizeof w, "%s: dV", what);
    ok &= util_fa_expect(w, res->dv, R->ndv, R->dv, in->nv, 3.0);
    if (ds) {
        snprintf(w, sizeof w, "%s: dsinks", what);
        ok &= util_fa_expect(w, ds, R->nds, R->ds, Hq, 3.0);
    }
    return ok;
}

/* ------------------------------------------------- typed test buffers -- */

size_t util_dtype_bytes(sdpa_dtype t)
{
    return t == SDPA_DTYPE_F32 ? 4 : 2;
}

void *util_store_as(sdpa_dtype t, const float *x, size_t n, size_t guard)
{
    unsigned char *buf = malloc((n + guard) * util_dtype_bytes(t) + 1);
    cr_assert_not_null(buf);
    memset(buf, 0xA5, (n + guard) * util_dtype_bytes(t));
    for (size_t i = 0; i < n; i++) {
        if (t == SDPA_DTYPE_F32) {
            memcpy(buf + 4 * i, &x[i], 4);
        } else {
            const uint16_t h = t == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(x[i]) : sdpa_f32_to_f16(x[i]);
            memcpy(buf + 2 * i, &h, 2);
        }
    }
    return buf;
}

float util_load_as(sdpa_dtype t, const void *buf, size_t i)
{
    if (t == SDPA_DTYPE_F32) {
        float x;
        memcpy(&x, (const char *)buf + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, (const char *)buf + 2 * i, 2);
    return t == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(h) : sdpa_f16_to_f32(h);
}

int util_guard_intact(const void *buf, size_t from_byte, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        if (((const unsigned char *)buf)[from_byte + i] != 0xA5)
            return 0;
    return 1;
}
