/* SPDX-License-Identifier: MIT */
/* sdpa.h - libsdpa public API: streaming scaled dot-product attention on CPUs.
 *
 * libsdpa computes, in fp32,
 *
 *     S = scale * Q K^T + bias      (masked entries of S are -inf)
 *     P = softmax(S) over the allowed keys of each query row
 *     O = P V,   LSE = log(sum_j exp(S_ij))   (natural log)
 *
 * and the gradients dQ, dK, dV of a loss given dO. Both passes stream over key
 * tiles with the FlashAttention-2 online softmax (Dao, "FlashAttention-2: Faster
 * Attention with Better Parallelism and Work Partitioning", 2023, Algorithms 1
 * and 2): no buffer of size Tq x Tk is ever allocated.
 *
 * Tensors are 4-D, logically
 *     Q   [B, Hq,  Tq, Dk]        O, dO [B, Hq, Tq, Dv]
 *     K   [B, Hkv, Tk, Dk]        LSE   [B, Hq, Tq]
 *     V   [B, Hkv, Tk, Dv]        dQ, dK, dV shaped like Q, K, V
 * The last dimension (head_dim) is contiguous; the other three have their own
 * strides in elements (not bytes). An input stride may be 0 (broadcast); output
 * strides must describe non-overlapping storage. Strides are never negative.
 *
 * Grouped-query attention (GQA/MQA): Hq must be a multiple of Hkv; query head h
 * reads key/value head h / (Hq / Hkv).
 *
 * Thread-safety: every function may be called from any number of threads at
 * once, except sdpa_force_isa(), which changes the process-wide default ISA
 * (calls already running keep the kernels they started with).
 *
 * Threads: sdpa_forward / sdpa_backward run an OpenMP team of num_threads
 * threads (0: omp_get_max_threads(); at most four per processor; one when the
 * library is built without OpenMP). A server that calls the library from N
 * threads of its own should pass num_threads = 1 (no team is started at all)
 * or split its cores between callers; with 0, N calls start N full teams. Inside
 * a caller's own OpenMP parallel region the call runs on one thread unless
 * nested parallelism is enabled. Results do not depend on the thread count.
 *
 * Out of memory: each call allocates one workspace (posix_memalign) and frees it
 * before returning; if that fails the call returns SDPA_ERR_OUT_OF_MEMORY and
 * writes nothing. With num_threads = 1 (or a build without OpenMP) that is the
 * library's only allocation and the OpenMP runtime is never entered, so running
 * out of memory always comes back as that status. With more threads the team
 * belongs to the OpenMP runtime (libgomp with GCC): if it cannot allocate its
 * team or create a thread, libgomp itself prints "libgomp: Out of memory ..." or
 * "Thread creation failed" and exits the process; OpenMP has no way to report
 * this to the library. A process that must survive memory exhaustion calls with
 * num_threads = 1 from threads of its own.
 */
#ifndef SDPA_H
#define SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(SDPA_BUILDING_DLL)
#define SDPA_API __declspec(dllexport)
#elif defined(__GNUC__) && __GNUC__ >= 4
#define SDPA_API __attribute__((visibility("default")))
#else
#define SDPA_API
#endif

/** Version of this header. The library's own version is sdpa_version_number(). These three
 *  lines are the one source of the version: meson.build reads them (library version, soname
 *  libsdpa.so.MAJOR, pkg-config version). */
#define SDPA_VERSION_MAJOR 0
#define SDPA_VERSION_MINOR 1
#define SDPA_VERSION_PATCH 0
/** Packs a version as 0x00MMmmpp. */
#define SDPA_MAKE_VERSION(major, minor, patch) (((major) << 16) | ((minor) << 8) | (patch))
#define SDPA_VERSION SDPA_MAKE_VERSION(SDPA_VERSION_MAJOR, SDPA_VERSION_MINOR, SDPA_VERSION_PATCH)
#define SDPA_VERSION_GET_MAJOR(v) (((v) >> 16) & 0xff)
#define SDPA_VERSION_GET_MINOR(v) (((v) >> 8) & 0xff)
#define SDPA_VERSION_GET_PATCH(v) ((v)&0xff)

/** Status codes. 0 is success; every error is negative. On any error the
 *  outputs have not been written. */
typedef enum sdpa_status {
    SDPA_OK = 0,
    SDPA_ERR_NULL_ARGUMENT = -1,    /**< a required pointer is NULL (the problem, a tensor view, or a
                                         data pointer whose tensor is not empty) */
    SDPA_ERR_BAD_DESCRIPTOR = -2,   /**< problem not set up by sdpa_problem_init(): wrong struct_size,
                                         nonzero reserved field, unknown enum value, or
                                         use_default_scale other than 0 or 1 */
    SDPA_ERR_NEGATIVE_SIZE = -3,    /**< a size (B, Hq, Hkv, Tq, Tk, Dk, Dv) is negative */
    SDPA_ERR_HEAD_GROUPING = -4,    /**< Hq is not a multiple of Hkv (or Hkv = 0 while Hq > 0) */
    SDPA_ERR_BAD_SCALE = -5,        /**< scale is NaN or infinite; or the default 1/sqrt(Dk) with Dk = 0;
                                         or use_default_scale = 1 while .scale was set (not 0) */
    SDPA_ERR_BAD_STRIDE = -6,       /**< a stride is negative, or an output's strides may overlap
                                         itself (checked conservatively: each nontrivial stride must
                                         step over everything the smaller ones cover) */
    SDPA_ERR_BAD_WINDOW = -7,       /**< a window bound is negative and not SDPA_WINDOW_UNBOUNDED,
                                         or |diagonal_offset| > SDPA_MAX_DIAGONAL_OFFSET */
    SDPA_ERR_BAD_KV_LENGTH = -8,    /**< kv_lengths[b] is negative or larger than Tk */
    SDPA_ERR_ALIASING = -9,         /**< an output overlaps an input, another output or an operand
                                         (mask, bias, kv_lengths, ALiBi slopes, sinks, the sdpa_seqs
                                         struct and its arrays), or a caller's workspace overlaps any
                                         of them */
    SDPA_ERR_BAD_THREADS = -10,     /**< num_threads is negative */
    SDPA_ERR_ISA_UNAVAILABLE = -11, /**< the ISA asked for is not compiled in or the CPU/OS cannot run it */
    SDPA_ERR_OUT_OF_MEMORY = -12,   /**< the workspace could not be allocated */
    SDPA_ERR_SIZE_OVERFLOW = -13,   /**< a tensor, mask, operand array or workspace extent overflows
                                         the address space (its byte count, or its end past the top
                                         of memory: a garbage pointer), head_dim >
                                         INT32_MAX, q_len or kv_len > SDPA_MAX_SEQ_LEN, B*Hq*Tq or
                                         B*Hkv*Tk > INT64_MAX, or the workspace size > SIZE_MAX */
    SDPA_ERR_BAD_BLOCK_SIZE = -14,  /**< block_q or block_k is outside [0, SDPA_MAX_BLOCK] */
    SDPA_ERR_BAD_SOFTCAP = -15,     /**< softcap is negative, NaN or infinite (0 = off) */
    SDPA_ERR_BAD_ALIBI = -16,       /**< an ALiBi slope is NaN or infinite */
    SDPA_ERR_BAD_SINKS = -17,       /**< a sink is NaN or +inf, or dsinks is set without sinks */
    SDPA_ERR_WORKSPACE_TOO_SMALL = -18, /**< a caller's workspace is smaller than the size query says */
    SDPA_ERR_BAD_SEQLENS = -19,     /**< cu_seqlens not 0-based and nondecreasing, their last entry not
                                         q_len / kv_len, a seq_lens_k entry negative or beyond its
                                         block table row, or kv_len not 0 with a block table */
    SDPA_ERR_BAD_BLOCK_TABLE = -20, /**< a page id a sequence uses is outside [0, num_blocks),
                                         block_size / max_blocks_per_seq / num_blocks out of range, or
                                         a block table given with cu_seqlens_k (one or the other) */
    SDPA_ERR_UNSUPPORTED = -21,     /**< a combination this version does not compute: kv_lengths,
                                         bool_mask or bias with seqs, or a paged backward */
    SDPA_ERR_MISALIGNED = -22       /**< a data pointer of a tensor that is not empty, or of an int32 /
                                         float operand array, is not a multiple of its element's size
                                         (4 bytes for fp32 and int32, 2 for bf16 / fp16) */
} sdpa_status;

