/* SPDX-License-Identifier: MIT */
/* tools/sdpa_ring.c - `sdpa-ring forward|backward`: the sdpa tool's forward and
 * backward on .npy files, computed by ring attention over MPI (include/sdpa_mpi.h).
 *
 *   mpirun -np 4 sdpa-ring forward -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy] [options]
 *   mpirun -np 4 sdpa-ring backward -q Q.npy -k K.npy -v V.npy --do dO.npy --dq dQ.npy --dk dK.npy
 *          --dv dV.npy [-o O.npy --lse LSE.npy] [options]
 *
 * Rank 0 reads every input and writes every output (the same .npy flags as `sdpa`:
 * tools/cli_args.c); the other ranks get their slices of Q, K, V (O, LSE, dO) over
 * MPI and send back their slices of the outputs. Outputs are handled as `sdpa`'s
 * (tools/cli_out.c): checked before anything is computed, written to temporary
 * files and renamed into place all or nothing, so an error leaves none behind and
 * replaces none.
 * Options: --causal top-left|bottom-right|none, --window-left N, --window-right N
 * (-1: unbounded), --window-align top-left|bottom-right, --scale S, --softcap C,
 * --kv-len LENS.npy, --alibi-slopes SLOPES.npy, --sinks SINKS.npy (float32 (Hq,)),
 * backward --dsinks dSINKS.npy (written), --threads N, --isa NAME, --layout
 * zigzag|contiguous (default zigzag), --dtype fp32|bf16|fp16 and --kv-dtype (as `sdpa`'s:
 * Q, O, dO, dQ in --dtype's type, K, V, dK, dV in --kv-dtype's, default --dtype's; inputs
 * float32 or float16 .npy rounded to nearest even on each rank; outputs float32 .npy, or
 * float16 for an fp16 one; LSE and dsinks float32). Refused (not computed by the ring): --mask,
 * --bias, packed sequences. Q's length and K's (they may differ: a chunk of queries
 * against a longer cache) each a multiple of the rank count (2x for zig-zag).
 * Errors: "sdpa-ring: error: ..." from rank 0, exit status 2 on every rank. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_out.h"
#include "dtype.h" /* src/dtype.h: the library's exact fp32 <-> bf16 / fp16 conversions */
#include "npy.h"
#include "sdpa_mpi.h"
#include "sdpa_ring_slices.h"

enum { EXIT_BAD = 2 };
static int P, R;

typedef struct opts {
    const char *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv, *kvlen, *slopes, *sinks, *dsinks;
    int have_scale;
    float scale, softcap;
    sdpa_causal causal;
    int64_t window_left, window_right;
    sdpa_alignment align;
    sdpa_ring_layout layout;
    int threads;
    sdpa_isa isa;
    sdpa_dtype dtype, kv_dtype; /* --dtype (Q, O, dO, dQ), --kv-dtype (K, V, dK, dV) */
    int have_kv_dtype;
} opts;

