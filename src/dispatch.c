/* SPDX-License-Identifier: MIT */
/* dispatch.c - picks the kernels once per process and answers ISA queries.
 *
 * At load (a constructor, plus a pthread_once guard on every entry point for
 * static links and early callers) the CPU is probed, one kernel table per
 * runnable ISA is filled, and the best runnable ISA, capped by the SDPA_ISA
 * environment variable, becomes the process-wide default. After that the
 * tables are read-only; only sdpa_force_isa() swaps the default pointer
 * (atomically).
 *
 * The ladder (dav1d's init pattern): this architecture's ISAs as an ordered
 * list of rungs, scalar first. The table of rung i is built by running the
 * init of every rung up to i in order: scalar fills every entry, and each rung
 * above overwrites only what it improves (AVX2 every kernel and shape of the
 * template; AVX-512 the same entries again, since it re-instantiates the whole
 * template over zmm). A rung is runnable when it is compiled in, the CPU (and
 * OS) has its flag, and the rung below it is runnable, so the runnable rungs
 * are always a prefix of the ladder and "best" is the last of them. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "cpu.h"
#include "kernels.h"
#include "tuning.h"

typedef struct sdpa_rung {
    sdpa_isa isa;
    unsigned cpu_flag;                /* 0: always runnable (the baseline) */
    void (*init)(sdpa_kernels *table); /* NULL: not compiled in */
} sdpa_rung;

static const sdpa_rung ladder[] = {
    {SDPA_ISA_SCALAR, 0, sdpa_kernels_init_scalar},
#if ARCH_X86_64
#if HAVE_AVX2
    {SDPA_ISA_AVX2, SDPA_X86_CPU_FLAG_AVX2, sdpa_kernels_init_avx2},
#else
    {SDPA_ISA_AVX2, SDPA_X86_CPU_FLAG_AVX2, NULL},
#endif
#if HAVE_AVX512
    {SDPA_ISA_AVX512, SDPA_X86_CPU_FLAG_AVX512, sdpa_kernels_init_avx512},
#else
    {SDPA_ISA_AVX512, SDPA_X86_CPU_FLAG_AVX512, NULL},
#endif
#if HAVE_AMX
    {SDPA_ISA_AMX, SDPA_X86_CPU_FLAG_AMX_BF16, sdpa_kernels_init_amx},
#else
    {SDPA_ISA_AMX, SDPA_X86_CPU_FLAG_AMX_BF16, NULL},
#endif
#elif ARCH_AARCH64
#if HAVE_NEON
    {SDPA_ISA_NEON, SDPA_ARM_CPU_FLAG_NEON, sdpa_kernels_init_neon},
#else
    {SDPA_ISA_NEON, SDPA_ARM_CPU_FLAG_NEON, NULL},
#endif
#endif
};
enum { N_RUNGS = (int)(sizeof ladder / sizeof ladder[0]) };

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static sdpa_kernels tables[SDPA_ISA_COUNT];
static int runnable[SDPA_ISA_COUNT];
static sdpa_isa load_choice = SDPA_ISA_SCALAR;
static _Atomic(const sdpa_kernels *) active_table;
static char cpu_names[256];
static char env_rejected[256]; /* its first 255 bytes (sdpa.h) */
static int env_was_rejected;

/* The rung of an ISA on this architecture's ladder, or -1. */
static int rung_of(sdpa_isa isa)
{
    for (int i = 0; i < N_RUNGS; i++)
        if (ladder[i].isa == isa)
            return i;
    return -1;
}

int sdpa_isa_compiled(sdpa_isa isa)
{
    const int r = rung_of(isa);
    return r >= 0 && ladder[r].init != NULL;
}

int sdpa_kernels_init(sdpa_kernels *t, sdpa_isa isa)
{
    const int top = rung_of(isa);
    if (top < 0)
        return -1;
    for (int i = 0; i <= top; i++)
        if (!ladder[i].init)
            return -1;
    for (int i = 0; i <= top; i++)
        ladder[i].init(t);
    return 0;
}