/** Instruction sets. Order within an architecture is "better is larger" (x86-64:
 *  scalar, avx2, avx512, amx; the numbers are not the order: neon is 3, amx 4). */
typedef enum sdpa_isa {
    SDPA_ISA_AUTO = -1, /**< the best ISA allowed (see sdpa_force_isa) */
    SDPA_ISA_SCALAR = 0,
    SDPA_ISA_AVX2 = 1,   /**< x86-64 AVX2 + FMA (needs OS support of YMM state) */
    SDPA_ISA_AVX512 = 2, /**< x86-64 AVX-512 F/DQ/BW/VL (needs OS support of ZMM state) */
    SDPA_ISA_NEON = 3,   /**< AArch64 Advanced SIMD */
    SDPA_ISA_AMX = 4     /**< x86-64 AMX-TILE + AMX-BF16 on top of AVX-512 and AVX512-BF16 (needs OS
                              support of tile state and, on Linux, the XTILEDATA permission the
                              library requests at load, unless SDPA_ISA names scalar, avx2 or
                              avx512; once granted, Linux requires alternate signal stacks of
                              at least AT_MINSIGSTKSZ): the AVX-512 kernels, with bf16 prefill
                              products on tiles; fp32 and fp16 problems run exactly as on avx512 */
} sdpa_isa;
#define SDPA_ISA_COUNT 5

/** Causal masking. Causal is a window with window_right = 0 on the aligned diagonal. */
typedef enum sdpa_causal {
    SDPA_CAUSAL_NONE = 0,
    SDPA_CAUSAL_TOP_LEFT = 1,    /**< query i sees keys j <= i */
    SDPA_CAUSAL_BOTTOM_RIGHT = 2 /**< query i sees keys j <= i + Tk_b - Tq (Tk_b: this batch's key length) */
} sdpa_causal;

/** Diagonal alignment of a sliding window when causal is SDPA_CAUSAL_NONE
 *  (with causal masking the window follows the causal alignment). */
typedef enum sdpa_alignment {
    SDPA_ALIGN_TOP_LEFT = 0,    /**< diagonal j = i */
    SDPA_ALIGN_BOTTOM_RIGHT = 1 /**< diagonal j = i + Tk_b - Tq */
} sdpa_alignment;

/** A window bound that does not limit anything. */
#define SDPA_WINDOW_UNBOUNDED (-1)
/** Largest |diagonal_offset| accepted (2^48). */
#define SDPA_MAX_DIAGONAL_OFFSET ((int64_t)1 << 48)
/** Largest q_len / kv_len accepted (2^60: positions, windows and offsets add up in int64). */
#define SDPA_MAX_SEQ_LEN ((int64_t)1 << 60)
/** Largest block_q / block_k accepted. */
#define SDPA_MAX_BLOCK 512

/** Element types of Q, K/V and O (sdpa_problem.q_dtype, kv_dtype, o_dtype).
 *  Storage only: every product and sum accumulates in fp32 (see docs/design.md,
 *  "Reduced precision", for the intermediates each ISA may round). bf16 is the
 *  upper half of an IEEE binary32 (8-bit exponent, 7 stored mantissa bits); fp16
 *  is IEEE binary16. Both are read exactly (every bf16 and fp16 value is an fp32
 *  value); results are rounded to nearest even, and an fp16 result beyond
 *  +-65504 (after rounding) becomes +-inf, as IEEE 754 specifies; NaN stays NaN. */
typedef enum sdpa_dtype {
    SDPA_DTYPE_F32 = 0,  /**< IEEE binary32 (the default) */
    SDPA_DTYPE_BF16 = 1, /**< bfloat16 */
    SDPA_DTYPE_F16 = 2   /**< IEEE binary16 */
} sdpa_dtype;

/** Whether a call may round intermediates to bf16 where a 16-bit dot instruction
 *  computes the product (sdpa_problem.fpmath_mode; the term is oneDNN's). With bf16
 *  K/V on an ISA where sdpa_isa_bf16_pairs() is 1, the default runs the prefill tiles
 *  on bf16 pair products, which round each probability P to bf16 before P V and an
 *  fp32 Q to bf16 (docs/design.md, "What is rounded": an fp32 Q then loses about
 *  three decimal digits, and O and LSE with it, in problems just past decode size).
 *  SDPA_FPMATH_STRICT rounds nothing: every product is of the values as stored, in
 *  fp32 (K and V widened; no 16-bit dot instruction, so bf16 subnormals count too),
 *  at the fp32 products' speed. The forward gives the bits of the same call on fp32
 *  copies of the 16-bit tensors (O narrowed at the end), and so does the backward
 *  (given O as stored), except that a decode-sized 16-bit backward (Tq x G <=
 *  nt_max_cols, no variant or mask: its fused kernels) and one whose kv head's keys
 *  are processed in chunks (fp32 K, V, dK, dV of one kv head above about 1 MiB) sum
 *  dQ, and so dK and dV, in another order: fp32 accuracy, other last bits. Types that
 *  are stored in 16 bits stay exactly what they are; only intermediates are concerned. */
