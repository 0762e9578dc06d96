/* SPDX-License-Identifier: MIT */
/* tests/test_adversarial.c - adversarial review: bad arguments, extreme sizes and
 * windows, nasty values, races, and a malicious-input pass over the sdpa CLI.
 *
 * Every test checks the contract of include/sdpa.h and design.md section 1
 * against an independent float64 reference written here (IEEE semantics: a NaN
 * in an allowed input propagates, masked positions are never read).
 *
 * Tests whose name starts with "bug_" reproduce bugs this review found (each
 * comment says where the bug was); they are fixed and stay as regression
 * tests. The other tests guard behaviour that held up under attack. */
#include "sdpa.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#ifndef SDPA_CLI_PATH
#error "SDPA_CLI_PATH must name the built sdpa binary"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ADV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ADV_ASAN 1
#endif
#endif
#ifndef ADV_ASAN
#define ADV_ASAN 0
#endif

extern char **environ;

/* ================================================================ helpers == */

static int same_bits(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

/* A strided [B, H, T, D] buffer: row stride D + pad, the pad filled with `gap`. */
typedef struct tbuf {
    int64_t B, H, T, D, pad;
    float *data; /* guarded (util_galloc) */
    size_t n;
} tbuf;

static tbuf tb_alloc(int64_t B, int64_t H, int64_t T, int64_t D, int64_t pad, float gap)
{
    tbuf t = {B, H, T, D, pad, NULL, 0};
    t.n = (size_t)(B * H * T * (D + pad));
    t.data = util_galloc_fill(t.n, gap);
    return t;
}

static float *tb_at(const tbuf *t, int64_t b, int64_t h, int64_t i)
{
    return t->data + ((b * t->H + h) * t->T + i) * (t->D + t->pad);
}

static sdpa_tensor tb_in(const tbuf *t)
{
    const int64_t st = t->D + t->pad;
    sdpa_tensor v = {t->data, t->H * t->T * st, t->T * st, st};
    return v;
}

static sdpa_tensor_out tb_out(const tbuf *t)
{
    const int64_t st = t->D + t->pad;
    sdpa_tensor_out v = {t->data, t->H * t->T * st, t->T * st, st};
    return v;
}

/* LSE as a [B, H, T] buffer with row stride 1 + pad. */
static tbuf lse_alloc(int64_t B, int64_t H, int64_t T, int64_t pad, float gap)
{
    return tb_alloc(B, H, T, 1, pad, gap);
}

/* 1 if every pad float of t still holds the bit pattern of `gap`. */
static int tb_gaps_are(const tbuf *t, float gap)
{
    for (int64_t b = 0; b < t->B; b++)
        for (int64_t h = 0; h < t->H; h++)
            for (int64_t i = 0; i < t->T; i++)
                for (int64_t c = 0; c < t->pad; c++)
                    if (memcmp(tb_at(t, b, h, i) + t->D + c, &gap, sizeof gap) != 0)
                        return 0;
    return 1;
}

static void tb_free(tbuf *t)
{
    util_gfree(t->data);
    t->data = NULL;
}

/* ------------------------------------------------ float64 reference -- */

static int64_t keys_b(const sdpa_problem *p, int64_t b)
{
    return p->kv_lengths ? p->kv_lengths[b] : p->kv_len;
}

/* Interval masks and the boolean mask (not the bias), with 128-bit arithmetic so
 * that windows near INT64_MAX are exact. */
static int allowed_nobias(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const int64_t tkb = keys_b(p, b);
    if (j >= tkb)
        return 0;
    const int br = p->causal == SDPA_CAUSAL_BOTTOM_RIGHT ||
                   (p->causal == SDPA_CAUSAL_NONE && p->window_alignment == SDPA_ALIGN_BOTTOM_RIGHT);
    const __int128 diag = (__int128)i + (br ? (__int128)tkb - p->q_len : 0);
    if (p->causal != SDPA_CAUSAL_NONE && (__int128)j > diag)
        return 0;
    if (p->window_left != SDPA_WINDOW_UNBOUNDED && (__int128)j < diag - p->window_left)
        return 0;
    if (p->window_right != SDPA_WINDOW_UNBOUNDED && (__int128)j > diag + p->window_right)
        return 0;
    const sdpa_bool_mask *m = &p->bool_mask;
    if (m->data && !m->data[b * m->batch_stride + h * m->head_stride + i * m->query_stride + j * m->key_stride])
        return 0;
    return 1;
}

static double bias_of(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const sdpa_bias *x = &p->bias;
    return x->data ? (double)x->data[b * x->batch_stride + h * x->head_stride + i * x->query_stride + j * x->key_stride]
                   : 0.0;
}

static int allowed(const sdpa_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    return allowed_nobias(p, b, h, i, j) && bias_of(p, b, h, i, j) != -INFINITY;
}

static double ref_scale_of(const sdpa_problem *p)
{
    return p->use_default_scale ? 1.0 / sqrt((double)p->head_dim_qk) : (double)p->scale;
}

static const float *row_of(const sdpa_tensor *t, int64_t b, int64_t h, int64_t i)
{
    return t->data + b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
}

/* Scores of one row in double (NaN where the row has no such key: check allowed()). */
static double score(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, int64_t b, int64_t h,
                    int64_t i, int64_t j)
{
    const int64_t hk = h / (p->q_heads / p->kv_heads);
    const float *qr = row_of(q, b, h, i), *kr = row_of(k, b, hk, j);
    double s = 0.0;
    for (int64_t c = 0; c < p->head_dim_qk; c++)
        s += (double)qr[c] * (double)kr[c];
    return s * ref_scale_of(p) + bias_of(p, b, h, i, j);
}

/* Forward of one row: o[Dv], *lse. IEEE semantics: a NaN score, or a +inf max,
 * makes the row NaN; a NaN in an allowed V row propagates (0 * NaN = NaN). */
static void ref_row(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                    int64_t b, int64_t h, int64_t i, double *o, double *lse)
{
    const int64_t Tk = p->kv_len, Dv = p->head_dim_v, hk = h / (p->q_heads / p->kv_heads);
    double mx = -INFINITY;
    int any = 0, nan = 0;
    for (int64_t j = 0; j < Tk; j++)
        if (allowed(p, b, h, i, j)) {
            const double s = score(p, q, k, b, h, i, j);
            any = 1;
            if (isnan(s))
                nan = 1;
            else if (s > mx)
                mx = s;
        }
    for (int64_t c = 0; c < Dv; c++)
        o[c] = 0.0;
    if (!any) {
        *lse = -INFINITY;
        return;
    }
    if (nan || mx == INFINITY || mx == -INFINITY) {
        for (int64_t c = 0; c < Dv; c++)
            o[c] = NAN;
        *lse = NAN;
        return;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < Tk; j++)
        if (allowed(p, b, h, i, j)) {
            const double w = exp(score(p, q, k, b, h, i, j) - mx);
            const float *vr = row_of(v, b, hk, j);
            sum += w;
            for (int64_t c = 0; c < Dv; c++)
                o[c] += w * (double)vr[c];
        }
    for (int64_t c = 0; c < Dv; c++)
        o[c] /= sum;
    *lse = mx + log(sum);
}

/* Backward in double into contiguous dq [B,Hq,Tq,Dk], dk [B,Hkv,Tk,Dk], dv [B,Hkv,Tk,Dv]
 * (zeroed here). Uses its own float64 O and LSE. */
static void ref_bwd(const sdpa_problem *p, const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                    const sdpa_tensor *dout, double *dq, double *dk, double *dv)
{
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len,
                  Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const double scale = ref_scale_of(p);
    memset(dq, 0, (size_t)(B * Hq * Tq * Dk) * sizeof(double));
    memset(dk, 0, (size_t)(B * Hkv * Tk * Dk) * sizeof(double));
    memset(dv, 0, (size_t)(B * Hkv * Tk * Dv) * sizeof(double));
    double *o = malloc((size_t)(Dv + 1) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t hk = h / (Hq / Hkv);
            for (int64_t i = 0; i < Tq; i++) {
                double lse;
                ref_row(p, q, k, v, b, h, i, o, &lse);
                if (lse == -INFINITY)
                    continue; /* fully masked: contributes exactly 0 */
                const float *dor = row_of(dout, b, h, i), *qr = row_of(q, b, h, i);
                double D = 0.0;
                for (int64_t c = 0; c < Dv; c++)
                    D += (double)dor[c] * o[c];
                for (int64_t j = 0; j < Tk; j++) {
                    if (!allowed(p, b, h, i, j))
                        continue;
                    const double P = exp(score(p, q, k, b, h, i, j) - lse);
                    const float *vr = row_of(v, b, hk, j), *kr = row_of(k, b, hk, j);
                    double dP = 0.0;
                    for (int64_t c = 0; c < Dv; c++)
                        dP += (double)dor[c] * (double)vr[c];
                    const double dS = P * (dP - D);
                    double *dqr = dq + ((b * Hq + h) * Tq + i) * Dk, *dkr = dk + ((b * Hkv + hk) * Tk + j) * Dk,
                           *dvr = dv + ((b * Hkv + hk) * Tk + j) * Dv;
                    for (int64_t c = 0; c < Dk; c++) {
                        dqr[c] += scale * dS * (double)kr[c];
                        dkr[c] += scale * dS * (double)qr[c];
                    }
                    for (int64_t c = 0; c < Dv; c++)
                        dvr[c] += P * (double)dor[c];
                }
            }
        }
    free(o);
}

/* |got - ref| <= tol, NaN exactly where the reference is NaN, infinities equal. */
static int close_to(float got, double ref, double tol)
{
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return (double)got == ref;
    return isfinite(got) && fabs((double)got - ref) <= tol;
}

static sdpa_problem prob(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dk, int64_t Dv)
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

/* ============================================= randomized differential == */

typedef struct fz {
    sdpa_problem p;
    tbuf q, k, v, dout;
    int32_t kvl[4];
    uint8_t *mask;
    float *bias;
    char what[256];
} fz;

static int64_t pick(util_rng *r, const int64_t *vals, int n)
{
    return vals[util_rng_int(r, 0, n - 1)];
}

/* A random problem with random masks, strided rows whose gaps hold NaN, and NaN
 * planted everywhere the contract says is never read: K/V rows no query may
 * attend, bias entries every mapped position of which is disallowed by another
 * mask, Q and dO rows of fully masked queries. (K, V and Q rows masked only
 * by a -inf bias are left finite: that case is bug_nan_key_masked_by_bias.) */
static void fz_make(fz *f, util_rng *r)
{
    static const int64_t Ts[] = {0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 40, 64, 65, 129, 200};
    static const int64_t Ds[] = {0, 1, 2, 3, 5, 8, 15, 16, 17, 20, 33};
    static const int64_t blocks[] = {0, 0, 1, 2, 3, 16, 17, 64, 512};
    memset(f, 0, sizeof *f);
    const int64_t B = util_rng_int(r, 1, 2), Hkv = util_rng_int(r, 1, 2), G = util_rng_int(r, 1, 3);
    const int64_t Tq = pick(r, Ts, 17), Tk = pick(r, Ts, 17), Dk = pick(r, Ds, 11), Dv = pick(r, Ds, 11);
    sdpa_problem *p = &f->p;
    *p = prob(B, Hkv * G, Hkv, Tq, Tk, Dk, Dv);
    const int sc = (int)util_rng_int(r, 0, 5);
    if (Dk == 0 || sc > 2) {
        static const float scales[] = {0.5f, -0.7f, 0.0f, 1.0f, 0.25f};
        p->use_default_scale = 0;
        p->scale = scales[util_rng_int(r, 0, 4)];
    }
    p->causal = (sdpa_causal)util_rng_int(r, 0, 2);
    p->window_alignment = (sdpa_alignment)util_rng_int(r, 0, 1);
    const int64_t wins[] = {-1, -1, -1, 0, 1, 2, 5, Tq + Tk - 1, Tq + Tk, Tq + Tk + 1, INT64_MAX};
    p->window_left = pick(r, wins, 11);
    p->window_right = pick(r, wins, 11);
    p->block_q = (int)pick(r, blocks, 9);
    p->block_k = (int)pick(r, blocks, 9);
    if (util_rng_int(r, 0, 9) < 4) {
        for (int64_t b = 0; b < B; b++)
            f->kvl[b] = (int32_t)util_rng_int(r, 0, Tk);
        p->kv_lengths = f->kvl;
    }
    const int64_t full[4] = {B, p->q_heads, Tq, Tk};
    int64_t st[4];
    if (util_rng_int(r, 0, 9) < 3) { /* boolean mask, each dim broadcast or not */
        int64_t n = 1;
        for (int d = 3; d >= 0; d--) {
            st[d] = util_rng_int(r, 0, 2) ? n : 0;
            n *= st[d] ? full[d] : 1;
        }
        f->mask = malloc((size_t)n + 1);
        for (int64_t x = 0; x < n; x++)
            f->mask[x] = util_rng_int(r, 0, 9) < 7 ? (uint8_t)util_rng_int(r, 1, 255) : 0;
        p->bool_mask = (sdpa_bool_mask){f->mask, st[0], st[1], st[2], st[3]};
    }
    if (util_rng_int(r, 0, 9) < 3) { /* bias */
        int64_t n = 1;
        for (int d = 3; d >= 0; d--) {
            st[d] = util_rng_int(r, 0, 2) ? n : 0;
            n *= st[d] ? full[d] : 1;
        }
        f->bias = malloc(((size_t)n + 1) * sizeof(float));
        for (int64_t x = 0; x < n; x++)
            f->bias[x] = util_rng_int(r, 0, 9) == 0 ? -INFINITY : (float)(4.0 * util_rng_double(r) - 2.0);
        p->bias = (sdpa_bias){f->bias, st[0], st[1], st[2], st[3]};
    }
    const int64_t pad = util_rng_int(r, 0, 1) ? 3 : 0;
    f->q = tb_alloc(B, p->q_heads, Tq, Dk, pad, NAN);
    f->k = tb_alloc(B, Hkv, Tk, Dk, pad, NAN);
    f->v = tb_alloc(B, Hkv, Tk, Dv, pad, NAN);
    f->dout = tb_alloc(B, p->q_heads, Tq, Dv, pad, NAN);
    tbuf *all[4] = {&f->q, &f->k, &f->v, &f->dout};
    for (int a = 0; a < 4; a++)
        for (int64_t b = 0; b < all[a]->B; b++)
            for (int64_t h = 0; h < all[a]->H; h++)
                for (int64_t i = 0; i < all[a]->T; i++)
                    for (int64_t c = 0; c < all[a]->D; c++)
                        tb_at(all[a], b, h, i)[c] = (float)util_rng_normal(r);

    /* NaN where nothing may read. */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t hk = 0; hk < Hkv; hk++)
            for (int64_t j = 0; j < Tk; j++) {
                int used = 0;
                for (int64_t h = hk * G; h < (hk + 1) * G && !used; h++)
                    for (int64_t i = 0; i < Tq && !used; i++)
                        used = allowed_nobias(p, b, h, i, j); /* _nobias: see bug_nan_key_masked_by_bias */
                if (!used && util_rng_int(r, 0, 1)) {
                    for (int64_t c = 0; c < Dk; c++)
                        tb_at(&f->k, b, hk, j)[c] = NAN;
                    for (int64_t c = 0; c < Dv; c++)
                        tb_at(&f->v, b, hk, j)[c] = NAN;
                }
            }
        for (int64_t h = 0; h < p->q_heads; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int used = 0, used_nb = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    used |= allowed(p, b, h, i, j);
                    used_nb |= allowed_nobias(p, b, h, i, j);
                }
                if (!used_nb && util_rng_int(r, 0, 1)) /* _nobias: see bug_nan_key_masked_by_bias */
                    for (int64_t c = 0; c < Dk; c++)
                        tb_at(&f->q, b, h, i)[c] = NAN;
                if (!used && util_rng_int(r, 0, 1))
                    for (int64_t c = 0; c < Dv; c++)
                        tb_at(&f->dout, b, h, i)[c] = NAN;
            }
    }
    if (f->bias) { /* NaN in bias entries whose every position is disallowed without the bias */
        const sdpa_bias *x = &p->bias;
        int64_t n = 1;
        for (int d = 0; d < 4; d++)
            n *= (d == 0 ? x->batch_stride : d == 1 ? x->head_stride : d == 2 ? x->query_stride : x->key_stride)
                     ? full[d] : 1;
        uint8_t *used = calloc((size_t)n + 1, 1);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < p->q_heads; h++)
                for (int64_t i = 0; i < Tq; i++)
                    for (int64_t j = 0; j < Tk; j++)
                        if (allowed_nobias(p, b, h, i, j))
                            used[b * x->batch_stride + h * x->head_stride + i * x->query_stride + j * x->key_stride] = 1;
        for (int64_t e = 0; e < n; e++)
            if (!used[e] && util_rng_int(r, 0, 1))
                f->bias[e] = NAN;
        free(used);
    }
    snprintf(f->what, sizeof f->what,
             "B=%ld Hq=%ld Hkv=%ld Tq=%ld Tk=%ld Dk=%ld Dv=%ld scale=%s%g causal=%d align=%d wl=%ld wr=%ld "
             "bq=%d bk=%d kvlen=%s mask=%s bias=%s pad=%ld",
             (long)B, (long)p->q_heads, (long)Hkv, (long)Tq, (long)Tk, (long)Dk, (long)Dv,
             p->use_default_scale ? "default " : "", (double)p->scale, (int)p->causal, (int)p->window_alignment,
             (long)p->window_left, (long)p->window_right, p->block_q, p->block_k, p->kv_lengths ? "yes" : "no",
             f->mask ? "yes" : "no", f->bias ? "yes" : "no", (long)pad);
}

