/* SPDX-License-Identifier: MIT */
/* paged_pair_tiles.c - a paged bf16 prefill whose pair products have key blocks of
 * their own (the amx table's pairs_block_k = 128) keeps every key tile inside one
 * page. The defect (found by a contract audit, session 30): sdpa_fwd_pairs_blocks set
 * bk = pairs_block_k after the sequence's plan had cut bk to a divisor of the page
 * size, so a 128-key tile read 128 consecutive rows from one 16-key page (other pages'
 * keys, or past the cache: ASan heap-buffer-overflow). Only the amx table sets
 * pairs_block_k, so this program sets it (to amx's value) on every table of this CPU
 * that runs the forward's bf16 pair products, the way the amx table has it, and
 * compares each paged sequence with the same sequence gathered into a dense call
 * whose block_k is the page size (the tiles the paged call must use): the bits must
 * be equal. Links the static library (internal symbols: the kernel tables).
 * Prints "N passed, N failed"; exit status 1 on any failure; 0 checks (no table with
 * the pair products) is a pass that says so. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "sdpa.h"

enum { NS = 2, HQ = 2, HKV = 1, D = 32, MAXB = 10, NB = 12 };

static long n_pass, n_fail;

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7FFFu + ((u >> 16) & 1u); /* round to nearest even (finite inputs) */
    return (uint16_t)(u >> 16);
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xFFFFFF) / 16777216.0f * 4.0f - 2.0f;
}

/* One page size: sequences of tq = tk = {64, 45} keys (wide: more query rows than a
 * decode tile) in shuffled pages of bs keys. */
static void check_page_size(sdpa_isa isa, int bs)
{
    const int32_t tq[NS] = {64, 45}, tk[NS] = {64, 45};
    int32_t cuq[NS + 1] = {0}, table[NS * MAXB];
    for (int b = 0; b < NS; b++)
        cuq[b + 1] = cuq[b] + tq[b];
    for (int i = 0; i < NS * MAXB; i++)
        table[i] = (int32_t)((i * 5 + 7) % NB); /* shuffled, pages reused across rows */
    const size_t ncache = (size_t)NB * HKV * bs * D, nq = (size_t)cuq[NS] * HQ * D;
    uint16_t *kc = malloc(ncache * 2), *vc = malloc(ncache * 2), *q = malloc(nq * 2);
    float *o = malloc(nq * 4);
    uint64_t seed = 0x5EEDu + (uint64_t)bs;
    for (size_t i = 0; i < ncache; i++) {
        kc[i] = bf16_of(frand(&seed));
        vc[i] = bf16_of(frand(&seed));
    }
    for (size_t i = 0; i < nq; i++)
        q[i] = bf16_of(frand(&seed));
    sdpa_seqs sq = {0};
    sq.cu_seqlens_q = cuq;
    sq.block_table = table;
    sq.max_blocks_per_seq = MAXB;
    sq.seq_lens_k = tk;
    sq.block_size = bs;
    sq.num_blocks = NB;
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = NS, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = cuq[NS], p.kv_len = 0;
    p.head_dim_qk = p.head_dim_v = D;
    p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
    p.q_dtype = p.kv_dtype = SDPA_DTYPE_BF16;
    p.isa = isa;
    p.num_threads = 1;
    p.seqs = &sq;
    const sdpa_tensor tq_ = {q, 0, D, HQ * D}, tk_ = {kc, HKV * bs * D, bs * D, D}, tv_ = {vc, HKV * bs * D, bs * D, D};
    const sdpa_tensor_out to = {o, 0, D, HQ * D};
    sdpa_status st = sdpa_forward(&p, &tq_, &tk_, &tv_, &to, NULL);
    if (st != SDPA_OK) {
        printf("FAIL [%s] pages of %d: paged call: %s\n", sdpa_isa_name(isa), bs, sdpa_status_string(st));
        n_fail++;
        goto out;
    }
    for (int b = 0; b < NS; b++) { /* sequence b as a dense call on its gathered keys */
        const size_t n = (size_t)tk[b];
        uint16_t *kd = malloc(n * D * 2), *vd = malloc(n * D * 2);
        float *od = malloc((size_t)tq[b] * HQ * D * 4);
        for (size_t j = 0; j < n; j++) {
            const size_t src = ((size_t)table[b * MAXB + j / bs] * bs + j % bs) * D;
            memcpy(kd + j * D, kc + src, D * 2);
            memcpy(vd + j * D, vc + src, D * 2);
        }
        sdpa_problem pd = p;
        pd.seqs = NULL;
        pd.batch = 1, pd.q_len = tq[b], pd.kv_len = tk[b];
        pd.block_k = bs; /* the paged call's tiles: the largest divisor of the page <= 128 */
        const sdpa_tensor dq = {q + (size_t)cuq[b] * HQ * D, 0, D, HQ * D}, dk = {kd, 0, (int64_t)n * D, D},
                          dv = {vd, 0, (int64_t)n * D, D};
        const sdpa_tensor_out dout = {od, 0, D, HQ * D};
        st = sdpa_forward(&pd, &dq, &dk, &dv, &dout, NULL);
        const float *op = o + (size_t)cuq[b] * HQ * D;
        size_t bad = 0;
        for (size_t i = 0; st == SDPA_OK && i < (size_t)tq[b] * HQ * D; i++)
            bad += memcmp(op + i, od + i, 4) != 0;
        if (st == SDPA_OK && bad == 0) {
            n_pass++;
        } else {
            n_fail++;
            printf("FAIL [%s] pages of %d, sequence %d: %s, %zu of %zu outputs differ from the dense call's\n",
                   sdpa_isa_name(isa), bs, b, sdpa_status_string(st), bad, (size_t)tq[b] * HQ * D);
        }
        free(kd), free(vd), free(od);
    }
out:
    free(kc), free(vc), free(q), free(o);
}

int main(void)
{
    int tables = 0;
    for (int i = 0; i < SDPA_ISA_COUNT; i++) {
        const sdpa_isa isa = (sdpa_isa)i;
        /* the library's own tables are static, non-const objects: writing one through
         * the pointer is what the amx table's init does for itself */
        sdpa_kernels *t = (sdpa_kernels *)sdpa_kernels_get(isa);
        if (!t || !t->gemm_bf16_pairs || !t->bf16_dot)
            continue;
        const int saved = t->pairs_block_k;
        t->pairs_block_k = 128; /* src/x86/kernels_amx.c */
        tables++;
        const int sizes[] = {16, 24, 48, 7};
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
            check_page_size(isa, sizes[s]);
        t->pairs_block_k = saved;
    }
    if (!tables)
        printf("no kernel table of this CPU runs the bf16 pair products: nothing to check\n");
    printf("%ld passed, %ld failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
