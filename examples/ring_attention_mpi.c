/* SPDX-License-Identifier: MIT */
/* examples/ring_attention_mpi.c - causal self-attention over a sequence split
 * across MPI ranks (ring attention, include/sdpa_mpi.h).
 *
 *   mpirun -np 4 ring_attention_mpi [T] [D] [H] [threads]
 *   mpirun -np 4 --host a,b,c,d ring_attention_mpi 65536 128 1 0   # several hosts
 *
 * Each rank makes up its own slice of Q, K, V (zig-zag split: rank r holds chunks
 * r and 2P-1-r of the 2P chunks, so every rank does the same causal work), runs
 * the ring forward and backward, and rank 0 prints the times. With T <= 4096 rank
 * 0 also gathers every slice and checks the output against one single-process
 * sdpa_forward on the whole sequence. Defaults: T = 4096, D = 64, H = 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdpa_mpi.h"

/* The value of element (h, global row t, d) of a made-up tensor: any rank can
 * produce any slice, and rank 0 the whole. */
static float val(int which, int64_t h, int64_t t, int64_t d)
{
    uint64_t x = (uint64_t)which * 0x9E3779B97F4A7C15ull ^ (uint64_t)(h * 1000003 + t) * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)d * 0x94D049BB133111EBull;
    x ^= x >> 31;
    x *= 0xD6E8FEB86672A1BDull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int P, r;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    const int64_t T = argc > 1 ? atoll(argv[1]) : 4096, D = argc > 2 ? atoll(argv[2]) : 64,
                  H = argc > 3 ? atoll(argv[3]) : 2;
    const int threads = argc > 4 ? atoi(argv[4]) : 0;
    const sdpa_ring_layout layout = SDPA_RING_ZIGZAG;
    const int64_t Tl = sdpa_ring_local_len(T, P, layout);
    if (Tl < 0) {
        if (r == 0)
            fprintf(stderr, "T = %lld must be a multiple of 2 * ranks = %d\n", (long long)T, 2 * P);
        MPI_Finalize();
        return 2;
    }
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = 1;
    p.q_heads = p.kv_heads = H;
    p.q_len = p.kv_len = T; /* the global sequence */
    p.head_dim_qk = p.head_dim_v = D;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    p.num_threads = threads;

    const size_t n = (size_t)(H * Tl * D);
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float)),
          *o = malloc(n * sizeof(float)), *lse = malloc((size_t)(H * Tl) * sizeof(float)),
          *dout = malloc(n * sizeof(float)), *dq = malloc(n * sizeof(float)), *dk = malloc(n * sizeof(float)),
          *dv = malloc(n * sizeof(float));
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < Tl; i++) {
            const int64_t t = sdpa_ring_global_row(T, P, r, layout, i); /* this local row's position */
            for (int64_t d = 0; d < D; d++) {
                const size_t e = (size_t)((h * Tl + i) * D + d);
                q[e] = val(0, h, t, d);
                k[e] = val(1, h, t, d);
                v[e] = val(2, h, t, d);
                dout[e] = val(3, h, t, d);
            }
        }
    /* [1, H, Tl, D] views of the local slice */
    const sdpa_tensor tq = {q, H * Tl * D, Tl * D, D}, tk = {k, H * Tl * D, Tl * D, D}, tv = {v, H * Tl * D, Tl * D, D};
    const sdpa_tensor_out to = {o, H * Tl * D, Tl * D, D}, tl = {lse, H * Tl, Tl, 1};

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    sdpa_status st = sdpa_ring_forward(MPI_COMM_WORLD, layout, &p, &tq, &tk, &tv, &to, &tl);
    double t1 = MPI_Wtime();
    if (st != SDPA_OK) { /* the same status on every rank */
        if (r == 0)
            fprintf(stderr, "sdpa_ring_forward: %s\n", sdpa_status_string(st));
        MPI_Finalize();
        return 1;
    }
    const sdpa_tensor tO = {o, to.batch_stride, to.head_stride, to.seq_stride}, tL = {lse, H * Tl, Tl, 1},
                      tdo = {dout, to.batch_stride, to.head_stride, to.seq_stride};
    const sdpa_tensor_out tdq = {dq, H * Tl * D, Tl * D, D}, tdk = {dk, H * Tl * D, Tl * D, D},
                          tdv = {dv, H * Tl * D, Tl * D, D};
    MPI_Barrier(MPI_COMM_WORLD);
    double t2 = MPI_Wtime();
    st = sdpa_ring_backward(MPI_COMM_WORLD, layout, &p, &tq, &tk, &tv, &tO, &tL, &tdo, &tdq, &tdk, &tdv);
    double t3 = MPI_Wtime();
    if (r == 0)
        printf("ring attention: %d ranks, T = %lld (%lld rows per rank), H = %lld, D = %lld, causal zig-zag\n"
               "forward %.3f s, backward %.3f s (%s)\n",
               P, (long long)T, (long long)Tl, (long long)H, (long long)D, t1 - t0, t3 - t2, sdpa_status_string(st));

    int rc = st == SDPA_OK ? 0 : 1;
    if (T <= 4096) { /* gather O on rank 0 and compare with one sdpa_forward */
        float *all = r == 0 ? malloc(n * (size_t)P * sizeof(float)) : NULL;
        MPI_Gather(o, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (r == 0) {
            const size_t N = (size_t)(H * T * D);
            float *Q = malloc(N * sizeof(float)), *K = malloc(N * sizeof(float)), *V = malloc(N * sizeof(float)),
                  *O = malloc(N * sizeof(float));
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++) {
                        const size_t e = (size_t)((h * T + t) * D + d);
                        Q[e] = val(0, h, t, d);
                        K[e] = val(1, h, t, d);
                        V[e] = val(2, h, t, d);
                    }
            const sdpa_tensor gq = {Q, H * T * D, T * D, D}, gk = {K, H * T * D, T * D, D}, gv = {V, H * T * D, T * D, D};
            const sdpa_tensor_out go = {O, H * T * D, T * D, D};
            sdpa_forward(&p, &gq, &gk, &gv, &go, NULL);
            double err = 0;
            for (int rr = 0; rr < P; rr++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < Tl; i++) {
                        const int64_t t = sdpa_ring_global_row(T, P, rr, layout, i);
                        for (int64_t d = 0; d < D; d++) {
                            const double e = fabs((double)all[(size_t)rr * n + (size_t)((h * Tl + i) * D + d)] -
                                                  O[(h * T + t) * D + d]);
                            err = e > err ? e : err;
                        }
                    }
            printf("max |ring O - single-process O| = %.3g\n", err);
            if (!(err < 1e-5))
                rc = 1;
            free(Q), free(K), free(V), free(O);
        }
        free(all);
    }
    free(q), free(k), free(v), free(o), free(lse), free(dout), free(dq), free(dk), free(dv);
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Finalize();
    return rc;
}