static void fz_free(fz *f)
{
    tb_free(&f->q);
    tb_free(&f->k);
    tb_free(&f->v);
    tb_free(&f->dout);
    free(f->mask);
    free(f->bias);
}

/* Forward + backward of one ISA and thread count into fresh strided outputs. */
typedef struct fz_out {
    tbuf o, lse, dq, dk, dv;
    sdpa_status sf, sb;
} fz_out;

static void fz_run(const fz *f, sdpa_isa isa, int threads, fz_out *r)
{
    sdpa_problem p = f->p;
    p.isa = isa;
    p.num_threads = threads;
    const int64_t pad = f->q.pad;
    r->o = tb_alloc(p.batch, p.q_heads, p.q_len, p.head_dim_v, pad, util_sentinel());
    r->lse = lse_alloc(p.batch, p.q_heads, p.q_len, pad, util_sentinel());
    r->dq = tb_alloc(p.batch, p.q_heads, p.q_len, p.head_dim_qk, pad, util_sentinel());
    r->dk = tb_alloc(p.batch, p.kv_heads, p.kv_len, p.head_dim_qk, pad, util_sentinel());
    r->dv = tb_alloc(p.batch, p.kv_heads, p.kv_len, p.head_dim_v, pad, util_sentinel());
    const sdpa_tensor q = tb_in(&f->q), k = tb_in(&f->k), v = tb_in(&f->v), dO = tb_in(&f->dout);
    const sdpa_tensor_out o = tb_out(&r->o), l = tb_out(&r->lse), dq = tb_out(&r->dq), dk = tb_out(&r->dk),
                          dv = tb_out(&r->dv);
    r->sf = sdpa_forward(&p, &q, &k, &v, &o, &l);
    const sdpa_tensor oi = tb_in(&r->o), li = tb_in(&r->lse);
    r->sb = r->sf == SDPA_OK ? sdpa_backward(&p, &q, &k, &v, &oi, &li, &dO, &dq, &dk, &dv) : r->sf;
}

static void fz_out_free(fz_out *r)
{
    tb_free(&r->o);
    tb_free(&r->lse);
    tb_free(&r->dq);
    tb_free(&r->dk);
    tb_free(&r->dv);
}

static int tb_same(const tbuf *a, const tbuf *b)
{
    return a->n == b->n && same_bits(a->data, b->data, a->n);
}

/* Compares a strided library output to a contiguous double reference. */
static int tb_check(const tbuf *got, const double *ref, double tol, const char *name, const char *isa, const char *what)
{
    int bad = 0;
    for (int64_t b = 0; b < got->B; b++)
        for (int64_t h = 0; h < got->H; h++)
            for (int64_t i = 0; i < got->T; i++)
                for (int64_t c = 0; c < got->D; c++) {
                    const float g = tb_at(got, b, h, i)[c];
                    const double e = ref[((b * got->H + h) * got->T + i) * got->D + c];
                    if (!close_to(g, e, tol) && bad++ < 3)
                        cr_log_error("[%s] %s[%ld][%ld][%ld][%ld] = %.9g, reference %.9g (tol %.3g) | %s", isa, name,
                                     (long)b, (long)h, (long)i, (long)c, (double)g, e, tol, what);
                }
    if (!tb_gaps_are(got, util_sentinel())) {
        cr_log_error("[%s] %s: a gap between rows was written | %s", isa, name, what);
        bad++;
    }
    if (!util_gintact(got->data, name))
        bad++;
    return bad;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

static int fz_check(const fz *f, int iter)
{
    const sdpa_problem *p = &f->p;
    const int64_t B = p->batch, Hq = p->q_heads, Hkv = p->kv_heads, Tq = p->q_len, Tk = p->kv_len,
                  Dk = p->head_dim_qk, Dv = p->head_dim_v;
    const size_t nO = (size_t)(B * Hq * Tq * Dv), nL = (size_t)(B * Hq * Tq), nQ = (size_t)(B * Hq * Tq * Dk),
                 nK = (size_t)(B * Hkv * Tk * Dk), nV = (size_t)(B * Hkv * Tk * Dv);
    double *ro = malloc((nO + 1) * sizeof(double)), *rl = malloc((nL + 1) * sizeof(double));
    double *rdq = malloc((nQ + 1) * sizeof(double)), *rdk = malloc((nK + 1) * sizeof(double)),
           *rdv = malloc((nV + 1) * sizeof(double));
    const sdpa_tensor q = tb_in(&f->q), k = tb_in(&f->k), v = tb_in(&f->v), dO = tb_in(&f->dout);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++)
                ref_row(p, &q, &k, &v, b, h, i, ro + ((b * Hq + h) * Tq + i) * Dv, rl + (b * Hq + h) * Tq + i);
    ref_bwd(p, &q, &k, &v, &dO, rdq, rdk, rdv);
    double vmax = 0.0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t j = 0; j < Tk; j++)
                for (int64_t c = 0; c < Dv; c++) {
                    const float x = tb_at(&f->v, b, h, j)[c];
                    if (isfinite(x) && fabsf(x) > vmax)
                        vmax = fabsf(x);
                }
    const double tolO = 3e-5 * (1.0 + vmax), tolL = 3e-5 * (1.0 + max_abs(rl, nL));
    const double tq = 2e-3 * (1.0 + max_abs(rdq, nQ)), tk = 2e-3 * (1.0 + max_abs(rdk, nK)),
                 tv = 2e-3 * (1.0 + max_abs(rdv, nV));
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    int bad = 0;
    char what[320];
    snprintf(what, sizeof what, "iter %d: %s", iter, f->what);
    for (int ii = 0; ii < nisa; ii++) {
        const char *name = sdpa_isa_name(isas[ii]);
        fz_out r1, r3;
        fz_run(f, isas[ii], 1, &r1);
        fz_run(f, isas[ii], 3, &r3);
        if (r1.sf != SDPA_OK || r1.sb != SDPA_OK) {
            cr_log_error("[%s] status %d / %d | %s", name, (int)r1.sf, (int)r1.sb, what);
            bad++;
        } else {
            bad += tb_check(&r1.o, ro, tolO, "O", name, what);
            bad += tb_check(&r1.lse, rl, tolL, "LSE", name, what);
            bad += tb_check(&r1.dq, rdq, tq, "dQ", name, what);
            bad += tb_check(&r1.dk, rdk, tk, "dK", name, what);
            bad += tb_check(&r1.dv, rdv, tv, "dV", name, what);
            if (!tb_same(&r1.o, &r3.o) || !tb_same(&r1.lse, &r3.lse) || !tb_same(&r1.dq, &r3.dq) ||
                !tb_same(&r1.dk, &r3.dk) || !tb_same(&r1.dv, &r3.dv)) {
                cr_log_error("[%s] 1 thread and 3 threads differ | %s", name, what);
                bad++;
            }
        }
        fz_out_free(&r1);
        fz_out_free(&r3);
    }
    free(ro);
    free(rl);
    free(rdq);
    free(rdk);
    free(rdv);
    return bad;
}

