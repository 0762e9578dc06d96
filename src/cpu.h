/* SPDX-License-Identifier: MIT */
/* cpu.h - CPU feature detection, one probe per architecture. */
#ifndef SDPA_CPU_H
#define SDPA_CPU_H

#include <stddef.h>
#include <string.h>

enum {
    SDPA_X86_CPU_FLAG_AVX2 = 1u << 0,   /* AVX + AVX2 + FMA, and the OS saves YMM state */
    SDPA_X86_CPU_FLAG_AVX512 = 1u << 1, /* AVX-512 F/DQ/BW/VL, and the OS saves ZMM state */
    SDPA_X86_CPU_FLAG_AVX512_BF16 = 1u << 2, /* AVX512_BF16 on top of SDPA_X86_CPU_FLAG_AVX512 */
    SDPA_X86_CPU_FLAG_AMX_BF16 = 1u << 3,    /* AMX-TILE + AMX-BF16 on top of SDPA_X86_CPU_FLAG_AVX512_BF16,
                                                XCR0 tile state, Linux XTILEDATA permission granted */
    SDPA_ARM_CPU_FLAG_NEON = 1u << 8,   /* AArch64 Advanced SIMD */
    SDPA_ARM_CPU_FLAG_DOTPROD = 1u << 9,/* reserved for later kernels */
    SDPA_ARM_CPU_FLAG_FP16 = 1u << 10,  /* reserved for later kernels */
    SDPA_ARM_CPU_FLAG_SVE = 1u << 11,   /* reserved for later kernels */
    SDPA_ARM_CPU_FLAG_BF16 = 1u << 12   /* FEAT_BF16 (BFMMLA, BFDOT): the NEON table's bf16 pair products */
};

/* Appends a feature name to the space-separated list names[cap] (dropped if it
 * does not fit). */
static inline void sdpa_cpu_add_name(char *names, size_t cap, const char *n)
{
    size_t len = strlen(names);
    if (len + strlen(n) + 2 > cap)
        return;
    if (len)
        names[len++] = ' ';
    strcpy(names + len, n);
}

/* Microarchitectures with parameters of their own (src/tuning.c). */
typedef enum sdpa_uarch {
    SDPA_UARCH_GENERIC = 0,
    SDPA_UARCH_ZEN4,         /* AMD family 19h, models 10h-1Fh, 60h-7Fh, A0h-AFh: AVX-512 on 256-bit units */
    SDPA_UARCH_ZEN5,         /* AMD family 1Ah */
    SDPA_UARCH_INTEL_SERVER, /* Intel Sapphire / Emerald / Granite Rapids (family 6, models 8Fh, CFh, ADh,
                                AEh): two 512-bit FMA units */
    SDPA_UARCH_COUNT
} sdpa_uarch;

/* The microarchitecture of this CPU; desc gets its vendor, family and model in
 * words (e.g. "GenuineIntel family 6 model 207"). */
sdpa_uarch sdpa_cpu_uarch_x86(char *desc, size_t cap);

/* Probes the CPU (and OS support of its register state). Fills names with a
 * space-separated list of what was seen (for `sdpa info`). Returns the flags.
 * want_tiles = 0: never asks Linux for the AMX tile-data permission (no
 * SDPA_X86_CPU_FLAG_AMX_BF16 then). */
unsigned sdpa_cpu_detect_x86(char *names, size_t cap, int want_tiles);
unsigned sdpa_cpu_detect_arm(char *names, size_t cap);

#endif