typedef enum sdpa_fpmath_mode {
    SDPA_FPMATH_DEFAULT = 0, /**< the ISA's fastest products, rounding as documented (default) */
    SDPA_FPMATH_STRICT = 1   /**< no intermediate rounded to a 16-bit type */
} sdpa_fpmath_mode;

/** Read-only view of a [B, H, T, D] tensor (D contiguous) of the type the
 *  descriptor gives it (fp32 unless q_dtype / kv_dtype / o_dtype say otherwise),
 *  or of the [B, H, T] fp32 LSE passed to sdpa_backward (seq_stride between
 *  rows). data points to its first element (const float * for fp32, uint16_t
 *  storage for bf16 and fp16; any pointer converts, aligned to its element: 4 bytes
 *  for fp32, 2 for bf16 / fp16, else SDPA_ERR_MISALIGNED). Strides are in elements
 *  of the tensor's own type; 0 broadcasts. The caller owns the memory. A call
 *  copies the view structs (these, sdpa_tensor_out, and the arrays of them that
 *  sdpa_merge_states_n and sdpa_merge_states_typed take) before it writes anything, so they may lie anywhere,
 *  inside an output buffer too; the data they point to and a tensor whose extent
 *  would run past the top of the address space are checked (SDPA_ERR_ALIASING,
 *  SDPA_ERR_SIZE_OVERFLOW). */
typedef struct sdpa_tensor {
    const void *data;
    int64_t batch_stride;
    int64_t head_stride;
    int64_t seq_stride;
} sdpa_tensor;

/** Writable view of a [B, H, T, D] tensor of its descriptor type (or the fp32 [B, H, T] LSE, whose
 *  seq_stride is the distance between consecutive query rows). Outputs must not
 *  share an element with each other, any input, or themselves. Views that
 *  interleave without sharing elements are accepted when they have the same
 *  sizes and strides (e.g. dQ, dK, dV inside one packed [B, T, 3, H, D] buffer);
 *  views of different layouts must occupy disjoint address ranges. The caller
 *  owns the memory. */
typedef struct sdpa_tensor_out {
    void *data;
    int64_t batch_stride;
    int64_t head_stride;
    int64_t seq_stride;
} sdpa_tensor_out;

/** Boolean mask broadcastable to [B, Hq, Tq, Tk]: nonzero byte = may attend.
 *  Broadcast a dimension by giving it stride 0. data == NULL: no mask. */
typedef struct sdpa_bool_mask {
    const uint8_t *data;
    int64_t batch_stride, head_stride, query_stride, key_stride;
} sdpa_bool_mask;

/** Additive fp32 bias broadcastable to [B, Hq, Tq, Tk], added to the already
 *  scaled logits (it is never multiplied by scale). -inf disallows a key; a
 *  finite value, however negative, does not. data == NULL: no bias. */
typedef struct sdpa_bias {
    const float *data;
    int64_t batch_stride, head_stride, query_stride, key_stride;
} sdpa_bias;

/** The problem descriptor: sizes, scale, the mask description, threads.
 *  Always fill it with sdpa_problem_init() first, then set fields: that keeps
 *  callers source-compatible when fields are added. struct_size records which
 *  version of the struct the caller was compiled with; this version accepts
 *  exactly its own size (SDPA_ERR_BAD_DESCRIPTOR otherwise), later versions
 *  will also accept the sizes of earlier ones.
 *  Key j is allowed for query i only if every active mask allows it:
 *  window (causal included) on the aligned diagonal, kv_lengths, bool_mask,
 *  and a bias entry that is not -inf. The same descriptor drives
 *  sdpa_forward() and sdpa_backward(), so both apply identical masks. */
