/* SPDX-License-Identifier: MIT */
/* tests/mpi/test_ring.c - ring attention over MPI (include/sdpa_mpi.h), run under
 *   mpirun --allow-run-as-root --oversubscribe -np N build/tests/mpi/test_ring
 * for N = 1..4 (.ci/mpi.sh). Every rank builds the same global Q, K, V, dO (one
 * seed), the float64 reference and the naive fp32 yardstick (tests/ref.c) of the
 * whole problem, and checks its slice:
 *  - forward O, LSE and backward dQ, dK, dV within the FlashAttention rule against
 *    float64 (O, LSE: 2x the naive fp32 error; gradients 3x; + 1e-6 / 1e-5 relative
 *    slack: the rule conformance.c applies to the single-process library), and
 *    the max difference to single-process sdpa_forward / sdpa_backward is printed;
 *  - with N = 1 and the contiguous layout: bitwise equal to the single-process calls
 *    (the ring then makes exactly that one call);
 *  - two runs with the same N: bitwise identical;
 *  - bad arguments on one rank only (NULL Q, a negative stride, a descriptor that
 *    disagrees, an unsupported mask, T not split evenly): every rank returns the
 *    same status, no output written, no hang.
 * Contiguous slices are views into the global arrays (strides of the whole
 * sequence); zig-zag slices are copied to [B, T, H, D] buffers (other strides).
 * Last line: "mpi ring (N ranks): P passed, F failed"; exit status 1 on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/dtype.h" /* the library's own rounding, to state what the ring must give */
#include "../ref.h"
#include "sdpa_mpi.h"

static int P, R;
static int passed, failed;

static uint64_t rng_state = 88172645463325252ull;
static double rng_unit(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* One check, agreed over every rank (all must pass); rank 0 prints it. */
static void check(int ok, const char *fmt, const char *what, double a, double b)
{
    int all;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all)
        passed++;
    else
        failed++;
    if (R == 0 && (!all || getenv("RING_VERBOSE")))
        printf("%s  %s: %s (%.3g vs %.3g)\n", all ? "ok  " : "FAIL", fmt, what, a, b);
}

typedef struct cfg {
    const char *name;
    int B, Hq, Hkv, T, Dk, Dv;
    sdpa_causal causal;
    sdpa_ring_layout layout;
    int32_t kvlen[2]; /* used when have_kvlen */
    int have_kvlen;
    float softcap, scale; /* scale 0: default */
    int have_window;      /* else both sides unbounded */
    int64_t wl, wr;       /* window_left / window_right (SDPA_WINDOW_UNBOUNDED allowed) */
    sdpa_alignment align; /* window_alignment */
    int var;              /* 1: ALiBi slopes, 2: sinks (and dsinks), 3: both; 4: large sinks (with 2) */
    int Tk;               /* the key length when it differs from T (the query length); 0: T */
} cfg;

static int64_t tk_of(const cfg *c)
{
    return c->Tk ? c->Tk : c->T;
}

static const float test_slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
static const float test_sinks[4] = {0.3f, -1.0f, 2.0f, -INFINITY};
static const float test_sinks_large[4] = {300.0f, 280.0f, -1.0f, -INFINITY}; /* |LSE| >= 256 */

/* max |x - ref| over finite references; a non-finite reference must match exactly
 * (both -inf); sets *bad on mismatch. */
static double max_err(const float *x, const double *ref, size_t n, int *bad)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(ref[i])) {
            if (!((double)x[i] == ref[i]))
                *bad = 1;
            continue;
        }
        if (isnan(x[i]))
            *bad = 1;
        const double d = fabs((double)x[i] - ref[i]);
        if (d > e)
            e = d;
    }
    return e;
}
static double max_abs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

/* Local slice buffer and the global rows of its local rows. */
typedef struct slice {
    float *buf;           /* zig-zag: own [B, Tl, H, D] copy; contiguous: NULL (a view) */
    sdpa_tensor_out view; /* the slice */
} slice;

/* A view of this rank's slice of the global [B, H, T, D] array g (copied for zig-zag). */
static slice make_slice(const cfg *c, float *g, int64_t H, int64_t T, int64_t D, int copy_in)
{
    slice s = {0};
    const int64_t Tl = T / P;
    if (c->layout == SDPA_RING_CONTIGUOUS) {
        s.view = (sdpa_tensor_out){g + (int64_t)R * Tl * D, H * T * D, T * D, D};
        return s;
    }
    s.buf = malloc(sizeof(float) * (size_t)(c->B * Tl * H * D + 1));
    s.view = (sdpa_tensor_out){s.buf, Tl * H * D, D, H * D};
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++) {
                const int64_t gi = sdpa_ring_global_row(T, P, R, c->layout, i);
                float *dst = s.buf + b * s.view.batch_stride + h * s.view.head_stride + i * s.view.seq_stride;
                if (copy_in)
                    memcpy(dst, g + ((b * H + h) * T + gi) * D, sizeof(float) * (size_t)D);
                else
                    for (int64_t d = 0; d < D; d++)
                        dst[d] = NAN;
            }
    return s;
}

/* Gathers the slice's rows into out[B, H, Tl, D] (contiguous, local order). */
static void slice_rows(const cfg *c, const slice *s, int64_t H, int64_t T, int64_t D, float *out)
{
    const int64_t Tl = T / P;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++)
                memcpy(out + ((b * H + h) * Tl + i) * D,
                       (const float *)s->view.data + b * s->view.batch_stride + h * s->view.head_stride + i * s->view.seq_stride,
                       sizeof(float) * (size_t)D);
}

/* The global rows of this rank's slice of a global [B, H, T, D] array (any type via element size). */
static void global_rows(const cfg *c, const void *g, size_t es, int64_t H, int64_t T, int64_t D, void *out)
{
    const int64_t Tl = T / P;
    for (int64_t bh = 0; bh < c->B * H; bh++)
        for (int64_t i = 0; i < Tl; i++)
            memcpy((char *)out + (size_t)((bh * Tl + i) * D) * es,
                   (const char *)g + (size_t)((bh * T + sdpa_ring_global_row(T, P, R, c->layout, i)) * D) * es,
                   es * (size_t)D);
}

