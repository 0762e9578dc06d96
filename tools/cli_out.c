/* SPDX-License-Identifier: MIT */
/* tools/cli_out.c - outputs of the sdpa and sdpa-ring tools: every output is written to a
 * temporary file in its target's directory (an output that is a symbolic link
 * is written through to the file it names) and renamed over the target only
 * after all of them were written; a rename that fails undoes the ones before
 * it, so a failure never leaves a half-written or changed output. Temporary
 * files are removed on SIGINT/SIGTERM/SIGHUP. Also the checks that two paths
 * name the same file. */
#include <errno.h>
#include <fcntl.h> /* AT_FDCWD */
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_out.h"
#include "npy.h"
#include "dtype.h" /* src/dtype.h: sdpa_bf16_to_f32 */

/* the tools' exit status for a bad file (EXIT_BAD in cli.h and sdpa_ring.c) */
#define OUT_EXIT_BAD 2

/* Temporary files alive right now, removed if SIGINT/SIGTERM/SIGHUP arrives
 * (unlink() is async-signal-safe), so an interrupted run leaves nothing. */
#define MAX_TEMPS 16
static char *volatile live_temps[MAX_TEMPS];

static void temps_track(char *tmp, int on)
{
    for (int i = 0; i < MAX_TEMPS; i++)
        if (on ? live_temps[i] == NULL : live_temps[i] == tmp) {
            live_temps[i] = on ? tmp : NULL;
            return;
        }
}

/* While out_commit renames, the temporaries may hold the previous files of the outputs
 * already exchanged: a fatal signal then waits (pending_signal) until the commit is
 * over. A flag, not a signal mask: the signal may be delivered to any thread (the
 * OpenMP workers, MPI's), and a mask is per thread. */
static atomic_int committing, pending_signal;