typedef struct sdpa_problem {
    uint32_t struct_size;  /**< set by sdpa_problem_init(); do not change */
    uint32_t reserved0;    /**< must be 0 */
    int64_t batch;         /**< B */
    int64_t q_heads;       /**< Hq */
    int64_t kv_heads;      /**< Hkv: Hq must be a multiple of it */
    int64_t q_len;         /**< Tq: query rows */
    int64_t kv_len;        /**< Tk: key/value rows in memory (per-batch lengths: kv_lengths) */
    int64_t head_dim_qk;   /**< Dk: head_dim of Q and K */
    int64_t head_dim_v;    /**< Dv: head_dim of V, O */
    int use_default_scale; /**< 1 (default): scale = 1/sqrt(Dk), and .scale must stay 0;
                                0: use .scale as given; other values: SDPA_ERR_BAD_DESCRIPTOR */
    float scale;           /**< with use_default_scale = 0: any finite value, 0 and negative
                                included (multiplies Q K^T; the bias is not scaled) */
    sdpa_causal causal;    /**< default SDPA_CAUSAL_NONE */
    sdpa_alignment window_alignment; /**< used only when causal == SDPA_CAUSAL_NONE */
    /* Window around the aligned diagonal key i + d of query i, where d = 0 for
     * top-left alignment and d = Tk_b - Tq for bottom-right (Tk_b = kv_lengths[b],
     * or Tk without them), plus diagonal_offset. Causal masking is window_right = 0
     * on that diagonal. */
    int64_t window_left;   /**< keys j >= i + d - window_left are allowed; SDPA_WINDOW_UNBOUNDED (default) */
    int64_t window_right;  /**< keys j <= i + d + window_right are allowed; SDPA_WINDOW_UNBOUNDED (default) */
    const int32_t *kv_lengths; /**< NULL, or B key lengths: key j allowed only if j < kv_lengths[b]
                                    (key padding / ragged KV cache); each in [0, Tk] */
    sdpa_bool_mask bool_mask;  /**< optional boolean mask */
    sdpa_bias bias;            /**< optional additive mask */
    int num_threads;       /**< OpenMP threads for this call; 0 = OpenMP's default */
    sdpa_isa isa;          /**< SDPA_ISA_AUTO (default) = the process-wide choice; else this ISA */
    int block_q, block_k;  /**< tile sizes; 0 (default) = the ISA's tuned values */
    /* Attention variants (all off by default; off, the results are bit for bit
     * those of a descriptor without them). Order of operations on a logit:
     *   x = scale * q.k;  x = softcap * tanh(x / softcap)  (softcap != 0);
     *   x += -alibi_slopes[h] * |j - (i + d)|  (alibi_slopes != NULL; d as for the window);
     *   x += bias;  then the masks (-inf wins, whatever came before). */
    float softcap;         /**< logit soft-capping (Gemma 2 report, 2024): 0 (default) = off,
                                else finite and > 0 (SDPA_ERR_BAD_SOFTCAP otherwise). Applied
                                before ALiBi, the bias and the masks, as FlashAttention and
                                ONNX Attention do; the backward applies its derivative
                                1 - tanh^2 inside the streaming pass */
    uint32_t reserved1;    /**< must be 0 */
    const float *alibi_slopes; /**< NULL (default), or Hq finite slopes (SDPA_ERR_BAD_ALIBI
                                otherwise): ALiBi (Press et al. 2022, "Train Short, Test
                                Long"), -slope[h] * |j - (i + d)| added to the logit of query i
                                and key j of query head h, d = 0 top-left, Tk_b - Tq
                                bottom-right (the alignment of causal / the window). Computed per
                                tile, never materialised; no gradient (a constant). Read only */
    const float *sinks;    /**< NULL (default), or Hq logits, each finite or -inf
                                (SDPA_ERR_BAD_SINKS otherwise): attention sinks (gpt-oss model
                                card, 2025; vLLM s_aux): one logit s_h per query head joins every
                                row's softmax denominator and carries no value:
                                P_ij = exp(S_ij - m) / (exp(s_h - m) + sum_j exp(S_ij - m)),
                                LSE = log(exp(s_h) + sum_j exp(S_ij)); a row with no allowed key
                                gets O = 0 and LSE = s_h. Read only */
    float *dsinks;         /**< sdpa_backward only (sdpa_forward ignores it): NULL, or Hq floats
                                overwritten with d loss / d sinks[h] = -sum over batch and rows of
                                exp(s_h - LSE) * D, D = rowsum(dO * O); needs sinks
                                (SDPA_ERR_BAD_SINKS without); must not overlap any input or
                                output (SDPA_ERR_ALIASING) */
    const struct sdpa_seqs *seqs; /**< NULL (default): dense [B, H, T, D] tensors. Else packed
                                variable-length sequences and optionally a paged K/V cache:
                                see sdpa_seqs */
    /* Element types (sdpa_dtype; default SDPA_DTYPE_F32 = the fp32 results, bit
     * for bit, of a descriptor without these fields). LSE, the bias, the slopes
     * and sinks stay fp32. The gradients have their tensor's type (dQ Q's, dK and
     * dV K/V's; dO is O's). */
    sdpa_dtype q_dtype;    /**< Q (and, in the backward, dQ) */
    sdpa_dtype kv_dtype;   /**< K and V together (a bf16 or fp16 KV cache; dK, dV) */
    sdpa_dtype o_dtype;    /**< O (and dO) */
    sdpa_fpmath_mode fpmath_mode; /**< SDPA_FPMATH_DEFAULT (0, default) or SDPA_FPMATH_STRICT
                                     (SDPA_ERR_BAD_DESCRIPTOR otherwise): may intermediates be
                                     rounded to bf16 (see sdpa_fpmath_mode) */
    int64_t diagonal_offset; /**< default 0: added to the diagonal d of causal masking, the
                                window and ALiBi: query i's diagonal key is i + d +
                                diagonal_offset. For a query block that starts
                                diagonal_offset positions after its key block in a longer
                                sequence (context parallelism: libsdpa_mpi's ring calls;
                                a block of a larger problem). |diagonal_offset| <=
                                SDPA_MAX_DIAGONAL_OFFSET (SDPA_ERR_BAD_WINDOW otherwise) */
} sdpa_problem;

/** Packed variable-length sequences and paged K/V (serving; FlashAttention's
 *  cu_seqlens, vLLM's query_start_loc / block_table / seq_lens). With
 *  problem->seqs set, batch = B sequences and:
 *  - Q, O (dO, dQ) are token lists [total_q, Hq, D]: row i of sequence b is token
 *    cu_seqlens_q[b] + i at data + token * seq_stride + h * head_stride
 *    (batch_stride unused: 0); LSE is [total_q, Hq] (seq_stride, head_stride);
 *    q_len = total_q = cu_seqlens_q[B];
 *  - packed K, V (dK, dV): [total_k, Hkv, D] token lists likewise with
 *    cu_seqlens_k, kv_len = total_k = cu_seqlens_k[B];
 *  - or paged K, V (forward only): caches of num_blocks pages of block_size
 *    keys; key j of sequence b is slot j % block_size of page
 *    block_table[b * max_blocks_per_seq + j / block_size], at data + page *
 *    batch_stride + h * head_stride + slot * seq_stride (vLLM/OpenVINO
 *    [num_blocks, Hkv, block_size, D] and [num_blocks, block_size, Hkv, D] are
 *    both such strides); seq_lens_k[b] keys; kv_len = 0. Pages are read in
 *    place (several sequences may share one: prefix caching); table entries past
 *    a sequence's last page are never read.
 *  Every mask applies per sequence on its own lengths (causal top-left j <= i,
 *  bottom-right j <= i + Tk_b - Tq_b, windows, the variants); nothing crosses a
 *  sequence boundary. kv_lengths, bool_mask and bias are refused with seqs
 *  (SDPA_ERR_UNSUPPORTED), and so is a paged backward. Batch invariance: a
 *  sequence's output bits depend only on its own inputs, lengths and the ISA,
 *  never on the other sequences of the call or the thread count. */
typedef struct sdpa_seqs {
    const int32_t *cu_seqlens_q; /**< B + 1 entries: 0, nondecreasing, last = q_len */
    const int32_t *cu_seqlens_k; /**< B + 1 entries (packed K/V), or NULL for paged K/V */
    const int32_t *block_table;  /**< paged: B x max_blocks_per_seq page ids in [0, num_blocks) */
    int64_t max_blocks_per_seq;  /**< paged: the block table's row length */
    const int32_t *seq_lens_k;   /**< paged: B key counts, each <= max_blocks_per_seq * block_size */
    int64_t block_size;          /**< paged: keys per page, >= 1 */
    int64_t num_blocks;          /**< paged: pages in each cache */
} sdpa_seqs;