static sdpa_problem problem_of(const cfg *c)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = c->B;
    p.q_heads = c->Hq;
    p.kv_heads = c->Hkv;
    p.q_len = c->T;
    p.kv_len = tk_of(c);
    p.head_dim_qk = c->Dk;
    p.head_dim_v = c->Dv;
    p.causal = c->causal;
    p.kv_lengths = c->have_kvlen ? c->kvlen : NULL;
    if (c->have_window) {
        p.window_left = c->wl;
        p.window_right = c->wr;
        p.window_alignment = c->align;
    }
    p.softcap = c->softcap;
    if (c->var & 1)
        p.alibi_slopes = test_slopes;
    if (c->var & 2)
        p.sinks = c->var & 4 ? test_sinks_large : test_sinks;
    if (c->scale != 0) {
        p.use_default_scale = 0;
        p.scale = c->scale;
    }
    p.num_threads = 1;
    return p;
}

/* Compares the slice's rows of `got` (local order) with the global reference. */
static void fa_check(const cfg *c, const char *what, const float *got, const double *ref_g, const float *naive_g,
                     const float *single_g, int64_t H, int64_t T, int64_t D, double factor, double rel)
{
    const int64_t Tl = T / P, n = c->B * H * Tl * D, ng = c->B * H * T * D;
    double *ref = malloc(sizeof(double) * (size_t)(n + 1));
    float *single = malloc(sizeof(float) * (size_t)(n + 1));
    global_rows(c, ref_g, sizeof(double), H, T, D, ref);
    global_rows(c, single_g, sizeof(float), H, T, D, single);
    int bad = 0, bad2 = 0;
    const double naive_err = max_err(naive_g, ref_g, (size_t)ng, &bad2);
    const double bound = factor * naive_err + rel * (1.0 + max_abs(ref_g, (size_t)ng));
    const double e = max_err(got, ref, (size_t)n, &bad);
    double dsingle = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(single[i]) && fabs((double)got[i] - single[i]) > dsingle)
            dsingle = fabs((double)got[i] - single[i]);
    double all_d;
    MPI_Allreduce(&dsingle, &all_d, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    char msg[200];
    snprintf(msg, sizeof msg, "%s %s vs float64 (max |ring - single-process| %.2g)", c->name, what, all_d);
    check(!bad && e <= bound, msg, "err vs bound", e, bound);
    if (P == 1 && c->layout == SDPA_RING_CONTIGUOUS) {
        snprintf(msg, sizeof msg, "%s %s N=1 contiguous bitwise = single-process", c->name, what);
        check(memcmp(got, single, sizeof(float) * (size_t)n) == 0, msg, "max diff", all_d, 0);
    }
    free(ref);
    free(single);
}

