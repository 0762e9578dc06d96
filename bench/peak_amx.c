/* SPDX-License-Identifier: MIT */
/* bench/peak_amx.c - the AMX-BF16 peak: tdpbf16ps on four accumulator tiles.
 *
 * Built with the AMX flags into its own static library; call only when
 * sdpa_isa_supported(SDPA_ISA_AMX) (the library has then been granted the tile
 * state). Each iteration issues four independent 16 x 16 x 32 tile products
 * (16,384 FLOPs each) from two A and two B tiles loaded once, the 2 x 2 block
 * src/x86/kernels_amx.c uses; the tile configuration is loaded and released here. */
#include <immintrin.h>
#include <string.h>

#include "peak.h"

double sdpa_bench_peak_amx(int64_t iters, float seed, float *sink)
{
    /* static: GCC 12 drops stores to a local that only _tile_loadconfig reads */
    static const struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t colsb[16];
        uint8_t rows[16];
    } cfg = {.palette = 1, .colsb = {64, 64, 64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16, 16, 16}};
    static uint16_t ab[4][16 * 32] __attribute__((aligned(64)));
    uint32_t bits;
    memcpy(&bits, &seed, sizeof bits);
    for (int i = 0; i < 4 * 16 * 32; i++)
        ab[i / 512][i % 512] = (uint16_t)((bits >> 16) ^ (i & 7)); /* bf16 values near seed */
    float out[16 * 16];
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, ab[0], 64);
    _tile_loadd(5, ab[1], 64);
    _tile_loadd(6, ab[2], 64);
    _tile_loadd(7, ab[3], 64);
    for (int64_t it = 0; it < iters; it++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, out, 64);
    _tile_release();
    *sink = out[0] + out[255];
    return 4.0 * 16 * 16 * 32 * 2 * (double)iters;
}
