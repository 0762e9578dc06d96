/* SPDX-License-Identifier: MIT */
/* api.c - the descriptor's defaults and the status strings. The entry points
 * sdpa_forward and sdpa_backward live in forward.c and backward.c; the ISA
 * queries in dispatch.c. */
#include <string.h>

#include "driver.h"

void sdpa_problem_init(sdpa_problem *p)
{
    if (!p)
        return;
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof(sdpa_problem);
    p->use_default_scale = 1;
    p->scale = 0.0f;
    p->causal = SDPA_CAUSAL_NONE;
    p->window_alignment = SDPA_ALIGN_TOP_LEFT;
    p->window_left = SDPA_WINDOW_UNBOUNDED;
    p->window_right = SDPA_WINDOW_UNBOUNDED;
    p->isa = SDPA_ISA_AUTO;
}

const char *sdpa_status_string(sdpa_status s)
{
    switch (s) {
    case SDPA_OK: return "success";
    case SDPA_ERR_NULL_ARGUMENT: return "a required pointer is NULL: the problem, a tensor view, or the data of a tensor that is not empty";
    case SDPA_ERR_BAD_DESCRIPTOR: return "problem descriptor not initialised by sdpa_problem_init (struct_size, reserved field or enum value)";
    case SDPA_ERR_NEGATIVE_SIZE: return "a size is negative";
    case SDPA_ERR_HEAD_GROUPING: return "q_heads is not a multiple of kv_heads";
    case SDPA_ERR_BAD_SCALE: return "bad scale: .scale was set while use_default_scale is still 1 (set use_default_scale = 0 to use it); or, with use_default_scale = 0, .scale is NaN or infinite; or the default 1/sqrt(head_dim_qk) with head_dim_qk = 0";
    case SDPA_ERR_BAD_STRIDE: return "a tensor or mask stride is negative, or an output's strides make it overlap itself";
    case SDPA_ERR_BAD_WINDOW: return "a window bound is negative and not SDPA_WINDOW_UNBOUNDED, or |diagonal_offset| is beyond SDPA_MAX_DIAGONAL_OFFSET";
    case SDPA_ERR_BAD_KV_LENGTH: return "a per-batch key length is negative or larger than kv_len";
    case SDPA_ERR_ALIASING: return "an output overlaps an input, another output, or an operand (kv_lengths, bool_mask, bias, alibi_slopes, sinks, the sdpa_seqs struct or its arrays); or the caller's workspace overlaps any of them";
    case SDPA_ERR_BAD_THREADS: return "num_threads is negative";
    case SDPA_ERR_ISA_UNAVAILABLE: return "the requested ISA is not compiled in or not supported by this CPU/OS";
    case SDPA_ERR_OUT_OF_MEMORY: return "the workspace could not be allocated (out of memory)";
    case SDPA_ERR_SIZE_OVERFLOW: return "a size overflows: a tensor or mask extent exceeds the address space, head_dim exceeds INT32_MAX, q_len or kv_len exceeds SDPA_MAX_SEQ_LEN (2^60), B*Hq*Tq or B*Hkv*Tk exceeds INT64_MAX, or the workspace size exceeds SIZE_MAX";
    case SDPA_ERR_BAD_BLOCK_SIZE: return "block_q or block_k is outside [0, SDPA_MAX_BLOCK]";
    case SDPA_ERR_BAD_SOFTCAP: return "softcap is negative, NaN or infinite (0 turns it off)";
    case SDPA_ERR_BAD_ALIBI: return "an ALiBi slope (alibi_slopes[h]) is NaN or infinite";
    case SDPA_ERR_BAD_SINKS: return "a sink (sinks[h]) is NaN or +inf, or dsinks is set without sinks";
    case SDPA_ERR_BAD_SEQLENS: return "bad sequence lengths: cu_seqlens must start at 0, never decrease and end at q_len / kv_len; seq_lens_k must be in [0, max_blocks_per_seq * block_size]";
    case SDPA_ERR_BAD_BLOCK_TABLE: return "bad block table: a page id a sequence uses is outside [0, num_blocks), or block_size < 1, max_blocks_per_seq < 0 or num_blocks < 0";
    case SDPA_ERR_UNSUPPORTED: return "not supported: kv_lengths, bool_mask or bias with packed sequences (seqs), or a backward with a paged K/V cache";
    case SDPA_ERR_MISALIGNED: return "a data pointer is not aligned to its element: 4 bytes for fp32 tensors and the int32 / float operand arrays, 2 for bf16 / fp16 tensors";
    case SDPA_ERR_WORKSPACE_TOO_SMALL: return "the caller's workspace is smaller than sdpa_forward_workspace_size / sdpa_backward_workspace_size says";
    }
    return "unknown status";
}