static void run_case(const cfg *c)
{
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, T = c->T, Tk = tk_of(c), Dk = c->Dk, Dv = c->Dv, Tl = T / P,
                  Tkl = Tk / P;
    const size_t nq = (size_t)(B * Hq * T * Dk), nk = (size_t)(B * Hkv * Tk * Dk), nv = (size_t)(B * Hkv * Tk * Dv),
                 no = (size_t)(B * Hq * T * Dv), nl = (size_t)(B * Hq * T);
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nv),
          *dout = malloc(sizeof(float) * no);
    rng_state = 88172645463325252ull ^ (uint64_t)(T * 131 + Dk * 7 + Hq);
    for (size_t i = 0; i < nq; i++) q[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nk; i++) k[i] = (float)(rng_unit() * 4 - 2);
    for (size_t i = 0; i < nv; i++) v[i] = (float)(rng_unit() * 2 - 1);
    for (size_t i = 0; i < no; i++) dout[i] = (float)(rng_unit() * 2 - 1);
    sdpa_problem p = problem_of(c);
    float ds1[4] = {0}, dsr[2][4] = {{0}};
    double dsref[4] = {0};
    if (c->var & 2)
        p.dsinks = ds1;

    /* single process, float64 and naive fp32 over the whole problem */
    float *o1 = malloc(sizeof(float) * no), *l1 = malloc(sizeof(float) * nl), *dq1 = malloc(sizeof(float) * nq),
          *dk1 = malloc(sizeof(float) * nk), *dv1 = malloc(sizeof(float) * nv);
    const sdpa_tensor gq = {q, Hq * T * Dk, T * Dk, Dk}, gk = {k, Hkv * Tk * Dk, Tk * Dk, Dk},
                      gv = {v, Hkv * Tk * Dv, Tk * Dv, Dv}, gdo = {dout, Hq * T * Dv, T * Dv, Dv};
    const sdpa_tensor_out go = {o1, Hq * T * Dv, T * Dv, Dv}, gl = {l1, Hq * T, T, 1};
    sdpa_status st = sdpa_forward(&p, &gq, &gk, &gv, &go, &gl);
    const sdpa_tensor gO = {o1, go.batch_stride, go.head_stride, go.seq_stride}, gL = {l1, Hq * T, T, 1};
    const sdpa_tensor_out gdq = {dq1, gq.batch_stride, gq.head_stride, gq.seq_stride},
                          gdk = {dk1, gk.batch_stride, gk.head_stride, gk.seq_stride},
                          gdv = {dv1, gv.batch_stride, gv.head_stride, gv.seq_stride};
    if (st == SDPA_OK)
        st = sdpa_backward(&p, &gq, &gk, &gv, &gO, &gL, &gdo, &gdq, &gdk, &gdv);
    check(st == SDPA_OK, c->name, "single-process status", st, 0);
    double *ro = malloc(sizeof(double) * no), *rl = malloc(sizeof(double) * nl), *rq = malloc(sizeof(double) * nq),
           *rk = malloc(sizeof(double) * nk), *rv = malloc(sizeof(double) * nv);
    float *n32o = malloc(sizeof(float) * no), *n32l = malloc(sizeof(float) * nl), *n32q = malloc(sizeof(float) * nq),
          *n32k = malloc(sizeof(float) * nk), *n32v = malloc(sizeof(float) * nv);
    ref_forward(&p, q, k, v, ro, rl);
    naive32_forward(&p, q, k, v, n32o, n32l);
    ref_backward_dsinks(&p, q, k, v, dout, rq, rk, rv, dsref);
    naive32_backward(&p, q, k, v, dout, n32q, n32k, n32v);

    /* this rank's slices */
    slice sq = make_slice(c, q, Hq, T, Dk, 1), sk = make_slice(c, k, Hkv, Tk, Dk, 1),
          sv = make_slice(c, v, Hkv, Tk, Dv, 1), sdo = make_slice(c, dout, Hq, T, Dv, 1);
    float *ob = malloc(sizeof(float) * no), *lb = malloc(sizeof(float) * nl); /* contiguous: global-shaped */
    slice so = make_slice(c, ob, Hq, T, Dv, 0);
    float *lse_loc = malloc(sizeof(float) * (size_t)(B * Hq * Tl + 1));
    const sdpa_tensor_out sl = {lse_loc, Hq * Tl, Tl, 1};
    const sdpa_tensor tq = {sq.view.data, sq.view.batch_stride, sq.view.head_stride, sq.view.seq_stride};
    const sdpa_tensor tk = {sk.view.data, sk.view.batch_stride, sk.view.head_stride, sk.view.seq_stride};
    const sdpa_tensor tv = {sv.view.data, sv.view.batch_stride, sv.view.head_stride, sv.view.seq_stride};
    const sdpa_tensor tdo = {sdo.view.data, sdo.view.batch_stride, sdo.view.head_stride, sdo.view.seq_stride};

    const size_t lo = (size_t)(B * Hq * Tl * Dv), ll = (size_t)(B * Hq * Tl), lq = (size_t)(B * Hq * Tl * Dk),
                 lk = (size_t)(B * Hkv * Tkl * Dk), lv = (size_t)(B * Hkv * Tkl * Dv);
    float *got_o[2], *got_l[2], *got_q[2], *got_k[2], *got_v[2];
    for (int run = 0; run < 2; run++) {
        st = sdpa_ring_forward(MPI_COMM_WORLD, c->layout, &p, &tq, &tk, &tv, &so.view, &sl);
        check(st == SDPA_OK, c->name, "ring forward status", st, 0);
        got_o[run] = malloc(sizeof(float) * (lo + 1));
        got_l[run] = malloc(sizeof(float) * (ll + 1));
        slice_rows(c, &so, Hq, T, Dv, got_o[run]);
        memcpy(got_l[run], lse_loc, sizeof(float) * ll);
        /* backward with the ring's O and LSE */
        float *gq_ = malloc(sizeof(float) * nq), *gk_ = malloc(sizeof(float) * nk), *gv_ = malloc(sizeof(float) * nv);
        slice sdq = make_slice(c, gq_, Hq, T, Dk, 0);
        slice sdk = make_slice(c, gk_, Hkv, Tk, Dk, 0);
        slice sdv = make_slice(c, gv_, Hkv, Tk, Dv, 0);
        const sdpa_tensor tO = {so.view.data, so.view.batch_stride, so.view.head_stride, so.view.seq_stride};
        const sdpa_tensor tL = {lse_loc, sl.batch_stride, sl.head_stride, sl.seq_stride};
        if (c->var & 2)
            p.dsinks = dsr[run];
        st = sdpa_ring_backward(MPI_COMM_WORLD, c->layout, &p, &tq, &tk, &tv, &tO, &tL, &tdo, &sdq.view, &sdk.view,
                                &sdv.view);
        check(st == SDPA_OK, c->name, "ring backward status", st, 0);
        got_q[run] = malloc(sizeof(float) * (lq + 1));
        got_k[run] = malloc(sizeof(float) * (lk + 1));
        got_v[run] = malloc(sizeof(float) * (lv + 1));
        slice_rows(c, &sdq, Hq, T, Dk, got_q[run]);
        slice_rows(c, &sdk, Hkv, Tk, Dk, got_k[run]);
        slice_rows(c, &sdv, Hkv, Tk, Dv, got_v[run]);
        free(gq_);
        free(gk_);
        free(gv_);
        free(sdq.buf);
        free(sdk.buf);
        free(sdv.buf);
    }
    fa_check(c, "O", got_o[0], ro, n32o, o1, Hq, T, Dv, 2.0, 1e-6);
    fa_check(c, "LSE", got_l[0], rl, n32l, l1, Hq, T, 1, 2.0, 1e-6);
    fa_check(c, "dQ", got_q[0], rq, n32q, dq1, Hq, T, Dk, 3.0, 1e-5);
    fa_check(c, "dK", got_k[0], rk, n32k, dk1, Hkv, Tk, Dk, 3.0, 1e-5);
    fa_check(c, "dV", got_v[0], rv, n32v, dv1, Hkv, Tk, Dv, 3.0, 1e-5);
    const int same = !memcmp(got_o[0], got_o[1], sizeof(float) * lo) && !memcmp(got_l[0], got_l[1], sizeof(float) * ll) &&
                     !memcmp(got_q[0], got_q[1], sizeof(float) * lq) && !memcmp(got_k[0], got_k[1], sizeof(float) * lk) &&
                     !memcmp(got_v[0], got_v[1], sizeof(float) * lv) && !memcmp(dsr[0], dsr[1], sizeof dsr[0]);
    char msg[160];
    if (c->var & 2) { /* dsinks: the same on every rank, against float64 and the single process */
        double e = 0, e1 = 0;
        for (int64_t h = 0; h < Hq; h++) {
            const double d = fabs((double)dsr[0][h] - dsref[h]), d1 = fabs((double)ds1[h] - dsref[h]);
            e = d > e ? d : e;
            e1 = d1 > e1 ? d1 : e1;
        }
        float mine[4], lo4[4];
        memcpy(mine, dsr[0], sizeof mine);
        MPI_Allreduce(mine, lo4, 4, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
        const int agree = !memcmp(mine, lo4, sizeof mine);
        snprintf(msg, sizeof msg, "%s dsinks vs float64 (single process: %.2g), same on every rank", c->name, e1);
        check(agree && e <= 2.0 * e1 + 1e-5, msg, "err vs bound", e, 2.0 * e1 + 1e-5);
    }
    snprintf(msg, sizeof msg, "%s two runs bitwise identical", c->name);
    check(same, msg, "O, LSE, dQ, dK, dV", same, 1);
    for (int run = 0; run < 2; run++) {
        free(got_o[run]);
        free(got_l[run]);
        free(got_q[run]);
        free(got_k[run]);
        free(got_v[run]);
    }
    free(sq.buf); free(sk.buf); free(sv.buf); free(sdo.buf); free(so.buf);
    free(ob); free(lb); free(lse_loc);
    free(q); free(k); free(v); free(dout);
    free(o1); free(l1); free(dq1); free(dk1); free(dv1);
    free(ro); free(rl); free(rq); free(rk); free(rv);
    free(n32o); free(n32l); free(n32q); free(n32k); free(n32v);
}

/* ----------------------------------------------------------- bad arguments */