static void init_dispatch(void)
{
    unsigned flags = 0;
#if ARCH_X86_64
    /* SDPA_ISA naming a rung below amx: the process never asks for the tile permission
     * (which makes Linux require larger alternate signal stacks, AT_MINSIGSTKSZ) */
    const char *cap_env = getenv("SDPA_ISA");
    sdpa_isa cap_isa;
    const int want_tiles = !(cap_env && *cap_env && sdpa_isa_from_name(cap_env, &cap_isa) == 0 &&
                             (cap_isa == SDPA_ISA_SCALAR || cap_isa == SDPA_ISA_AVX2 || cap_isa == SDPA_ISA_AVX512));
    flags = sdpa_cpu_detect_x86(cpu_names, sizeof cpu_names, want_tiles);
#elif ARCH_AARCH64
    flags = sdpa_cpu_detect_arm(cpu_names, sizeof cpu_names);
#endif
    /* the runnable prefix of the ladder; each table built rung by rung */
    int best = 0;
    for (int i = 0; i < N_RUNGS; i++) {
        const sdpa_rung *r = &ladder[i];
        if (!r->init || (r->cpu_flag && !(flags & r->cpu_flag)))
            break;
        sdpa_kernels_init(&tables[r->isa], r->isa);
        runnable[r->isa] = 1;
        best = i;
    }
#if ARCH_X86_64 && HAVE_AVX512_BF16
    if (runnable[SDPA_ISA_AVX512] && (flags & SDPA_X86_CPU_FLAG_AVX512_BF16))
        sdpa_kernels_init_avx512_bf16(&tables[SDPA_ISA_AVX512]);
#endif
#if ARCH_AARCH64 && HAVE_NEON_BF16
    if (runnable[SDPA_ISA_NEON] && (flags & SDPA_ARM_CPU_FLAG_BF16))
        sdpa_kernels_init_neon_bf16(&tables[SDPA_ISA_NEON]);
#endif
    sdpa_tuning_apply(tables, runnable);

    /* SDPA_ISA caps the choice: the best runnable rung not above the named
     * one's. A value that is not an ISA name, or names an ISA that is not on
     * this architecture's ladder, is recorded and ignored: a library must not
     * abort or print on behalf of its caller. */
    const char *env = getenv("SDPA_ISA");
    if (env && *env) {
        sdpa_isa cap;
        const int valid = sdpa_isa_from_name(env, &cap) == 0;
        const int cap_rung = valid && cap != SDPA_ISA_AUTO ? rung_of(cap) : -1;
        if (!valid || (cap != SDPA_ISA_AUTO && cap_rung < 0)) {
            env_was_rejected = 1;
            strncpy(env_rejected, env, sizeof env_rejected - 1);
        } else if (cap != SDPA_ISA_AUTO && cap_rung < best) {
            best = cap_rung;
        }
    }
    load_choice = ladder[best].isa;
    atomic_store(&active_table, &tables[load_choice]);
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
    case SDPA_ISA_AMX: return "amx";
    default: return "unknown";
    }
}

int sdpa_isa_from_name(const char *name, sdpa_isa *isa)
{
    static const sdpa_isa all[] = {SDPA_ISA_AUTO, SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512,
                                   SDPA_ISA_NEON, SDPA_ISA_AMX};
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

const char *sdpa_tuning(void)
{
    ensure_init();
    return sdpa_tuning_description();
}

int sdpa_isa_bf16_pairs(sdpa_isa isa)
{
    const sdpa_kernels *t = sdpa_kernels_get(isa); /* NULL for an ISA this CPU cannot run */
    return t && t->bf16_dot;
}

int sdpa_isa_bf16_pairs_backward(sdpa_isa isa)
{
    const sdpa_kernels *t = sdpa_kernels_get(isa);
    return t && t->bwd_bf16_dot;
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
