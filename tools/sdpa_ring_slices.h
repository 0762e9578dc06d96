/* SPDX-License-Identifier: MIT */
/* tools/sdpa_ring_slices.h - the slices of `sdpa-ring` (tools/sdpa_ring.c): scatter and
 * gather over MPI_COMM_WORLD of P ranks (this one R), views, storage types. */
#ifndef SDPA_TOOLS_RING_SLICES_H
#define SDPA_TOOLS_RING_SLICES_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa_mpi.h"

/** Rank 0's global [B, H, T, D] (g, read on rank 0 only) -> every rank's [B, H, T/P, D]
 *  slice in the layout's row order (returned, malloc'd; MPI_Scatter, collective). */
float *ring_scatter(int P, int R, const float *g, int64_t B, int64_t H, int64_t T, int64_t D, sdpa_ring_layout layout);
/** Every rank's slice -> the global array on rank 0 (returned there, NULL elsewhere; collective). */
float *ring_gather(int P, int R, const float *mine, int64_t B, int64_t H, int64_t T, int64_t D,
                   sdpa_ring_layout layout);
/** Bytes of one element of type dt. */
size_t ring_dtype_bytes(sdpa_dtype dt);
/** A contiguous [B, H, Tl, D] slice's view. */
sdpa_tensor ring_view(const void *x, int64_t H, int64_t Tl, int64_t D);
sdpa_tensor_out ring_view_out(void *x, int64_t H, int64_t Tl, int64_t D);
/** n fp32 values in type dt: x itself for fp32, else a new buffer rounded to nearest even
 *  (x freed; NULL when out of memory). */
void *ring_to_type(float *x, int64_t n, sdpa_dtype dt);
/** n values of type dt as fp32: x itself for fp32, else a new widened buffer (x freed). */
float *ring_to_f32(void *x, int64_t n, sdpa_dtype dt);
/** Rank 0: an fp32 output of type dt as out_file data (fp16: stored as float16, exact). */
void *ring_file_data(float *g, int64_t n, sdpa_dtype dt);

#endif /* SDPA_TOOLS_RING_SLICES_H */
