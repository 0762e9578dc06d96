/* SPDX-License-Identifier: MIT */
/* dtype.h - exact scalar conversions between fp32 and the 16-bit storage types.
 *
 * Widening (bf16 -> fp32, fp16 -> fp32) is exact. Narrowing rounds to nearest,
 * ties to even (IEEE 754 roundTiesToEven), on the bits alone (no FPU mode is read
 * or set): bf16 keeps the upper 16 bits of the rounded fp32; fp16 rounds to
 * binary16 with its subnormals, and a value whose rounded magnitude exceeds
 * 65504 becomes +-inf. NaN stays NaN (quiet, sign kept). Every ISA's vector
 * conversion gives these same bits (checkasm compares them). Internal. */
#ifndef SDPA_DTYPE_H
#define SDPA_DTYPE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t sdpa_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float sdpa_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline float sdpa_bf16_to_f32(uint16_t h)
{
    return sdpa_bits_f32((uint32_t)h << 16);
}

static inline uint16_t sdpa_f32_to_bf16(float x)
{
    const uint32_t u = sdpa_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet, sign and top payload kept */
        return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float sdpa_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) /* inf, NaN (quieted as the hardware conversions do) */
        return sdpa_bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x00400000u : 0u));
    if (exp != 0)
        return sdpa_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in fp32 */
    const float mag = (float)man * 0x1p-24f;
    return sdpa_bits_f32(sign | sdpa_f32_bits(mag));
}

static inline uint16_t sdpa_f32_to_f16(float x)
{
    const uint32_t u = sdpa_f32_bits(x);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits kept */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* rounds to a magnitude beyond 65504 (65520 and up), or inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal binary16: drop 13 mantissa bits, ties to even */
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    /* subnormal binary16 (or zero): the value in units of 2^-24, ties to even */
    if (a < 0x33000000u) /* below 2^-25: rounds to 0 (2^-25 itself is a tie, to even 0) */
        return sign;
    const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 2^(e-127) * m/2^23 / 2^-24 = m >> (126 - e) */
    const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    const uint32_t rounded = q + (rem > half || (rem == half && (q & 1u)));
    return (uint16_t)(sign | rounded);
}

#endif /* SDPA_DTYPE_H */