static void bad_case(const char *name, int which)
{
    const int64_t B = 1, H = 2, T = 24, D = 8, Tl = T / P;
    const cfg shape = {
        .name = name, .B = (int)B, .Hq = (int)H, .Hkv = (int)H, .T = (int)T, .Dk = (int)D, .Dv = (int)D, .causal = SDPA_CAUSAL_TOP_LEFT};
    sdpa_problem p = problem_of(&shape); /* num_threads = 1 */
    const size_t n = (size_t)(B * H * Tl * D);
    float *x = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * n), *l = malloc(sizeof(float) * (size_t)(B * H * Tl));
    float *g = malloc(sizeof(float) * n), *dq = malloc(sizeof(float) * n), *dk = malloc(sizeof(float) * n),
          *dv = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 7) * 0.1f;
        g[i] = 0.5f;
        o[i] = dq[i] = dk[i] = dv[i] = 12345.0f;
    }
    for (int64_t i = 0; i < B * H * Tl; i++)
        l[i] = 0.25f;
    sdpa_tensor t = {x, H * Tl * D, Tl * D, D};
    sdpa_tensor_out to = {o, H * Tl * D, Tl * D, D}, tl = {l, H * Tl, Tl, 1};
    sdpa_tensor tO = {o, H * Tl * D, Tl * D, D}, tL = {l, H * Tl, Tl, 1}, tg = {g, H * Tl * D, Tl * D, D};
    sdpa_tensor_out tdq = {dq, H * Tl * D, Tl * D, D}, tdk = {dk, H * Tl * D, Tl * D, D}, tdv = {dv, H * Tl * D, Tl * D, D};
    const int32_t kvl[1] = {20};
    const int me = R == P - 1; /* the last rank gets the bad argument */
    sdpa_tensor tq = t;
    sdpa_status expect = SDPA_OK, expect_fwd = (sdpa_status)1; /* 1: as expect */
    sdpa_ring_layout layout = SDPA_RING_ZIGZAG;
    switch (which) {
    case 0: /* NULL Q data */
        if (me)
            tq.data = NULL;
        expect = SDPA_ERR_NULL_ARGUMENT;
        break;
    case 1: /* negative stride */
        if (me)
            tq.seq_stride = -D;
        expect = SDPA_ERR_BAD_STRIDE;
        break;
    case 2: /* a descriptor that disagrees (another head count) */
        if (me) {
            p.q_heads = p.kv_heads = 1;
        }
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    case 3: /* an unsupported mask (a bias) on one rank */
        if (me) {
            p.bias.data = x;
            p.bias.key_stride = 1;
        }
        expect = SDPA_ERR_UNSUPPORTED;
        break;
    case 4: /* T not a multiple of 2P (every rank) */
        p.q_len = p.kv_len = T + 1;
        expect = SDPA_ERR_UNSUPPORTED;
        break;
    case 5: /* NaN scale on one rank */
        if (me) {
            p.use_default_scale = 0;
            p.scale = NAN;
        }
        expect = SDPA_ERR_BAD_SCALE;
        break;
    case 6: /* O aliasing Q on one rank */
        if (me)
            to.data = x;
        expect = SDPA_ERR_ALIASING;
        break;
    case 7: /* a negative window on one rank */
        if (me)
            p.window_right = -2;
        expect = SDPA_ERR_BAD_WINDOW;
        break;
    case 8: /* windows that disagree */
        p.window_left = me ? 4 : 5;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    case 9: /* a bottom-right window with key lengths (every rank) */
        p.causal = SDPA_CAUSAL_NONE;
        p.window_left = 3;
        p.window_alignment = SDPA_ALIGN_BOTTOM_RIGHT;
        p.kv_lengths = kvl;
        expect = SDPA_ERR_UNSUPPORTED;
        break;
    case 10: /* causal out of its enum on one rank */
        if (me)
            p.causal = (sdpa_causal)7;
        expect = SDPA_ERR_BAD_DESCRIPTOR;
        break;
    case 11: /* window_alignment out of its enum, with causal, on one rank */
        if (me)
            p.window_alignment = (sdpa_alignment)9;
        expect = SDPA_ERR_BAD_DESCRIPTOR;
        break;
    /* Regressions (an adversarial review, session 29): the agreement compared whether
     * causal was on but not its corner, nor the window alignment, and the sinks, ALiBi
     * slopes and key lengths only through a hash, which chosen values collide. */
    case 12: /* causal corners that disagree */
        p.causal = me ? SDPA_CAUSAL_BOTTOM_RIGHT : SDPA_CAUSAL_TOP_LEFT;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    case 13: /* window alignments that disagree */
        p.causal = SDPA_CAUSAL_NONE;
        p.window_left = 3;
        p.window_alignment = me ? SDPA_ALIGN_BOTTOM_RIGHT : SDPA_ALIGN_TOP_LEFT;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    case 14: { /* dsinks on all ranks but the last, whose first sink makes the old hash collide */
        static float sinks_a[2] = {1.0f, -0.5f}, sinks_b[2], ds[2] = {7.0f, 7.0f};
        uint32_t u;
        memcpy(&u, &sinks_a[0], 4);
        u += 8u * 1000003u; /* the dsinks flag (8) times the hash's multiplier, moved into the sink */
        memcpy(&sinks_b[0], &u, 4);
        sinks_b[1] = sinks_a[1];
        p.sinks = me ? sinks_b : sinks_a;
        p.dsinks = me ? NULL : ds;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    }
    case 15: /* one sink one ulp apart */
    {
        static float sinks_a[2] = {0.25f, -0.5f}, sinks_b[2] = {0.25f, -0.5f};
        sinks_b[1] = nextafterf(sinks_b[1], 0.0f);
        p.sinks = me ? sinks_b : sinks_a;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    }
    /* Regressions (a contract audit, session 30): a q_dtype the library does not know
     * was UNSUPPORTED (sdpa_forward says BAD_DESCRIPTOR); misaligned key lengths were
     * read as int32 before the library's MISALIGNED check. */
    case 16: /* q_dtype out of its enum on one rank */
        if (me)
            p.q_dtype = (sdpa_dtype)7;
        expect = SDPA_ERR_BAD_DESCRIPTOR;
        break;
    case 17: { /* misaligned kv_lengths on one rank */
        static int32_t lens[3] = {24, 24, 24};
        p.kv_lengths = me ? (const int32_t *)(const void *)((const char *)lens + 2) : lens;
        expect = SDPA_ERR_MISALIGNED;
        break;
    }
    case 18: { /* dsinks on some ranks only, the same sinks everywhere: the forward ignores
                  dsinks (as sdpa_forward), the backward's ranks disagree */
        static float sinks[2] = {0.25f, -0.5f}, ds[2] = {7.0f, 7.0f};
        p.sinks = sinks;
        p.dsinks = me ? NULL : ds;
        expect_fwd = SDPA_OK;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    }
    /* Regressions (a ring fuzz, session 30): lengths beyond the library's limits, with
     * empty outputs (batch 0), gave BAD_WINDOW from a block pair's diagonal offset */
    case 19: /* Tq = Tk = 2^52 (every rank): beyond SDPA_MAX_DIAGONAL_OFFSET together */
        p.batch = 0;
        p.q_len = p.kv_len = (int64_t)1 << 52;
        p.window_left = 3;
        expect = SDPA_ERR_UNSUPPORTED;
        break;
    case 20: /* Tk = 2^61 (every rank): sdpa_forward's SIZE_OVERFLOW */
        p.batch = 0;
        p.kv_len = (int64_t)1 << 61;
        expect = SDPA_ERR_SIZE_OVERFLOW;
        break;
    case 21: { /* kv_lengths running past the top of memory on one rank (a garbage pointer,
                  aligned): the ring read it before any check, a SEGV (session 32 review) */
        static const int32_t lens21[1] = {24};
        p.kv_lengths = me ? (const int32_t *)(UINTPTR_MAX - 3) : lens21;
        expect = SDPA_ERR_SIZE_OVERFLOW;
        break;
    }
    case 22: /* K/V's type bf16 on one rank: the types are part of the descriptor every rank
                agrees on (session 33's review: taken before) */
        if (me)
            p.kv_dtype = SDPA_DTYPE_BF16;
        expect = P > 1 ? SDPA_ERR_BAD_DESCRIPTOR : SDPA_OK;
        break;
    }
    for (int pass = 0; pass < 2; pass++) {
        const sdpa_status want = pass == 0 && expect_fwd != (sdpa_status)1 ? expect_fwd : expect;
        if (pass == 1 && expect_fwd == SDPA_OK && expect != SDPA_OK) { /* O, LSE written by the forward */
            for (size_t i = 0; i < n; i++)
                o[i] = 12345.0f;
            for (int64_t i = 0; i < B * H * Tl; i++)
                l[i] = 0.25f;
        }
        sdpa_status st = pass == 0 ? sdpa_ring_forward(MPI_COMM_WORLD, layout, &p, &tq, &t, &t, &to, &tl)
                                   : sdpa_ring_backward(MPI_COMM_WORLD, layout, &p, &tq, &t, &t, &tO, &tL, &tg,
                                                        which == 6 && me ? &(sdpa_tensor_out){x, H * Tl * D, Tl * D, D} : &tdq,
                                                        &tdk, &tdv);
        int sts[2] = {st, -st}, r[2];
        MPI_Allreduce(sts, r, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        const int agree = r[0] == -r[1];
        int untouched = 1;
        if (want != SDPA_OK)
            for (size_t i = 0; i < n; i++)
                if (o[i] != 12345.0f || dq[i] != 12345.0f || dk[i] != 12345.0f || dv[i] != 12345.0f)
                    untouched = 0;
        for (int64_t i = 0; want != SDPA_OK && i < B * H * Tl; i++)
            if (l[i] != 0.25f)
                untouched = 0;
        char msg[160];
        snprintf(msg, sizeof msg, "bad argument on rank %d: %s (%s): same status on every rank, nothing written",
                 P - 1, name, pass ? "backward" : "forward");
        check(agree && st == want && untouched, msg, "status vs expected", st, want);
    }
    free(x); free(o); free(l); free(g); free(dq); free(dk); free(dv);
}

