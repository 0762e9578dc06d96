/* SPDX-License-Identifier: MIT */
/* tests/rename_fault.c - preloaded (LD_PRELOAD) into the sdpa CLI by
 * tests/test_cli_files.c: rename() onto a file whose name starts with
 * "fail-rename" fails with EACCES (as a rename into a sticky directory over
 * another user's file does), every other rename() is glibc's. Lets a test make
 * the CLI's last output rename fail after the earlier ones succeeded. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

__attribute__((visibility("default"))) int rename(const char *from, const char *to)
{
    static int (*real_rename)(const char *, const char *);
    const char *slash = strrchr(to, '/');
    const char *base = slash ? slash + 1 : to;
    if (strncmp(base, "fail-rename", 11) == 0) {
        errno = EACCES;
        return -1;
    }
    if (!real_rename)
        real_rename = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    if (!real_rename) {
        errno = ENOSYS;
        return -1;
    }
    return real_rename(from, to);
}