/** Fills *problem with defaults: all sizes 0, default scale, no masks,
 *  unbounded window, num_threads 0, ISA auto. Thread-safe; never fails
 *  (a NULL pointer is ignored). */
SDPA_API void sdpa_problem_init(sdpa_problem *problem);

/**
 * Forward pass: O = softmax(scale * Q K^T + bias, masked) V, and optionally LSE.
 *
 * Math: FlashAttention-2 forward (Dao 2023, Algorithm 1): for each query tile,
 * stream key tiles, keep the running row max m and row sum l, rescale the
 * accumulator by exp(m_old - m_new), finally O = acc / l, LSE = m + log(l).
 *
 * @param problem sizes, scale, masks and element types (see sdpa_problem).
 * @param q   Q [B, Hq, Tq, Dk] of q_dtype.   @param k   K [B, Hkv, Tk, Dk] of kv_dtype.
 * @param v   V [B, Hkv, Tk, Dv] of kv_dtype.  @param o   O [B, Hq, Tq, Dv] of o_dtype (written;
 *   a 16-bit O is rounded to nearest even, an fp16 one past 65504 is inf).
 * @param lse LSE [B, Hq, Tq] (written, natural log), or NULL / data NULL if not wanted.
 * A row with no allowed key gets O = 0 and LSE = -inf. NaN/Inf in an allowed
 * input propagates; masked keys, masked bias entries are never read.
 * Results are bitwise identical for every thread count (for a given ISA and
 * block sizes). Thread-safety: any number of calls may run at once; the inputs
 * are only read, so they may be shared between concurrent calls.
 * Workspace, allocated per call: per thread about 4 * ld * (Dk + Dv + block_k + 9)
 * bytes, where ld is block_q rounded up to a multiple of 16, plus the ISA's tile_pad
 * when that rounded block_q is a multiple of 64 (tile_pad: 16 floats on SDPA_ISA_AVX2,
 * 0 elsewhere, sdpa_tuning() and SDPA_TUNE), and per call under 1 KiB per sequence (one
 * for a dense problem, B for packed sequences), and with a tile_pad and Dv a multiple of 64 also
 * 4 * max(block_k, 16) * (Dv + tile_pad) bytes for a key tile's V rows; plus, when
 * the keys are split (fewer than 64 query tiles, e.g. decode), at most
 * 4 * block_q * (Dv + 2) bytes per (tile, split), fewer than 128 of them; failure
 * returns SDPA_ERR_OUT_OF_MEMORY. Nothing grows with Tq x Tk. With a bf16 / fp16
 * tensor, per thread also (max(block_k, 16) (Dk + Dv) + max(Dk, Dv)) floats of
 * conversion buffers (the V rows' counted above where they are padded), and where bf16 K/V run on the bf16
 * pair products (sdpa_isa_bf16_pairs()) about (Dk/2 + block_k/2) block_q +
 * block_k/2 Dv more (on SDPA_ISA_AMX with block_q = block_k = 128 unless the
 * descriptor gives them, for prefill problems, and block_k/2 there rounded up to a
 * multiple of 16 in the block_q term: P's pairs as whole rows of tile chunks), plus, for a prefill of more than one
 * query tile whose kv head's V in bf16 is at most 1 MiB, that V once more (2 Tk Dv
 * bytes: its key pairs, packed once per thread and kv head instead of once per query
 * tile), and on AMX about 24 KiB of stack per thread. With a boolean mask or bias whose
 * head stride is 0 (the same for every head, as (B, 1, Tq, Tk) masks are) and
 * Hq > 1, per thread also about 17 * ceil(Tk / block_k) bytes: each key tile's
 * classification (skipped, full, partial) for the rows being worked on, kept
 * for the other heads, which then run one after another.
 * @return SDPA_OK, or SDPA_ERR_NULL_ARGUMENT, SDPA_ERR_BAD_DESCRIPTOR (also an
 *   unknown element type), SDPA_ERR_NEGATIVE_SIZE, SDPA_ERR_HEAD_GROUPING, SDPA_ERR_BAD_SCALE,
 *   SDPA_ERR_BAD_STRIDE, SDPA_ERR_BAD_WINDOW, SDPA_ERR_BAD_KV_LENGTH,
 *   SDPA_ERR_ALIASING, SDPA_ERR_BAD_THREADS, SDPA_ERR_ISA_UNAVAILABLE,
 *   SDPA_ERR_BAD_BLOCK_SIZE, SDPA_ERR_BAD_SOFTCAP, SDPA_ERR_BAD_ALIBI, SDPA_ERR_BAD_SINKS,
 *   SDPA_ERR_SIZE_OVERFLOW, SDPA_ERR_MISALIGNED, SDPA_ERR_OUT_OF_MEMORY; with
 *   problem->seqs set also SDPA_ERR_BAD_SEQLENS, SDPA_ERR_BAD_BLOCK_TABLE and
 *   SDPA_ERR_UNSUPPORTED (kv_lengths, bool_mask or bias given with seqs).
 *   On error nothing is written.
 */
SDPA_API sdpa_status sdpa_forward(const sdpa_problem *problem, const sdpa_tensor *q,
                                  const sdpa_tensor *k, const sdpa_tensor *v,
                                  const sdpa_tensor_out *o, const sdpa_tensor_out *lse);