/* ----------------------------------------------------------- 16-bit tensors */

static size_t esize(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* x rounded to type dt (to nearest even), as fp32. */
static float round_to(sdpa_dtype dt, float x)
{
    return dt == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(sdpa_f32_to_bf16(x))
           : dt == SDPA_DTYPE_F16 ? sdpa_f16_to_f32(sdpa_f32_to_f16(x))
                                  : x;
}

/* This rank's slice [B, H, Tl, D] (local row order, contiguous) of the global fp32
 * array g [B, H, T, D], stored in type dt (rounded). */
static void *typed_slice(const cfg *c, const float *g, sdpa_dtype dt, int64_t H, int64_t T, int64_t D)
{
    const int64_t Tl = T / P, n = c->B * H * Tl * D;
    float *rows = malloc(sizeof(float) * (size_t)(n + 1));
    global_rows(c, g, sizeof(float), H, T, D, rows);
    void *out = malloc(esize(dt) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; i++) {
        if (dt == SDPA_DTYPE_F32)
            ((float *)out)[i] = rows[i];
        else
            ((uint16_t *)out)[i] = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(rows[i]) : sdpa_f32_to_f16(rows[i]);
    }
    free(rows);
    return out;
}

/* Whether got (n elements of type dt) holds exactly ref (fp32) rounded to dt. */
static int rounded_equal(const void *got, sdpa_dtype dt, const float *ref, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t want, have;
        if (dt == SDPA_DTYPE_F32) {
            memcpy(&want, &ref[i], 4);
            memcpy(&have, (const float *)got + i, 4);
        } else {
            want = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(ref[i]) : sdpa_f32_to_f16(ref[i]);
            have = ((const uint16_t *)got)[i];
        }
        if (want != have)
            return 0;
    }
    return 1;
}

/* The ring over bf16 / fp16 tensors (q_dtype, kv_dtype, o_dtype) must give exactly the fp32
 * ring's results on the same values widened, rounded once to each output's type: O (and
 * dO) in o_dtype, dQ in q_dtype, dK and dV in kv_dtype, LSE and dsinks fp32 and equal. */
