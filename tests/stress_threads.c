/* SPDX-License-Identifier: MIT */
/* tests/stress_threads.c - 64 caller threads on shared read-only inputs
 * (issue 14, "Checks that stay").
 *
 * Every caller runs forwards and backwards of three shapes (GQA prefill with a
 * bottom-right causal mask, split-KV decode with kv_lengths, a boolean mask and
 * bias) on mixed ISAs (each supported one by name, and SDPA_ISA_AUTO) and
 * thread counts (num_threads 1, and 2 for one caller in eight: 2 cores), while
 * another thread calls sdpa_force_isa() in a loop over the supported ISAs.
 * Every result must be bitwise equal to the single-threaded result of its ISA
 * computed before the threads start; with SDPA_ISA_AUTO the forward and the
 * backward must each equal the result of one of the ISAs (force_isa may change
 * the default between calls, never inside one). The backward reads the first
 * ISA's forward outputs, shared by all callers. Prints the number of calls.
 *
 *   stress_threads [ITERATIONS] [--threads1]
 * ITERATIONS per caller (default 12); --threads1: every call with num_threads =
 * 1, the honest version under ThreadSanitizer (libgomp is not instrumented, so
 * TSan cannot see its team's synchronisation and would report false races). */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

#define CALLERS 64
#define NSHAPES 3

typedef struct shape {
    const char *name;
    int64_t B, Hq, Hkv, Tq, Tk, D;
    int causal, masks;
} shape;

static const shape shapes[NSHAPES] = {
    {"prefill GQA causal", 1, 4, 2, 37, 45, 32, 2, 0},
    {"split-KV decode", 2, 2, 1, 1, 300, 16, 0, 1},
    {"masks", 1, 2, 2, 19, 23, 8, 0, 1},
};

typedef struct shape_data {
    sdpa_problem p;
    float *q, *k, *v, *dout, *bias;
    uint8_t *bm;
    int32_t kvl[2];
    size_t nq, nk, no, nl;
    /* per ISA: o, lse, dq, dk, dv of the single-threaded run (NULL: ISA not supported) */
    float *ref[SDPA_ISA_COUNT][5];
} shape_data;