/**
 * Backward pass: dQ, dK, dV of a loss whose gradient with respect to O is dO.
 *
 * Math: FlashAttention-2 backward (Dao 2023, Algorithm 2): D = rowsum(dO * O);
 * per tile S = scale Q K^T + bias (masked), P = exp(S - LSE); dV += P^T dO;
 * dP = dO V^T; dS = P * (dP - D); dQ += scale dS K; dK += scale dS^T Q.
 * With GQA, dK and dV of a kv head sum over the query heads of its group.
 *
 * @param problem the same descriptor as the forward call.
 * @param q, k, v  the forward inputs.   @param o O [B, Hq, Tq, Dv] from the forward
 *   (read for D = rowsum(dO * O), except in the rows with |LSE| >= 256).
 * @param lse LSE [B, Hq, Tq] from the forward (required).
 * @param dout dO [B, Hq, Tq, Dv] of o_dtype (O too).
 * @param dq dQ [B, Hq, Tq, Dk] of q_dtype, @param dk dK [B, Hkv, Tk, Dk], @param dv dV [B, Hkv, Tk, Dv]
 *   of kv_dtype (16-bit gradients rounded to nearest even from the fp32 ones;
 *   with bf16 Q, K/V and O on an ISA where sdpa_isa_bf16_pairs_backward() is 1, the
 *   prefill tiles' products are bf16 pair products with P and dS rounded to bf16):
 *   overwritten in full (rows of masked keys get exactly 0). None of them may
 *   share an element with any input or each other (SDPA_ERR_ALIASING); dQ, dK,
 *   dV interleaved in one packed [B, T, 3, H, D] buffer are fine. Any alignment
 *   of the element's size works (SDPA_ERR_MISALIGNED otherwise); speed: a decode
 *   backward (one query tile per kv head) whose fp32 dK + dV are 16 MiB or more
 *   writes them with non-temporal stores where their data and row strides are multiples of 64 bytes (AVX-512; 32 on AVX2), else with plain
 *   stores, which read each line first (slower from memory, docs/perf-notes.md:
 *   allocate them line-aligned, as PyTorch and the Python package do).
 * Rows with LSE = -inf (fully masked) contribute exactly 0; NaN in the dO or O
 * of such a row, or in masked K/V rows, never reaches a gradient. NaN/Inf in
 * allowed inputs propagates (O excepted for the rows with |LSE| >= 256 below,
 * whose D does not read O). Dv = 0 gives dQ = dK = 0 (nothing flows back).
 * An fp32 Q over bf16 K/V on an ISA where sdpa_isa_bf16_pairs() is 1, in a problem whose
 * query length Tq (a packed sequence: its own) exceeds nt_max_cols / G (sdpa_tuning()),
 * i.e. more than nt_max_cols query rows (Tq x G) per kv head, without
 * SDPA_FPMATH_STRICT, is read rounded to bf16 here as the forward read it (nearest even, subnormals as 0), so that P recomputed
 * from the forward's LSE sums to 1; dK and dQ are those of the rounded Q (the rounding
 * passed through as the identity), the bits of the same call with Q rounded beforehand
 * (docs/design.md, "What is rounded").
 * P is recomputed from LSE; a row whose |LSE| >= 256, where the float LSE
 * keeps log(sum) only to ulp(LSE)/2 (2^-17 and coarser: every key of a padded
 * row given a bias of -FLT_MAX, or logits in the thousands), has its max and
 * sum recomputed from the keys first (one more pass of score and dP tiles for
 * that row's query tile), so its P is exp((S - max) - log(sum)), and its D is
 * sum_j P_j dP_j (float64 sums) instead of rowsum(dO * O), whose O has
 * rounded away the other keys' share when one key dominates.
 * Determinism: every dQ tile receives its terms in increasing key-tile order and
 * every dK/dV tile in increasing query-tile order, whether a thread runs whole
 * heads or the team runs the tiles in anti-diagonal waves: bitwise identical for
 * every thread count.
 * Thread-safety: as sdpa_forward(); the inputs are only read.
 * Workspace, allocated per call: 4 * B * Hq * Tq floats (D, and the recomputed
 * max, log-sum and D remainder of such rows), plus per thread about
 * 4 * ld * (2 * Dk + 2 * Dv + 2 * block_k + 16) bytes (ld as for sdpa_forward()),
 * and with the ISA's tile_pad 4 * ld * tile_pad bytes more for each of Dk and Dv
 * that is a multiple of 64, and 4 * block_k * (Dk + tile_pad) bytes for a key tile's
 * K rows when Dk is; with a bf16 / fp16
 * tensor, per (batch, kv head) group being worked on also 2 (G Tq (Dk + Dv) +
 * Tk (Dk + Dv)) + G Tq Dk floats of fp32 copies (one group per thread, or one at a time),
 * and on the bf16 pair products per thread about (Dk + Dv + 2 block_k) block_q / 2 +
 * (block_k / 2) (Dk + block_q) more floats of packed operands (the blocks 128 x 128 on
 * SDPA_ISA_AMX for problems with more than nt_max_cols / G query rows, unless given);
 * failure returns SDPA_ERR_OUT_OF_MEMORY before any output is written.
 * @return the same codes as sdpa_forward(), and SDPA_ERR_UNSUPPORTED also for a paged
 *   K/V (seqs with a block table: no paged backward); on error nothing is written.
 */
SDPA_API sdpa_status sdpa_backward(const sdpa_problem *problem, const sdpa_tensor *q,
                                   const sdpa_tensor *k, const sdpa_tensor *v,
                                   const sdpa_tensor *o, const sdpa_tensor *lse,
                                   const sdpa_tensor *dout, const sdpa_tensor_out *dq,
                                   const sdpa_tensor_out *dk, const sdpa_tensor_out *dv);

/**
 * Merges two partial attention states computed over disjoint key sets of the
 * same queries (prefix caching / cascade attention, context parallelism, or
 * split-KV done by the caller) into the state over their union.
 *
 * Math (FlashAttention-2's online softmax, natural log throughout; a base-2 LSE
 * mixed in silently corrupts the merge):
 *   LSE = log(exp(LSE_a) + exp(LSE_b)),
 *   O   = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b,
 * computed as M = max(LSE_a, LSE_b), w = exp(LSE - M) per part. A part with
 * LSE = -inf (no key) has weight 0 and its O row is not read; both -inf: O = 0,
 * LSE = -inf. NaN propagates, and so does a part's LSE = +inf (an overflowed state: the
 * merged row is NaN, never an error).
 * Splitting one call's keys into parts: each part is a call on its key range with the
 * same queries, and it must see the masks and variants as the whole call would: give
 * sinks to exactly one part (each part's LSE would count them again), and where the
 * diagonal matters (causal, a window, ALiBi) set diagonal_offset so that each part's
 * diagonal is the whole call's (a part starting at key c of a top-left-aligned call:
 * diagonal_offset = -c; bottom-right alignment counts from the part's own last key,
 * so a part ending e keys before the last one needs diagonal_offset = e).
 * The parts' O are fp32 here; sdpa_merge_states_typed() takes bf16 or fp16 parts and
 * output (fp32 partials, sdpa_forward with o_dtype fp32, keep the merge's full accuracy:
 * a 16-bit part is rounded once more than the whole call's O).
 *
 * @param batch, heads, len, head_dim_v  B, H, T, Dv of every state.
 * @param o_a, o_b  O [B, H, T, Dv] of the parts, fp32 (head_dim contiguous, strides in
 *   elements, 0 broadcasts); @param lse_a, lse_b LSE [B, H, T] (natural log, fp32).
 * @param o, lse  the merged O [B, H, T, Dv] and LSE [B, H, T]: written. Each may
 *   be exactly one of the inputs of its kind (same data pointer and strides: in
 *   place); otherwise an output must not overlap any input or the other output
 *   (SDPA_ERR_ALIASING) nor itself (SDPA_ERR_BAD_STRIDE).
 * Ownership: the caller owns every buffer. Thread-safety: reentrant; runs on the
 * calling thread; allocates one small block (the parts' views copied, n pointers and
 * 2n floats).
 * @return SDPA_OK, or SDPA_ERR_NULL_ARGUMENT, SDPA_ERR_NEGATIVE_SIZE,
 *   SDPA_ERR_BAD_STRIDE, SDPA_ERR_ALIASING, SDPA_ERR_SIZE_OVERFLOW,
 *   SDPA_ERR_MISALIGNED, SDPA_ERR_OUT_OF_MEMORY; on error nothing is written.
 */
