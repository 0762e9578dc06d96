/* SPDX-License-Identifier: MIT */
/* tools/cli_out.c - outputs of the sdpa tool: every output is written to a
 * temporary file in its own directory and renamed over the destination only
 * after all of them were written, so a failure never leaves a half-written or
 * changed output; temporary files are removed on SIGINT/SIGTERM/SIGHUP. Also
 * the checks that two paths name the same file. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "dtype.h" /* src/dtype.h: sdpa_bf16_to_f32 */

/* Temporary files alive right now, removed if SIGINT/SIGTERM/SIGHUP arrives
 * (unlink() is async-signal-safe), so an interrupted run leaves nothing. */
#define MAX_TEMPS 8
static char *volatile live_temps[MAX_TEMPS];

static void temps_track(char *tmp, int on)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (on ? live_temps[i] == NULL : live_temps[i] == tmp) {
            live_temps[i] = on ? tmp : NULL;
            return;
        }
}

static void on_fatal_signal(int sig)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (live_temps[i])
            unlink(live_temps[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

void install_signal_cleanup(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_fatal_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(sigs[i], &sa, NULL);
    }
}

int out_prepare(out_file *of)
{
    struct stat st;
    int fd;
    mode_t mask;
    if (stat(of->path, &st) == 0 && S_ISDIR(st.st_mode)) {
        file_error(of->path, "is a directory");
        return EXIT_BAD;
    }
    /* Only regular files are replaced: renaming over a FIFO or a device node
     * (e.g. /dev/null, as root) would destroy it. */
    if (stat(of->path, &st) == 0 && !S_ISREG(st.st_mode)) {
        file_error(of->path, "exists and is not a regular file");
        return EXIT_BAD;
    }
    /* The temporary file lives in the output's directory (rename() stays on one
     * file system) under a short name, so long output names still fit. */
    const char *slash = strrchr(of->path, '/');
    const size_t dirlen = slash ? (size_t)(slash - of->path) + 1 : 0;
    const size_t n = dirlen + 32;
    of->tmp = malloc(n);
    if (!of->tmp) {
        file_error(of->path, "out of memory");
        return EXIT_BAD;
    }
    snprintf(of->tmp, n, "%.*s.sdpa-out.XXXXXX", (int)dirlen, of->path);
    temps_track(of->tmp, 1);
    fd = mkstemp(of->tmp);
    if (fd < 0) {
        file_error(of->path, "cannot create: %s", strerror(errno));
        temps_track(of->tmp, 0);
        free(of->tmp);
        of->tmp = NULL;
        return EXIT_BAD;
    }
    mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    close(fd);
    return 0;
}

void out_discard(out_file *outs, int n)
{
    for (int i = 0; i < n; i++)
        if (outs[i].tmp) {
            unlink(outs[i].tmp);
            temps_track(outs[i].tmp, 0);
            free(outs[i].tmp);
            outs[i].tmp = NULL;
        }
}

/* Writes one output's data to its temporary file: fp32 as float32, fp16 as
 * float16 (its bits as they are), bf16 widened (exactly) to float32. */
static int out_write(const out_file *of, char *err, size_t errlen)
{
    if (of->dt == SDPA_DTYPE_F32)
        return npy_write(of->tmp, NPY_F4, of->data, of->ndim, of->shape, err, errlen);
    if (of->dt == SDPA_DTYPE_F16)
        return npy_write(of->tmp, NPY_F2, of->data, of->ndim, of->shape, err, errlen);
    int64_t count = 1;
    for (int d = 0; d < of->ndim; d++)
        count *= of->shape[d]; /* checked against overflow when the shapes were made */
    float *wide = alloc_floats(count);
    if (!wide) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const uint16_t *h = of->data;
    for (int64_t i = 0; i < count; i++)
        wide[i] = sdpa_bf16_to_f32(h[i]);
    const int rc = npy_write(of->tmp, NPY_F4, wide, of->ndim, of->shape, err, errlen);
    free(wide);
    return rc;
}

int out_commit(out_file *outs, int n)
{
    char err[256];
    for (int i = 0; i < n; i++)
        if (out_write(&outs[i], err, sizeof err) != 0) {
            file_error(outs[i].path, "%s", err);
            out_discard(outs, n);
            return EXIT_BAD;
        }
    for (int i = 0; i < n; i++) {
        if (rename(outs[i].tmp, outs[i].path) != 0) {
            file_error(outs[i].path, "cannot rename the finished output into place: %s", strerror(errno));
            out_discard(outs, n);
            return EXIT_BAD;
        }
        temps_track(outs[i].tmp, 0);
        free(outs[i].tmp);
        outs[i].tmp = NULL;
    }
    return 0;
}

/* Canonical form of a path that may not exist yet: realpath() of its directory
 * plus its last component. Returns 0 on success. */
static int canonical_path(const char *path, char *out, size_t cap)
{
    char dir[PATH_MAX], real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (slash) {
        const size_t len = slash == path ? 1 : (size_t)(slash - path);
        if (len >= sizeof dir)
            return -1;
        memcpy(dir, path, len);
        dir[len] = '\0';
    } else {
        strcpy(dir, ".");
    }
    if (!realpath(dir, real))
        return -1;
    if ((size_t)snprintf(out, cap, "%s/%s", real, base) >= cap)
        return -1;
    return 0;
}

/* The same string, or the same existing file (device and inode) reached by
 * different names, or the same canonical name for a file not created yet. */
int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    char ca[PATH_MAX + 256], cb[PATH_MAX + 256];
    if (!a || !b)
        return 0;
    if (strcmp(a, b) == 0)
        return 1;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    /* one of them does not exist yet: compare the names they would have */
    return canonical_path(a, ca, sizeof ca) == 0 && canonical_path(b, cb, sizeof cb) == 0 && strcmp(ca, cb) == 0;
}

int same_paths(const char *const *paths, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (same_file(paths[i], paths[j]))
                return 1;
    return 0;
}