static void typed_case(const cfg *c, sdpa_dtype qdt, sdpa_dtype kvdt, sdpa_dtype odt)
{
    const int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, T = c->T, Tk = tk_of(c), Dk = c->Dk, Dv = c->Dv, Tl = T / P,
                  Tkl = Tk / P;
    const size_t nq = (size_t)(B * Hq * T * Dk), nk = (size_t)(B * Hkv * Tk * Dk), nv = (size_t)(B * Hkv * Tk * Dv),
                 no = (size_t)(B * Hq * T * Dv);
    float *g[4] = {malloc(sizeof(float) * nq), malloc(sizeof(float) * nk), malloc(sizeof(float) * nv),
                   malloc(sizeof(float) * no)};
    const size_t gn[4] = {nq, nk, nv, no};
    const sdpa_dtype gt[4] = {qdt, kvdt, kvdt, odt};
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(T * 17 + Dk * 3 + Hq + 1000 * (int)qdt + 100 * (int)kvdt + 10 * (int)odt);
    for (int a = 0; a < 4; a++)
        for (size_t i = 0; i < gn[a]; i++) /* values already in the tensor's type */
            g[a][i] = round_to(gt[a], (float)(rng_unit() * 4 - 2));
    sdpa_problem p32 = problem_of(c), pt = p32;
    pt.q_dtype = qdt;
    pt.kv_dtype = kvdt;
    pt.o_dtype = odt;
    float ds32[4] = {0}, dst[4] = {0};
    if (c->var & 2) {
        p32.dsinks = ds32;
        pt.dsinks = dst;
    }
    /* local slices: fp32 (the reference ring) and typed */
    float *q32 = typed_slice(c, g[0], SDPA_DTYPE_F32, Hq, T, Dk), *k32 = typed_slice(c, g[1], SDPA_DTYPE_F32, Hkv, Tk, Dk),
          *v32 = typed_slice(c, g[2], SDPA_DTYPE_F32, Hkv, Tk, Dv), *do32 = typed_slice(c, g[3], SDPA_DTYPE_F32, Hq, T, Dv);
    void *qt = typed_slice(c, g[0], qdt, Hq, T, Dk), *kt = typed_slice(c, g[1], kvdt, Hkv, Tk, Dk),
         *vt = typed_slice(c, g[2], kvdt, Hkv, Tk, Dv), *dot = typed_slice(c, g[3], odt, Hq, T, Dv);
    const int64_t lo = B * Hq * Tl * Dv, ll = B * Hq * Tl, lq = B * Hq * Tl * Dk, lk = B * Hkv * Tkl * Dk,
                  lv = B * Hkv * Tkl * Dv;
    float *o32 = malloc(sizeof(float) * (size_t)(lo + 1)), *l32 = malloc(sizeof(float) * (size_t)(ll + 1)),
          *lt = malloc(sizeof(float) * (size_t)(ll + 1)), *ow = malloc(sizeof(float) * (size_t)(lo + 1));
    void *ot = malloc(esize(odt) * (size_t)(lo + 1));
#define VQ(d, H, Tl_, D) {(d), (H) * (Tl_) * (D), (Tl_) * (D), (D)}
    const sdpa_tensor tq32 = VQ(q32, Hq, Tl, Dk), tk32 = VQ(k32, Hkv, Tkl, Dk), tv32 = VQ(v32, Hkv, Tkl, Dv),
                      tqt = VQ(qt, Hq, Tl, Dk), tkt = VQ(kt, Hkv, Tkl, Dk), tvt = VQ(vt, Hkv, Tkl, Dv);
    const sdpa_tensor_out to32 = VQ(o32, Hq, Tl, Dv), tot = VQ(ot, Hq, Tl, Dv), tl32 = VQ(l32, Hq, Tl, 1),
                          tlt = VQ(lt, Hq, Tl, 1);
    sdpa_status s1 = sdpa_ring_forward(MPI_COMM_WORLD, c->layout, &p32, &tq32, &tk32, &tv32, &to32, &tl32);
    sdpa_status s2 = sdpa_ring_forward(MPI_COMM_WORLD, c->layout, &pt, &tqt, &tkt, &tvt, &tot, &tlt);
    char msg[200];
    const char *tn[3] = {"fp32", "bf16", "fp16"};
    snprintf(msg, sizeof msg, "%s q %s kv %s o %s: ring forward = fp32 ring on the widened values, O rounded once", c->name,
             tn[qdt], tn[kvdt], tn[odt]);
    check(s1 == SDPA_OK && s2 == SDPA_OK && rounded_equal(ot, odt, o32, lo) && !memcmp(lt, l32, sizeof(float) * (size_t)ll),
          msg, "status", s2, s1);
    /* backward from the typed forward's O: the reference gets it widened */
    for (int64_t i = 0; i < lo; i++)
        ow[i] = odt == SDPA_DTYPE_F32 ? ((float *)ot)[i]
                : odt == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(((uint16_t *)ot)[i]) : sdpa_f16_to_f32(((uint16_t *)ot)[i]);
    float *dq32 = malloc(sizeof(float) * (size_t)(lq + 1)), *dk32 = malloc(sizeof(float) * (size_t)(lk + 1)),
          *dv32 = malloc(sizeof(float) * (size_t)(lv + 1));
    void *dqt = malloc(esize(qdt) * (size_t)(lq + 1)), *dkt = malloc(esize(kvdt) * (size_t)(lk + 1)),
         *dvt = malloc(esize(kvdt) * (size_t)(lv + 1));
    const sdpa_tensor tow = VQ(ow, Hq, Tl, Dv), totc = VQ(ot, Hq, Tl, Dv), tlc = VQ(l32, Hq, Tl, 1),
                      tdo32 = VQ(do32, Hq, Tl, Dv), tdot = VQ(dot, Hq, Tl, Dv);
    const sdpa_tensor_out tdq32 = VQ(dq32, Hq, Tl, Dk), tdk32 = VQ(dk32, Hkv, Tkl, Dk), tdv32 = VQ(dv32, Hkv, Tkl, Dv),
                          tdqt = VQ(dqt, Hq, Tl, Dk), tdkt = VQ(dkt, Hkv, Tkl, Dk), tdvt = VQ(dvt, Hkv, Tkl, Dv);
#undef VQ
    s1 = sdpa_ring_backward(MPI_COMM_WORLD, c->layout, &p32, &tq32, &tk32, &tv32, &tow, &tlc, &tdo32, &tdq32, &tdk32,
                            &tdv32);
    s2 = sdpa_ring_backward(MPI_COMM_WORLD, c->layout, &pt, &tqt, &tkt, &tvt, &totc, &tlc, &tdot, &tdqt, &tdkt, &tdvt);
    snprintf(msg, sizeof msg, "%s q %s kv %s o %s: ring backward = fp32 ring on the widened values, rounded once",
             c->name, tn[qdt], tn[kvdt], tn[odt]);
    check(s1 == SDPA_OK && s2 == SDPA_OK && rounded_equal(dqt, qdt, dq32, lq) && rounded_equal(dkt, kvdt, dk32, lk) &&
              rounded_equal(dvt, kvdt, dv32, lv) && !memcmp(ds32, dst, sizeof ds32),
          msg, "status", s2, s1);
    for (int a = 0; a < 4; a++)
        free(g[a]);
    free(q32), free(k32), free(v32), free(do32), free(qt), free(kt), free(vt), free(dot);
    free(o32), free(l32), free(lt), free(ow), free(ot);
    free(dq32), free(dk32), free(dv32), free(dqt), free(dkt), free(dvt);
}

/* The caller's key lengths inside an output's memory (the padding column of O's
 * rows, or dsinks): SDPA_ERR_ALIASING on every rank, nothing written, as
 * sdpa_forward / sdpa_backward do. */