SDPA_API sdpa_status sdpa_merge_states(int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v,
                                       const sdpa_tensor *o_a, const sdpa_tensor *lse_a,
                                       const sdpa_tensor *o_b, const sdpa_tensor *lse_b,
                                       const sdpa_tensor_out *o, const sdpa_tensor_out *lse);

/**
 * The N-way form of sdpa_merge_states(): n >= 1 parts, o_parts[s] and
 * lse_parts[s] for s < n (arrays of n views), merged in increasing s
 * (M = max_s LSE_s, L = sum_s exp(LSE_s - M), O = sum_s exp(LSE_s - M) O_s / L,
 * LSE = M + log L). The same code merges the forward's own split-KV partials.
 * n < 1: SDPA_ERR_NEGATIVE_SIZE. Otherwise as sdpa_merge_states().
 */
SDPA_API sdpa_status sdpa_merge_states_n(int n, int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v,
                                         const sdpa_tensor *o_parts, const sdpa_tensor *lse_parts,
                                         const sdpa_tensor_out *o, const sdpa_tensor_out *lse);

/**
 * sdpa_merge_states_n() with the parts' O of type parts_dtype and the merged O of
 * type o_dtype (each SDPA_DTYPE_F32, _BF16 or _F16; every LSE stays fp32), as a server
 * whose prefix and suffix calls (cascade attention, split-KV across calls) write
 * their O in the model's 16-bit type merges them. Each part's row is widened to fp32
 * (exact), the merge runs in fp32 as sdpa_merge_states_n() does, and each merged
 * element is rounded once to nearest even into o_dtype (fp16: beyond +-65504 after
 * rounding, +-inf; NaN stays NaN). fp32 parts into an fp32 O: exactly
 * sdpa_merge_states_n(), bit for bit. The result is the merge of the parts as they
 * are stored: parts rounded to 16 bits carry that rounding into it (up to 2^-8
 * relative for bf16, 2^-11 for fp16, beyond the single rounding of O), so where
 * accuracy matters more than memory, merge fp32 partials into a 16-bit O.
 * Views: o_parts / o strides in elements of their own type, data aligned to it
 * (else SDPA_ERR_MISALIGNED). In place: o may be one of the parts only when
 * o_dtype == parts_dtype (the same data and strides); a 16-bit part overlapping an
 * output otherwise is SDPA_ERR_ALIASING.
 * @return as sdpa_merge_states_n(), plus SDPA_ERR_BAD_DESCRIPTOR for a type outside
 *   sdpa_dtype; on error nothing is written. Scratch: the small block of
 *   sdpa_merge_states() plus n + 1 rows of Dv floats where a type is 16-bit
 *   (SDPA_ERR_OUT_OF_MEMORY if that cannot be allocated). Thread-safety: reentrant,
 *   on the calling thread.
 */
SDPA_API sdpa_status sdpa_merge_states_typed(int n, int64_t batch, int64_t heads, int64_t len, int64_t head_dim_v,
                                             sdpa_dtype parts_dtype, const sdpa_tensor *o_parts,
                                             const sdpa_tensor *lse_parts, sdpa_dtype o_dtype,
                                             const sdpa_tensor_out *o, const sdpa_tensor_out *lse);

/**
 * Caller-owned workspace, so that a server's hot path makes no allocation of
 * the library's own: sdpa_forward_workspace_size() / sdpa_backward_workspace_size()
 * give the bytes a call with this descriptor needs (shapes, block sizes and
 * num_threads; with num_threads = 0 the size follows OpenMP's default at the
 * time of the query: pass an explicit num_threads to keep it fixed; with packed or
 * paged sequences, sdpa_seqs, also the lengths in cu_seqlens_q, cu_seqlens_k and
 * seq_lens_k, so that a server stepping through changing lengths queries it per
 * step: it reads the descriptor only, O(B)), and the
 * _with_workspace calls take that memory instead of allocating it. Any
 * alignment (the library aligns inside; the size includes the slack). The
 * workspace is scratch for the duration of the call only: one workspace per
 * concurrent call; its workspace_bytes must not overlap any tensor or operand
 * of the call (SDPA_ERR_ALIASING). The size is about the one documented for sdpa_forward() /
 * sdpa_backward() (each of its buffers rounded up to 64 bytes, plus 64 bytes of
 * alignment slack): allocate what the query returns. 0 is possible (nothing to
 * compute: no rows; then workspace may be NULL). The _with_workspace calls never
 * allocate a workspace of their own, whatever workspace and workspace_bytes are.
 * With more than one thread the OpenMP runtime still creates (and caches) its
 * team, see "Out of memory" at the top of this file.
 * @return the codes of the plain calls, plus SDPA_ERR_WORKSPACE_TOO_SMALL (the
 *   workspace is smaller than the size query says; nothing written) and
 *   SDPA_ERR_NULL_ARGUMENT (workspace NULL, whatever workspace_bytes, where the call
 *   needs one; bytes NULL for the queries); sdpa_backward_workspace_size() says
 *   SDPA_ERR_UNSUPPORTED for a paged problem, as sdpa_backward() does;
 *   never SDPA_ERR_OUT_OF_MEMORY. Thread-safety: as the plain calls.
 */
SDPA_API sdpa_status sdpa_forward_workspace_size(const sdpa_problem *problem, size_t *bytes);
SDPA_API sdpa_status sdpa_forward_with_workspace(const sdpa_problem *problem, const sdpa_tensor *q,
                                                 const sdpa_tensor *k, const sdpa_tensor *v,
                                                 const sdpa_tensor_out *o, const sdpa_tensor_out *lse,
                                                 void *workspace, size_t workspace_bytes);
