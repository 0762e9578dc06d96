/* SPDX-License-Identifier: MIT */
/* dispatch.c - picks the kernels once per process and answers ISA queries.
 *
 * At load (a constructor, plus a pthread_once guard on every entry point for
 * static links and early callers) the CPU is probed, one kernel table per
 * runnable ISA is filled (scalar entries first, then upgraded: the dav1d
 * pattern), and the best runnable ISA, capped by the SDPA_ISA environment
 * variable, becomes the process-wide default. After that the tables are
 * read-only; only sdpa_force_isa() swaps the default pointer (atomically). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "cpu.h"
#include "kernels.h"

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static sdpa_kernels tables[SDPA_ISA_COUNT];
static int runnable[SDPA_ISA_COUNT];
static sdpa_isa load_choice = SDPA_ISA_SCALAR;
static _Atomic(const sdpa_kernels *) active_table;
static char cpu_names[256];
static char env_rejected[64];
static int env_was_rejected;

int sdpa_isa_compiled(sdpa_isa isa)
{
    switch (isa) {
    case SDPA_ISA_SCALAR: return 1;
    case SDPA_ISA_AVX2: return HAVE_AVX2;
    case SDPA_ISA_AVX512: return HAVE_AVX512;
    case SDPA_ISA_NEON: return HAVE_NEON;
    default: return 0;
    }
}

int sdpa_kernels_init(sdpa_kernels *t, sdpa_isa isa)
{
    if (!sdpa_isa_compiled(isa))
        return -1;
    sdpa_kernels_init_scalar(t);
#if HAVE_AVX2
    if (isa == SDPA_ISA_AVX2 || isa == SDPA_ISA_AVX512)
        sdpa_kernels_init_avx2(t);
#endif
#if HAVE_AVX512
    if (isa == SDPA_ISA_AVX512)
        sdpa_kernels_init_avx512(t);
#endif
#if HAVE_NEON
    if (isa == SDPA_ISA_NEON)
        sdpa_kernels_init_neon(t);
#endif
    t->isa = isa;
    return 0;
}

static void init_dispatch(void)
{
    unsigned flags = 0;
#if ARCH_X86_64
    flags = sdpa_cpu_detect_x86(cpu_names, sizeof cpu_names);
#elif ARCH_AARCH64
    flags = sdpa_cpu_detect_arm(cpu_names, sizeof cpu_names);
#endif
    runnable[SDPA_ISA_SCALAR] = 1;
    runnable[SDPA_ISA_AVX2] = HAVE_AVX2 && (flags & SDPA_X86_CPU_FLAG_AVX2);
    runnable[SDPA_ISA_AVX512] = HAVE_AVX512 && (flags & SDPA_X86_CPU_FLAG_AVX512);
    runnable[SDPA_ISA_NEON] = HAVE_NEON && (flags & SDPA_ARM_CPU_FLAG_NEON);

    sdpa_isa best = SDPA_ISA_SCALAR;
    for (int i = 0; i < SDPA_ISA_COUNT; i++)
        if (runnable[i]) {
            sdpa_kernels_init(&tables[i], (sdpa_isa)i);
            if (i != SDPA_ISA_NEON && i > (int)best)
                best = (sdpa_isa)i;
        }
    if (runnable[SDPA_ISA_NEON])
        best = SDPA_ISA_NEON;

    /* SDPA_ISA caps the choice: the best runnable ISA not above the named one
     * (scalar < avx2 < avx512 on x86; scalar < neon on AArch64). A value that
     * is not an ISA name, or names an ISA of another architecture, is recorded
     * and ignored: a library must not abort or print on behalf of its caller. */
    const char *env = getenv("SDPA_ISA");
    if (env && *env) {
        sdpa_isa cap;
        const int valid = sdpa_isa_from_name(env, &cap) == 0;
        const int other_arch = valid && ((ARCH_X86_64 && cap == SDPA_ISA_NEON) ||
                                         (!ARCH_X86_64 && (cap == SDPA_ISA_AVX2 || cap == SDPA_ISA_AVX512)));
        if (!valid || other_arch) {
            env_was_rejected = 1;
            strncpy(env_rejected, env, sizeof env_rejected - 1);
        } else if (cap != SDPA_ISA_AUTO && cap < best) {
            best = cap;
            while (!runnable[best])
                best = (sdpa_isa)(best - 1);
        }
    }
    load_choice = best;
    atomic_store(&active_table, &tables[best]);
}

__attribute__((constructor)) static void sdpa_dispatch_constructor(void)
{
    pthread_once(&init_once, init_dispatch);
}

static void ensure_init(void)
{
    pthread_once(&init_once, init_dispatch);
}

const sdpa_kernels *sdpa_kernels_get(sdpa_isa isa)
{
    ensure_init();
    if (isa == SDPA_ISA_AUTO)
        return atomic_load(&active_table);
    if ((int)isa < 0 || (int)isa >= SDPA_ISA_COUNT || !runnable[isa])
        return NULL;
    return &tables[isa];
}

sdpa_isa sdpa_isa_active(void)
{
    ensure_init();
    return atomic_load(&active_table)->isa;
}

int sdpa_isa_supported(sdpa_isa isa)
{
    ensure_init();
    return (int)isa >= 0 && (int)isa < SDPA_ISA_COUNT && runnable[isa];
}

sdpa_status sdpa_force_isa(sdpa_isa isa)
{
    ensure_init();
    if (isa == SDPA_ISA_AUTO) {
        atomic_store(&active_table, &tables[load_choice]);
        return SDPA_OK;
    }
    if (!sdpa_isa_supported(isa))
        return SDPA_ERR_ISA_UNAVAILABLE;
    atomic_store(&active_table, &tables[isa]);
    return SDPA_OK;
}

const char *sdpa_isa_name(sdpa_isa isa)
{
    switch (isa) {
    case SDPA_ISA_AUTO: return "auto";
    case SDPA_ISA_SCALAR: return "scalar";
    case SDPA_ISA_AVX2: return "avx2";
    case SDPA_ISA_AVX512: return "avx512";
    case SDPA_ISA_NEON: return "neon";
    default: return "unknown";
    }
}

int sdpa_isa_from_name(const char *name, sdpa_isa *isa)
{
    static const sdpa_isa all[] = {SDPA_ISA_AUTO, SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512,
                                   SDPA_ISA_NEON};
    if (!name || !isa)
        return -1;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcasecmp(name, sdpa_isa_name(all[i])) == 0) {
            *isa = all[i];
            return 0;
        }
    return -1;
}

const char *sdpa_cpu_features(void)
{
    ensure_init();
    return cpu_names;
}

const char *sdpa_isa_env_rejected(void)
{
    ensure_init();
    return env_was_rejected ? env_rejected : NULL;
}

const char *sdpa_version(void)
{
    return SDPA_VERSION_STRING;
}

unsigned sdpa_version_number(void)
{
    return SDPA_VERSION;
}
