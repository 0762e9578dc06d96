/* SPDX-License-Identifier: MIT */
/* tools/sdpa_ring_slices.c - `sdpa-ring`'s slices (tools/sdpa_ring_slices.h): rank 0's
 * global arrays scattered to every rank's rows and gathered back, views of a slice, and the
 * slices' storage types. */
#include <stdlib.h>
#include <string.h>

#include "dtype.h" /* src/dtype.h: the library's exact fp32 <-> bf16 / fp16 conversions */
#include "sdpa_ring_slices.h"

/* Rank 0: global [B, H, T, D] -> every rank's [B, H, Tl, D] slice (scatter). */
float *ring_scatter(int P, int R, const float *g, int64_t B, int64_t H, int64_t T, int64_t D, sdpa_ring_layout layout)
{
    const int64_t Tl = T / P, n = B * H * Tl * D;
    float *mine = malloc(sizeof(float) * (size_t)(n + 1)), *all = NULL;
    if (R == 0) {
        all = malloc(sizeof(float) * (size_t)(n * P + 1));
        for (int r = 0; r < P; r++)
            for (int64_t bh = 0; bh < B * H; bh++)
                for (int64_t i = 0; i < Tl; i++)
                    memcpy(all + r * n + (bh * Tl + i) * D, g + (bh * T + sdpa_ring_global_row(T, P, r, layout, i)) * D,
                           sizeof(float) * (size_t)D);
    }
    MPI_Scatter(all, (int)n, MPI_FLOAT, mine, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    free(all);
    return mine;
}

/* Every rank's slice -> the global array on rank 0 (returned there, NULL elsewhere). */
float *ring_gather(int P, int R, const float *mine, int64_t B, int64_t H, int64_t T, int64_t D, sdpa_ring_layout layout)
{
    const int64_t Tl = T / P, n = B * H * Tl * D;
    float *all = R == 0 ? malloc(sizeof(float) * (size_t)(n * P + 1)) : NULL, *g = NULL;
    MPI_Gather(mine, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, 0, MPI_COMM_WORLD);
    if (R == 0) {
        g = malloc(sizeof(float) * (size_t)(B * H * T * D + 1));
        for (int r = 0; r < P; r++)
            for (int64_t bh = 0; bh < B * H; bh++)
                for (int64_t i = 0; i < Tl; i++)
                    memcpy(g + (bh * T + sdpa_ring_global_row(T, P, r, layout, i)) * D, all + r * n + (bh * Tl + i) * D,
                           sizeof(float) * (size_t)D);
    }
    free(all);
    return g;
}

size_t ring_dtype_bytes(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

sdpa_tensor ring_view(const void *x, int64_t H, int64_t Tl, int64_t D)
{
    return (sdpa_tensor){x, H * Tl * D, Tl * D, D};
}
sdpa_tensor_out ring_view_out(void *x, int64_t H, int64_t Tl, int64_t D)
{
    return (sdpa_tensor_out){x, H * Tl * D, Tl * D, D};
}

/* n fp32 values in type dt: a new buffer of that type (x itself, not copied, for fp32;
 * 16-bit: rounded to nearest even, and x freed). */
void *ring_to_type(float *x, int64_t n, sdpa_dtype dt)
{
    if (dt == SDPA_DTYPE_F32 || !x)
        return x;
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(n + 1));
    for (int64_t i = 0; h && i < n; i++)
        h[i] = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(x[i]) : sdpa_f32_to_f16(x[i]);
    free(x);
    return h;
}

/* n values of type dt as fp32: a new buffer (x itself for fp32; 16-bit: widened, exact,
 * and x freed). */
float *ring_to_f32(void *x, int64_t n, sdpa_dtype dt)
{
    if (dt == SDPA_DTYPE_F32 || !x)
        return x;
    float *f = malloc(sizeof(float) * (size_t)(n + 1));
    for (int64_t i = 0; f && i < n; i++)
        f[i] = dt == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(((const uint16_t *)x)[i]) : sdpa_f16_to_f32(((const uint16_t *)x)[i]);
    free(x);
    return f;
}

/* Rank 0: an fp32 output of type dt for out_file (fp16: stored as float16, exact; fp32
 * and bf16 data are written as float32 either way). */
void *ring_file_data(float *g, int64_t n, sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F16 ? ring_to_type(g, n, dt) : g;
}