/* Random problems, every ISA, 1 and 3 threads, forward and backward against the
 * float64 reference; NaN in padding and in every never-read position.
 * ADV_FUZZ_ITERS=N runs N problems instead of 300 (SDPA_TEST_SEED picks the seed). */
Test(adversarial, differential_fuzz_nan_in_never_read_places, .timeout = 300)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.differential_fuzz", 0xad7e55a1);
    int bad = 0, iters = 300;
    if (getenv("ADV_FUZZ_ITERS"))
        iters = atoi(getenv("ADV_FUZZ_ITERS"));
    for (int it = 0; it < iters && bad < 10; it++) {
        fz f;
        fz_make(&f, &r);
        bad += fz_check(&f, it);
        fz_free(&f);
    }
    cr_expect_eq(bad, 0, "%d mismatch(es), see the log", bad);
}

/* Windows at int64 extremes, every causal / alignment combination, with and
 * without key lengths, Tq != Tk both ways. */
Test(adversarial, windows_int64_extremes_all_alignments, .timeout = 120)
{
    static const int64_t extra[] = {-1, 0, 1, 2, INT64_MAX, INT64_MAX - 1, INT64_MAX / 2};
    const int64_t shapes[][2] = {{5, 9}, {9, 5}, {1, 17}, {17, 1}};
    util_rng r;
    util_rng_seed(&r, "adversarial.windows", 7);
    int bad = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int64_t Tq = shapes[s][0], Tk = shapes[s][1], D = 3;
        const int64_t wins[] = {extra[0], extra[1], extra[2], extra[3], extra[4], extra[5], extra[6],
                                Tq + Tk - 1, Tq + Tk, Tq + Tk + 1, Tq, Tk};
        const int nw = (int)(sizeof wins / sizeof wins[0]);
        tbuf q = tb_alloc(1, 1, Tq, D, 0, 0), k = tb_alloc(1, 1, Tk, D, 0, 0), v = tb_alloc(1, 1, Tk, D, 0, 0);
        util_fill_normal(&r, q.data, q.n, 1.0f);
        util_fill_normal(&r, k.data, k.n, 1.0f);
        util_fill_normal(&r, v.data, v.n, 1.0f);
        int32_t kvl[1] = {(int32_t)(Tk > 2 ? Tk - 2 : Tk)};
        for (int wl = 0; wl < nw; wl++)
            for (int wr = 0; wr < nw; wr++)
                for (int mode = 0; mode < 8; mode++) {
                    sdpa_problem p = prob(1, 1, 1, Tq, Tk, D, D);
                    p.window_left = wins[wl];
                    p.window_right = wins[wr];
                    p.causal = (sdpa_causal)(mode % 3 == 2 ? 0 : mode % 3);
                    p.window_alignment = (sdpa_alignment)((mode / 2) % 2);
                    p.kv_lengths = mode >= 4 ? kvl : NULL;
                    p.isa = SDPA_ISA_SCALAR;
                    p.block_k = mode % 2 ? 2 : 0;
                    tbuf o = tb_alloc(1, 1, Tq, D, 0, util_sentinel()), l = lse_alloc(1, 1, Tq, 0, util_sentinel());
                    const sdpa_tensor tq = tb_in(&q), tk = tb_in(&k), tv = tb_in(&v);
                    const sdpa_tensor_out to = tb_out(&o), tl = tb_out(&l);
                    const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
                    if (st != SDPA_OK) {
                        if (bad++ < 5)
                            cr_log_error("wl=%ld wr=%ld mode=%d: status %d", (long)wins[wl], (long)wins[wr], mode, (int)st);
                    } else {
                        double ro[3], rl;
                        for (int64_t i = 0; i < Tq; i++) {
                            ref_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
                            int ok = close_to(l.data[i], rl, 1e-5 * (1 + fabs(rl)));
                            for (int c = 0; c < D; c++)
                                ok = ok && close_to(o.data[i * D + c], ro[c], 1e-5 * 4);
                            if (!ok && bad++ < 5)
                                cr_log_error("Tq=%ld Tk=%ld wl=%ld wr=%ld causal=%d align=%d kvlen=%s row %ld: "
                                             "LSE %.9g vs %.9g", (long)Tq, (long)Tk, (long)wins[wl], (long)wins[wr],
                                             (int)p.causal, (int)p.window_alignment, p.kv_lengths ? "yes" : "no",
                                             (long)i, (double)l.data[i], rl);
                        }
                    }
                    tb_free(&o);
                    tb_free(&l);
                }
        tb_free(&q);
        tb_free(&k);
        tb_free(&v);
    }
    cr_expect_eq(bad, 0, "%d window case(s) wrong", bad);
}

/* ================================================== nasty values ====== */

/* Runs the forward of a 1-head problem on every ISA and checks O and LSE row by
 * row against the reference with a relative tolerance. */
static int check_all_isas(sdpa_problem p, const float *q, const float *k, const float *v, double rtol,
                          const char *what)
{
    const int64_t Tq = p.q_len, Tk = p.kv_len, Dk = p.head_dim_qk, Dv = p.head_dim_v;
    const sdpa_tensor tq = {q, Tq * Dk, Tq * Dk, Dk}, tk = {k, Tk * Dk, Tk * Dk, Dk}, tv = {v, Tk * Dv, Tk * Dv, Dv};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    int bad = 0;
    double *ro = malloc((size_t)(Dv + 1) * sizeof(double));
    for (int ii = 0; ii < nisa; ii++) {
        p.isa = isas[ii];
        float *o = util_galloc((size_t)(Tq * Dv)), *l = util_galloc((size_t)Tq);
        const sdpa_tensor_out to = {o, Tq * Dv, Tq * Dv, Dv}, tl = {l, Tq, Tq, 1};
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        if (st != SDPA_OK) {
            cr_log_error("[%s] %s: status %d", sdpa_isa_name(isas[ii]), what, (int)st);
            bad++;
        }
        for (int64_t i = 0; i < Tq && st == SDPA_OK; i++) {
            double rl;
            ref_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
            int ok = close_to(l[i], rl, rtol * (fabs(rl) + 1e-30));
            for (int64_t c = 0; c < Dv; c++)
                ok = ok && close_to(o[i * Dv + c], ro[c], rtol * (fabs(ro[c]) + 1e-44));
            if (!ok && bad++ < 4)
                cr_log_error("[%s] %s row %ld: O[0] %.9g (ref %.9g) LSE %.9g (ref %.9g)", sdpa_isa_name(isas[ii]), what,
                             (long)i, Dv ? (double)o[i * Dv] : 0.0, Dv ? ro[0] : 0.0, (double)l[i], rl);
        }
        cr_expect(util_gintact(o, "O") && util_gintact(l, "LSE"));
        util_gfree(o);
        util_gfree(l);
    }
    free(ro);
    return bad;
}

Test(adversarial, extreme_scales)
{
    /* well separated scores so that even scale 1e30 has one clear winner */
    const float q[2 * 2] = {1.0f, 0.5f, -0.25f, 1.0f};
    const float k[3 * 2] = {1.0f, 0.0f, 0.0f, 1.0f, -1.0f, -1.0f};
    const float v[3 * 2] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    static const float scales[] = {1e30f, -1e30f, 1e-30f, 1e-40f /* denormal */, -0.0f, 0.0f, 3.4e38f};
    int bad = 0;
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        sdpa_problem p = prob(1, 1, 1, 2, 3, 2, 2);
        p.use_default_scale = 0;
        p.scale = scales[s];
        char what[64];
        snprintf(what, sizeof what, "scale %g", (double)scales[s]);
        bad += check_all_isas(p, q, k, v, 1e-5, what);
    }
    cr_expect_eq(bad, 0);
}

/* Inputs near 1e18 (scores near 1e36, still finite in fp32) and signed zeros:
 * one-hot softmax rows, the same on every ISA as in float64. */
Test(adversarial, huge_magnitude_and_signed_zero_inputs)
{
    enum { TQ = 7, TK = 40, D = 4 };
    util_rng r;
    util_rng_seed(&r, "adversarial.huge_magnitude", 13);
    float q[TQ * D], k[TK * D], v[TK * D];
    util_fill_normal(&r, q, TQ * D, 1e18f);
    util_fill_normal(&r, k, TK * D, 1e18f);
    util_fill_normal(&r, v, TK * D, 1.0f);
    for (int i = 0; i < D; i++) {
        q[i] = -0.0f;         /* row 0: all scores are zeros of either sign: uniform */
        k[5 * D + i] = -0.0f; /* key 5: score -0 or +0 for every row */
    }
    sdpa_problem p = prob(1, 1, 1, TQ, TK, D, D);
    p.use_default_scale = 0;
    p.scale = 1.0f;
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-5, "|x| ~ 1e18"), 0);
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.block_k = 3;
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-5, "|x| ~ 1e18, causal, block_k 3"), 0);
}

/* Denormal inputs must not be flushed to zero by any ISA (no FTZ/DAZ). */
Test(adversarial, denormal_values_not_flushed)
{
    const float tiny = 1e-40f;
    const float q[2 * 2] = {tiny, -tiny, 1.0f, 0.0f};
    const float k[3 * 2] = {tiny, 0.0f, -0.0f, tiny, 1.0f, -0.0f};
    const float v[3 * 2] = {tiny, -tiny, 2 * tiny, 3e-45f, -0.0f, 5 * tiny};
    sdpa_problem p = prob(1, 1, 1, 2, 3, 2, 2);
    cr_expect_eq(check_all_isas(p, q, k, v, 1e-4, "denormals"), 0);
}

/* Everything masked (three ways) while every input, bias excepted, is NaN:
 * O = 0, LSE = -inf, gradients exactly 0, nothing read. */
Test(adversarial, all_masked_with_all_inputs_nan)
{
    const int64_t B = 2, H = 2, Tq = 5, Tk = 37, D = 9;
    const size_t nq = (size_t)(B * H * Tq * D), nk = (size_t)(B * H * Tk * D);
    float *q = util_galloc_fill(nq, NAN), *k = util_galloc_fill(nk, NAN), *v = util_galloc_fill(nk, NAN),
          *dO = util_galloc_fill(nq, NAN);
    float *bias = util_galloc_fill((size_t)(Tq * Tk), -INFINITY);
    uint8_t zeros[1] = {0};
    int32_t kvl[2] = {0, 0};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int how = 0; how < 3; how++)
        for (int ii = 0; ii < nisa; ii++)
            for (int bk = 0; bk < 2; bk++) {
                sdpa_problem p = prob(B, H, H, Tq, Tk, D, D);
                p.isa = isas[ii];
                p.block_k = bk ? 1 : 0; /* 1: the split-KV path for this short Tq */
                if (how == 0)
                    p.bias = (sdpa_bias){bias, 0, 0, Tk, 1};
                else if (how == 1)
                    p.bool_mask = (sdpa_bool_mask){zeros, 0, 0, 0, 0};
                else
                    p.kv_lengths = kvl;
                float *o = util_galloc(nq), *l = util_galloc((size_t)(B * H * Tq)), *dq = util_galloc(nq),
                      *dk = util_galloc(nk), *dv = util_galloc(nk);
                const sdpa_tensor tq = util_cview(q, H, Tq, D), tk = util_cview(k, H, Tk, D), tv = util_cview(v, H, Tk, D),
                                  tdo = util_cview(dO, H, Tq, D);
                const sdpa_tensor_out to = util_cview_out(o, H, Tq, D), tl = util_lse_view_out(l, H, Tq),
                                      odq = util_cview_out(dq, H, Tq, D), odk = util_cview_out(dk, H, Tk, D),
                                      odv = util_cview_out(dv, H, Tk, D);
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
                const sdpa_tensor oi = util_cview(o, H, Tq, D), li = util_lse_view(l, H, Tq);
                cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
                int bad = 0;
                for (size_t i = 0; i < nq; i++)
                    bad += o[i] != 0.0f || dq[i] != 0.0f;
                for (size_t i = 0; i < (size_t)(B * H * Tq); i++)
                    bad += l[i] != -INFINITY;
                for (size_t i = 0; i < nk; i++)
                    bad += dk[i] != 0.0f || dv[i] != 0.0f;
                cr_expect_eq(bad, 0, "[%s] how=%d bk=%d: %d wrong values", sdpa_isa_name(isas[ii]), how, bk, bad);
                util_gfree(o);
                util_gfree(l);
                util_gfree(dq);
                util_gfree(dk);
                util_gfree(dv);
            }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(dO);
    util_gfree(bias);
}

