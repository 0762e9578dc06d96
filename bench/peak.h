/* SPDX-License-Identifier: MIT */
/* bench/peak.h - register-resident fp32 FMA loops that measure a CPU's arithmetic peak.
 *
 * Each function runs `iters` iterations of a fixed number of independent FMA
 * chains (enough to cover FMA latency x throughput on current x86-64 and
 * AArch64 cores), keeps every value in registers, stores a value derived from
 * all chains to *sink (so nothing is optimised away) and returns the number of
 * floating-point operations it performed (an FMA counts as 2).
 * The AVX2 / AVX-512 versions live in their own files, built with their own -m
 * flags into their own static libraries; call them only when
 * sdpa_isa_supported() says the CPU and OS can run that ISA. */
#ifndef SDPA_BENCH_PEAK_H
#define SDPA_BENCH_PEAK_H

#include <stdint.h>

/** Scalar fmaf() chains, built without auto-vectorisation: the ceiling of the
 *  scalar kernels, which use fmaf() (a libm call on baseline x86-64). */
double sdpa_bench_peak_scalar(int64_t iters, float seed, float *sink);
/** 256-bit _mm256_fmadd_ps chains (needs AVX2+FMA). */
double sdpa_bench_peak_avx2(int64_t iters, float seed, float *sink);
/** 512-bit _mm512_fmadd_ps chains (needs AVX-512F). */
double sdpa_bench_peak_avx512(int64_t iters, float seed, float *sink);
/** 128-bit vfmaq_f32 chains (AArch64 Advanced SIMD). */
double sdpa_bench_peak_neon(int64_t iters, float seed, float *sink);
/** AMX-BF16 tdpbf16ps on four accumulator tiles (needs AMX-TILE, AMX-BF16 and the
 *  process's tile permission, i.e. sdpa_isa_supported(SDPA_ISA_AMX)); bf16 FLOPs. */
double sdpa_bench_peak_amx(int64_t iters, float seed, float *sink);

#endif /* SDPA_BENCH_PEAK_H */