SDPA_API sdpa_status sdpa_backward_workspace_size(const sdpa_problem *problem, size_t *bytes);
SDPA_API sdpa_status sdpa_backward_with_workspace(const sdpa_problem *problem, const sdpa_tensor *q,
                                                  const sdpa_tensor *k, const sdpa_tensor *v,
                                                  const sdpa_tensor *o, const sdpa_tensor *lse,
                                                  const sdpa_tensor *dout, const sdpa_tensor_out *dq,
                                                  const sdpa_tensor_out *dk, const sdpa_tensor_out *dv,
                                                  void *workspace, size_t workspace_bytes);

/** A static English description of a status code ("unknown status" for others). */
SDPA_API const char *sdpa_status_string(sdpa_status status);

/** The ISA the process uses by default (after SDPA_ISA and sdpa_force_isa). */
SDPA_API sdpa_isa sdpa_isa_active(void);
/** 1 if the ISA's kernels are compiled into this library, else 0. */
SDPA_API int sdpa_isa_compiled(sdpa_isa isa);
/** 1 if compiled in and this CPU and OS can run it (CPUID + XGETBV, HWCAP; amx: also the
 *  Linux tile-data permission, requested at load), else 0. */
SDPA_API int sdpa_isa_supported(sdpa_isa isa);
/** Sets the process-wide default ISA (SDPA_ISA_AUTO: back to the load-time choice).
 *  @return SDPA_OK, or SDPA_ERR_ISA_UNAVAILABLE (nothing changes). */
SDPA_API sdpa_status sdpa_force_isa(sdpa_isa isa);
/** "scalar", "avx2", "avx512", "amx", "neon", "auto", or "unknown". Static string. */
SDPA_API const char *sdpa_isa_name(sdpa_isa isa);
/** Parses an ISA name as accepted by SDPA_ISA; returns 0 and sets *isa, or -1. */
SDPA_API int sdpa_isa_from_name(const char *name, sdpa_isa *isa);
/** Space-separated CPU features detected at load (e.g. "avx avx2 fma avx512f ... os-zmm").
 *  Static string, valid for the life of the process. */
SDPA_API const char *sdpa_cpu_features(void);
/** The microarchitecture detected at load (vendor, family, model) and the block
 *  sizes each runnable ISA's table uses for it (a descriptor's block_q / block_k
 *  override them per call; the SDPA_TUNE environment variable, e.g.
 *  "block_q=64,block_k=256,nt_max_cols=8,wide_prefetch=2,bf16_dot=0", for the process: decimal
 *  values, no empty item, at most 1023 bytes, else rejected as a whole; and whether it was
 *  applied or rejected), e.g. "uarch zen4 (AuthenticAMD family 25 model 97);
 *  scalar block_q 64 ...". Static string, valid for the life of the process;
 *  thread-safe. */
SDPA_API const char *sdpa_tuning(void);
/** 1 when a forward on `isa` (SDPA_ISA_AUTO: the process-wide default) runs the
 *  prefill key tiles of bf16 K/V with a bf16 or fp32 Q (head_dim_qk even) on bf16 pair
 *  products (AVX512-BF16 `vdpbf16ps` where the tuning for this CPU turns them on,
 *  AMX `tdpbf16ps` on SDPA_ISA_AMX, and Arm BFMMLA and BFDOT (the same bits) on SDPA_ISA_NEON
 *  where the OS reports BF16, whose fp32 additions round to odd: "bf16_dot 1" in sdpa_tuning(),
 *  SDPA_TUNE=bf16_dot=0|1), which round each
 *  probability P to bf16 before P V, round an fp32 Q to bf16 (nearest even; in every
 *  tile of a problem whose query length Tq, a packed sequence's own, exceeds
 *  nt_max_cols / G, i.e. more than nt_max_cols query rows (Tq x G) per kv head, and in
 *  its backward; a smaller, decode-sized problem rounds nothing; a call with
 *  fpmath_mode SDPA_FPMATH_STRICT rounds nothing at all) and read
 *  bf16 subnormals as 0 (docs/design.md,
 *  "What is rounded"). On SDPA_ISA_AVX512 the decode-sized tiles of a bf16 Q over bf16
 *  K/V (head_dim_qk = head_dim_v, a multiple of 32 up to 256) then compute their scores
 *  on `vdpbf16ps` too: exact products, fp32 sums in another order, nothing rounded.
 *  0 otherwise, and for an ISA this CPU cannot run. Fixed at
 *  load; thread-safe; no errors. */
SDPA_API int sdpa_isa_bf16_pairs(sdpa_isa isa);
/** 1 when a backward on `isa` (SDPA_ISA_AUTO: the process-wide default) whose Q, K/V
 *  and O (so dO) are all bf16, with even head_dim_qk and head_dim_v, runs the five
 *  products of its prefill tiles (S = Q K^T, dP = dO V^T, dV = P^T dO, dK = dS^T Q,
 *  dQ = dS K; FlashAttention-2 backward, Dao 2023, Alg. 2) on bf16 pair products: AMX
 *  `tdpbf16ps` on SDPA_ISA_AMX ("bwd_bf16_dot 1" in sdpa_tuning()), AVX512-BF16
 *  `vdpbf16ps` on SDPA_ISA_AVX512 on Zen 4 (where it issues at the FMA rate); elsewhere
 *  AVX512-BF16 and Arm BFMMLA / BFDOT only where SDPA_TUNE=bwd_bf16_dot=1 asks (measured slower
 *  than the fp32 products where vdpbf16ps runs at half rate). These round P to bf16 before dV and dS before dK and
 *  dQ (nearest even, bf16 subnormals read as 0; docs/design.md, "What is rounded"); a
 *  (batch, kv head) group or key chunk with an inf or NaN in Q, K, V or dO keeps the fp32
 *  products, as do decode-sized tiles. 0 otherwise, and for an ISA this CPU cannot
 *  run. Fixed at load; thread-safe; no errors. */
SDPA_API int sdpa_isa_bf16_pairs_backward(sdpa_isa isa);
/** The raw SDPA_ISA value seen at load if it was ignored (not an ISA name, or an
 *  ISA of another architecture; at most its first 255 bytes), else NULL. An empty
 *  SDPA_ISA is the same as unset. */
SDPA_API const char *sdpa_isa_env_rejected(void);

/** The library's version string, e.g. "0.1.0". */
SDPA_API const char *sdpa_version(void);
/** The library's version as SDPA_MAKE_VERSION(major, minor, patch). */
SDPA_API unsigned sdpa_version_number(void);

#ifdef __cplusplus
}
#endif
#endif /* SDPA_H */