/* A NaN or +inf bias entry at an allowed position poisons exactly its row, also
 * when it sits alone in a split-KV chunk whose other keys are all masked. */
Test(adversarial, bias_nan_or_inf_poisons_only_its_row)
{
    const int64_t Tq = 3, Tk = 300, D = 4;
    util_rng r;
    util_rng_seed(&r, "adversarial.bias_nan", 3);
    float *q = util_galloc(Tq * D), *k = util_galloc(Tk * D), *v = util_galloc(Tk * D);
    util_fill_normal(&r, q, Tq * D, 1.0f);
    util_fill_normal(&r, k, Tk * D, 1.0f);
    util_fill_normal(&r, v, Tk * D, 1.0f);
    float *bias = util_galloc_fill((size_t)(Tq * Tk), 0.0f);
    for (int64_t j = 280; j < 300; j++)
        bias[1 * Tk + j] = -INFINITY;
    static const float poison[] = {NAN, INFINITY};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int pi = 0; pi < 2; pi++) {
        bias[1 * Tk + 290] = poison[pi];
        for (int ii = 0; ii < nisa; ii++)
            for (int bk = 0; bk < 3; bk++) {
                sdpa_problem p = prob(1, 1, 1, Tq, Tk, D, D);
                p.isa = isas[ii];
                p.block_k = bk == 0 ? 0 : bk == 1 ? 4 : 1;
                p.bias = (sdpa_bias){bias, 0, 0, Tk, 1};
                float *o = util_galloc(Tq * D), *l = util_galloc(Tq);
                const sdpa_tensor tq = util_cview(q, 1, Tq, D), tk = util_cview(k, 1, Tk, D), tv = util_cview(v, 1, Tk, D);
                const sdpa_tensor_out to = util_cview_out(o, 1, Tq, D), tl = util_lse_view_out(l, 1, Tq);
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
                for (int64_t i = 0; i < Tq; i++) {
                    const int want_nan = i == 1;
                    int ok = want_nan ? isnan(l[i]) : isfinite(l[i]);
                    for (int64_t c = 0; c < D; c++)
                        ok = ok && (want_nan ? isnan(o[i * D + c]) : isfinite(o[i * D + c]));
                    cr_expect(ok, "[%s] bias %g, block_k %d: row %ld has O[0] = %g, LSE = %g", sdpa_isa_name(isas[ii]),
                              (double)poison[pi], p.block_k, (long)i, (double)o[i * D], (double)l[i]);
                }
                util_gfree(o);
                util_gfree(l);
            }
    }
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
    util_gfree(bias);
}

/* ============================================ invalid arguments ====== */

typedef struct inv_env {
    float *q, *k, *v, *o, *l, *dq, *dk, *dv, *dO;
    float *snap[9];
} inv_env;

enum { IV_T = 4, IV_D = 3, IV_N = IV_T * IV_D };

static void inv_snap(inv_env *e)
{
    float *b[9] = {e->q, e->k, e->v, e->o, e->l, e->dq, e->dk, e->dv, e->dO};
    for (int i = 0; i < 9; i++)
        e->snap[i] = util_gdup(b[i], util_glen(b[i]));
}

static int inv_unchanged(const inv_env *e)
{
    const float *b[9] = {e->q, e->k, e->v, e->o, e->l, e->dq, e->dk, e->dv, e->dO};
    for (int i = 0; i < 9; i++) {
        const size_t n = util_glen(b[i]) + 2 * UTIL_GUARD_FLOATS;
        if (memcmp(b[i] - UTIL_GUARD_FLOATS, e->snap[i] - UTIL_GUARD_FLOATS, n * sizeof(float)) != 0)
            return 0;
    }
    return 1;
}

/* Each invalid call must return its status and write nothing (guards included). */
Test(adversarial, invalid_arguments_write_nothing)
{
    inv_env e;
    e.q = util_galloc_fill(IV_N, 0.5f);
    e.k = util_galloc_fill(IV_N, 0.25f);
    e.v = util_galloc_fill(IV_N, 1.0f);
    e.dO = util_galloc_fill(IV_N, 1.0f);
    e.o = util_galloc(IV_N);
    e.l = util_galloc(IV_T);
    e.dq = util_galloc(IV_N);
    e.dk = util_galloc(IV_N);
    e.dv = util_galloc(IV_N);
    inv_snap(&e);
    float *kvbuf = util_galloc_fill(IV_N, 0.0f);
    const int32_t four = 4;
    memcpy(kvbuf + 5, &four, sizeof four);
    float *kvsnap = util_gdup(kvbuf, IV_N);
    int32_t kvl[2] = {4, 4}, kvl_bad[1] = {INT32_MIN};
    const sdpa_tensor q = {e.q, IV_N, IV_N, IV_D}, k = {e.k, IV_N, IV_N, IV_D}, v = {e.v, IV_N, IV_N, IV_D},
                      dO = {e.dO, IV_N, IV_N, IV_D}, oin = {e.v, IV_N, IV_N, IV_D}, lin = {e.q, IV_T, IV_T, 1};
    const sdpa_tensor_out o = {e.o, IV_N, IV_N, IV_D}, l = {e.l, IV_T, IV_T, 1}, dq = {e.dq, IV_N, IV_N, IV_D},
                          dk = {e.dk, IV_N, IV_N, IV_D}, dv = {e.dv, IV_N, IV_N, IV_D};
    struct {
        const char *name;
        sdpa_status want;
        sdpa_problem p;
        sdpa_tensor_out o, l, dq;
    } c[40];
    int n = 0;
#define CASE(nm, st, ...)                                                                                          \
    do {                                                                                                           \
        c[n].name = nm;                                                                                            \
        c[n].want = st;                                                                                            \
        c[n].p = prob(1, 1, 1, IV_T, IV_T, IV_D, IV_D);                                                            \
        c[n].o = o;                                                                                                \
        c[n].l = l;                                                                                                \
        c[n].dq = dq;                                                                                              \
        {                                                                                                          \
            sdpa_problem *PP = &c[n].p;                                                                             \
            (void)PP;                                                                                              \
            __VA_ARGS__;                                                                                           \
        }                                                                                                          \
        n++;                                                                                                       \
    } while (0)
    CASE("struct_size garbage", SDPA_ERR_BAD_DESCRIPTOR, PP->struct_size = 0xdeadbeef);
    CASE("struct_size one less", SDPA_ERR_BAD_DESCRIPTOR, PP->struct_size -= 1);
    CASE("reserved[7]", SDPA_ERR_BAD_DESCRIPTOR, PP->reserved[7] = 1);
    CASE("causal 3", SDPA_ERR_BAD_DESCRIPTOR, PP->causal = (sdpa_causal)3);
    CASE("causal -1", SDPA_ERR_BAD_DESCRIPTOR, PP->causal = (sdpa_causal)-1);
    CASE("alignment 2", SDPA_ERR_BAD_DESCRIPTOR, PP->window_alignment = (sdpa_alignment)2);
    CASE("use_default_scale 2", SDPA_ERR_BAD_DESCRIPTOR, PP->use_default_scale = 2);
    CASE("isa 4", SDPA_ERR_BAD_DESCRIPTOR, PP->isa = (sdpa_isa)4);
    CASE("isa -2", SDPA_ERR_BAD_DESCRIPTOR, PP->isa = (sdpa_isa)-2);
    CASE("B INT64_MIN", SDPA_ERR_NEGATIVE_SIZE, PP->batch = INT64_MIN);
    CASE("Dv -1", SDPA_ERR_NEGATIVE_SIZE, PP->head_dim_v = -1);
    CASE("Hkv 0", SDPA_ERR_HEAD_GROUPING, PP->kv_heads = 0);
    CASE("Hq 3 Hkv 2", SDPA_ERR_HEAD_GROUPING, PP->q_heads = 3; PP->kv_heads = 2);
    CASE("scale NaN", SDPA_ERR_BAD_SCALE, PP->use_default_scale = 0; PP->scale = NAN);
    CASE("scale -inf", SDPA_ERR_BAD_SCALE, PP->use_default_scale = 0; PP->scale = -INFINITY);
    CASE("window_left INT64_MIN", SDPA_ERR_BAD_WINDOW, PP->window_left = INT64_MIN);
    CASE("window_right -2", SDPA_ERR_BAD_WINDOW, PP->window_right = -2);
    CASE("num_threads INT_MIN", SDPA_ERR_BAD_THREADS, PP->num_threads = INT32_MIN);
    CASE("block_q 513", SDPA_ERR_BAD_BLOCK_SIZE, PP->block_q = SDPA_MAX_BLOCK + 1);
    CASE("block_k INT_MIN", SDPA_ERR_BAD_BLOCK_SIZE, PP->block_k = INT32_MIN);
    CASE("Dk > INT32_MAX", SDPA_ERR_SIZE_OVERFLOW, PP->head_dim_qk = (int64_t)INT32_MAX + 1);
    CASE("kv_lengths INT32_MIN", SDPA_ERR_BAD_KV_LENGTH, PP->kv_lengths = kvl_bad);
    CASE("kv_lengths > Tk", SDPA_ERR_BAD_KV_LENGTH, PP->kv_len = 3; PP->kv_lengths = kvl);
    CASE("bool mask stride INT64_MIN", SDPA_ERR_BAD_STRIDE,
         PP->bool_mask = (sdpa_bool_mask){(const uint8_t *)e.q, 0, 0, 0, INT64_MIN});
    CASE("bias extent overflow", SDPA_ERR_SIZE_OVERFLOW, PP->bias = (sdpa_bias){e.q, 0, 0, INT64_MAX, INT64_MAX});
    CASE("Tq INT64_MAX (Q broadcast, O real)", SDPA_ERR_SIZE_OVERFLOW, PP->q_len = INT64_MAX);
    CASE("output overlaps the bias", SDPA_ERR_ALIASING, PP->bias = (sdpa_bias){e.o + 2, 0, 0, 0, 0});
    CASE("output overlaps kv_lengths", SDPA_ERR_ALIASING, c[n].o.data = kvbuf;
         PP->kv_lengths = (const int32_t *)(kvbuf + 5));
    CASE("output overlaps the bool mask", SDPA_ERR_ALIASING,
         PP->bool_mask = (sdpa_bool_mask){(const uint8_t *)e.o + 7, 0, 0, 0, 0});
    CASE("LSE inside O", SDPA_ERR_ALIASING, c[n].l.data = e.o + 1);
    CASE("O seq stride 0", SDPA_ERR_BAD_STRIDE, c[n].o.seq_stride = 0);
    CASE("O rows overlap (stride D-1)", SDPA_ERR_BAD_STRIDE, c[n].o.seq_stride = IV_D - 1);
    CASE("LSE stride -1", SDPA_ERR_BAD_STRIDE, c[n].l.seq_stride = -1);
    CASE("O stride INT64_MAX", SDPA_ERR_SIZE_OVERFLOW, c[n].o.seq_stride = INT64_MAX);
    CASE("NULL O data", SDPA_ERR_NULL_ARGUMENT, c[n].o.data = NULL);
    CASE("dQ overlaps the LSE input", SDPA_ERR_ALIASING, c[n].dq.data = e.q + 2);
#undef CASE
    for (int i = 0; i < n; i++) {
        const int bwd_only = strncmp(c[i].name, "dQ", 2) == 0;
        if (!bwd_only) {
            const sdpa_status st = sdpa_forward(&c[i].p, &q, &k, &v, &c[i].o, &c[i].l);
            cr_expect_eq(st, c[i].want, "forward, %s: status %d (%s), want %d", c[i].name, (int)st,
                         sdpa_status_string(st), (int)c[i].want);
            cr_expect(inv_unchanged(&e), "forward, %s: an output was written", c[i].name);
        }
        const int fwd_only = strncmp(c[i].name, "LSE", 3) == 0 || strncmp(c[i].name, "O ", 2) == 0 ||
                             strncmp(c[i].name, "NULL O", 6) == 0;
        if (!fwd_only) {
            sdpa_tensor_out dqo = c[i].dq;
            if (strncmp(c[i].name, "output overlaps", 15) == 0)
                dqo.data = c[i].o.data; /* the same overlap, through dQ */
            const sdpa_status st = sdpa_backward(&c[i].p, &q, &k, &v, &oin, &lin, &dO, &dqo, &dk, &dv);
            cr_expect_eq(st, c[i].want, "backward, %s: status %d (%s), want %d", c[i].name, (int)st,
                         sdpa_status_string(st), (int)c[i].want);
            cr_expect(inv_unchanged(&e), "backward, %s: an output was written", c[i].name);
        }
    }
    cr_expect(memcmp(kvbuf - UTIL_GUARD_FLOATS, kvsnap - UTIL_GUARD_FLOATS,
                     (IV_N + 2 * UTIL_GUARD_FLOATS) * sizeof(float)) == 0,
              "the buffer holding kv_lengths was written");
    util_gfree(kvbuf);
    util_gfree(kvsnap);
    float *all[9] = {e.q, e.k, e.v, e.o, e.l, e.dq, e.dk, e.dv, e.dO};
    for (int i = 0; i < 9; i++) {
        util_gfree(all[i]);
        util_gfree(e.snap[i]);
    }
}

