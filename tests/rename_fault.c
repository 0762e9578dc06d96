/* SPDX-License-Identifier: MIT */
/* tests/rename_fault.c - preloaded (LD_PRELOAD) into the sdpa CLI by
 * tests/test_cli_files.c to make its output commit fail where a test says:
 *  - rename() or renameat2() onto a file whose name starts with "fail-rename"
 *    fails with EACCES (as a rename into a sticky directory over another user's
 *    file does);
 *  - with RENAME_FAULT_NO_EXCHANGE set, renameat2(..., RENAME_EXCHANGE) fails
 *    with EINVAL (a file system that cannot exchange);
 *  - with RENAME_FAULT_NO_LINK set, link() fails with EPERM (no hard links, or
 *    fs.protected_hardlinks against a file of another user);
 *  - with RENAME_FAULT_SIGINT set, a successful RENAME_EXCHANGE is followed by
 *    SIGINT to the process (any of its threads may take it) and a 0.2 s pause,
 *    i.e. a signal in the middle of the commit;
 *  - with RENAME_FAULT_DIR=PATH set, fdopen() (the CLI writes its temporaries
 *    through it) first replaces PATH by an empty directory: the output changed
 *    between the check and the commit.
 * Every other call is glibc's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static int fails(const char *to)
{
    const char *slash = strrchr(to, '/');
    const char *base = slash ? slash + 1 : to;
    return strncmp(base, "fail-rename", 11) == 0;
}

static void *next(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f)
        errno = ENOSYS;
    return f;
}

EXPORT int rename(const char *from, const char *to)
{
    if (fails(to)) {
        errno = EACCES;
        return -1;
    }
    int (*real)(const char *, const char *) = (int (*)(const char *, const char *))next("rename");
    return real ? real(from, to) : -1;
}

EXPORT int renameat2(int fromfd, const char *from, int tofd, const char *to, unsigned int flags)
{
    if ((flags & RENAME_EXCHANGE) && getenv("RENAME_FAULT_NO_EXCHANGE")) {
        errno = EINVAL;
        return -1;
    }
    if (fails(to)) {
        errno = EACCES;
        return -1;
    }
    int (*real)(int, const char *, int, const char *, unsigned int) =
        (int (*)(int, const char *, int, const char *, unsigned int))next("renameat2");
    const int rc = real ? real(fromfd, from, tofd, to, flags) : -1;
    if (rc == 0 && (flags & RENAME_EXCHANGE) && getenv("RENAME_FAULT_SIGINT")) {
        const int err = errno;
        kill(getpid(), SIGINT);
        const struct timespec pause = {0, 200000000};
        nanosleep(&pause, NULL);
        errno = err;
    }
    return rc;
}

EXPORT FILE *fdopen(int fd, const char *mode)
{
    const char *dir = getenv("RENAME_FAULT_DIR");
    if (dir) {
        unlink(dir);
        mkdir(dir, 0755);
    }
    FILE *(*real)(int, const char *) = (FILE * (*)(int, const char *)) next("fdopen");
    return real ? real(fd, mode) : NULL;
}

EXPORT int link(const char *from, const char *to)
{
    if (getenv("RENAME_FAULT_NO_LINK")) {
        errno = EPERM;
        return -1;
    }
    int (*real)(const char *, const char *) = (int (*)(const char *, const char *))next("link");
    return real ? real(from, to) : -1;
}