static void on_fatal_signal(int sig)
{
    atomic_store(&pending_signal, sig);
    if (atomic_load(&committing))
        return;
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

/* The directory part of path ("." when it has none, "/" for "/x"): malloc'ed. */
static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    const size_t len = slash == path ? 1 : (size_t)(slash - path);
    char *dir = malloc(len + 1);
    if (dir) {
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    return dir;
}

int out_prepare(out_file *of)
{
    struct stat st;
    int fd;
    mode_t mask;
    /* An output that is a symbolic link is written through: the file it names
     * is replaced and the link stays (a dangling link is refused, as GNU cp
     * does: creating a file where it points is rarely what was meant). */
    if (lstat(of->path, &st) == 0 && S_ISLNK(st.st_mode)) {
        of->target = realpath(of->path, NULL);
        if (!of->target) {
            const int err = errno;
            if (stat(of->path, &st) == 0 && !S_ISREG(st.st_mode)) /* e.g. /dev/stdout on a pipe */
                file_error(of->path, "exists and is not a regular file");
            else if (err == ENOENT)
                file_error(of->path, "is a symbolic link to a missing file");
            else
                file_error(of->path, "is a symbolic link that cannot be resolved: %s", strerror(err));
            return OUT_EXIT_BAD;
        }
    } else if (!(of->target = strdup(of->path))) {
        file_error(of->path, "out of memory");
        return OUT_EXIT_BAD;
    }
    const char *target = of->target;
    if (stat(target, &st) == 0 && S_ISDIR(st.st_mode)) {
        file_error(of->path, "is a directory");
        return OUT_EXIT_BAD;
    }
    /* Only regular files are replaced: renaming over a FIFO or a device node
     * (e.g. /dev/null, as root) would destroy it. */
    if (stat(target, &st) == 0 && !S_ISREG(st.st_mode)) {
        file_error(of->path, "exists and is not a regular file");
        return OUT_EXIT_BAD;
    }
    /* A name its file system cannot hold would make the rename fail after the
     * other outputs were written: refused here, before anything is. */
    const char *slash = strrchr(target, '/');
    const char *base = slash ? slash + 1 : target;
    char *dir = dir_of(target);
    if (!dir) {
        file_error(of->path, "out of memory");
        return OUT_EXIT_BAD;
    }
    const long name_max = pathconf(dir, _PC_NAME_MAX), path_max = pathconf(dir, _PC_PATH_MAX);
    free(dir);
    if ((name_max > 0 && strlen(base) > (size_t)name_max) || (path_max > 0 && strlen(target) >= (size_t)path_max)) {
        file_error(of->path, "cannot create: %s", strerror(ENAMETOOLONG));
        return OUT_EXIT_BAD;
    }
    /* The temporary file lives in the target's directory (rename() stays on one
     * file system) under a short name, so long output names still fit. */
    const size_t dirlen = slash ? (size_t)(slash - target) + 1 : 0;
    const size_t n = dirlen + 32;
    of->tmp = malloc(n);
    if (!of->tmp) {
        file_error(of->path, "out of memory");
        return OUT_EXIT_BAD;
    }
    snprintf(of->tmp, n, "%.*s.sdpa-out.XXXXXX", (int)dirlen, target);
    temps_track(of->tmp, 1);
    fd = mkstemp(of->tmp);
    if (fd < 0) {
        file_error(of->path, "cannot create: %s", strerror(errno));
        temps_track(of->tmp, 0);
        free(of->tmp);
        of->tmp = NULL;
        return OUT_EXIT_BAD;
    }
    mask = umask(0);
    umask(mask);
    (void)fchmod(fd, 0666 & ~mask);
    of->fd1 = fd + 1; /* written through this descriptor: the name is never reopened */
    return 0;
}

static void forget(char **name, int remove)
{
    if (*name) {
        if (remove)
            unlink(*name);
        temps_track(*name, 0);
        free(*name);
        *name = NULL;
    }
}

void out_discard(out_file *outs, int n)
{
    for (int i = 0; i < n; i++) {
        if (outs[i].fd1 > 0)
            close(outs[i].fd1 - 1);
        outs[i].fd1 = 0;
        forget(&outs[i].tmp, 1);
        forget(&outs[i].backup, 1);
        free(outs[i].target);
        outs[i].target = NULL;
    }
}

/* Writes one output's data to its temporary file: fp32 as float32, fp16 as
 * float16 (its bits as they are), bf16 widened (exactly) to float32. */
static int out_write(out_file *of, char *err, size_t errlen)
{
    FILE *f = of->fd1 > 0 ? fdopen(of->fd1 - 1, "wb") : NULL;
    if (!f) {
        snprintf(err, errlen, "cannot write: %s", strerror(errno));
        return -1;
    }
    of->fd1 = 0; /* the stream owns it now, and npy_write_stream closes it */
    if (of->dt == SDPA_DTYPE_F32)
        return npy_write_stream(f, NPY_F4, of->data, of->ndim, of->shape, err, errlen);
    if (of->dt == SDPA_DTYPE_F16)
        return npy_write_stream(f, NPY_F2, of->data, of->ndim, of->shape, err, errlen);
    int64_t count = 1;
    for (int d = 0; d < of->ndim; d++)
        count *= of->shape[d]; /* checked against overflow when the shapes were made */
    float *wide = malloc((size_t)count * sizeof(float) + 1); /* count: checked when the shapes were made */
    if (!wide) {
        snprintf(err, errlen, "out of memory");
        fclose(f);
        return -1;
    }
    const uint16_t *h = of->data;
    for (int64_t i = 0; i < count; i++)
        wide[i] = sdpa_bf16_to_f32(h[i]);
    const int rc = npy_write_stream(f, NPY_F4, wide, of->ndim, of->shape, err, errlen);
    free(wide);
    return rc;
}

/* Where a committed output's previous file is, i.e. what undoing it takes. */
enum {
    OUT_NEW = 1, /* there was none: remove the target */
    OUT_SWAPPED, /* exchanged with the temporary (RENAME_EXCHANGE): it is at of->tmp */
    OUT_KEPT,    /* a hard link made before the rename: it is at of->backup */
    OUT_UNKEPT   /* neither was possible: it is gone */
};

/* A hard link to the target's present file next to it, named after the
 * temporary's unique suffix (mkstemp's XXXXXX): 0, or -1. */
static int out_link_backup(out_file *of)
{
    const size_t len = strlen(of->tmp), n = len + 16;
    if (!(of->backup = malloc(n)))
        return -1;
    const char *suffix = of->tmp + len - 6;
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(of->backup, n, "%.*s.sdpa-old.%s%.0d", (int)(len - 16), of->tmp, suffix, attempt);
        temps_track(of->backup, 1);
        if (link(of->target, of->backup) == 0)
            return 0;
        temps_track(of->backup, 0);
        if (errno != EEXIST)
            break;
    }
    free(of->backup);
    of->backup = NULL;
    return -1;
}

/* Puts a finished output in place so that it can be undone: over no file, by
 * exchanging it with the present file (Linux's RENAME_EXCHANGE: the old file then
 * lives on at the temporary's name, owner and links intact), or where the file
 * system cannot exchange, after a hard link to the present file. 0 when placed,
 * -1 (errno) when it failed and nothing changed, 1 when it cannot be undone and
 * was not placed (nothing changed) unless last_resort (then a plain rename). */
