/* SPDX-License-Identifier: MIT */
/* sdpa_mpi.h - libsdpa_mpi: context-parallel (ring) attention over MPI.
 *
 * Each of the P ranks of an MPI communicator holds a slice of the sequence: its
 * rows of Q, K, V (and of O, LSE, dO, dQ, dK, dV). K/V blocks travel around the
 * ring (rank r sends to r + 1 and receives from r - 1) with non-blocking
 * sends/receives, overlapped with the local attention of the block in hand; the
 * partial states (O, LSE) merge with sdpa_merge_states (Liu et al. 2023, "Ring
 * Attention with Blockwise Transformers"; ring-flash-attn). The backward takes
 * the global O and LSE (FlashAttention-2: with them each key block's share of
 * dQ, dK, dV is independent): dQ accumulates locally, dK/dV travel with the K/V
 * block they belong to, accumulate in fp32 at every rank they visit and arrive
 * home after P steps (ring-flash-attn's scheme).
 *
 * The problem descriptor describes the GLOBAL problem: q_len = Tq and kv_len = Tk
 * (the whole sequence: Tq = Tk for self-attention; Tq < Tk for a chunk of queries
 * against a longer cache, or Tq > Tk), the same on every rank. The tensor views are
 * the rank's LOCAL slices, with the core API's strides: Tq / P query rows (Q, O,
 * LSE, dO, dQ) and Tk / P key rows (K, V, dK, dV), split as below (each length by
 * itself), in increasing global position.
 *
 * Layouts (the split of a sequence of length T, Tq or Tk, into the ranks' slices):
 *   SDPA_RING_CONTIGUOUS  rank r holds rows [r T/P, (r+1) T/P). T % P == 0.
 *   SDPA_RING_ZIGZAG      the sequence is cut into 2P chunks of C = T / (2P)
 *                         rows; rank r holds chunk r then chunk 2P-1-r (local
 *                         rows [0, C) and [C, 2C)). T % (2P) == 0. With a
 *                         causal mask every rank then does the same work.
 * sdpa_ring_global_row() maps a local row to its global position.
 *
 * Masks whose meaning survives sharding: none; causal (top-left, or bottom-right:
 * diagonal Tk - Tq), applied on global positions (with Tq = Tk and no window or
 * ALiBi: a key block entirely after the query block is skipped, the diagonal block
 * is causal, earlier blocks unmasked); sliding windows (window_left / window_right,
 * with or without causal), ALiBi, and any causal mask when Tq != Tk: each (query
 * chunk, key chunk) pair is one call whose diagonal_offset is the global diagonal
 * plus the chunks' distance, pairs no query of which sees a key are skipped (the K/V
 * blocks still go the whole way round the ring; rows that see no key get O = 0,
 * LSE = -inf, or the sink);
 * kv_lengths (global key lengths, each in [0, Tk]); GQA; a custom scale; softcap;
 * sinks (in the softmax of each row's first call, as one call would have them) and,
 * in the backward, dsinks (each rank's rows summed in double, then over the ranks
 * with MPI_Allreduce; every rank gets the total); bf16 / fp16 tensors (q_dtype, kv_dtype,
 * o_dtype as in sdpa_forward): the ring widens them to fp32 as it copies them (its local Q,
 * O and dO, and every K/V block it packs), sends fp32 blocks, runs fp32 calls and rounds
 * each output once, to nearest even, into its type (O and dO: o_dtype, dQ: q_dtype, dK and
 * dV: kv_dtype; LSE and dsinks fp32): the bits of the fp32 ring on the widened values,
 * rounded (so, unlike sdpa_forward on an ISA with bf16 pair products, it rounds neither
 * an fp32 Q nor P to bf16); it allocates fp32 copies of the 16-bit local slices of Q (and of O and dO in the
 * backward) and, in the forward with a 16-bit O, an fp32 state of this rank's rows.
 * Refused with SDPA_ERR_UNSUPPORTED:
 * Tq or Tk not a multiple of P (2P for zig-zag), bool_mask and bias (a dense mask
 * per rank would be Tq/P x Tk and undo the ring's memory bound),
 * packed/paged sequences (seqs), a nonzero diagonal_offset, bottom-right causal, a
 * bottom-right window or bottom-right ALiBi with kv_lengths, Tq + Tk beyond
 * SDPA_MAX_DIAGONAL_OFFSET (2^48; only empty outputs can be that long). A window bound
 * below SDPA_WINDOW_UNBOUNDED: SDPA_ERR_BAD_WINDOW; Tq or Tk beyond SDPA_MAX_SEQ_LEN:
 * SDPA_ERR_SIZE_OVERFLOW, as sdpa_forward().
 *
 * Errors: every rank validates its own arguments and the ranks agree (one
 * MPI_Allreduce of the status and of the global sizes) before any data moves.
 * If any rank's arguments are bad, or the ranks disagree on the descriptor
 * (SDPA_ERR_BAD_DESCRIPTOR), every rank returns the same status (the most
 * negative one) and writes nothing. Collective: every rank of comm must call.
 * Communication errors follow comm's MPI error handler (by default MPI aborts).
 *
 * Determinism: for a given P, layout, ISA and block sizes the results are
 * bitwise identical from run to run (every sum is done in a fixed order); they
 * differ from the single-process sdpa_forward/sdpa_backward in the last bits
 * (the key blocks are merged through their LSE, and dK/dV summed block by block),
 * within the FlashAttention rule against float64. With P = 1 and the contiguous
 * layout the call is one sdpa_forward/sdpa_backward on the whole problem: the same
 * O, LSE, dQ and dV bits, dK's up to the sign of zeros (the ring sums dK into a
 * zeroed buffer: +0 where the call gives -0), and dsinks from the ring's own sum in
 * double, which can differ from the call's in the last bits; with 16-bit tensors, as
 * the call under SDPA_FPMATH_STRICT (the ring's calls run fp32, so fpmath_mode changes
 * nothing in the ring; a default-mode call on an ISA with bf16 pair products rounds
 * P, dS and an fp32 Q to bf16 and so differs from it).
 *
 * Large logits: the backward recomputes P from the global LSE. Where a rank has a
 * row with |LSE| >= 256 (for which sdpa_backward would recompute the row's max and
 * sum from the keys of the call, one block's), its calls get each row's -LSE as a
 * bias (key stride 0) and LSE 0, the same P; those rows then have the library's
 * ordinary fp32 precision (D = rowsum(dO * O) in float) rather than the float64
 * statistics pass a single sdpa_backward gives them.
 *
 * Memory per rank beyond its slice: two K/V buffers (the block in hand and the
 * one arriving), one O-sized partial state, and in the backward two traveling
 * dK/dV buffers, one dK/dV and one dQ partial, and dQ's accumulator; with 16-bit
 * tensors also fp32 copies of the 16-bit Q slice (and of O and dO in the backward) and,
 * in the forward with a 16-bit O, an fp32 O state: all of the size of the rank's slice
 * in fp32 (the K/V buffers too, whatever kv_dtype); nothing of size T x T or of size T.
 */