/* A descriptor full of garbage is refused; a valid one whose enum and int
 * fields are garbage either fails without writing or computes the reference. */
Test(adversarial, garbage_descriptors, .timeout = 120)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.garbage_descriptors", 11);
    const int64_t T = 6, D = 3;
    float *q = util_galloc(T * D), *k = util_galloc(T * D), *v = util_galloc(T * D);
    util_fill_normal(&r, q, T * D, 1.0f);
    util_fill_normal(&r, k, T * D, 1.0f);
    util_fill_normal(&r, v, T * D, 1.0f);
    const sdpa_tensor tq = util_cview(q, 1, T, D), tk = util_cview(k, 1, T, D), tv = util_cview(v, 1, T, D);
    int bad = 0;
    for (int it = 0; it < 3000; it++) {
        sdpa_problem p;
        unsigned char *raw = (unsigned char *)&p;
        for (size_t i = 0; i < sizeof p; i++)
            raw[i] = (unsigned char)util_rng_u64(&r);
        float *o = util_galloc(T * D), *l = util_galloc(T);
        const sdpa_tensor_out to = util_cview_out(o, 1, T, D), tl = util_lse_view_out(l, 1, T);
        sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, &tl);
        if (p.struct_size != sizeof p && st != SDPA_ERR_BAD_DESCRIPTOR && bad++ < 5)
            cr_log_error("random bytes: status %d", (int)st);
        /* now a valid frame with garbage in the enums and integers */
        sdpa_problem g = p;
        sdpa_problem_init(&p);
        p.batch = p.q_heads = p.kv_heads = 1;
        p.q_len = p.kv_len = T;
        p.head_dim_qk = p.head_dim_v = D;
        const int pick_field = (int)util_rng_int(&r, 0, 9);
        const int64_t small_wins[] = {-3, -1, 0, 1, 2, 7, INT64_MAX, INT64_MIN, g.window_left, g.window_right};
        switch (pick_field) {
        case 0: p.causal = g.causal; break;
        case 1: p.window_alignment = g.window_alignment; p.window_left = small_wins[util_rng_int(&r, 0, 9)]; break;
        case 2: p.use_default_scale = g.use_default_scale; p.scale = g.scale; break;
        case 3: p.isa = g.isa; break;
        case 4: p.num_threads = g.num_threads < 0 || g.num_threads > 8 ? -abs(g.num_threads % 1000) - 1 : g.num_threads; break;
        case 5: p.block_q = g.block_q; p.block_k = (int)util_rng_int(&r, -2, 600); break;
        case 6: p.window_left = small_wins[util_rng_int(&r, 0, 9)]; p.window_right = small_wins[util_rng_int(&r, 0, 9)];
                p.causal = (sdpa_causal)util_rng_int(&r, 0, 2); break;
        case 7: p.reserved0 = g.reserved0; break;
        case 8: p.reserved[util_rng_int(&r, 0, 7)] = g.reserved[0]; break;
        default: p.use_default_scale = 0; p.scale = g.scale; p.causal = (sdpa_causal)util_rng_int(&r, 0, 2); break;
        }
        util_gfree(o);
        util_gfree(l);
        o = util_galloc(T * D);
        l = util_galloc(T);
        const sdpa_tensor_out to2 = util_cview_out(o, 1, T, D), tl2 = util_lse_view_out(l, 1, T);
        st = sdpa_forward(&p, &tq, &tk, &tv, &to2, &tl2);
        if (st != SDPA_OK) {
            int written = 0;
            for (int64_t i = 0; i < T * D; i++)
                written |= !util_is_sentinel(o[i]);
            for (int64_t i = 0; i < T; i++)
                written |= !util_is_sentinel(l[i]);
            if (written && bad++ < 5)
                cr_log_error("field %d: status %d but outputs were written", pick_field, (int)st);
        } else if (p.use_default_scale || fabsf(p.scale) <= 10.0f) {
            double ro[3], rl;
            for (int64_t i = 0; i < T; i++) {
                ref_row(&p, &tq, &tk, &tv, 0, 0, i, ro, &rl);
                int ok = close_to(l[i], rl, 1e-4 * (1 + fabs(rl)));
                for (int c = 0; c < D; c++)
                    ok = ok && close_to(o[i * D + c], ro[c], 1e-4 * (1 + fabs(ro[c])));
                if (!ok && bad++ < 5)
                    cr_log_error("field %d (causal %d wl %ld wr %ld scale %g): row %ld LSE %g vs %g", pick_field,
                                 (int)p.causal, (long)p.window_left, (long)p.window_right, (double)p.scale, (long)i,
                                 (double)l[i], rl);
            }
        }
        cr_expect(util_gintact(o, "O") && util_gintact(l, "LSE"));
        util_gfree(o);
        util_gfree(l);
    }
    cr_expect_eq(bad, 0, "%d garbage descriptor(s) mishandled", bad);
    util_gfree(q);
    util_gfree(k);
    util_gfree(v);
}

/* Outputs written concurrently with sdpa_force_isa() flipping the default ISA:
 * every AUTO call must equal, bit for bit, the result of one supported ISA. */
typedef struct race_ctx {
    const sdpa_tensor *q, *k, *v;
    const float *want[SDPA_ISA_COUNT];
    int nisa;
    sdpa_isa isas[SDPA_ISA_COUNT];
    atomic_int stop;
    atomic_int bad;
    atomic_int calls;
} race_ctx;

enum { RACE_T = 70, RACE_D = 24 };

static void *race_compute(void *arg)
{
    race_ctx *c = arg;
    float *o = malloc(RACE_T * RACE_D * sizeof(float));
    while (!atomic_load(&c->stop)) {
        sdpa_problem p = prob(1, 1, 1, RACE_T, RACE_T, RACE_D, RACE_D);
        p.causal = SDPA_CAUSAL_TOP_LEFT;
        p.num_threads = 1;
        const sdpa_tensor_out to = util_cview_out(o, 1, RACE_T, RACE_D);
        if (sdpa_forward(&p, c->q, c->k, c->v, &to, NULL) != SDPA_OK) {
            atomic_fetch_add(&c->bad, 1);
            continue;
        }
        int match = 0;
        for (int i = 0; i < c->nisa; i++)
            match |= same_bits(o, c->want[i], RACE_T * RACE_D);
        if (!match)
            atomic_fetch_add(&c->bad, 1);
        atomic_fetch_add(&c->calls, 1);
    }
    free(o);
    return NULL;
}

static void *race_force(void *arg)
{
    race_ctx *c = arg;
    unsigned i = 0;
    while (!atomic_load(&c->stop)) {
        if (sdpa_force_isa(c->isas[i++ % (unsigned)c->nisa]) != SDPA_OK)
            atomic_fetch_add(&c->bad, 1);
        (void)sdpa_force_isa(SDPA_ISA_NEON + 1); /* refused, changes nothing */
    }
    return NULL;
}

Test(adversarial, force_isa_races_with_computation, .timeout = 60)
{
    race_ctx c;
    memset(&c, 0, sizeof c);
    c.nisa = util_isas(c.isas);
    util_rng r;
    util_rng_seed(&r, "adversarial.race", 5);
    float *q = malloc(RACE_T * RACE_D * sizeof(float)), *k = malloc(RACE_T * RACE_D * sizeof(float)),
          *v = malloc(RACE_T * RACE_D * sizeof(float));
    util_fill_normal(&r, q, RACE_T * RACE_D, 1.0f);
    util_fill_normal(&r, k, RACE_T * RACE_D, 1.0f);
    util_fill_normal(&r, v, RACE_T * RACE_D, 1.0f);
    const sdpa_tensor tq = util_cview(q, 1, RACE_T, RACE_D), tk = util_cview(k, 1, RACE_T, RACE_D),
                      tv = util_cview(v, 1, RACE_T, RACE_D);
    c.q = &tq;
    c.k = &tk;
    c.v = &tv;
    for (int i = 0; i < c.nisa; i++) {
        float *o = malloc(RACE_T * RACE_D * sizeof(float));
        sdpa_problem p = prob(1, 1, 1, RACE_T, RACE_T, RACE_D, RACE_D);
        p.causal = SDPA_CAUSAL_TOP_LEFT;
        p.num_threads = 1;
        p.isa = c.isas[i];
        const sdpa_tensor_out to = util_cview_out(o, 1, RACE_T, RACE_D);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, NULL), SDPA_OK);
        c.want[i] = o;
    }
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, i < 2 ? race_compute : race_force, &c);
    struct timespec ts = {0, 400 * 1000 * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&c.stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(sdpa_force_isa(SDPA_ISA_AUTO), SDPA_OK);
    cr_expect_eq(atomic_load(&c.bad), 0, "%d bad results / refused forces", atomic_load(&c.bad));
    cr_expect_gt(atomic_load(&c.calls), 0);
    for (int i = 0; i < c.nisa; i++)
        free((void *)c.want[i]);
    free(q);
    free(k);
    free(v);
}

/* dQ, dK, dV as views of one buffer with random nested layouts (dimension order,
 * padding, room for interleaving) and random relative offsets. Against a
 * brute-force element overlap: any shared element must give SDPA_ERR_ALIASING
 * and leave the buffer untouched; views of one layout that share nothing must
 * be accepted (the aliasing test is exact for them) and give the bits of
 * separate buffers, touching nothing else. */
typedef struct lay {
    int64_t s[3]; /* batch, head, seq strides */
    int64_t extent;
} lay;

static lay random_layout(util_rng *r, const int64_t n[3], int64_t D)
{
    int order[3] = {0, 1, 2};
    for (int i = 2; i > 0; i--) {
        const int j = (int)util_rng_int(r, 0, i), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    lay L;
    int64_t E = D + util_rng_int(r, 0, 1); /* row length with optional padding */
    for (int i = 0; i < 3; i++) {          /* innermost first */
        const int d = order[i];
        L.s[d] = E * util_rng_int(r, 1, 3) + util_rng_int(r, 0, 1);
        E = L.s[d] * (n[d] - 1) + E;
    }
    L.extent = E;
    return L;
}

static void mark(uint8_t *m, int64_t off, const lay *L, const int64_t n[3], int64_t D)
{
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t h = 0; h < n[1]; h++)
            for (int64_t t = 0; t < n[2]; t++)
                for (int64_t c = 0; c < D; c++)
                    m[off + b * L->s[0] + h * L->s[1] + t * L->s[2] + c] = 1;
}

