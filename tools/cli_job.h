/* SPDX-License-Identifier: MIT */
/* tools/cli_job.h - what `sdpa forward` / `sdpa backward` (cli_attn.c) and their
 * input loading (cli_load.c) share: the job of one command. */
#ifndef SDPA_CLI_JOB_H
#define SDPA_CLI_JOB_H

#include "cli.h"

/* How a file's dims map onto the library's [B, H, T, D] views. */
typedef enum vkind {
    V_BHSD,   /* (B, H, T, D), or (H, T, D) / (T, D) with the missing dims 1 */
    V_BSHD,   /* (B, T, H, D) */
    V_TOKENS, /* (total, H, D): a packed token list (batch stride 0) */
    V_HND,    /* (num_blocks, H, block_size, D): batch stride = page stride */
    V_NHD     /* (num_blocks, block_size, H, D) */
} vkind;

enum { MODE_DENSE, MODE_PACKED, MODE_PAGED };

typedef struct job {
    cli_opts opt;
    tensor q, k, v, o, lse, dout;
    npy_array kvlen_raw, mask, bias, alibi, sinks;
    int32_t *kvlen;
    sdpa_problem p;
    int mode;
    vkind qkind, kvkind;        /* layouts of Q/O/dO/LSE and of K/V */
    sdpa_tensor vq, vk, vv;     /* views of the Q, K, V files */
    int ondim, lndim;           /* O (shaped like Q, last dim Dv) and LSE (Q.shape[:-1]) */
    int64_t oshape[4], lshape[4];
    int64_t ocount, lcount;     /* their element counts */
    int64_t ostr[3], lstr[3];   /* their (batch, head, seq) strides */
    /* packed / paged (issue 17) */
    npy_array cuq_raw, cuk_raw, bt_raw, lk_raw;
    int32_t *cuq, *cuk, *bt, *lk;
    int64_t nseq, total_q, total_k, num_blocks, block_size, max_blocks;
    sdpa_seqs seqs;
} job;

/* Frees everything a job loaded. */
void job_free(job *j);
/* The first output path that names one of the input files, or NULL (an output
 * must never replace an input by accident). */
const char *output_clobbers_input(const cli_opts *o, const char *const *outs, int nout);
/* Loads and checks every input of the job (Q, K, V, the packed/paged tables,
 * masks, variants) and fills its problem and output shapes; 0, or 2 after
 * printing the error. */
int load_common(job *j);

#endif
