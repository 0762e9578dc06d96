/* SPDX-License-Identifier: MIT */
/* bench/cache_flush.h - evicting buffers from every cache level, for sdpa bench's decode
 * rows and sdpa-ab --flush: clflush (x86) or dc civac (aarch64) on each 64-byte line (and
 * the last byte's), then a fence, so that the next call reads them from memory and no
 * dirty line of them is left to write back during it. CACHE_FLUSH_LINE is defined only
 * where the CPU has such an instruction; cache_flush_lines returns 0 (nothing done)
 * elsewhere. */
#ifndef SDPA_BENCH_CACHE_FLUSH_H
#define SDPA_BENCH_CACHE_FLUSH_H

#include <stddef.h>

#if defined(__x86_64__) || defined(__i386__)
#include <emmintrin.h>
#define CACHE_FLUSH_LINE(p) _mm_clflush(p)
#define CACHE_FLUSH_FENCE() _mm_mfence()
#elif defined(__aarch64__)
#define CACHE_FLUSH_LINE(p) __asm__ volatile("dc civac, %0" : : "r"(p) : "memory")
#define CACHE_FLUSH_FENCE() __asm__ volatile("dsb ish" : : : "memory")
#endif

/* Every line of the n buffers p[i] (bytes[i] bytes each; 0 bytes: skipped) out of the
 * caches; returns 1, or 0 where this build has no line flush (then nothing is done). */
static inline int cache_flush_lines(int n, const void *const *p, const size_t *bytes)
{
#ifdef CACHE_FLUSH_LINE
    for (int i = 0; i < n; i++) {
        if (!p[i] || !bytes[i])
            continue;
        const char *c = (const char *)p[i];
        for (size_t off = 0; off < bytes[i]; off += 64)
            CACHE_FLUSH_LINE(c + off);
        CACHE_FLUSH_LINE(c + bytes[i] - 1);
    }
    CACHE_FLUSH_FENCE();
    return 1;
#else
    (void)n, (void)p, (void)bytes;
    return 0;
#endif
}

#endif /* SDPA_BENCH_CACHE_FLUSH_H */