Test(adversarial, interleaved_outputs_random_layouts, .timeout = 120)
{
    util_rng r;
    util_rng_seed(&r, "adversarial.interleaved", 21);
    int bad = 0, accepted = 0, refused = 0;
    for (int it = 0; it < 400 && bad < 5; it++) {
        const int64_t B = util_rng_int(&r, 1, 2), H = util_rng_int(&r, 1, 3), T = util_rng_int(&r, 1, 5),
                      D = util_rng_int(&r, 1, 4);
        const int64_t n[3] = {B, H, T};
        const int same = util_rng_int(&r, 0, 3) != 0;
        lay L[3];
        L[0] = random_layout(&r, n, D);
        for (int v = 1; v < 3; v++)
            L[v] = same ? L[0] : random_layout(&r, n, D);
        int64_t maxext = 0;
        for (int v = 0; v < 3; v++)
            maxext = L[v].extent > maxext ? L[v].extent : maxext;
        int64_t off[3];
        for (int v = 0; v < 3; v++) {
            /* a multiple of a stride or row length, plus a small jitter */
            const int64_t unit = util_rng_int(&r, 0, 1) ? L[0].s[util_rng_int(&r, 0, 2)] : D;
            off[v] = util_rng_int(&r, 0, 3) * unit + (util_rng_int(&r, 0, 4) == 0 ? util_rng_int(&r, 0, 2) : 0);
        }
        const int64_t size = off[0] + off[1] + off[2] + maxext + 1;
        uint8_t *m[3];
        int overlap = 0;
        for (int v = 0; v < 3; v++) {
            m[v] = calloc((size_t)size, 1);
            mark(m[v], off[v], &L[v], n, D);
        }
        for (int64_t e = 0; e < size; e++)
            overlap |= (m[0][e] + m[1][e] + m[2][e]) > 1;
        /* inputs: separate contiguous tensors */
        sdpa_problem p = prob(B, H, H, T, T, D, D);
        p.causal = (sdpa_causal)util_rng_int(&r, 0, 2);
        const size_t ne = (size_t)(B * H * T * D);
        float *q = malloc(ne * sizeof(float)), *k = malloc(ne * sizeof(float)), *vv = malloc(ne * sizeof(float)),
              *dO = malloc(ne * sizeof(float)), *o = malloc(ne * sizeof(float)), *l = malloc((size_t)(B * H * T) * sizeof(float));
        util_fill_normal(&r, q, ne, 1.0f);
        util_fill_normal(&r, k, ne, 1.0f);
        util_fill_normal(&r, vv, ne, 1.0f);
        util_fill_normal(&r, dO, ne, 1.0f);
        const sdpa_tensor tq = util_cview(q, H, T, D), tk = util_cview(k, H, T, D), tv = util_cview(vv, H, T, D),
                          tdo = util_cview(dO, H, T, D), to = util_cview(o, H, T, D), tl = util_lse_view(l, H, T);
        const sdpa_tensor_out wo = util_cview_out(o, H, T, D), wl = util_lse_view_out(l, H, T);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &wo, &wl), SDPA_OK);
        /* reference gradients into separate buffers */
        float *sep[3];
        for (int v = 0; v < 3; v++)
            sep[v] = malloc(ne * sizeof(float));
        const sdpa_tensor_out s0 = util_cview_out(sep[0], H, T, D), s1 = util_cview_out(sep[1], H, T, D),
                              s2 = util_cview_out(sep[2], H, T, D);
        cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &s0, &s1, &s2), SDPA_OK);
        float *buf = util_galloc((size_t)size);
        sdpa_tensor_out g[3];
        for (int v = 0; v < 3; v++)
            g[v] = (sdpa_tensor_out){buf + off[v], L[v].s[0], L[v].s[1], L[v].s[2]};
        const sdpa_status st = sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &g[0], &g[1], &g[2]);
        char what[200];
        snprintf(what, sizeof what, "it %d B=%ld H=%ld T=%ld D=%ld same=%d off=%ld,%ld,%ld overlap=%d", it, (long)B,
                 (long)H, (long)T, (long)D, same, (long)off[0], (long)off[1], (long)off[2], overlap);
        if (overlap || st != SDPA_OK) {
            refused += st == SDPA_ERR_ALIASING;
            int untouched = 1;
            for (int64_t e = 0; e < size; e++)
                untouched &= util_is_sentinel(buf[e]);
            if ((overlap && st != SDPA_ERR_ALIASING) || (!overlap && !(st == SDPA_ERR_ALIASING && !same)) || !untouched)
                if (bad++ < 5)
                    cr_log_error("status %d, untouched %d: %s", (int)st, untouched, what);
        } else {
            accepted++;
            int ok = 1;
            for (int v = 0; v < 3; v++)
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t t = 0; t < T; t++)
                            ok &= same_bits(buf + off[v] + b * L[v].s[0] + h * L[v].s[1] + t * L[v].s[2],
                                            sep[v] + ((b * H + h) * T + t) * D, (size_t)D);
            for (int64_t e = 0; e < size; e++)
                if (!m[0][e] && !m[1][e] && !m[2][e])
                    ok &= util_is_sentinel(buf[e]);
            ok &= util_gintact(buf, "packed gradients");
            if (!ok && bad++ < 5)
                cr_log_error("accepted but wrong or wrote outside the views: %s", what);
        }
        util_gfree(buf);
        for (int v = 0; v < 3; v++) {
            free(m[v]);
            free(sep[v]);
        }
        free(q);
        free(k);
        free(vv);
        free(dO);
        free(o);
        free(l);
    }
    cr_log_info("interleaved layouts: %d accepted, %d refused", accepted, refused);
    cr_expect_eq(bad, 0, "%d wrong aliasing decision(s)", bad);
    cr_expect_gt(accepted, 20);
    cr_expect_gt(refused, 20);
}

/* ============================================================ bugs ===== */

/* REGRESSION (a bug found by the adversarial review, now fixed): a key disallowed by a -inf bias entry is
 * still read. src/sdpa.c mask_tile() (element-wise branch) computes the score
 * from K, then does `*sv += bias_at(...)` when the interval and boolean masks
 * allow the key, relying on x + (-inf) = -inf; but NaN + (-inf) = NaN, so a
 * NaN in a K row that the bias masks (padding, a common use of additive
 * masks) makes the whole query row NaN, and the backward spreads it to dQ, dK,
 * dV. The same happens for a fully masked query row (bias all -inf) whose Q
 * holds NaN, as soon as another row of its tile keeps a key. Contract: "a bias
 * of -inf disallows the key", "masked positions are never read". Fix: treat a
 * -inf bias as !ok (store -inf), do not add it. */
Test(adversarial, bug_nan_key_masked_by_bias)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++) {
        /* (a) one query, keys 0 and 1; the bias masks key 1, whose K and V rows are NaN */
        {
            const float q[1] = {1.0f}, k[2] = {0.5f, NAN}, v[2] = {3.0f, NAN}, bias[2] = {0.0f, -INFINITY};
            sdpa_problem p = prob(1, 1, 1, 1, 2, 1, 1);
            p.isa = isas[ii];
            p.bias = (sdpa_bias){bias, 0, 0, 0, 1};
            float o[1], l[1];
            const sdpa_tensor tq = util_cview(q, 1, 1, 1), tk = util_cview(k, 1, 2, 1), tv = util_cview(v, 1, 2, 1);
            const sdpa_tensor_out to = util_cview_out(o, 1, 1, 1), tl = util_lse_view_out(l, 1, 1);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            cr_expect(o[0] == 3.0f && fabsf(l[0] - 0.5f) < 1e-6f, "[%s] (a) O = %g, LSE = %g; want 3 and 0.5",
                      sdpa_isa_name(isas[ii]), (double)o[0], (double)l[0]);
        }
        /* (b) two queries; row 1 is fully masked by the bias and its Q is NaN */
        {
            const float q[2] = {1.0f, NAN}, k[2] = {0.5f, 0.25f}, v[2] = {3.0f, 5.0f};
            const float bias[4] = {0.0f, 0.0f, -INFINITY, -INFINITY};
            sdpa_problem p = prob(1, 1, 1, 2, 2, 1, 1);
            p.isa = isas[ii];
            p.bias = (sdpa_bias){bias, 0, 0, 2, 1};
            float o[2], l[2];
            const sdpa_tensor tq = util_cview(q, 1, 2, 1), tk = util_cview(k, 1, 2, 1), tv = util_cview(v, 1, 2, 1);
            const sdpa_tensor_out to = util_cview_out(o, 1, 2, 1), tl = util_lse_view_out(l, 1, 2);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            cr_expect(o[1] == 0.0f && l[1] == -INFINITY, "[%s] (b) fully masked row: O = %g, LSE = %g; want 0, -inf",
                      sdpa_isa_name(isas[ii]), (double)o[1], (double)l[1]);
        }
    }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): a NaN in an ALLOWED V row disappears when
 * its probability underflows to 0 and the key tile is "partial". src/sdpa.c
 * fwd_item passes SDPA_GEMM_SKIP_ZERO_B / _A to the P.V gemm on every partial
 * tile (sdpa.c, the two kt->gemm calls after online_softmax), and a tile is
 * partial as soon as any bool mask or bias is given, or a causal/window edge
 * crosses it. So adding an all-ones boolean mask or an all-zero bias (which
 * change nothing mathematically) turns O from NaN into a finite number.
 * Contract: "A NaN or Inf in an allowed input propagates" (design.md 1); the
 * float64 reference gives exp(-141) * NaN = NaN. */
Test(adversarial, bug_nan_in_allowed_v_hidden_by_neutral_mask)
{
    /* two keys, both allowed; score of key 1 = -200/sqrt(1) far below key 0 */
    const float q[2] = {1.0f, 1.0f}, k[2] = {0.0f, -200.0f}, v[2] = {1.0f, NAN};
    const float zero_bias[4] = {0, 0, 0, 0};
    const uint8_t ones[4] = {1, 1, 1, 1};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (int variant = 0; variant < 3; variant++) {
            sdpa_problem p = prob(1, 1, 1, 2, 2, 1, 1);
            p.isa = isas[ii];
            if (variant == 1)
                p.bias = (sdpa_bias){zero_bias, 0, 0, 2, 1};
            if (variant == 2)
                p.bool_mask = (sdpa_bool_mask){ones, 0, 0, 2, 1};
            float o[2], l[2];
            const sdpa_tensor tq = util_cview(q, 1, 2, 1), tk = util_cview(k, 1, 2, 1), tv = util_cview(v, 1, 2, 1);
            const sdpa_tensor_out to = util_cview_out(o, 1, 2, 1), tl = util_lse_view_out(l, 1, 2);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            static const char *const names[] = {"no mask", "all-zero bias", "all-ones bool mask"};
            cr_expect(isnan(o[0]) && isnan(o[1]), "[%s] %s: O = (%g, %g), expected NaN (V[1] = NaN is allowed)",
                      sdpa_isa_name(isas[ii]), names[variant], (double)o[0], (double)o[1]);
        }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): the same in the backward. dS is forced to
 * exactly 0 wherever P == 0 (kernels bwd_dscores: "exactly 0 where P == 0"),
 * and the dV / dK / dQ gemms skip zero terms on partial tiles, so a NaN dO row
 * of an allowed query whose P to key 0 underflowed never reaches dV[0] (with a
 * mask) and never reaches dK[0] (even without one). Reference: P = exp(-200),
 * dV[0] = P00 dO0 + P10 dO1 = NaN, dK[0] = NaN. */
Test(adversarial, bug_nan_in_allowed_dout_hidden_by_underflow)
{
    const float q[2] = {1.0f, 1.0f}, k[2] = {-200.0f, 0.0f}, v[2] = {1.0f, 2.0f}, dO[2] = {1.0f, NAN};
    const uint8_t ones[4] = {1, 1, 1, 1};
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int nisa = util_isas(isas);
    for (int ii = 0; ii < nisa; ii++)
        for (int variant = 0; variant < 2; variant++) {
            sdpa_problem p = prob(1, 1, 1, 2, 2, 1, 1);
            p.isa = isas[ii];
            p.use_default_scale = 0;
            p.scale = 1.0f;
            if (variant)
                p.bool_mask = (sdpa_bool_mask){ones, 0, 0, 2, 1};
            float o[2], l[2], dq[2], dk[2], dv[2];
            const sdpa_tensor tq = util_cview(q, 1, 2, 1), tk = util_cview(k, 1, 2, 1), tv = util_cview(v, 1, 2, 1),
                              tdo = util_cview(dO, 1, 2, 1), oi = util_cview(o, 1, 2, 1), li = util_lse_view(l, 1, 2);
            const sdpa_tensor_out to = util_cview_out(o, 1, 2, 1), tl = util_lse_view_out(l, 1, 2),
                                  odq = util_cview_out(dq, 1, 2, 1), odk = util_cview_out(dk, 1, 2, 1),
                                  odv = util_cview_out(dv, 1, 2, 1);
            cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &oi, &li, &tdo, &odq, &odk, &odv), SDPA_OK);
            cr_expect(isnan(dv[0]) && isnan(dk[0]), "[%s] %s: dV[0] = %g, dK[0] = %g, expected NaN",
                      sdpa_isa_name(isas[ii]), variant ? "all-ones mask" : "no mask", (double)dv[0], (double)dk[0]);
        }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): Tk near INT64_MAX is legal with
 * broadcast K/V (seq_stride 0) and a small allowed range (kv_lengths, causal,
 * or a window), but src/sdpa.c fwd_make_layout computes
 * L.nkt = (Tk + bk - 1) / bk, which overflows: the forward then sees no key
 * tile and returns O = 0, LSE = -inf for rows that have allowed keys. */
