/* SPDX-License-Identifier: MIT */
/* x86/cpu.c - CPUID + XGETBV detection of AVX2 and AVX-512 on x86-64.
 *
 * A CPUID bit only says the core implements an instruction set; it can still
 * fault (#UD) if the operating system does not save the wider registers on a
 * context switch. So every vector level is gated twice: the CPUID feature bits,
 * and the XCR0 bits the OS has enabled (read with XGETBV, which is only legal
 * when CPUID.1:ECX.OSXSAVE[27] is set). References: Intel SDM vol. 1, 13.3
 * ("Enabling the XSAVE feature set") and 15.2 / 14.3 ("Detection of AVX-512 /
 * AVX instructions"). */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "cpu.h"

#if ARCH_X86_64
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static void cpuid(unsigned leaf, unsigned sub, unsigned r[4])
{
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}

/* XGETBV(0) = XCR0. Encoded as bytes so that no -mxsave flag is needed here. */
static unsigned long long read_xcr0(void)
{
    unsigned eax, edx;
    __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* Linux keeps AMX tile data (XTILEDATA, XSAVE component 18) off for a process until it
 * asks (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+; Documentation/arch/x86/xstate.rst);
 * a tile instruction before that faults. Asked once, at detection; the permission is
 * the whole process's. 0 where the kernel refuses or is not Linux: no AMX rung. */
static int request_tile_permission(void)
{
#if defined(__linux__)
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

unsigned sdpa_cpu_detect_x86(char *names, size_t cap, int want_tiles)
{
    unsigned r[4];
    unsigned flags = 0;
    if (cap)
        names[0] = '\0';

    cpuid(0, 0, r);
    const unsigned max_leaf = r[0];
    if (max_leaf < 1)
        return 0;

    cpuid(1, 0, r);
    const unsigned ecx1 = r[2];
    const int sse42 = (ecx1 >> 20) & 1;
    const int fma = (ecx1 >> 12) & 1;
    const int osxsave = (ecx1 >> 27) & 1; /* the OS uses XSAVE: XGETBV is legal */
    const int avx = (ecx1 >> 28) & 1;
    const int f16c = (ecx1 >> 29) & 1; /* vcvtph2ps / vcvtps2ph: the AVX2 rung's fp16 storage */
    if (sse42) sdpa_cpu_add_name(names, cap, "sse4.2");
    if (avx) sdpa_cpu_add_name(names, cap, "avx");
    if (fma) sdpa_cpu_add_name(names, cap, "fma");
    if (f16c) sdpa_cpu_add_name(names, cap, "f16c");

    unsigned ebx7 = 0;
    if (max_leaf >= 7) {
        cpuid(7, 0, r);
        ebx7 = r[1];
    }
    const int avx2 = (ebx7 >> 5) & 1;
    const int avx512f = (ebx7 >> 16) & 1;
    const int avx512dq = (ebx7 >> 17) & 1;
    const int avx512bw = (ebx7 >> 30) & 1;
    const int avx512vl = (ebx7 >> 31) & 1;
    if (avx2) sdpa_cpu_add_name(names, cap, "avx2");
    if (avx512f) sdpa_cpu_add_name(names, cap, "avx512f");
    if (avx512dq) sdpa_cpu_add_name(names, cap, "avx512dq");
    if (avx512bw) sdpa_cpu_add_name(names, cap, "avx512bw");
    if (avx512vl) sdpa_cpu_add_name(names, cap, "avx512vl");

    unsigned long long xcr0 = 0;
    if (osxsave) {
        sdpa_cpu_add_name(names, cap, "osxsave");
        xcr0 = read_xcr0();
    }
    /* XCR0 bits 1 (SSE) and 2 (AVX upper halves): the OS saves YMM registers. */
    const int os_ymm = (xcr0 & 0x6) == 0x6;
    /* XCR0 bits 5, 6, 7 (opmask, ZMM0-15 upper halves, ZMM16-31): ZMM state. */
    const int os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (os_ymm) sdpa_cpu_add_name(names, cap, "os-ymm");
    if (os_zmm) sdpa_cpu_add_name(names, cap, "os-zmm");

    /* 16-bit arithmetic and matrix extensions: listed for `sdpa info`; AVX512_BF16
     * also adds the pair products to the AVX-512 table (docs/design.md, "Reduced
     * precision"), the others are not used */
    unsigned eax71 = 0, edx7 = 0;
    if (max_leaf >= 7) {
        cpuid(7, 0, r);
        edx7 = r[3];
        if (r[0] >= 1) {
            cpuid(7, 1, r);
            eax71 = r[0];
        }
    }
    if ((eax71 >> 5) & 1) sdpa_cpu_add_name(names, cap, "avx512_bf16");
    if ((edx7 >> 23) & 1) sdpa_cpu_add_name(names, cap, "avx512_fp16");
    if ((edx7 >> 24) & 1) sdpa_cpu_add_name(names, cap, "amx_tile");
    if ((edx7 >> 22) & 1) sdpa_cpu_add_name(names, cap, "amx_bf16");
    if ((eax71 >> 21) & 1) sdpa_cpu_add_name(names, cap, "amx_fp16");
    if ((xcr0 & 0x60000) == 0x60000) sdpa_cpu_add_name(names, cap, "os-amx"); /* XTILECFG, XTILEDATA */

    if (avx && avx2 && fma && f16c && os_ymm)
        flags |= SDPA_X86_CPU_FLAG_AVX2;
    if ((flags & SDPA_X86_CPU_FLAG_AVX2) && avx512f && avx512dq && avx512bw && avx512vl && os_zmm)
        flags |= SDPA_X86_CPU_FLAG_AVX512;
    if ((flags & SDPA_X86_CPU_FLAG_AVX512) && ((eax71 >> 5) & 1))
        flags |= SDPA_X86_CPU_FLAG_AVX512_BF16;
    if ((flags & SDPA_X86_CPU_FLAG_AVX512_BF16) && ((edx7 >> 24) & 1) && ((edx7 >> 22) & 1) &&
        (xcr0 & 0x60000) == 0x60000 && want_tiles && request_tile_permission()) {
        flags |= SDPA_X86_CPU_FLAG_AMX_BF16;
        sdpa_cpu_add_name(names, cap, "amx-permitted");
    }
    return flags;
}
sdpa_uarch sdpa_cpu_uarch_x86(char *desc, size_t cap)
{
    unsigned r[4];
    char vendor[13];
    cpuid(0, 0, r);
    memcpy(vendor, &r[1], 4);
    memcpy(vendor + 4, &r[3], 4);
    memcpy(vendor + 8, &r[2], 4);
    vendor[12] = '\0';
    const unsigned max_leaf = r[0];
    if (r[0] < 1) {
        snprintf(desc, cap, "%s", vendor);
        return SDPA_UARCH_GENERIC;
    }
    cpuid(1, 0, r);
    const unsigned base_family = (r[0] >> 8) & 0xf, base_model = (r[0] >> 4) & 0xf;
    const unsigned family = base_family == 0xf ? base_family + ((r[0] >> 20) & 0xff) : base_family;
    const unsigned model =
        base_family == 0x6 || base_family == 0xf ? base_model | (((r[0] >> 16) & 0xf) << 4) : base_model;
    snprintf(desc, cap, "%s family %u model %u", vendor, family, model);
    if (!strcmp(vendor, "AuthenticAMD") && family == 0x19 &&
        ((model >= 0x10 && model <= 0x1f) || (model >= 0x60 && model <= 0x7f) || (model >= 0xa0 && model <= 0xaf)))
        return SDPA_UARCH_ZEN4;
    if (!strcmp(vendor, "AuthenticAMD") && family == 0x1a)
        return SDPA_UARCH_ZEN5;
    if (!strcmp(vendor, "GenuineIntel") && family == 6 &&
        (model == 0x8f || model == 0xcf || model == 0xad || model == 0xae))
        return SDPA_UARCH_INTEL_SERVER;
    /* a hypervisor may report another model number; AMX tiles exist only on those
     * servers (Sapphire Rapids and later) */
    if (!strcmp(vendor, "GenuineIntel") && family == 6 && max_leaf >= 7) {
        cpuid(7, 0, r);
        if ((r[3] >> 24) & 1)
            return SDPA_UARCH_INTEL_SERVER;
    }
    return SDPA_UARCH_GENERIC;
}
#else
sdpa_uarch sdpa_cpu_uarch_x86(char *desc, size_t cap)
{
    if (cap)
        desc[0] = '\0';
    return SDPA_UARCH_GENERIC;
}

unsigned sdpa_cpu_detect_x86(char *names, size_t cap, int want_tiles)
{
    (void)want_tiles;
    if (cap)
        names[0] = '\0';
    return 0;
}
#endif
