/* SPDX-License-Identifier: MIT */
/* src/mpi/ring_internal.h - what the two files of libsdpa_mpi share: the state of one
 * ring call (struct ring), a local call of the ring (sub_call), the plan and setup
 * functions of ring_setup.c used by the forward and backward of ring.c. Internal:
 * nothing here is exported (the library is built with hidden visibility). */
#ifndef SDPA_MPI_RING_INTERNAL_H
#define SDPA_MPI_RING_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sdpa_mpi.h"

enum { MASK_SKIP = 0, MASK_FULL = 1, MASK_DIAG = 2 };
enum { TAG_KV = 100, TAG_DKV = 200 };
/* Floats per block of a message (an MPI count is an int: a block is one element of a
 * contiguous datatype of MSG_FLOATS floats). The MPI tests also build the ring with a
 * small value (-DSDPA_RING_MSG_FLOATS=7) so that messages of several blocks and a
 * remainder are exercised. */
#ifdef SDPA_RING_MSG_FLOATS
#define MSG_FLOATS ((int64_t)SDPA_RING_MSG_FLOATS)
#else
#define MSG_FLOATS ((int64_t)1 << 28)
#endif
/* Requests of one set (post() adds at most 2 per call; a set takes at most 2 posts) */
#define MAX_MSGS 8

typedef struct sub_call {
    int64_t q0, nq, k0, nk; /* local rows of the query slice and of the K/V block */
    int diag;               /* causal top-left on the block (diagonal chunk) */
    int64_t wl, wr;         /* the call's top-left window (SDPA_WINDOW_UNBOUNDED: none) */
    int64_t off;            /* its diagonal_offset */
} sub_call;

typedef struct ring {
    MPI_Comm comm;
    int P, r, nc; /* ranks, this rank, chunks per rank (1 contiguous, 2 zig-zag) */
    sdpa_ring_layout layout;
    int64_t B, Hq, Hkv, Dk, Dv;
    int64_t Tq, Tk;       /* the whole sequence's query and key lengths */
    int64_t Cq, Ck;       /* rows of a query / key chunk */
    int64_t Tql, Tkl;     /* this rank's query / key rows: nc * Cq, nc * Ck */
    int64_t dglob;        /* the global diagonal: Tk - Tq bottom-right, else 0 */
    int causal;
    int per_pair;         /* a bounded window, ALiBi or Tq != Tk: one call per (query chunk, key chunk) pair */
    int64_t wl, wr;       /* the global window (wr = 0 with causal), SDPA_WINDOW_UNBOUNDED */
    const float *sinks;   /* Hq sink logits, merged in after the ring (forward), or NULL */
    float *frame_bias;    /* backward, rows with |LSE| >= 256 present: -LSE per row [B, Hq, Tql] */
    float *frame_lse;     /* and the LSE the calls get: 0 (-inf for a row with no key) */
    float *dsinks;        /* backward: Hq gradients, summed over every rank's rows, or NULL */
    const int32_t *kvlen; /* global key lengths, or NULL */
    sdpa_dtype q_dtype, kv_dtype, o_dtype; /* the caller's types; base and the calls: fp32 */
    sdpa_problem base;
    int32_t *kvbuf; /* B local key lengths of one call */
} ring;

static inline sdpa_tensor tv(const float *d, int64_t bs, int64_t hs, int64_t ss)
{
    return (sdpa_tensor){d, bs, hs, ss};
}

/* Row offset of a view (rows are the seq dimension). */
static inline sdpa_tensor rows_in(const sdpa_tensor *t, int64_t r0)
{
    return tv(t->data ? (const float *)t->data + r0 * t->seq_stride : NULL, t->batch_stride, t->head_stride, t->seq_stride);
}
static inline sdpa_tensor_out rows_out(const sdpa_tensor_out *t, int64_t r0)
{
    return (sdpa_tensor_out){t->data ? (float *)t->data + r0 * t->seq_stride : NULL, t->batch_stride, t->head_stride,
                             t->seq_stride};
}

/* The calls of step `src` (the K/V block of rank src), in a fixed order. */
int sdpa_ring_plan_calls(const ring *R, int src, sub_call out[4]);
/* Descriptor of one call (its key lengths mapped onto the call's key rows). */
sdpa_problem sdpa_ring_call_problem(ring *R, int src, const sub_call *c);
/* The whole-slice descriptor the library validates the local views against. */
sdpa_problem sdpa_ring_slice_problem(ring *R);
/* Whether bytes [p, p + n) overlap a valid output view [B, H, T, D] of es-byte elements. */
int sdpa_ring_overlaps(const void *p, size_t n, const sdpa_tensor_out *t, int64_t B, int64_t H, int64_t T, int64_t D,
                       size_t es);
/* SDPA_OK for the probe's WORKSPACE_TOO_SMALL (everything else validated). */
sdpa_status sdpa_ring_probe_status(sdpa_status st);
/* The start of both entry points: this rank's own checks, the key-length buffer
 * (backward: keeps the problem's dsinks; the forward ignores them). */
sdpa_status sdpa_ring_begin(ring *R, MPI_Comm comm, const sdpa_problem *problem, sdpa_ring_layout layout,
                            int backward);
/* The workspace the calls need, then every rank's agreement on one status. */
sdpa_status sdpa_ring_checked(ring *R, sdpa_status st, int backward, const sdpa_problem *problem, sdpa_ring_layout layout,
                         size_t *ws_bytes);
/* Backward with rows of |LSE| >= 256: the per-row bias and LSE frame (0: none needed,
 * 1: set, -1: out of memory). */
int sdpa_ring_frame_rows(ring *R, const sdpa_tensor *lse);

#endif /* SDPA_MPI_RING_INTERNAL_H */