static void kvlen_alias_case(void)
{
    const int64_t B = 1, H = 2, T = 24, D = 8, Tl = T / P, W = D + 1; /* O rows padded by one */
    const size_t n = (size_t)(B * H * Tl * D), nw = (size_t)(B * H * Tl * W);
    float *x = malloc(sizeof(float) * n), *o = malloc(sizeof(float) * nw), *l = malloc(sizeof(float) * (size_t)(H * Tl));
    float *g = malloc(sizeof(float) * n), *dq = malloc(sizeof(float) * n), *dk = malloc(sizeof(float) * n),
          *dv = malloc(sizeof(float) * n), sinks[2] = {0.5f, -1.0f}, ds[2] = {7.0f, 7.0f};
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 5) * 0.2f;
        g[i] = 0.25f;
        dq[i] = dk[i] = dv[i] = 12345.0f;
    }
    for (size_t i = 0; i < nw; i++)
        o[i] = 12345.0f;
    for (int64_t i = 0; i < H * Tl; i++)
        l[i] = 0.5f;
    const cfg shape = {.name = "kv_lengths alias", .B = 1, .Hq = (int)H, .Hkv = (int)H, .T = (int)T, .Dk = (int)D,
                       .Dv = (int)D, .causal = SDPA_CAUSAL_TOP_LEFT};
    sdpa_problem p = problem_of(&shape);
    const int32_t kvl_ok = 20;
    int32_t kvl_in_ds[1] = {20};
    const sdpa_tensor t = {x, H * Tl * D, Tl * D, D}, tg = {g, H * Tl * D, Tl * D, D}, tl = {l, H * Tl, Tl, 1};
    const sdpa_tensor_out to = {o, H * Tl * W, Tl * W, W}, tlo = {l, H * Tl, Tl, 1};
    const sdpa_tensor tO = {o, H * Tl * W, Tl * W, W};
    const sdpa_tensor_out tdq = {dq, H * Tl * D, Tl * D, D}, tdk = {dk, H * Tl * D, Tl * D, D}, tdv = {dv, H * Tl * D, Tl * D, D};
    const int me = R == P - 1;
    for (int pass = 0; pass < 2; pass++) {
        sdpa_status st;
        if (pass == 0) { /* forward: the lengths in the padding slot of O's first row on the last rank */
            memcpy(&o[D], &kvl_ok, sizeof kvl_ok);
            p.kv_lengths = me ? (const int32_t *)(const void *)&o[D] : &kvl_ok;
            st = sdpa_ring_forward(MPI_COMM_WORLD, SDPA_RING_ZIGZAG, &p, &t, &t, &t, &to, &tlo);
        } else { /* backward: dsinks over the lengths on the last rank */
            p.sinks = sinks;
            p.kv_lengths = me ? kvl_in_ds : &kvl_ok;
            p.dsinks = me ? (float *)(void *)kvl_in_ds : ds;
            st = sdpa_ring_backward(MPI_COMM_WORLD, SDPA_RING_ZIGZAG, &p, &t, &t, &t, &tO, &tl, &tg, &tdq, &tdk, &tdv);
        }
        int sts[2] = {st, -st}, r[2];
        MPI_Allreduce(sts, r, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        int untouched = kvl_in_ds[0] == 20 && ds[0] == 7.0f && ds[1] == 7.0f;
        for (size_t i = 0; i < nw; i++)
            if (i % (size_t)W != (size_t)D && o[i] != 12345.0f)
                untouched = 0;
        for (size_t i = 0; i < n; i++)
            if (dq[i] != 12345.0f || dk[i] != 12345.0f || dv[i] != 12345.0f)
                untouched = 0;
        char msg[160];
        snprintf(msg, sizeof msg, "kv_lengths inside an output on rank %d (%s): ALIASING on every rank, nothing written",
                 P - 1, pass ? "backward: dsinks" : "forward: O's row padding");
        check(r[0] == -r[1] && st == SDPA_ERR_ALIASING && untouched, msg, "status", st, SDPA_ERR_ALIASING);
    }
    free(x); free(o); free(l); free(g); free(dq); free(dk); free(dv);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);

    /* the layout maps */
    {
        int ok = sdpa_ring_local_len(48, P, SDPA_RING_ZIGZAG) == 48 / P && sdpa_ring_local_len(49, P, SDPA_RING_CONTIGUOUS) == (49 % P ? -1 : 49) &&
                 sdpa_ring_global_row(48, P, 0, SDPA_RING_ZIGZAG, 48 / P - 1) == 47 &&
                 sdpa_ring_global_row(48, P, P - 1, SDPA_RING_CONTIGUOUS, 0) == 48 - 48 / P;
        check(ok, "sdpa_ring_local_len / sdpa_ring_global_row", "", ok, 1);
    }
    /* T = 48 splits for P = 1..4 in both layouts (2P divides 48 for P <= 4) */
    const cfg cases[] = {
        {"full contiguous", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal contiguous", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"full zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal zigzag GQA B=2 Dv!=Dk", 2, 4, 2, 48, 16, 8, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal bottom-right contiguous MQA", 1, 3, 1, 48, 8, 8, SDPA_CAUSAL_BOTTOM_RIGHT, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal zigzag kv_lengths {37, 0}", 2, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {37, 0}, 1, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"full contiguous kv_lengths {5, 48}", 2, 2, 1, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {5, 48}, 1, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"full zigzag kv_lengths {30, 13}", 2, 2, 2, 48, 8, 8, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {30, 13}, 1, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal zigzag softcap 5 scale 0.7", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 5.0f, 0.7f, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal zigzag T=96 D=64", 1, 2, 1, 96, 64, 64, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        /* sliding windows on global positions: narrower than a chunk (6 rows at P = 4
         * zig-zag), across chunk edges, one-sided, two-sided, with causal, GQA, key lengths */
        {"causal window 5 zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0,
         1, 5, SDPA_WINDOW_UNBOUNDED, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal window 13 contiguous GQA", 1, 4, 2, 48, 16, 8, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0,
         0, 1, 13, SDPA_WINDOW_UNBOUNDED, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"window (7, 3) zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 1, 7, 3,
         SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"window (0, 9) contiguous bottom-right", 1, 2, 1, 48, 8, 8, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0,
         0, 1, 0, 9, SDPA_ALIGN_BOTTOM_RIGHT, 0, 0},
        {"window (unbounded, 2) zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 1,
         SDPA_WINDOW_UNBOUNDED, 2, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"window (20, 0) zigzag kv_lengths {33, 4}", 2, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {33, 4},
         1, 0, 0, 1, 20, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"causal window 0 zigzag softcap 3", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0,
         3.0f, 0, 1, 0, SDPA_WINDOW_UNBOUNDED, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"window (2, 30) contiguous", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 1, 2,
         30, SDPA_ALIGN_TOP_LEFT, 0, 0},
        /* ALiBi on global positions (every pair one call, its diagonal_offset the chunks'
         * distance) and sinks merged after the ring */
        {"ALiBi causal zigzag GQA", 1, 4, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0,
         SDPA_ALIGN_TOP_LEFT, 1, 0},
        {"ALiBi full contiguous", 2, 2, 1, 48, 16, 8, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 0, 0, 0,
         SDPA_ALIGN_TOP_LEFT, 1, 0},
        {"ALiBi window (9, 4) zigzag kv_lengths {41, 6}", 2, 2, 2, 48, 8, 8, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {41, 6},
         1, 0, 0, 1, 9, 4, SDPA_ALIGN_TOP_LEFT, 1, 0},
        {"sinks causal zigzag", 1, 4, 4, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0,
         SDPA_ALIGN_TOP_LEFT, 2, 0},
        {"sinks full zigzag kv_lengths {37, 0}", 2, 4, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {37, 0}, 1, 0,
         0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 2, 0},
        {"ALiBi + sinks causal contiguous softcap 4", 1, 4, 1, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_CONTIGUOUS,
         {0, 0}, 0, 4.0f, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 3, 0},
        /* logits in the hundreds (scale 20: |LSE| >= 256 in most rows), where a call would
         * recompute a row's max and sum from its block alone */
        {"large logits causal zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 20.0f,
         0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"large logits + sinks causal contiguous kv_lengths {5, 0}", 2, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT,
         SDPA_RING_CONTIGUOUS, {5, 0}, 1, 0, 20.0f, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 2, 0},
        {"large sinks causal contiguous kv_lengths {9, 0}", 2, 2, 2, 48, 16, 16, SDPA_CAUSAL_TOP_LEFT,
         SDPA_RING_CONTIGUOUS, {9, 0}, 1, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 6, 0},
        {"large sinks full zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 0, 0, 0,
         SDPA_ALIGN_TOP_LEFT, 6, 0},
        /* query and key lengths that differ (a chunk of queries against a longer cache,
         * or more queries than keys): every pair one call on the global diagonal */
        {"Tq 48 Tk 96 causal bottom-right zigzag", 1, 2, 1, 48, 16, 16, SDPA_CAUSAL_BOTTOM_RIGHT, SDPA_RING_ZIGZAG,
         {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 96},
        {"Tq 96 Tk 48 full contiguous GQA Dv != Dk", 2, 4, 2, 96, 16, 8, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0},
         0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 48},
        {"Tq 48 Tk 144 window (10, 0) bottom-right ALiBi + sinks zigzag", 1, 4, 2, 48, 16, 16, SDPA_CAUSAL_NONE,
         SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 1, 10, 0, SDPA_ALIGN_BOTTOM_RIGHT, 3, 144},
        {"Tq 48 Tk 96 causal top-left kv_lengths {70, 3} contiguous", 2, 2, 2, 48, 8, 8, SDPA_CAUSAL_TOP_LEFT,
         SDPA_RING_CONTIGUOUS, {70, 3}, 1, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 96},
        {"Tq 144 Tk 48 causal bottom-right zigzag large logits", 1, 2, 2, 144, 16, 16, SDPA_CAUSAL_BOTTOM_RIGHT,
         SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 20.0f, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 48},
        {"Tq 96 Tk 48 causal bottom-right sinks contiguous (rows with no key)", 1, 4, 4, 96, 16, 16,
         SDPA_CAUSAL_BOTTOM_RIGHT, SDPA_RING_CONTIGUOUS, {0, 0}, 0, 0, 0, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 2, 48},
        /* window bounds at INT64_MAX: unbounded, nothing overflows */
        {"window (3, INT64_MAX) zigzag", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_ZIGZAG, {0, 0}, 0, 0, 0, 1, 3,
         INT64_MAX, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"window (INT64_MAX - 1, 2) contiguous", 1, 2, 2, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS, {0, 0}, 0,
         0, 0, 1, INT64_MAX - 1, 2, SDPA_ALIGN_TOP_LEFT, 0, 0},
        {"large logits full contiguous kv_lengths {30, 48}", 2, 2, 1, 48, 16, 16, SDPA_CAUSAL_NONE, SDPA_RING_CONTIGUOUS,
         {30, 48}, 1, 0, -20.0f, 0, 0, 0, SDPA_ALIGN_TOP_LEFT, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
    /* 16-bit tensors (every pair of types over a spread of the cases above: windows, GQA,
     * key lengths, ALiBi, sinks with dsinks, large logits, Tq != Tk, both layouts) */
    static const int typed_of[] = {1, 2, 4, 6, 11, 19, 22, 23, 25, 28, 29};
    static const sdpa_dtype types[][3] = {{SDPA_DTYPE_BF16, SDPA_DTYPE_BF16, SDPA_DTYPE_BF16},
                                          {SDPA_DTYPE_F16, SDPA_DTYPE_F16, SDPA_DTYPE_F16},
                                          {SDPA_DTYPE_F32, SDPA_DTYPE_BF16, SDPA_DTYPE_F32},
                                          {SDPA_DTYPE_BF16, SDPA_DTYPE_F32, SDPA_DTYPE_F16},
                                          {SDPA_DTYPE_F16, SDPA_DTYPE_BF16, SDPA_DTYPE_F32}};
    for (size_t i = 0; i < sizeof typed_of / sizeof typed_of[0]; i++)
        typed_case(&cases[typed_of[i]], types[i % 5][0], types[i % 5][1], types[i % 5][2]);
    for (int t = 0; t < 5; t++) /* each type triple on a plain causal zig-zag too */
        typed_case(&cases[2], types[t][0], types[t][1], types[t][2]);
    const char *bad[] = {"NULL Q", "negative stride", "descriptor disagrees", "bias (unsupported)",
                         "T not a multiple of 2P", "NaN scale", "O aliases Q", "negative window",
                         "windows that disagree", "bottom-right window with kv_lengths", "causal = 7",
                         "window_alignment = 9", "causal corners that disagree", "window alignments that disagree",
                         "dsinks on some ranks (a hash collision)", "a sink one ulp apart", "q_dtype = 7",
                         "misaligned kv_lengths", "dsinks on some ranks, same sinks",
                         "Tq = Tk = 2^52, batch 0", "Tk = 2^61, batch 0", "kv_lengths past the top of memory",
                         "kv_dtype bf16 on one rank"};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
        bad_case(bad[i], i);
    kvlen_alias_case();
    if (R == 0) {
        printf("mpi ring (%d ranks): %d passed, %d failed\n", P, passed, failed);
        fflush(stdout);
    }
    MPI_Finalize();
    return failed ? 1 : 0;
}