/* "sdpa-ring: error: [<path>: ]<message>" */
static void verror(const char *path, const char *fmt, va_list ap)
{
    fputs("sdpa-ring: error: ", stderr);
    if (path)
        fprintf(stderr, "%s: ", path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

static void err0(const char *fmt, ...)
{
    if (R != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    verror(NULL, fmt, ap);
    va_end(ap);
}

/* cli_out.c's error line (rank 0 writes every output) */
void file_error(const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verror(path, fmt, ap);
    va_end(ap);
}

static void usage(void)
{
    if (R == 0)
        fprintf(stderr,
                "usage: mpirun -np N sdpa-ring forward -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy] [options]\n"
                "       mpirun -np N sdpa-ring backward -q Q.npy -k K.npy -v V.npy --do dO.npy --dq dQ.npy --dk dK.npy "
                "--dv dV.npy [-o O.npy --lse LSE.npy] [options]\n"
                "options: --causal top-left|bottom-right|none, --window-left N, --window-right N (-1: unbounded),\n"
                "         --window-align top-left|bottom-right, --scale S, --softcap C, --kv-len LENS.npy,\n"
                "         --alibi-slopes SLOPES.npy, --sinks SINKS.npy, backward: --dsinks dSINKS.npy (written),\n"
                "         --threads N, --isa NAME, --layout zigzag|contiguous (default zigzag),\n"
                "         --dtype fp32|bf16|fp16, --kv-dtype fp32|bf16|fp16 (default: --dtype's)\n"
                "Q, K, V: float32 or float16 (T, D), (H, T, D) or (B, H, T, D); Q's T and K's each a\n"
                "multiple of N (contiguous) or 2N (zigzag). Types as `sdpa`'s: Q, O, dO, dQ stored in\n"
                "--dtype's, K, V, dK, dV in --kv-dtype's, rounded to nearest even; outputs float32 .npy\n"
                "(float16 for an fp16 one), LSE and dsinks float32. Rank 0 reads and writes the files.\n");
}

/* Parses argv (every rank parses the same). Returns 0 or EXIT_BAD. */
static int parse(int bwd, int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->layout = SDPA_RING_ZIGZAG;
    o->isa = SDPA_ISA_AUTO;
    o->window_left = o->window_right = SDPA_WINDOW_UNBOUNDED;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return -1;
        }
        static const char *const refused[] = {"--mask", "--bias", "--cu-seqlens-q",
                                              "--cu-seqlens-k", "--block-table", "--seq-lens-k", "--page-layout"};
        for (size_t j = 0; j < sizeof refused / sizeof refused[0]; j++)
            if (!strcmp(a, refused[j])) {
                err0("%s: not supported by sdpa-ring (use `sdpa` on one machine)", a);
                return EXIT_BAD;
            }
        if (i + 1 >= argc) {
            err0("option '%s' needs a value (or is unknown)", a);
            usage();
            return EXIT_BAD;
        }
        const char *v = argv[++i];
        char *end;
        if (!strcmp(a, "-q") || !strcmp(a, "--query")) o->q = v;
        else if (!strcmp(a, "-k") || !strcmp(a, "--key")) o->k = v;
        else if (!strcmp(a, "-v") || !strcmp(a, "--value")) o->v = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->o = v;
        else if (!strcmp(a, "--lse")) o->lse = v;
        else if (bwd && !strcmp(a, "--do")) o->dout = v;
        else if (bwd && !strcmp(a, "--dq")) o->dq = v;
        else if (bwd && !strcmp(a, "--dk")) o->dk = v;
        else if (bwd && !strcmp(a, "--dv")) o->dv = v;
        else if (!strcmp(a, "--kv-len")) o->kvlen = v;
        else if (!strcmp(a, "--alibi-slopes")) o->slopes = v;
        else if (!strcmp(a, "--sinks")) o->sinks = v;
        else if (bwd && !strcmp(a, "--dsinks")) o->dsinks = v;
        else if (!strcmp(a, "--scale") || !strcmp(a, "--softcap")) {
            errno = 0;
            const float x = strtof(v, &end);
            if (errno || *end || !*v || !isfinite(x) || (a[2] == 's' && a[3] == 'o' && x < 0)) {
                err0("%s '%s': expected a finite number%s", a, v, a[3] == 'o' ? " >= 0" : "");
                return EXIT_BAD;
            }
            if (a[3] == 'o')
                o->softcap = x;
            else {
                o->scale = x;
                o->have_scale = 1;
            }
        } else if (!strcmp(a, "--causal")) {
            if (!strcmp(v, "top-left")) o->causal = SDPA_CAUSAL_TOP_LEFT;
            else if (!strcmp(v, "bottom-right")) o->causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            else if (!strcmp(v, "none")) o->causal = SDPA_CAUSAL_NONE;
            else {
                err0("--causal '%s': expected top-left, bottom-right or none", v);
                return EXIT_BAD;
            }
        } else if (!strcmp(a, "--window-left") || !strcmp(a, "--window-right")) {
            errno = 0;
            const long long n = strtoll(v, &end, 10);
            if (errno || *end || !*v || n < -1) {
                err0("%s '%s': expected an integer >= 0 (or -1: unbounded)", a, v);
                return EXIT_BAD;
            }
            *(a[9] == 'l' ? &o->window_left : &o->window_right) = (int64_t)n;
        } else if (!strcmp(a, "--window-align")) {
            if (!strcmp(v, "top-left")) o->align = SDPA_ALIGN_TOP_LEFT;
            else if (!strcmp(v, "bottom-right")) o->align = SDPA_ALIGN_BOTTOM_RIGHT;
            else {
                err0("--window-align '%s': expected top-left or bottom-right", v);
                return EXIT_BAD;
            }
        } else if (!strcmp(a, "--layout")) {
            if (!strcmp(v, "zigzag")) o->layout = SDPA_RING_ZIGZAG;
            else if (!strcmp(v, "contiguous")) o->layout = SDPA_RING_CONTIGUOUS;
            else {
                err0("--layout '%s': expected zigzag or contiguous", v);
                return EXIT_BAD;
            }
        } else if (!strcmp(a, "--threads")) {
            const long n = strtol(v, &end, 10);
            if (*end || !*v || n < 0 || n > 4096) {
                err0("--threads '%s': expected an integer in [0, 4096]", v);
                return EXIT_BAD;
            }
            o->threads = (int)n;
        } else if (!strcmp(a, "--dtype") || !strcmp(a, "--kv-dtype")) {
            sdpa_dtype *dt = a[2] == 'd' ? &o->dtype : &o->kv_dtype;
            if (!strcmp(v, "fp32")) *dt = SDPA_DTYPE_F32;
            else if (!strcmp(v, "bf16")) *dt = SDPA_DTYPE_BF16;
            else if (!strcmp(v, "fp16")) *dt = SDPA_DTYPE_F16;
            else {
                err0("%s '%s': expected fp32, bf16 or fp16", a, v);
                return EXIT_BAD;
            }
            if (a[2] == 'k')
                o->have_kv_dtype = 1;
        } else if (!strcmp(a, "--isa")) {
            if (sdpa_isa_from_name(v, &o->isa) != 0 || (o->isa != SDPA_ISA_AUTO && !sdpa_isa_supported(o->isa))) {
                err0("--isa '%s': unknown or not supported here", v);
                return EXIT_BAD;
            }
        } else {
            err0("unknown option '%s' for 'sdpa-ring %s'", a, bwd ? "backward" : "forward");
            usage();
            return EXIT_BAD;
        }
    }
    if (!o->have_kv_dtype)
        o->kv_dtype = o->dtype;
    if (!o->q || !o->k || !o->v) {
        err0("-q, -k and -v are required");
        return EXIT_BAD;
    }
    if (!bwd && !o->o) {
        err0("forward needs -o O.npy");
        return EXIT_BAD;
    }
    if (bwd && (!o->dout || !o->dq || !o->dk || !o->dv)) {
        err0("backward needs --do, --dq, --dk and --dv");
        return EXIT_BAD;
    }
    if (bwd && !o->o != !o->lse) {
        err0("backward: give both -o and --lse (the forward's O and LSE) or neither (recomputed)");
        return EXIT_BAD;
    }
    return 0;
}

/* ------------------------------------------------------------ files (rank 0) */

typedef struct arr {
    npy_array a;
    int64_t b, h, t, d;
} arr;

static int load(const char *path, const char *role, arr *x)
{
    char e[256];
    if (npy_read(path, &x->a, e, sizeof e) != 0) {
        err0("%s: %s", path, e);
        return EXIT_BAD;
    }
    if ((x->a.dtype != NPY_F4 && x->a.dtype != NPY_F2) || x->a.ndim < 2 || x->a.ndim > 4) {
        err0("%s: %s must be float32 or float16 of rank 2, 3 or 4", path, role);
        return EXIT_BAD;
    }
    if (x->a.dtype == NPY_F2) { /* widened (exact): the slices are rounded into their types later */
        float *f = malloc(sizeof(float) * (x->a.count + 1));
        if (!f) {
            err0("%s: out of memory", path);
            return EXIT_BAD;
        }
        for (size_t i = 0; i < x->a.count; i++)
            f[i] = sdpa_f16_to_f32(((const uint16_t *)x->a.data)[i]);
        free(x->a.data);
        x->a.data = f;
        x->a.dtype = NPY_F4;
    }
    const int n = x->a.ndim;
    x->d = x->a.shape[n - 1];
    x->t = x->a.shape[n - 2];
    x->h = n >= 3 ? x->a.shape[n - 3] : 1;
    x->b = n == 4 ? x->a.shape[0] : 1;
    return 0;
}

static int same_shape(const arr *x, const char *path, const char *role, int ndim, int64_t b, int64_t h, int64_t t,
                      int64_t d)
{
    if (x->a.ndim != ndim || x->b != b || x->h != h || x->t != t || x->d != d) {
        err0("%s: %s has the wrong shape (expected B=%lld H=%lld T=%lld D=%lld in rank %d)", path, role, (long long)b,
             (long long)h, (long long)t, (long long)d, ndim);
        return EXIT_BAD;
    }
    return 0;
}

/* Rank 0: the outputs of the command (cli_out.c, as `sdpa`): checked and their
 * temporaries created before anything is computed (two outputs naming one file, an
 * output naming an input, a missing directory: refused on every rank), written and
 * renamed into place, all or nothing, after. Returns 0 or EXIT_BAD. */
static int outputs_prepare(int bwd, const opts *o, out_file *outs, int *n)
{
    const char *paths[4] = {bwd ? o->dq : o->o, bwd ? o->dk : o->lse, bwd ? o->dv : NULL, bwd ? o->dsinks : NULL};
    const char *ins[] = {o->q, o->k, o->v, o->dout, o->kvlen, o->slopes, o->sinks, bwd ? o->o : NULL,
                         bwd ? o->lse : NULL};
    *n = 0;
    for (int i = 0; i < 4; i++)
        if (paths[i])
            paths[(*n)++] = paths[i];
    if (same_paths(paths, *n)) {
        err0("two outputs name the same file");
        return EXIT_BAD;
    }
    for (int i = 0; i < *n; i++)
        for (size_t j = 0; j < sizeof ins / sizeof ins[0]; j++)
            if (ins[j] && same_file(paths[i], ins[j])) {
                err0("output %s is also an input", paths[i]);
                return EXIT_BAD;
            }
    for (int i = 0; i < *n; i++) {
        outs[i] = (out_file){.path = paths[i], .dt = SDPA_DTYPE_F32};
        if (out_prepare(&outs[i]))
            return EXIT_BAD;
    }
    return 0;
}

/* An output's data and shape, before out_commit. */
static void output_set(out_file *of, const void *data, int ndim, const int64_t *shape)
{
    of->data = data;
    of->ndim = ndim;
    memcpy(of->shape, shape, (size_t)ndim * sizeof shape[0]);
}

static int run(int bwd, int argc, char **argv)
{
    opts o;
    int rc = parse(bwd, argc, argv, &o);
    if (rc)
        return rc < 0 ? 0 : rc;
    /* rank 0 reads; hdr: rc, ndim, B, Hq, Hkv, Tq, Dk, Dv, have O/LSE, Tk */
    arr q = {0}, k = {0}, v = {0}, O = {0}, L = {0}, dO = {0};
    npy_array kl = {0}, sl = {0}, sk = {0};
    int64_t hdr[10] = {0};
    int32_t *kvlen = NULL;
    float *slopes = NULL, *sinks = NULL, *dsinks = NULL;
    out_file outs[4];
    int nout = 0;
    memset(outs, 0, sizeof outs);
    if (R == 0) {
        install_signal_cleanup();
        rc = load(o.q, "Q", &q);
        if (!rc) rc = load(o.k, "K", &k);
        if (!rc) rc = load(o.v, "V", &v);
        if (!rc && (k.a.ndim != q.a.ndim || v.a.ndim != q.a.ndim || k.b != q.b || k.d != q.d || v.b != k.b ||
                    v.h != k.h || v.t != k.t || k.h == 0 || q.h % k.h)) {
            err0("%s, %s, %s: Q, K, V do not fit (same rank and batch, K and V the same heads and length, Q's heads "
                 "a multiple of K's, Q and K the same head_dim)", o.q, o.k, o.v);
            rc = EXIT_BAD;
        }
        for (int w = 0; w < 2 && !rc; w++) { /* Q's length, K's: each split over the ranks */
            const int64_t t = w ? k.t : q.t;
            if (sdpa_ring_local_len(t, P, o.layout) < 0) {
                err0("%s: T = %lld is not a multiple of %d (%s layout on %d ranks)", w ? o.k : o.q, (long long)t,
                     o.layout == SDPA_RING_ZIGZAG ? 2 * P : P, o.layout == SDPA_RING_ZIGZAG ? "zigzag" : "contiguous",
                     P);
                rc = EXIT_BAD;
            }
        }
        if (!rc && bwd && o.o) {
            rc = load(o.o, "O", &O);
            if (!rc) rc = same_shape(&O, o.o, "O", q.a.ndim, q.b, q.h, q.t, v.d);
            if (!rc) {
                char e[256] = "";
                int ok = npy_read(o.lse, &L.a, e, sizeof e) == 0 && L.a.dtype == NPY_F4 && L.a.ndim == q.a.ndim - 1;
                for (int d = 0; ok && d < L.a.ndim; d++) /* Q.shape[:-1] exactly */
                    ok = L.a.shape[d] == q.a.shape[d];
                if (!ok) {
                    err0("%s: %s", o.lse, e[0] ? e : "the LSE must be float32 of shape Q.shape[:-1]");
                    rc = EXIT_BAD;
                }
            }
        }
        if (!rc && bwd) {
            rc = load(o.dout, "dO", &dO);
            if (!rc) rc = same_shape(&dO, o.dout, "dO", q.a.ndim, q.b, q.h, q.t, v.d);
        }
        if (!rc && o.kvlen) {
            char e[256];
            if (npy_read(o.kvlen, &kl, e, sizeof e) != 0 || (kl.dtype != NPY_I4 && kl.dtype != NPY_I8) || kl.ndim != 1 ||
                kl.shape[0] != q.b) {
                err0("%s: kv lengths must be int32 or int64 of shape (B,) = (%lld,)", o.kvlen, (long long)q.b);
                rc = EXIT_BAD;
            }
        }
        for (int w = 0; w < 2 && !rc; w++) { /* slopes, sinks: float32 (Hq,) */
            const char *path = w ? o.sinks : o.slopes;
            npy_array *a = w ? &sk : &sl;
            char e[256] = "";
            if (path && npy_read(path, a, e, sizeof e) != 0) {
                err0("%s: %s", path, e);
                rc = EXIT_BAD;
            } else if (path && (a->dtype != NPY_F4 || a->ndim != 1 || a->shape[0] != q.h)) {
                err0("%s: %s must be float32 of shape (Hq,) = (%lld,)", path, w ? "sinks" : "ALiBi slopes",
                     (long long)q.h);
                rc = EXIT_BAD;
            }
        }
        if (!rc && o.dsinks && !o.sinks) {
            err0("--dsinks needs --sinks (it is the gradient of the sinks)");
            rc = EXIT_BAD;
        }
        if (!rc)
            rc = outputs_prepare(bwd, &o, outs, &nout);
        const int64_t h[10] = {rc, q.a.ndim, q.b, q.h, k.h, q.t, q.d, v.d, bwd && o.o, k.t};
        memcpy(hdr, h, sizeof hdr);
    }
    MPI_Bcast(hdr, 10, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (hdr[0]) {
        rc = (int)hdr[0];
        goto done;
    }
    const int ndim = (int)hdr[1];
    const int64_t B = hdr[2], Hq = hdr[3], Hkv = hdr[4], T = hdr[5], Dk = hdr[6], Dv = hdr[7], Tl = T / P,
                  Tk = hdr[9], Tkl = Tk / P;
    if (o.kvlen) {
        kvlen = malloc(sizeof(int32_t) * (size_t)(B + 1));
        if (R == 0)
            for (int64_t b = 0; b < B; b++) {
                const int64_t x = kl.dtype == NPY_I4 ? ((int32_t *)kl.data)[b] : ((int64_t *)kl.data)[b];
                kvlen[b] = x < 0 ? -1 : x > INT32_MAX ? INT32_MAX : (int32_t)x; /* the library checks the range */
            }
        MPI_Bcast(kvlen, (int)B, MPI_INT32_T, 0, MPI_COMM_WORLD);
    }
    if (o.slopes) {
        slopes = malloc(sizeof(float) * (size_t)(Hq + 1));
        if (R == 0)
            memcpy(slopes, sl.data, sizeof(float) * (size_t)Hq);
        MPI_Bcast(slopes, (int)Hq, MPI_FLOAT, 0, MPI_COMM_WORLD);
    }
    if (o.sinks) {
        sinks = malloc(sizeof(float) * (size_t)(Hq + 1));
        if (R == 0)
            memcpy(sinks, sk.data, sizeof(float) * (size_t)Hq);
        MPI_Bcast(sinks, (int)Hq, MPI_FLOAT, 0, MPI_COMM_WORLD);
    }
    if (o.dsinks)
        dsinks = calloc((size_t)(Hq + 1), sizeof(float));
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B;
    p.q_heads = Hq;
    p.kv_heads = Hkv;
    p.q_len = T;
    p.kv_len = Tk;
    p.head_dim_qk = Dk;
    p.head_dim_v = Dv;
    p.causal = o.causal;
    p.window_left = o.window_left;
    p.window_right = o.window_right;
    p.window_alignment = o.align;
    p.kv_lengths = kvlen;
    p.alibi_slopes = slopes;
    p.sinks = sinks;
    p.softcap = o.softcap;
    p.num_threads = o.threads;
    p.isa = o.isa;
    p.q_dtype = p.o_dtype = o.dtype;
    p.kv_dtype = o.kv_dtype;
    if (o.have_scale) {
        p.use_default_scale = 0;
        p.scale = o.scale;
    }
    /* every rank's slices, rounded into their types (Q, O, dO: --dtype; K, V: --kv-dtype) */
    const sdpa_dtype qt = o.dtype, kvt = o.kv_dtype;
    const int64_t nlq = B * Hq * Tl * Dk, nlo = B * Hq * Tl * Dv, nlk = B * Hkv * Tkl * Dk, nlv = B * Hkv * Tkl * Dv;
    void *lq = ring_to_type(ring_scatter(P, R, q.a.data, B, Hq, T, Dk, o.layout), nlq, qt),
         *lk = ring_to_type(ring_scatter(P, R, k.a.data, B, Hkv, Tk, Dk, o.layout), nlk, kvt),
         *lv = ring_to_type(ring_scatter(P, R, v.a.data, B, Hkv, Tk, Dv, o.layout), nlv, kvt);
    void *lo = NULL, *ldo = NULL, *ldq = NULL, *ldk = NULL, *ldv = NULL;
    float *ll = NULL;
    const sdpa_tensor tq = ring_view(lq, Hq, Tl, Dk), tk = ring_view(lk, Hkv, Tkl, Dk), tv = ring_view(lv, Hkv, Tkl, Dv);
    sdpa_status st = SDPA_OK;
    if (hdr[8]) { /* backward with the given O and LSE */
        lo = ring_to_type(ring_scatter(P, R, O.a.data, B, Hq, T, Dv, o.layout), nlo, qt);
        ll = ring_scatter(P, R, L.a.data, B, Hq, T, 1, o.layout);
    } else {
        lo = malloc(ring_dtype_bytes(qt) * (size_t)(nlo + 1));
        ll = malloc(sizeof(float) * (size_t)(B * Hq * Tl + 1));
        const sdpa_tensor_out to = ring_view_out(lo, Hq, Tl, Dv), tl = ring_view_out(ll, Hq, Tl, 1);
        st = sdpa_ring_forward(MPI_COMM_WORLD, o.layout, &p, &tq, &tk, &tv, &to, &tl);
    }
    if (st == SDPA_OK && bwd) {
        ldo = ring_to_type(ring_scatter(P, R, dO.a.data, B, Hq, T, Dv, o.layout), nlo, qt);
        ldq = malloc(ring_dtype_bytes(qt) * (size_t)(nlq + 1));
        ldk = malloc(ring_dtype_bytes(kvt) * (size_t)(nlk + 1));
        ldv = malloc(ring_dtype_bytes(kvt) * (size_t)(nlv + 1));
        const sdpa_tensor tO = ring_view(lo, Hq, Tl, Dv), tL = ring_view(ll, Hq, Tl, 1), tdo = ring_view(ldo, Hq, Tl, Dv);
        const sdpa_tensor_out tdq = ring_view_out(ldq, Hq, Tl, Dk), tdk = ring_view_out(ldk, Hkv, Tkl, Dk),
                              tdv = ring_view_out(ldv, Hkv, Tkl, Dv);
        p.dsinks = dsinks;
        st = sdpa_ring_backward(MPI_COMM_WORLD, o.layout, &p, &tq, &tk, &tv, &tO, &tL, &tdo, &tdq, &tdk, &tdv);
    }
    if (st != SDPA_OK) { /* the same status on every rank */
        err0("libsdpa_mpi: %s (status %d)", sdpa_status_string(st), (int)st);
        rc = EXIT_BAD;
    } else {
        int64_t shape[4];
        int w = 0;
        /* shape in the inputs' rank: [B, H, T, D] without the leading 1s the inputs lacked */
#define SHAPE(h_, t_, d_, nd_)                                                                                         \
    do {                                                                                                               \
        const int64_t full[4] = {B, h_, t_, d_};                                                                       \
        for (int i_ = 0; i_ < (nd_); i_++)                                                                             \
            shape[i_] = full[4 - ndim + i_];                                                                           \
    } while (0)
        if (!bwd) {
            lo = ring_to_f32(lo, nlo, qt);
            float *gl = ring_gather(P, R, ll, B, Hq, T, 1, o.layout);
            void *go = ring_file_data(ring_gather(P, R, lo, B, Hq, T, Dv, o.layout), B * Hq * T * Dv, qt);
            if (R == 0 && (!go || !gl)) {
                err0("out of memory gathering the outputs");
                w = EXIT_BAD;
            } else if (R == 0) {
                SHAPE(Hq, T, Dv, ndim);
                output_set(&outs[0], go, ndim, shape);
                outs[0].dt = qt == SDPA_DTYPE_F16 ? SDPA_DTYPE_F16 : SDPA_DTYPE_F32;
                if (o.lse) {
                    SHAPE(Hq, T, 1, ndim - 1);
                    output_set(&outs[1], gl, ndim - 1, shape);
                }
                w = out_commit(outs, nout);
            }
            free(go);
            free(gl);
        } else {
            ldq = ring_to_f32(ldq, nlq, qt);
            ldk = ring_to_f32(ldk, nlk, kvt);
            ldv = ring_to_f32(ldv, nlv, kvt);
            void *gq = ring_file_data(ring_gather(P, R, ldq, B, Hq, T, Dk, o.layout), B * Hq * T * Dk, qt),
                 *gk = ring_file_data(ring_gather(P, R, ldk, B, Hkv, Tk, Dk, o.layout), B * Hkv * Tk * Dk, kvt),
                 *gv = ring_file_data(ring_gather(P, R, ldv, B, Hkv, Tk, Dv, o.layout), B * Hkv * Tk * Dv, kvt);
            if (R == 0 && (!gq || !gk || !gv)) {
                err0("out of memory gathering the outputs");
                w = EXIT_BAD;
            } else if (R == 0) {
                const sdpa_dtype fq = qt == SDPA_DTYPE_F16 ? SDPA_DTYPE_F16 : SDPA_DTYPE_F32,
                                 fkv = kvt == SDPA_DTYPE_F16 ? SDPA_DTYPE_F16 : SDPA_DTYPE_F32;
                SHAPE(Hq, T, Dk, ndim);
                output_set(&outs[0], gq, ndim, shape);
                outs[0].dt = fq;
                SHAPE(Hkv, Tk, Dk, ndim);
                output_set(&outs[1], gk, ndim, shape);
                outs[1].dt = fkv;
                SHAPE(Hkv, Tk, Dv, ndim);
                output_set(&outs[2], gv, ndim, shape);
                outs[2].dt = fkv;
                shape[0] = Hq;
                if (o.dsinks)
                    output_set(&outs[3], dsinks, 1, shape);
                w = out_commit(outs, nout);
            }
            free(gq);
            free(gk);
            free(gv);
        }
#undef SHAPE
        int64_t ww = w;
        MPI_Bcast(&ww, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        rc = (int)ww;
    }
    free(lq), free(lk), free(lv), free(lo), free(ll), free(ldo), free(ldq), free(ldk), free(ldv);
done:
    out_discard(outs, nout); /* whatever out_commit did not take (an error before it) */
    npy_free(&q.a), npy_free(&k.a), npy_free(&v.a), npy_free(&O.a), npy_free(&L.a), npy_free(&dO.a), npy_free(&kl);
    npy_free(&sl), npy_free(&sk);
    free(kvlen), free(slopes), free(sinks), free(dsinks);
    return rc;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    int rc;
    if (argc >= 2 && !strcmp(argv[1], "forward"))
        rc = run(0, argc, argv);
    else if (argc >= 2 && !strcmp(argv[1], "backward"))
        rc = run(1, argc, argv);
    else {
        usage();
        rc = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) ? 0 : EXIT_BAD;
    }
    MPI_Finalize();
    return rc;
}
