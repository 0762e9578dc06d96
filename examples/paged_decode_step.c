/* SPDX-License-Identifier: MIT */
/* examples/paged_decode_step.c - one decode step of a server over a paged KV cache.
 *
 * Three sequences decode one token each; their keys live in a vLLM-style cache
 * [num_blocks, Hkv, block_size, D] (HND) reached through a block table, pages in
 * any order and the first page shared by two sequences (prefix caching). One
 * sdpa_forward_with_workspace call computes the three rows, reading the pages in
 * place, with a workspace the caller allocated once (the hot path allocates
 * nothing). The program checks the result against a plain double loop over the
 * same cache and exits 0 when they agree. README.md ("Serving") shows decode_step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <sdpa.h>

enum { B = 3, HQ = 8, HKV = 2, D = 64, BS = 16, NUM_BLOCKS = 8, MAX_BLOCKS = 4 };

/* ---- the code shown in README.md ---- */
/* q: [B, Hq, D] (one new token per sequence), o: [B, Hq, D];
 * k_cache, v_cache: [num_blocks, Hkv, block_size, D]; block_table: [B, max_blocks];
 * seq_lens: keys per sequence, the new token's own key included. */
static sdpa_status decode_step(const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *block_table, const int32_t *seq_lens, float *o,
                               void *workspace, size_t workspace_bytes)
{
    static const int32_t cu_seqlens_q[B + 1] = {0, 1, 2, 3}; /* one query row per sequence */
    sdpa_seqs seqs = {0};
    seqs.cu_seqlens_q = cu_seqlens_q;
    seqs.block_table = block_table;
    seqs.max_blocks_per_seq = MAX_BLOCKS;
    seqs.seq_lens_k = seq_lens;
    seqs.block_size = BS;
    seqs.num_blocks = NUM_BLOCKS;

    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = B;
    p.q_heads = HQ;
    p.kv_heads = HKV;
    p.q_len = B; /* total query tokens */
    p.kv_len = 0; /* paged: the keys are in the pages */
    p.head_dim_qk = p.head_dim_v = D;
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT; /* each row sees all of its sequence's keys */
    p.num_threads = 1;
    p.seqs = &seqs;

    /* token lists [total, H, D]: batch stride 0, head stride D, token stride H * D */
    const sdpa_tensor tq = {q, 0, D, HQ * D};
    const sdpa_tensor_out to = {o, 0, D, HQ * D};
    /* pages: batch stride = page stride, head stride, slot stride */
    const sdpa_tensor tk = {k_cache, HKV * BS * D, BS * D, D};
    const sdpa_tensor tv = {v_cache, HKV * BS * D, BS * D, D};
    return sdpa_forward_with_workspace(&p, &tq, &tk, &tv, &to, NULL, workspace, workspace_bytes);
}
/* ---- end of the code shown in README.md ---- */

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(void)
{
    static float q[B * HQ * D], o[B * HQ * D];
    static float kc[NUM_BLOCKS * HKV * BS * D], vc[NUM_BLOCKS * HKV * BS * D];
    /* sequence 0: 40 keys on pages 5, 2, 7; sequence 1: 16 keys on page 5 (shared with
     * sequence 0's first page); sequence 2: 50 keys on pages 1, 0, 6, 3. Entries past a
     * sequence's last page are never read (-1 here). */
    const int32_t block_table[B * MAX_BLOCKS] = {5, 2, 7, -1, 5, -1, -1, -1, 1, 0, 6, 3};
    const int32_t seq_lens[B] = {40, 16, 50};
    unsigned s = 42;
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
        q[i] = frand(&s);
    for (size_t i = 0; i < sizeof kc / sizeof kc[0]; i++)
        kc[i] = frand(&s), vc[i] = frand(&s);

    /* once, at start-up: the workspace for this shape (sized for the largest step in a server) */
    sdpa_problem probe;
    sdpa_seqs probe_seqs = {0};
    static const int32_t cuq[B + 1] = {0, 1, 2, 3};
    sdpa_problem_init(&probe);
    probe_seqs.cu_seqlens_q = cuq, probe_seqs.block_table = block_table;
    probe_seqs.max_blocks_per_seq = MAX_BLOCKS, probe_seqs.seq_lens_k = seq_lens;
    probe_seqs.block_size = BS, probe_seqs.num_blocks = NUM_BLOCKS;
    probe.batch = B, probe.q_heads = HQ, probe.kv_heads = HKV, probe.q_len = B;
    probe.head_dim_qk = probe.head_dim_v = D, probe.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    probe.num_threads = 1, probe.seqs = &probe_seqs;
    size_t bytes = 0;
    sdpa_status st = sdpa_forward_workspace_size(&probe, &bytes);
    void *ws = st == SDPA_OK ? malloc(bytes ? bytes : 1) : NULL;
    if (!ws) {
        fprintf(stderr, "workspace: %s\n", sdpa_status_string(st));
        return 1;
    }
    st = decode_step(q, kc, vc, block_table, seq_lens, o, ws, bytes);
    free(ws);
    if (st != SDPA_OK) {
        fprintf(stderr, "decode_step: %s\n", sdpa_status_string(st));
        return 1;
    }

    /* the check: softmax(q.k / sqrt(D)) v in double over the same pages */
    double worst = 0.0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++) {
            const int kh = h / (HQ / HKV);
            const float *qr = q + (b * HQ + h) * D;
            double m = -INFINITY, l = 0.0, acc[D] = {0};
            double sc[64];
            for (int j = 0; j < seq_lens[b]; j++) {
                const size_t off = ((size_t)(block_table[b * MAX_BLOCKS + j / BS] * HKV + kh) * BS + j % BS) * D;
                double x = 0.0;
                for (int d = 0; d < D; d++)
                    x += (double)qr[d] * kc[off + d];
                sc[j] = x / sqrt((double)D);
                m = sc[j] > m ? sc[j] : m;
            }
            for (int j = 0; j < seq_lens[b]; j++) {
                const size_t off = ((size_t)(block_table[b * MAX_BLOCKS + j / BS] * HKV + kh) * BS + j % BS) * D;
                const double w = exp(sc[j] - m);
                l += w;
                for (int d = 0; d < D; d++)
                    acc[d] += w * vc[off + d];
            }
            for (int d = 0; d < D; d++) {
                const double e = fabs(acc[d] / l - o[(b * HQ + h) * D + d]);
                worst = e > worst ? e : worst;
            }
        }
    printf("paged decode step: %d sequences, %d query heads, %d kv heads, pages of %d keys; "
           "max |error| vs double %.2e\n",
           B, HQ, HKV, BS, worst);
    return worst < 1e-5 ? 0 : 1;
}