static int out_place(out_file *of, int last_resort)
{
    struct stat st;
    if (lstat(of->target, &st) != 0 && errno == ENOENT) {
#ifdef RENAME_NOREPLACE
        /* a file created there since is not overwritten: EEXIST, the commit fails */
        if (renameat2(AT_FDCWD, of->tmp, AT_FDCWD, of->target, RENAME_NOREPLACE) != 0 &&
            (errno != EINVAL || rename(of->tmp, of->target) != 0))
            return -1;
#else
        if (rename(of->tmp, of->target) != 0)
            return -1;
#endif
        of->state = OUT_NEW;
        forget(&of->tmp, 0);
        return 0;
    }
    /* out_prepare found a regular file or nothing; what is there now must be a regular
     * file still (a directory, link or FIFO made there since is left alone) */
    if (!S_ISREG(st.st_mode)) {
        errno = S_ISDIR(st.st_mode) ? EISDIR : EEXIST;
        return -1;
    }
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, of->tmp, AT_FDCWD, of->target, RENAME_EXCHANGE) == 0) {
        if (lstat(of->tmp, &st) == 0 && !S_ISREG(st.st_mode)) { /* replaced since the check: put back */
            (void)renameat2(AT_FDCWD, of->tmp, AT_FDCWD, of->target, RENAME_EXCHANGE);
            errno = S_ISDIR(st.st_mode) ? EISDIR : EEXIST;
            return -1;
        }
        of->state = OUT_SWAPPED;
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP && errno != ENOTSUP)
        return -1; /* e.g. EPERM in a sticky directory: the plain rename would fail too */
#endif
    if (out_link_backup(of) == 0) {
        if (rename(of->tmp, of->target) != 0) {
            const int err = errno;
            forget(&of->backup, 1);
            errno = err;
            return -1;
        }
        of->state = OUT_KEPT;
        forget(&of->tmp, 0);
        return 0;
    }
    if (!last_resort)
        return 1;
    if (rename(of->tmp, of->target) != 0)
        return -1;
    of->state = OUT_UNKEPT;
    forget(&of->tmp, 0);
    return 0;
}

/* Undoes a placed output; says so when it cannot (and keeps the old file's name). */
static void out_undo(out_file *of)
{
    if (of->state == OUT_NEW) {
        if (unlink(of->target) != 0)
            file_error(of->path, "was created and could not be removed again: %s", strerror(errno));
        return;
    }
    if (of->state == OUT_UNKEPT) {
        file_error(of->path, "was replaced, and its previous file could not be kept (its file system has "
                             "neither RENAME_EXCHANGE nor hard links)");
        return;
    }
    char **old = of->state == OUT_SWAPPED ? &of->tmp : &of->backup;
    if (rename(*old, of->target) != 0)
        file_error(of->path, "was replaced and could not be put back (%s): its previous file is %s",
                   strerror(errno), *old);
    forget(old, 0); /* renamed back, or kept for the user under its name */
}

int out_commit(out_file *outs, int n)
{
    char err[256];
    for (int i = 0; i < n; i++)
        if (out_write(&outs[i], err, sizeof err) != 0) {
            file_error(outs[i].path, "%s", err);
            out_discard(outs, n);
            return OUT_EXIT_BAD;
        }
    /* All or nothing: every output is placed so that it can be undone, except (on a
     * file system with neither RENAME_EXCHANGE nor hard links) those that cannot,
     * placed last; if a placement fails, the ones before it are undone, then the
     * error is said. Fatal signals wait until the commit is over (on_fatal_signal);
     * SIGPIPE is ignored meanwhile (a closed stderr must not stop an undo). */
    atomic_store(&committing, 1);
    void (*old_pipe)(int) = signal(SIGPIPE, SIG_IGN);
    int placed[8], np = 0, later[8], nl = 0, failed = -1, failed_errno = 0;
    for (int i = 0; i < n && i < 8 && failed < 0; i++) {
        const int r = out_place(&outs[i], 0);
        if (r == 1)
            later[nl++] = i;
        else if (r == 0)
            placed[np++] = i;
        else
            failed = i, failed_errno = errno;
    }
    for (int k = 0; k < nl && failed < 0; k++) {
        if (out_place(&outs[later[k]], 1) == 0)
            placed[np++] = later[k];
        else
            failed = later[k], failed_errno = errno;
    }
    int rc = 0;
    if (failed >= 0) {
        for (int k = np - 1; k >= 0; k--)
            out_undo(&outs[placed[k]]);
        file_error(outs[failed].path, "cannot rename the finished output into place: %s", strerror(failed_errno));
        rc = OUT_EXIT_BAD;
    }
    out_discard(outs, n); /* the temporaries left: the previous files of the exchanged outputs, backups */
    signal(SIGPIPE, old_pipe == SIG_ERR ? SIG_DFL : old_pipe);
    atomic_store(&committing, 0);
    const int sig = atomic_load(&pending_signal);
    if (sig) /* arrived during the commit: now the process ends as it asked */
        on_fatal_signal(sig);
    return rc;
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
