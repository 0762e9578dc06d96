/* SPDX-License-Identifier: MIT */
/* tools/cli.h - what the files of the sdpa command-line tool share.
 *
 *   sdpa.c      main: the command table and the top-level help
 *   cli_args.c  error messages, the option table, --help, option parsing
 *   cli_npy.c   .npy inputs as tensors: loading, shape checks, checked sizes, broadcasting
 *   cli_out.c   outputs: temporary files renamed into place, cleanup on signals,
 *               same-file checks
 *   cli_attn.c  `sdpa forward` and `sdpa backward`
 *   cli_demo.c  `sdpa info` and `sdpa demo`
 *
 * Errors: one line "sdpa: error: ..." on stderr and exit status EXIT_BAD (2). */
#ifndef SDPA_TOOLS_CLI_H
#define SDPA_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "npy.h"
#include "sdpa.h"

#if defined(__GNUC__)
#define CLI_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_PRINTF(f, a)
#endif

enum { EXIT_BAD = 2 };

/* ------------------------------------------------------------ options (cli_args.c) */

enum { CMD_FORWARD = 1, CMD_BACKWARD = 2, CMD_DEMO = 4 };

typedef struct cli_opts {
    const char *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    const char *kvlen, *mask, *bias, *data_dir;
    const char *alibi, *sinks, *dsinks; /* --alibi-slopes, --sinks (read), --dsinks (written) */
    /* packed sequences and paged K/V (issue 17): --cu-seqlens-q, --cu-seqlens-k,
     * --block-table, --seq-lens-k */
    const char *cuq, *cuk, *btab, *lensk;
    int page_nhd, have_page_layout; /* --page-layout NHD (default HND) */
    int bshd, have_layout;          /* --layout bshd (default bhsd) */
    int have_scale;
    float scale;
    float softcap; /* --softcap: 0 = off, else finite > 0 */
    sdpa_causal causal;
    int have_align;
    sdpa_alignment align;
    int64_t window_left, window_right;
    int64_t diagonal_offset;
    int threads;
    sdpa_isa isa;
    /* --dtype (Q, O, dO, dQ) and --kv-dtype (K, V, dK, dV; default --dtype): the
     * types the tensors are stored in while the library computes (issue 16) */
    sdpa_dtype dtype, kv_dtype;
    int have_kv_dtype;
    sdpa_fpmath_mode fpmath; /* --fpmath */
} cli_opts;

/** "sdpa: error: <path>: <message>" */
void file_error(const char *path, const char *fmt, ...) CLI_PRINTF(2, 3);
/** "sdpa: error: <message>" */
void plain_error(const char *fmt, ...) CLI_PRINTF(1, 2);
/** The message, the command's usage line and a pointer to --help; returns EXIT_BAD. */
int usage_error(int cmd, const char *fmt, ...) CLI_PRINTF(2, 3);
/** "sdpa: error: libsdpa: <status string> (status N)"; returns EXIT_BAD. */
int library_error(sdpa_status st);

void print_help(int cmd);
/** Fills *o from argv[1..argc-1] (argv[0] is the command). Returns 0 (with
 *  *help set for --help) or EXIT_BAD after printing the reason. */
int parse_options(int cmd, int argc, char **argv, cli_opts *o, int *help);

/* ------------------------------------------------------------ tensors (cli_npy.c) */

/* A float32 or float16 .npy of rank 2..4 viewed as [B, H, T, D]; size[i] is the
 * product of the dims from i on (size[0] the element count, size[1..3] the
 * strides), each checked against int64 overflow when the file is loaded. Once
 * loaded, a.data holds a.count elements of type dt (float for fp32, uint16_t
 * for bf16 and fp16), whatever the file's type was; a.dtype stays the file's. */
typedef struct tensor {
    const char *path;
    npy_array a;
    sdpa_dtype dt;
    int64_t b, h, t, d;
    int64_t size[4];
} tensor;

/** size[i] = dims[i] * ... * dims[n-1] for i < n. Returns 0, or -1 if any of
 *  these products overflows int64 (a 0 among the dims does not hide it). */
int dims_sizes(const int64_t *dims, int n, int64_t *size);
int load_npy(const char *path, npy_array *a);
/** load_tensor_as(path, role, SDPA_DTYPE_F32, t). */
int load_tensor(const char *path, const char *role, tensor *t);
/** Loads a float32 or float16 tensor and stores it as dt (rounded to nearest
 *  even where dt is narrower than the file; widening is exact). */
int load_tensor_as(const char *path, const char *role, sdpa_dtype dt, tensor *t);
/** Converts the n elements of an npy array of dtype NPY_F4 or NPY_F2 in place
 *  into a buffer of type dt (a->data replaced; a->dtype kept). 0, or -1 when
 *  out of memory (a unchanged). */
int npy_store_as(npy_array *a, sdpa_dtype dt);
/** Bytes of one element: 4 for fp32, 2 for bf16 and fp16. */
size_t dtype_size(sdpa_dtype dt);
/** "fp32", "bf16" or "fp16". */
const char *dtype_name(sdpa_dtype dt);
/** Parses "fp32", "bf16" or "fp16" (those spellings only); 0, or -1. */
int dtype_parse(const char *s, sdpa_dtype *dt);
sdpa_tensor tensor_view(const tensor *t);
/** Shape of a tensor of logical dims (b, h, t, d) in the given rank. */
void shape_in_rank(int rank, int64_t b, int64_t h, int64_t t, int64_t d, int64_t *shape);
int check_shape(const tensor *t, const char *role, int rank, int64_t b, int64_t h, int64_t tt, int64_t d,
                const char *what);
/** Strides (elements) mapping an array broadcastable to target[4] by NumPy's rules. */
int broadcast_strides(const char *path, const char *role, const npy_array *a, const int64_t target[4],
                      int64_t strides[4]);
/** n floats (at least one byte), or NULL if n is negative or too large. */
float *alloc_floats(int64_t n);
/** n elements of type dt (at least one byte), or NULL if n is negative or too large. */
void *alloc_elems(int64_t n, sdpa_dtype dt);

/* ------------------------------------------------------------ outputs (cli_out.c) */

/* outputs (cli_out.c): out_file, out_prepare, out_commit, out_discard, same_file */
#include "cli_out.h"

/* ------------------------------------------------------------ commands */

int cmd_forward(int argc, char **argv);  /* cli_attn.c */
int cmd_backward(int argc, char **argv); /* cli_attn.c */
int cmd_info(int argc, char **argv);     /* cli_demo.c */
int cmd_demo(int argc, char **argv);     /* cli_demo.c */
/** OpenMP's maximum thread count (1 without OpenMP). */
int max_threads(void);

#endif /* SDPA_TOOLS_CLI_H */
