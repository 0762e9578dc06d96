/* SPDX-License-Identifier: MIT */
/* tools/cli_out.h - the outputs of the command-line tools (tools/cli_out.c), shared by
 * `sdpa` and `sdpa-ring`: each output written to a temporary file in its target's
 * directory and renamed into place, all or nothing, only when every one was written;
 * temporaries removed on SIGINT/SIGTERM/SIGHUP; the checks that two paths name the
 * same file. The program defines file_error (its one-line error message). */
#ifndef SDPA_TOOLS_CLI_OUT_H
#define SDPA_TOOLS_CLI_OUT_H

#include <stdint.h>

#include "sdpa.h"

#if defined(__GNUC__)
#define CLI_OUT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define CLI_OUT_PRINTF(f, a)
#endif

/** Defined by the program: "<program>: error: <path>: <message>" on stderr. */
void file_error(const char *path, const char *fmt, ...) CLI_OUT_PRINTF(2, 3);

/* An output: data holds the elements of type dt (fp32 when zero-initialised).
 * fp32 and bf16 data are written as float32 ('<f4', bf16 widened exactly), fp16
 * data as float16 ('<f2'). path, data, ndim, shape and dt are the caller's (data,
 * ndim and shape may be set after out_prepare, before out_commit). */
typedef struct out_file {
    const char *path;
    char *tmp; /* the finished data, in the target's directory */
    const void *data;
    int ndim;
    int64_t shape[4];
    sdpa_dtype dt;
    /* set by out_prepare and out_commit */
    char *target; /* where the data goes: path, or the file a symbolic link path names */
    char *backup; /* during the commit: a hard link to the target's previous file */
    int state;    /* during the commit: what undoing this output's rename takes */
    int fd1;      /* the temporary's descriptor, plus 1 (0: none; zero-initialised outputs) */
} out_file;

/** Removes the live temporaries when SIGINT, SIGTERM or SIGHUP arrives. */
void install_signal_cleanup(void);
/** Resolves of->path (a symbolic link to its target; a dangling link, a directory,
 * a non-regular file or a name longer than NAME_MAX is an error) and creates the
 * temporary file in the target's directory (validates that it can be written).
 * 0, or 2 (EXIT_BAD) after file_error. */
int out_prepare(out_file *of);
/** Removes the temporaries of outs[0..n-1] and frees what out_prepare allocated. */
void out_discard(out_file *outs, int n);
/** Writes every temporary file, then renames them all over their targets, all
 * or nothing: a rename that fails puts back the files the earlier ones replaced
 * (exchanged with RENAME_EXCHANGE, else kept by hard links) and removes the ones
 * they created. 0, or 2 after file_error (everything discarded either way). */
int out_commit(out_file *outs, int n);
/** Two paths name the same file (the same string, or the same file by other names). */
int same_file(const char *a, const char *b);
int same_paths(const char *const *paths, int n);

#endif /* SDPA_TOOLS_CLI_OUT_H */