#ifndef SDPA_MPI_H
#define SDPA_MPI_H

#include <mpi.h>

#include "sdpa.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum sdpa_ring_layout {
    SDPA_RING_CONTIGUOUS = 0, /**< rank r holds rows [r T/P, (r+1) T/P) */
    SDPA_RING_ZIGZAG = 1      /**< rank r holds chunks r and 2P-1-r of 2P chunks */
} sdpa_ring_layout;

/** Rows of each rank's slice (T / P), or -1 if T is not split evenly by the
 *  layout (T % P, or T % 2P for zig-zag) or an argument is out of range. */
SDPA_API int64_t sdpa_ring_local_len(int64_t seq_len, int nranks, sdpa_ring_layout layout);

/** Global position of local row `row` of rank `rank`, or -1 if out of range. */
SDPA_API int64_t sdpa_ring_global_row(int64_t seq_len, int nranks, int rank, sdpa_ring_layout layout,
                                      int64_t row);

/**
 * Ring forward: O and LSE of this rank's query rows over every key of the
 * sequence. Views as in sdpa_forward(), over the local slice (T / P rows);
 * lse may be NULL (then an internal buffer carries the state). Collective.
 * @return as sdpa_forward(), plus SDPA_ERR_UNSUPPORTED (see above); the same
 *   status on every rank.
 */
SDPA_API sdpa_status sdpa_ring_forward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                                       const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                       const sdpa_tensor_out *o, const sdpa_tensor_out *lse);

/**
 * Ring backward: dQ, dK, dV of this rank's slice given the global O and LSE
 * (from sdpa_ring_forward) and dO of its rows. Views as in sdpa_backward(),
 * over the local slice. Collective.
 * @return as sdpa_backward(), plus SDPA_ERR_UNSUPPORTED; the same on every rank.
 */
SDPA_API sdpa_status sdpa_ring_backward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                                        const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                                        const sdpa_tensor *o, const sdpa_tensor *lse, const sdpa_tensor *dout,
                                        const sdpa_tensor_out *dq, const sdpa_tensor_out *dk,
                                        const sdpa_tensor_out *dv);

#ifdef __cplusplus
}
#endif
#endif /* SDPA_MPI_H */