Test(adversarial, bug_kv_len_int64_max_with_broadcast_keys)
{
    const float q[1] = {1.0f}, k[1] = {2.0f}, v[1] = {3.0f};
    int32_t kvl[1] = {3};
    for (int mode = 0; mode < 3; mode++) {
        sdpa_problem p = prob(1, 1, 1, 2, INT64_MAX, 1, 1);
        p.use_default_scale = 0;
        p.scale = 1.0f;
        p.isa = SDPA_ISA_SCALAR;
        if (mode == 0)
            p.kv_lengths = kvl; /* 3 keys: LSE = 2 + log 3 */
        else if (mode == 1)
            p.causal = SDPA_CAUSAL_TOP_LEFT; /* row i: i + 1 keys */
        else
            p.window_left = p.window_right = 0; /* one key per row */
        float o[2] = {-7, -7}, l[2] = {-7, -7};
        const sdpa_tensor tq = {q, 0, 0, 0}, tk = {k, 0, 0, 0}, tv = {v, 0, 0, 0};
        const sdpa_tensor_out to = {o, 2, 2, 1}, tl = {l, 2, 2, 1};
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
        const double want1 = mode == 0 ? 2.0 + log(3.0) : mode == 1 ? 2.0 + log(2.0) : 2.0;
        cr_expect(o[0] == 3.0f && o[1] == 3.0f && fabs(l[1] - want1) < 1e-5,
                  "mode %d: O = (%g, %g), LSE[1] = %g, want O = 3, LSE[1] = %g", mode, (double)o[0], (double)o[1],
                  (double)l[1], want1);
    }
}

/* REGRESSION (a bug found by the adversarial review, now fixed): with a huge but legal Tk (2^60, broadcast
 * K/V) and block_k = 1, src/sdpa.c fwd_item's `split * L->nkt / L->nsplit`
 * (and `(split + 1) * L->nkt`) overflows int64: splits then cover the same key
 * tiles several times and LSE counts keys twice or more (UBSan: signed integer
 * overflow at the kt_first / kt_end lines). */
Test(adversarial, bug_huge_kv_len_small_block_k_split_overflow)
{
    const float q[1] = {1.0f}, k[1] = {2.0f}, v[1] = {3.0f};
    sdpa_problem p = prob(1, 1, 1, 2, (int64_t)1 << 60, 1, 1);
    p.use_default_scale = 0;
    p.scale = 1.0f;
    p.isa = SDPA_ISA_SCALAR;
    p.block_k = 1;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    float o[2] = {-7, -7}, l[2] = {-7, -7};
    const sdpa_tensor tq = {q, 0, 0, 0}, tk = {k, 0, 0, 0}, tv = {v, 0, 0, 0};
    const sdpa_tensor_out to = {o, 2, 2, 1}, tl = {l, 2, 2, 1};
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
    cr_expect(fabs(l[0] - 2.0) < 1e-5 && fabs(l[1] - (2.0 + log(2.0))) < 1e-5,
              "LSE = (%.7g, %.7g), want (2, %.7g)", (double)l[0], (double)l[1], 2.0 + log(2.0));
}

/* REGRESSION (a bug found by the adversarial review, now fixed; it failed by timeout): a backward whose every
 * tensor is empty (Tq = Tk = 0) still loops over B * Hq and B * Hkv: src/sdpa.c
 * zero_rows() walks every (b, h) with an empty innermost loop, and the
 * per-head wave loop runs B * Hkv dynamic-schedule iterations with no wave in
 * them. B = Hq = Hkv = 2^20 is 2^40 iterations (hours); the forward returns at
 * once. (With B * Hkv past 2^63 the products also overflow.) */
Test(adversarial, bug_backward_all_empty_huge_heads_is_instant, .timeout = 15)
{
    float dummy[4] = {0};
    sdpa_problem p = prob((int64_t)1 << 20, (int64_t)1 << 20, (int64_t)1 << 20, 0, 0, 1, 1);
    p.num_threads = 1;
    const sdpa_tensor t = {dummy, 0, 0, 0};
    const sdpa_tensor_out a = {dummy + 1, 0, 0, 0}, b = {dummy + 2, 0, 0, 0}, c = {dummy + 3, 0, 0, 0};
    cr_assert_eq(sdpa_forward(&p, &t, &t, &t, &a, NULL), SDPA_OK);
    cr_assert_eq(sdpa_backward(&p, &t, &t, &t, &t, &t, &t, &a, &b, &c), SDPA_OK);
}

/* Runs fn in a child process limited to `extra` bytes of address space beyond
 * what it maps now; returns the child's wait status. */
static int in_limited_child(void (*fn)(void), size_t extra)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        size_t vm = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (f) {
            unsigned long pages = 0;
            if (fscanf(f, "%lu", &pages) == 1)
                vm = (size_t)pages * (size_t)sysconf(_SC_PAGESIZE);
            fclose(f);
        }
        struct rlimit rl = {vm + extra, vm + extra};
        if (setrlimit(RLIMIT_AS, &rl) != 0)
            _exit(100);
        fn();
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void backward_4000_threads_tiny(void)
{
    enum { T = 4, D = 4 };
    float q[T * D], o[T * D], l[T], dq[T * D], dk[T * D], dv[T * D];
    for (int i = 0; i < T * D; i++)
        q[i] = (float)(i % 5) * 0.25f;
    sdpa_problem p = prob(1, 1, 1, T, T, D, D);
    p.num_threads = 1;
    const sdpa_tensor tq = util_cview(q, 1, T, D), oi = util_cview(o, 1, T, D), li = util_lse_view(l, 1, T);
    const sdpa_tensor_out to = util_cview_out(o, 1, T, D), tl = util_lse_view_out(l, 1, T),
                          odq = util_cview_out(dq, 1, T, D), odk = util_cview_out(dk, 1, T, D),
                          odv = util_cview_out(dv, 1, T, D);
    if (sdpa_forward(&p, &tq, &tq, &tq, &to, &tl) != SDPA_OK)
        _exit(3);
    p.num_threads = 4000; /* far more than the one (batch, head) pair of work */
    const sdpa_status st = sdpa_backward(&p, &tq, &tq, &tq, &oi, &li, &tq, &odq, &odk, &odv);
    _exit(st == SDPA_OK || st == SDPA_ERR_OUT_OF_MEMORY ? 0 : 4);
}

/* REGRESSION (a bug found by the adversarial review, now fixed): sdpa_backward never caps num_threads
 * (sdpa_forward caps it at its work items): num_threads = 4000 on a problem
 * with one (batch, kv head) pair allocates 4000 workspaces and asks libgomp for
 * 4000 threads. Where they cannot be created (address-space or pid limits of a
 * container), libgomp prints "libgomp: Thread creation failed" and calls
 * exit(1): the library kills its caller. Here the child gets 512 MiB of
 * address space (about 60 default thread stacks). Skipped under ASan, which
 * cannot run with an address-space limit. */
Test(adversarial, bug_backward_thread_count_not_capped)
{
    if (ADV_ASAN)
        cr_skip_test("RLIMIT_AS cannot be used under AddressSanitizer");
    const int status = in_limited_child(backward_4000_threads_tiny, (size_t)512 << 20);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "child %s %d (libgomp exits the process when it cannot create the threads asked for)",
              WIFEXITED(status) ? "exited with" : "killed by signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* ============================================================ CLI ====== */

static char g_dir[64];

static void cli_setup(void)
{
    strcpy(g_dir, "/tmp/sdpa_adv_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            rm_rf(path);
            rmdir(path);
        } else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void cli_teardown(void)
{
    rm_rf(g_dir);
}

static const char *P(const char *name)
{
    static char buf[32][4096];
    static int slot;
    char *b = buf[slot++ % 32];
    snprintf(b, sizeof buf[0], "%s/%s", g_dir, name);
    return b;
}

/* Writes a version-1.0 .npy with a raw header dict (padded to 64 bytes). */
static void write_raw(const char *path, const char *dict, const void *data, size_t nbytes)
{
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64;
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)((total - 10) & 0xff),
                             (unsigned char)((total - 10) >> 8)};
    fwrite(pre, 1, 10, f);
    fwrite(dict, 1, dl, f);
    for (size_t i = 10 + dl; i + 1 < total; i++)
        fputc(' ', f);
    fputc('\n', f);
    if (nbytes)
        fwrite(data, 1, nbytes, f);
    fclose(f);
}

static void write_f32(const char *path, const char *shape, const float *data, size_t n)
{
    char dict[256];
    snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape);
    write_raw(path, dict, data, n * sizeof(float));
}

/* Standard inputs: q (4, 8), k (6, 8), v (6, 8). */
static void cli_inputs(void)
{
    float x[49];
    for (int i = 0; i < 49; i++)
        x[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    write_f32(P("q.npy"), "(4, 8)", x, 32);
    write_f32(P("k.npy"), "(6, 8)", x, 48);
    write_f32(P("v.npy"), "(6, 8)", x + 1, 48);
}

typedef struct cli_res {
    int status; /* exit status, or 128 + signal */
    char err[4096];
    int err_lines;
} cli_res;

static cli_res cli_run_env(const char *const *args, const struct rlimit *as_limit)
{
    cli_res r;
    memset(&r, 0, sizeof r);
    const char *argv[32];
    int n = 0;
    argv[n++] = SDPA_CLI_PATH;
    for (; args[n - 1] && n < 31; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char errp[4200];
    snprintf(errp, sizeof errp, "%s.stderr", g_dir);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644), nul = open("/dev/null", O_WRONLY);
        if (fd < 0 || nul < 0)
            _exit(120);
        dup2(fd, 2);
        dup2(nul, 1);
        if (as_limit && setrlimit(RLIMIT_AS, as_limit) != 0)
            _exit(121);
        execve(SDPA_CLI_PATH, (char *const *)argv, environ);
        _exit(122);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    FILE *f = fopen(errp, "r");
    if (f) {
        size_t len = fread(r.err, 1, sizeof r.err - 1, f);
        r.err[len] = '\0';
        fclose(f);
        unlink(errp);
    }
    for (const char *c = r.err; *c; c++)
        r.err_lines += *c == '\n';
    return r;
}

static cli_res cli_run(const char *const *args)
{
    return cli_run_env(args, NULL);
}

/* Names in g_dir starting with prefix. */
static int count_files(const char *prefix)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* A bad-file run: exit 2, exactly one stderr line "sdpa: error: <path>: ...",
 * and no file named out* created. */
static void expect_bad(const char *const *args, const char *blame, const char *what)
{
    cli_res r = cli_run(args);
    char head[4200];
    snprintf(head, sizeof head, "sdpa: error: %s: ", blame);
    cr_expect_eq(r.status, 2, "%s: exit status %d, stderr: %s", what, r.status, r.err);
    cr_expect_eq(r.err_lines, 1, "%s: %d stderr lines: %s", what, r.err_lines, r.err);
    cr_expect(strncmp(r.err, head, strlen(head)) == 0, "%s: stderr '%s' does not start with '%s'", what, r.err, head);
    cr_expect_eq(count_files("out"), 0, "%s: an output (or its temporary) was created", what);
}

Test(adversarial, cli_malicious_headers, .init = cli_setup, .fini = cli_teardown, .timeout = 120)
{
    cli_inputs();
    static const struct {
        const char *name, *dict;
        size_t nbytes;
    } bad[] = {
        {"huge shape", "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", 0},
        {"product overflow", "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 8), }", 0},
        {"dimension past int64", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999, 8), }", 0},
        {"negative dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, -8), }", 128},
        {"double comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (4,, 8), }", 128},
        {"lone comma", "{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", 0},
        {"unicode key", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), '\xd0\xba': 1}", 128},
        {"unicode descr", "{'descr': '<\xc6\x92" "4', 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"big-endian", "{'descr': '>f4', 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"no byte order for f4", "{'descr': '|f4', 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"float64", "{'descr': '<f8', 'fortran_order': False, 'shape': (4, 4), }", 128},
        {"structured", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"fortran 2-D", "{'descr': '<f4', 'fortran_order': True, 'shape': (4, 8), }", 128},
        {"fortran lowercase", "{'descr': '<f4', 'fortran_order': false, 'shape': (4, 8), }", 128},
        {"shape as list", "{'descr': '<f4', 'fortran_order': False, 'shape': [4, 8], }", 128},
        {"missing shape", "{'descr': '<f4', 'fortran_order': False, }", 128},
        {"repeated key", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"escape in string", "{'descr': '<f\\4', 'fortran_order': False, 'shape': (4, 8), }", 128},
        {"unterminated", "{'descr': '<f4", 0},
        {"trailing garbage", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), } x", 128},
        {"truncated data", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 127},
        {"extra data", "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", 129},
        {"rank 0", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4},
        {"rank 5", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 4, 8), }", 128},
        {"33 dims", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1), }", 4},
    };
    static unsigned char zeros[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_raw(P("bad.npy"), bad[i].dict, zeros, bad[i].nbytes);
        const char *args[] = {"forward", "-q", P("bad.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"),
                              "--lse", P("out_lse.npy"), NULL};
        expect_bad(args, P("bad.npy"), bad[i].name);
    }
    /* a 2 MB header (version 2.0) */
    {
        FILE *f = fopen(P("bad.npy"), "wb");
        const uint32_t hl = 2u << 20;
        unsigned char pre[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, (unsigned char)hl, (unsigned char)(hl >> 8),
                                 (unsigned char)(hl >> 16), (unsigned char)(hl >> 24)};
        fwrite(pre, 1, 12, f);
        fputs("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }", f);
        for (uint32_t i = 60; i + 1 < hl; i++)
            fputc(' ', f);
        fputc('\n', f);
        fclose(f);
        const char *args[] = {"forward", "-q", P("bad.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"), NULL};
        expect_bad(args, P("bad.npy"), "2 MB header");
    }
    /* a directory, a missing file, an empty file */
    {
        mkdir(P("adir.npy"), 0755);
        const char *a1[] = {"forward", "-q", P("adir.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"), NULL};
        expect_bad(a1, P("adir.npy"), "directory as input");
        const char *a2[] = {"forward", "-q", P("q.npy"), "-k", P("nope.npy"), "-v", P("v.npy"), "-o", P("out.npy"), NULL};
        expect_bad(a2, P("nope.npy"), "missing input");
        FILE *f = fopen(P("empty.npy"), "wb");
        fclose(f);
        const char *a3[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("empty.npy"), "-o", P("out.npy"), NULL};
        expect_bad(a3, P("empty.npy"), "empty file");
    }
}

