/* SPDX-License-Identifier: MIT */
/* output_hash.c - one FNV-1a hash of the output bits of every ISA over a sweep of
 * forward and backward problems (every mask kind, GQA, decode, split-KV, Dk != Dv,
 * strided views, 1 and 2 threads). Used to show that a change which must not
 * alter results (a refactor) leaves every ISA's bits as they were:
 *     build/tests/output_hash > before.txt   (old tree)
 *     build/tests/output_hash > after.txt    (new tree)
 *     diff before.txt after.txt
 * Prints one line per ISA the machine runs: "<isa> <problems> <hash>". Public API only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint32_t lcg_state;
static int n_failed; /* problems whose forward or backward returned an error */
static float rnd(void)
{
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)((lcg_state >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static float *filled(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = rnd();
    return x;
}

typedef struct shape {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int causal, wl, wr, align, kvlen, boolmask, bias, pad;
    float scale; /* 0: the default 1/sqrt(Dk) */
} shape;

/* Runs forward then backward of one problem; hashes O, LSE, dQ, dK, dV. */
static uint64_t run(uint64_t h, const shape *s, sdpa_isa isa, int threads)
{
    const int64_t pad = s->pad; /* extra elements per row: strided views */
    const int64_t lq = s->Dk + pad, lk = s->Dk + pad, lv = s->Dv + pad, lo = s->Dv + pad;
    const size_t nq = (size_t)(s->B * s->Hq * s->Tq * lq), nk = (size_t)(s->B * s->Hkv * s->Tk * lk),
                 nv = (size_t)(s->B * s->Hkv * s->Tk * lv), no = (size_t)(s->B * s->Hq * s->Tq * lo),
                 nl = (size_t)(s->B * s->Hq * s->Tq);
    lcg_state = (uint32_t)(s->B * 7 + s->Tq * 131 + s->Tk * 31 + s->Dk * 17 + s->Dv);
    float *q = filled(nq), *k = filled(nk), *v = filled(nv), *dout = filled(no);
    float *o = calloc(no + 1, 4), *lse = calloc(nl + 1, 4);
    float *dq = calloc(nq + 1, 4), *dk = calloc(nk + 1, 4), *dv = calloc(nv + 1, 4);
    int32_t *kvl = malloc((size_t)(s->B + 1) * sizeof(int32_t));
    for (int64_t b = 0; b < s->B; b++)
        kvl[b] = (int32_t)(s->Tk - (b * 5) % (s->Tk + 1));
    const size_t nm = (size_t)(s->B * s->Tq * s->Tk);
    uint8_t *mask = malloc(nm + 1);
    for (size_t i = 0; i < nm; i++)
        mask[i] = (i * 2654435761u >> 7) % 5 != 0;
    float *bias = filled(nm);
    for (size_t i = 0; i < nm; i += 7)
        bias[i] = -INFINITY;

    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = s->B;
    p.q_heads = s->Hq;
    p.kv_heads = s->Hkv;
    p.q_len = s->Tq;
    p.kv_len = s->Tk;
    p.head_dim_qk = s->Dk;
    p.head_dim_v = s->Dv;
    if (s->scale != 0.0f) {
        p.use_default_scale = 0;
        p.scale = s->scale;
    }
    p.causal = (sdpa_causal)s->causal;
    p.window_left = s->wl;
    p.window_right = s->wr;
    p.window_alignment = (sdpa_alignment)s->align;
    p.kv_lengths = s->kvlen ? kvl : NULL;
    if (s->boolmask)
        p.bool_mask = (sdpa_bool_mask){mask, s->Tq * s->Tk, 0, s->Tk, 1};
    if (s->bias)
        p.bias = (sdpa_bias){bias, s->Tq * s->Tk, 0, s->Tk, 1};
    p.num_threads = threads;
    p.isa = isa;
    const sdpa_tensor tq = {q, s->Hq * s->Tq * lq, s->Tq * lq, lq}, tk = {k, s->Hkv * s->Tk * lk, s->Tk * lk, lk},
                      tv = {v, s->Hkv * s->Tk * lv, s->Tk * lv, lv},
                      to = {o, s->Hq * s->Tq * lo, s->Tq * lo, lo}, tl = {lse, s->Hq * s->Tq, s->Tq, 1},
                      tdo = {dout, s->Hq * s->Tq * lo, s->Tq * lo, lo};
    const sdpa_tensor_out oo = {o, to.batch_stride, to.head_stride, to.seq_stride},
                          ol = {lse, tl.batch_stride, tl.head_stride, 1},
                          odq = {dq, tq.batch_stride, tq.head_stride, tq.seq_stride},
                          odk = {dk, tk.batch_stride, tk.head_stride, tk.seq_stride},
                          odv = {dv, tv.batch_stride, tv.head_stride, tv.seq_stride};
    sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &oo, &ol);
    n_failed += st != SDPA_OK;
    h = fnv(h, &st, sizeof st);
    h = fnv(h, o, no * 4);
    h = fnv(h, lse, nl * 4);
    st = sdpa_backward(&p, &tq, &tk, &tv, &to, &tl, &tdo, &odq, &odk, &odv);
    h = fnv(h, &st, sizeof st);
    h = fnv(h, dq, nq * 4);
    h = fnv(h, dk, nk * 4);
    h = fnv(h, dv, nv * 4);
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free(kvl), free(mask), free(bias);
    return h;
}

int main(void)
{
    static const int64_t dims[] = {1, 3, 8, 15, 16, 17, 63, 64, 65, 80, 96, 128, 256};
    static const int64_t lens[] = {0, 1, 2, 15, 17, 63, 65, 129, 257};
    const int U = SDPA_WINDOW_UNBOUNDED;
    shape sh[512];
    int n = 0;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) /* head_dim sweep */
        sh[n++] = (shape){1, 2, 1, 33, 47, dims[i], dims[(i + 3) % 13], 1, U, U, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) /* length sweep, masks */
        for (size_t j = 0; j < sizeof lens / sizeof lens[0]; j += 2) {
            const int64_t tq = lens[i], tk = lens[j];
            sh[n++] = (shape){2, 4, 2, tq, tk, 64, 64, (int)((i + j) % 3), U, U, 0, 0, 0, 0, 0, 0};
            sh[n++] = (shape){2, 2, 2, tq, tk, 17, 15, 0, 5, 3, (int)(i % 2), 1, (int)(j % 2), (int)(i % 2), 3, 0};
        }
    /* prefill, decode (GQA groups in a tile, split-KV), windows, large tiles */
    sh[n++] = (shape){1, 4, 2, 300, 300, 64, 64, 1, U, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){1, 4, 2, 300, 300, 128, 128, 2, 64, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){2, 8, 2, 1, 2000, 128, 128, 0, U, U, 0, 1, 0, 0, 0, 0};
    sh[n++] = (shape){1, 8, 8, 1, 1500, 64, 64, 2, U, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){1, 32, 8, 1, 700, 96, 80, 0, U, U, 0, 0, 1, 1, 0, 0};
    sh[n++] = (shape){1, 8, 1, 4, 900, 128, 128, 2, U, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){2, 4, 4, 130, 200, 80, 96, 0, 20, 20, 1, 1, 1, 1, 5, 0};
    sh[n++] = (shape){3, 6, 3, 70, 70, 64, 64, 1, U, U, 0, 1, 0, 0, 0, 0};
    sh[n++] = (shape){1, 2, 2, 520, 520, 32, 32, 1, U, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){1, 1, 1, 5, 7, 0, 4, 0, U, U, 0, 0, 0, 0, 0, 0};
    sh[n++] = (shape){2, 2, 1, 5, 7, 0, 4, 1, U, U, 0, 1, 0, 0, 0, 0.5f};
    sh[n++] = (shape){1, 4, 2, 1, 300, 0, 64, 0, U, U, 0, 0, 0, 0, 0, -0.25f};
    sh[n++] = (shape){1, 1, 1, 5, 7, 4, 0, 0, U, U, 0, 0, 0, 0, 0, 0};

    static const sdpa_isa isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_NEON};
    int bad = 0;
    for (size_t ii = 0; ii < sizeof isas / sizeof isas[0]; ii++) {
        if (!sdpa_isa_supported(isas[ii]))
            continue;
        uint64_t h = 1469598103934665603ull;
        for (int t = 1; t <= 2; t++) {
            uint64_t ht = 1469598103934665603ull;
            for (int i = 0; i < n; i++)
                ht = run(ht, &sh[i], isas[ii], t);
            if (t == 1)
                h = ht;
            else if (ht != h)
                bad = 1, printf("%s: 2 threads differ from 1\n", sdpa_isa_name(isas[ii]));
        }
        printf("%s %d problems (%d refused) %016llx\n", sdpa_isa_name(isas[ii]), n, n_failed / 2,
               (unsigned long long)h);
        n_failed = 0;
    }
    return bad;
}
