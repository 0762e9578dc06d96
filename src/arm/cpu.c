/* SPDX-License-Identifier: MIT */
/* arm/cpu.c - AArch64 feature detection.
 *
 * Advanced SIMD (NEON) is part of the AArch64 base architecture, so it is
 * always present; the OS probes below exist for the optional extensions that
 * later kernels may use (dot product, fp16 arithmetic, SVE), and confirm
 * ASIMD where the OS reports it; BF16 (BFMMLA, BFDOT) installs the NEON table's bf16 pair
 * products (src/arm/kernels_neon_bf16.c). Linux: getauxval(AT_HWCAP) (see the kernel's
 * Documentation/arch/arm64/elf_hwcaps.rst). Apple: sysctlbyname("hw.optional.*").
 * Other systems: baseline only. */
#include <string.h>

#include "config.h"
#include "cpu.h"

#if ARCH_AARCH64 && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_FPHP
#define HWCAP_FPHP (1 << 9)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1 << 22)
#endif
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
#elif ARCH_AARCH64 && defined(__APPLE__)
#include <sys/sysctl.h>
#endif

unsigned sdpa_cpu_detect_arm(char *names, size_t cap)
{
    if (cap)
        names[0] = '\0';
#if ARCH_AARCH64
    unsigned flags = SDPA_ARM_CPU_FLAG_NEON; /* baseline on AArch64 */
#if defined(__linux__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if (hw & HWCAP_ASIMD) sdpa_cpu_add_name(names, cap, "asimd");
    if ((hw & HWCAP_ASIMDDP)) { flags |= SDPA_ARM_CPU_FLAG_DOTPROD; sdpa_cpu_add_name(names, cap, "asimddp"); }
    if ((hw & HWCAP_FPHP) && (hw & HWCAP_ASIMDHP)) { flags |= SDPA_ARM_CPU_FLAG_FP16; sdpa_cpu_add_name(names, cap, "asimdhp"); }
    if (hw & HWCAP_SVE) { flags |= SDPA_ARM_CPU_FLAG_SVE; sdpa_cpu_add_name(names, cap, "sve"); }
    if (getauxval(AT_HWCAP2) & HWCAP2_BF16) { flags |= SDPA_ARM_CPU_FLAG_BF16; sdpa_cpu_add_name(names, cap, "bf16"); }
#elif defined(__APPLE__)
    int v = 0;
    size_t len = sizeof(v);
    sdpa_cpu_add_name(names, cap, "asimd");
    if (sysctlbyname("hw.optional.arm.FEAT_DotProd", &v, &len, NULL, 0) == 0 && v) {
        flags |= SDPA_ARM_CPU_FLAG_DOTPROD; sdpa_cpu_add_name(names, cap, "asimddp");
    }
    len = sizeof(v); v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_FP16", &v, &len, NULL, 0) == 0 && v) {
        flags |= SDPA_ARM_CPU_FLAG_FP16; sdpa_cpu_add_name(names, cap, "asimdhp");
    }
    len = sizeof(v); v = 0;
    if (sysctlbyname("hw.optional.arm.FEAT_BF16", &v, &len, NULL, 0) == 0 && v) {
        flags |= SDPA_ARM_CPU_FLAG_BF16; sdpa_cpu_add_name(names, cap, "bf16");
    }
#else
    sdpa_cpu_add_name(names, cap, "asimd(baseline)");
#endif
    return flags;
#else
    return 0;
#endif
}