/* Harmless header variants NumPy or other writers produce are accepted, and a
 * boolean mask whose bytes are 2..255 means "may attend" like 1. */
Test(adversarial, cli_header_variants_and_bool_bytes, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    cli_inputs();
    float x[32];
    for (int i = 0; i < 32; i++)
        x[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    static const char *const dicts[] = {
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 8,), }",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (4L, 8L)}",
        "{'shape': (4, 8), 'fortran_order': False, 'descr': '=f4'}",
        "{'descr': 'f4', 'fortran_order': False, 'shape': (4, 8)}",
    };
    cli_res ref;
    memset(&ref, 0, sizeof ref);
    for (size_t i = 0; i < sizeof dicts / sizeof dicts[0]; i++) {
        write_raw(P("qv.npy"), dicts[i], x, sizeof x);
        const char *args[] = {"forward", "-q", P("qv.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P(i ? "o2.npy" : "o1.npy"), NULL};
        cli_res r = cli_run(args);
        cr_expect_eq(r.status, 0, "variant %zu: %s", i, r.err);
    }
    /* bool mask bytes: |b1 holding 0, 1, 2, 7, 255 vs the same as 0/1 */
    unsigned char m1[24], m2[24];
    for (int i = 0; i < 24; i++) {
        static const unsigned char vals[] = {2, 255, 0, 7, 1, 0};
        m1[i] = vals[i % 6];
        m2[i] = m1[i] != 0;
    }
    write_raw(P("m1.npy"), "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 6), }", m1, 24);
    write_raw(P("m2.npy"), "{'descr': '|b1', 'fortran_order': False, 'shape': (4, 6), }", m2, 24);
    const char *a1[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("om1.npy"), "--mask", P("m1.npy"), NULL};
    const char *a2[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("om2.npy"), "--mask", P("m2.npy"), NULL};
    cli_res r1 = cli_run(a1), r2 = cli_run(a2);
    cr_assert_eq(r1.status, 0, "mask with bytes 2..255: %s", r1.err);
    cr_assert_eq(r2.status, 0, "0/1 mask: %s", r2.err);
    size_t l1 = 0, l2 = 0;
    char *b1 = util_read_file(P("om1.npy"), &l1), *b2 = util_read_file(P("om2.npy"), &l2);
    cr_expect(b1 && b2 && l1 == l2 && memcmp(b1, b2, l1) == 0, "bool bytes 2..255 do not act as True");
    free(b1);
    free(b2);
}

/* Output-file safety: a bad input leaves an existing output (even one that is
 * also an input) untouched; outputs in missing directories or on directories
 * are refused; nothing is created. */
Test(adversarial, cli_output_safety, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    cli_inputs();
    size_t ql = 0;
    char *qbefore = util_read_file(P("q.npy"), &ql);
    write_raw(P("badk.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (6, 9), }", NULL, 0);
    const char *a1[] = {"forward", "-q", P("q.npy"), "-k", P("badk.npy"), "-v", P("v.npy"), "-o", P("q.npy"), NULL};
    cli_res r = cli_run(a1);
    cr_expect_eq(r.status, 2, "%s", r.err);
    size_t ql2 = 0;
    char *qafter = util_read_file(P("q.npy"), &ql2);
    cr_expect(qbefore && qafter && ql == ql2 && memcmp(qbefore, qafter, ql) == 0, "input Q named as output was changed");
    free(qbefore);
    free(qafter);
    cr_expect_eq(count_files("q.npy."), 0, "a temporary file was left next to q.npy");

    const char *a2[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"),
                        "--lse", P("nodir/out_lse.npy"), NULL};
    expect_bad(a2, P("nodir/out_lse.npy"), "LSE in a missing directory");
    mkdir(P("d_out"), 0755);
    const char *a3[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("d_out"), NULL};
    cli_res r3 = cli_run(a3);
    cr_expect_eq(r3.status, 2, "%s", r3.err);
    const char *a4[] = {"backward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "--do", P("badk.npy"),
                        "--dq", P("out_dq.npy"), "--dk", P("out_dk.npy"), "--dv", P("out_dv.npy"), NULL};
    expect_bad(a4, P("badk.npy"), "backward with a bad dO");
}

/* REGRESSION (a bug found by the adversarial review, now fixed): tools/sdpa.c same_paths() / same_file()
 * compare the output paths as strings, or by st_dev/st_ino only when both
 * files already exist; for new outputs "-o DIR/X --lse DIR/./X" passes the
 * check, both temporaries are renamed onto the same file and O is silently
 * replaced by the LSE (exit 0). The same for --dq/--dk/--dv. Two outputs naming
 * one file should be refused with exit 2 (e.g. compare st_dev/st_ino of the
 * parent directories plus the final names, or the temporaries after mkstemp). */
Test(adversarial, bug_cli_output_alias_via_dot_slash, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    cli_inputs();
    char alias[4200];
    snprintf(alias, sizeof alias, "%s/./out.npy", g_dir);
    const char *a1[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"),
                        "--lse", alias, NULL};
    cli_res r = cli_run(a1);
    cr_expect_eq(r.status, 2, "forward -o X --lse <dir>/./X: exit %d (O overwritten by LSE)", r.status);
    char alias2[4200];
    snprintf(alias2, sizeof alias2, "%s/./g.npy", g_dir);
    const char *a2[] = {"backward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "--do", P("q.npy"),
                        "--dq", P("g.npy"), "--dk", alias2 /* the same file */, "--dv", P("gv.npy"), NULL};
    cli_res r2 = cli_run(a2);
    cr_expect_eq(r2.status, 2, "backward --dq X --dk <dir>/./X: exit %d (dQ overwritten by dK)", r2.status);
}

/* REGRESSION (a bug found by the adversarial review, now fixed): tools/sdpa.c load_common() checks a
 * per-batch key length only against [0, Tk] and then stores (int32_t)x, so an
 * int64 length above INT32_MAX is silently truncated when Tk is that large
 * (legal with head_dim 0: the arrays hold no data). 2^32 + 1 becomes 1:
 * exit 0 and LSE = 0 instead of log(2^32 + 1) (or a clear error). */
Test(adversarial, bug_cli_kv_len_above_int32_truncated, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    write_raw(P("q0.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 0), }", NULL, 0);
    write_raw(P("k0.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967297, 0), }", NULL, 0);
    write_raw(P("v0.npy"), "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967297, 0), }", NULL, 0);
    const int64_t len = ((int64_t)1 << 32) + 1;
    write_raw(P("kvl.npy"), "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", &len, 8);
    const char *args[] = {"forward", "-q", P("q0.npy"), "-k", P("k0.npy"), "-v", P("v0.npy"), "-o", P("out.npy"),
                          "--lse", P("out_lse.npy"), "--scale", "1", "--kv-len", P("kvl.npy"), NULL};
    cli_res r = cli_run(args);
    cr_expect_eq(r.status, 2, "kv length 2^32 + 1 accepted (exit %d); it is stored as int32 1", r.status);
    cr_expect_eq(count_files("out"), 0);
}

/* REGRESSION (a low-severity bug found by the adversarial review, now fixed): tools/sdpa.c K_SCALE
 * parsing rejects a denormal or underflowing --scale: strtof sets ERANGE for
 * 1e-40 (and for 1e-38 < FLT_MIN), and the check reports "'1e-38' is not a
 * finite number" although the library accepts any finite scale. */
Test(adversarial, bug_cli_denormal_scale_rejected, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    cli_inputs();
    const char *args[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P("out.npy"),
                          "--scale", "1e-40", NULL};
    cli_res r = cli_run(args);
    cr_expect_eq(r.status, 0, "--scale 1e-40: %s", r.err);
}

/* REGRESSION (a low-severity bug found by the adversarial review, now fixed): tools/sdpa.c out_prepare()
 * creates "<path>.tmp.XXXXXX" next to the output, 11 bytes longer than the
 * name: an output whose name has 245..255 bytes (legal on Linux, NAME_MAX 255)
 * fails with "cannot create: File name too long". */
Test(adversarial, bug_cli_long_output_name, .init = cli_setup, .fini = cli_teardown, .timeout = 60)
{
    cli_inputs();
    char name[256];
    memset(name, 'o', 250);
    strcpy(name + 250, ".npy"); /* 254 bytes */
    const char *args[] = {"forward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "-o", P(name), NULL};
    cli_res r = cli_run(args);
    cr_expect_eq(r.status, 0, "a 254-byte output name: %s", r.err);
}

/* REGRESSION (a bug found by the adversarial review, now fixed): `sdpa backward --threads 4096` on a tiny
 * problem asks libgomp for 4096 threads (see bug_backward_thread_count_not_capped);
 * where they cannot be created libgomp prints its own message and exits 1,
 * and the three "<out>.tmp.XXXXXX" temporaries are left behind, breaking the
 * CLI contract (one "sdpa: error" line, exit 2, no file created). Skipped
 * under ASan. */
Test(adversarial, bug_cli_backward_many_threads_limited_memory, .timeout = 60)
{
    if (ADV_ASAN)
        cr_skip_test("RLIMIT_AS cannot be used under AddressSanitizer");
    cli_setup();
    cli_inputs();
    struct rlimit rl = {(rlim_t)1 << 30, (rlim_t)1 << 30}; /* 1 GiB: ~100 thread stacks */
    const char *args[] = {"backward", "-q", P("q.npy"), "-k", P("k.npy"), "-v", P("v.npy"), "--do", P("q.npy"),
                          "--dq", P("out_dq.npy"), "--dk", P("out_dk.npy"), "--dv", P("out_dv.npy"), "--threads",
                          "4096", NULL};
    cli_res r = cli_run_env(args, &rl);
    cr_expect(r.status == 0 || (r.status == 2 && strncmp(r.err, "sdpa: error: ", 13) == 0),
              "exit %d, stderr: %s", r.status, r.err);
    if (r.status != 0)
        cr_expect_eq(count_files("out"), 0, "temporaries left behind");
    cli_teardown();
}