static shape_data g_sd[NSHAPES];
static sdpa_isa g_isas[SDPA_ISA_COUNT];
static int g_nisa, g_iters = 12, g_threads1;
static atomic_int g_stop, g_bad;
static atomic_long g_calls, g_forces;

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static float *fill(size_t n, uint64_t seed)
{
    float *x = malloc((n + 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(mix(seed + i) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    return x;
}

static size_t sizes(const shape *s, size_t n[5])
{
    n[0] = (size_t)(s->B * s->Hq * s->Tq * s->D);  /* o, dq, q */
    n[1] = (size_t)(s->B * s->Hq * s->Tq);         /* lse */
    n[2] = n[0];                                   /* dq */
    n[3] = (size_t)(s->B * s->Hkv * s->Tk * s->D); /* dk, k, v */
    n[4] = n[3];                                   /* dv */
    return 5;
}

/* One forward + backward of shape i with problem p; outputs in out[5]. */
static sdpa_status run(int i, const sdpa_problem *p, float *out[5])
{
    const shape *s = &shapes[i];
    const shape_data *d = &g_sd[i];
    const int64_t D = s->D;
    sdpa_tensor q = {d->q, s->Hq * s->Tq * D, s->Tq * D, D}, k = {d->k, s->Hkv * s->Tk * D, s->Tk * D, D},
                v = {d->v, s->Hkv * s->Tk * D, s->Tk * D, D};
    sdpa_tensor_out o = {out[0], s->Hq * s->Tq * D, s->Tq * D, D}, l = {out[1], s->Hq * s->Tq, s->Tq, 1};
    sdpa_status st = sdpa_forward(p, &q, &k, &v, &o, &l);
    if (st != SDPA_OK)
        return st;
    /* The backward reads the forward outputs of the first ISA (shared and
     * read-only), not this call's: with SDPA_ISA_AUTO the forward and the
     * backward may run on different ISAs when force_isa runs between them. */
    const float *o0 = d->ref[g_isas[0]][0], *l0 = d->ref[g_isas[0]][1];
    sdpa_tensor oi = {o0, s->Hq * s->Tq * D, s->Tq * D, D}, li = {l0, s->Hq * s->Tq, s->Tq, 1},
                dO = {d->dout, s->Hq * s->Tq * D, s->Tq * D, D};
    sdpa_tensor_out dq = {out[2], s->Hq * s->Tq * D, s->Tq * D, D}, dk = {out[3], s->Hkv * s->Tk * D, s->Tk * D, D},
                    dv = {out[4], s->Hkv * s->Tk * D, s->Tk * D, D};
    return sdpa_backward(p, &q, &k, &v, &oi, &li, &dO, &dq, &dk, &dv);
}

static void setup(void)
{
    for (int i = 0; i < NSHAPES; i++) {
        const shape *s = &shapes[i];
        shape_data *d = &g_sd[i];
        sdpa_problem_init(&d->p);
        d->p.batch = s->B;
        d->p.q_heads = s->Hq;
        d->p.kv_heads = s->Hkv;
        d->p.q_len = s->Tq;
        d->p.kv_len = s->Tk;
        d->p.head_dim_qk = d->p.head_dim_v = s->D;
        d->p.causal = (sdpa_causal)s->causal;
        size_t n[5];
        sizes(s, n);
        d->q = fill(n[0], 1000u * (unsigned)i + 1);
        d->k = fill(n[3], 1000u * (unsigned)i + 2);
        d->v = fill(n[3], 1000u * (unsigned)i + 3);
        d->dout = fill(n[0], 1000u * (unsigned)i + 4);
        if (s->masks) {
            const size_t nm = (size_t)(s->B * s->Hq * s->Tq * s->Tk);
            d->bias = fill(nm, 1000u * (unsigned)i + 5);
            d->bm = malloc(nm);
            for (size_t j = 0; j < nm; j++)
                d->bm[j] = (mix(j + 77) & 7) != 0;
            d->p.bias = (sdpa_bias){d->bias, s->Hq * s->Tq * s->Tk, s->Tq * s->Tk, s->Tk, 1};
            d->p.bool_mask = (sdpa_bool_mask){d->bm, s->Hq * s->Tq * s->Tk, s->Tq * s->Tk, s->Tk, 1};
            for (int b = 0; b < s->B && b < 2; b++)
                d->kvl[b] = (int32_t)(s->Tk - 7 * b - 1);
            d->p.kv_lengths = d->kvl;
        }
        for (int a = 0; a < g_nisa; a++) {
            float **r = d->ref[g_isas[a]];
            for (int j = 0; j < 5; j++)
                r[j] = malloc((n[j] + 1) * sizeof(float));
            sdpa_problem p = d->p;
            p.isa = g_isas[a];
            p.num_threads = 1;
            const sdpa_status st = run(i, &p, r);
            if (st != SDPA_OK) {
                fprintf(stderr, "stress_threads: reference %s %s: %s\n", s->name, sdpa_isa_name(g_isas[a]),
                        sdpa_status_string(st));
                exit(1);
            }
        }
    }
}

/* Outputs [j0, j1) of shape i equal to the single-threaded ones of isa. */
static int equal_to(int i, sdpa_isa isa, float *out[5], int j0, int j1)
{
    size_t n[5];
    sizes(&shapes[i], n);
    for (int j = j0; j < j1; j++)
        if (memcmp(out[j], g_sd[i].ref[isa][j], n[j] * sizeof(float)) != 0)
            return 0;
    return 1;
}

static void *caller(void *arg)
{
    const int id = (int)(intptr_t)arg;
    float *out[NSHAPES][5];
    for (int i = 0; i < NSHAPES; i++) {
        size_t n[5];
        sizes(&shapes[i], n);
        for (int j = 0; j < 5; j++)
            out[i][j] = malloc((n[j] + 1) * sizeof(float));
    }
    while (atomic_load(&g_forces) < 64) /* force_isa is running before the first call */
        sched_yield();
    for (int it = 0; it < g_iters; it++) {
        const uint64_t r = mix((uint64_t)id * 1000003u + (uint64_t)it);
        const int i = (int)(r % NSHAPES);
        const int a = (int)((r >> 8) % (uint64_t)(g_nisa + 1)); /* g_nisa: AUTO */
        sdpa_problem p = g_sd[i].p;
        p.isa = a < g_nisa ? g_isas[a] : SDPA_ISA_AUTO;
        p.num_threads = (!g_threads1 && id % 8 == 0 && (it & 1)) ? 2 : 1;
        const sdpa_status st = run(i, &p, out[i]);
        atomic_fetch_add(&g_calls, 2);
        int ok = st == SDPA_OK;
        if (ok && a < g_nisa)
            ok = equal_to(i, g_isas[a], out[i], 0, 5);
        else if (ok) { /* AUTO: the forward and the backward each equal to one ISA's */
            int fwd = 0, bwd = 0;
            for (int b = 0; b < g_nisa; b++) {
                fwd |= equal_to(i, g_isas[b], out[i], 0, 2);
                bwd |= equal_to(i, g_isas[b], out[i], 2, 5);
            }
            ok = fwd && bwd;
        }
        if (!ok && atomic_fetch_add(&g_bad, 1) < 10)
            fprintf(stderr, "stress_threads: FAIL: caller %d call %d: %s isa %s threads %d: %s\n", id, it,
                    shapes[i].name, sdpa_isa_name(p.isa), p.num_threads,
                    st == SDPA_OK ? "bits differ from the single-threaded result" : sdpa_status_string(st));
    }
    for (int i = 0; i < NSHAPES; i++)
        for (int j = 0; j < 5; j++)
            free(out[i][j]);
    return NULL;
}

static void *forcer(void *arg)
{
    (void)arg;
    for (unsigned n = 0; !atomic_load(&g_stop); n++) {
        const sdpa_isa isa = n % (unsigned)(g_nisa + 1) == (unsigned)g_nisa ? SDPA_ISA_AUTO : g_isas[n % (unsigned)(g_nisa + 1)];
        if (sdpa_force_isa(isa) != SDPA_OK) {
            fprintf(stderr, "stress_threads: FAIL: sdpa_force_isa(%s)\n", sdpa_isa_name(isa));
            atomic_fetch_add(&g_bad, 1);
        }
        atomic_fetch_add(&g_forces, 1);
        sched_yield();
    }
    return NULL;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads1") == 0)
            g_threads1 = 1;
        else
            g_iters = atoi(argv[i]);
    }
    for (int isa = SDPA_ISA_SCALAR; isa < SDPA_ISA_COUNT; isa++)
        if (sdpa_isa_supported((sdpa_isa)isa))
            g_isas[g_nisa++] = (sdpa_isa)isa;
    setup();
    pthread_t th[CALLERS], fth;
    pthread_create(&fth, NULL, forcer, NULL);
    for (int t = 0; t < CALLERS; t++)
        if (pthread_create(&th[t], NULL, caller, (void *)(intptr_t)t) != 0) {
            fprintf(stderr, "stress_threads: cannot create thread %d\n", t);
            return 1;
        }
    for (int t = 0; t < CALLERS; t++)
        pthread_join(th[t], NULL);
    atomic_store(&g_stop, 1);
    pthread_join(fth, NULL);
    sdpa_force_isa(SDPA_ISA_AUTO);
    printf("stress_threads: %ld calls (forward and backward) from %d threads on %d shapes, ISAs", atomic_load(&g_calls),
           CALLERS, NSHAPES);
    for (int a = 0; a < g_nisa; a++)
        printf(" %s", sdpa_isa_name(g_isas[a]));
    printf(" and auto, num_threads %s, %ld sdpa_force_isa calls alongside: %d results not bitwise equal to the "
           "single-threaded ones\n",
           g_threads1 ? "1" : "1 and 2", atomic_load(&g_forces), atomic_load(&g_bad));
    return atomic_load(&g_bad) ? 1 : 0;
}
