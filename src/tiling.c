/* SPDX-License-Identifier: MIT */
/* tiling.c - how both passes cut a problem into tiles (the tile layout, see
 * driver.h), and the workspace allocation. */
#include <stdint.h>
#include <stdlib.h>

#include "driver.h"

/* Below this many tiles the keys are split (covers up to 64 threads). */
#define SPLIT_TARGET_ITEMS SDPA_MAX_SPLITS /* so nsplit <= SDPA_MAX_SPLITS */
/* Each split keeps at least this many key tiles, so merging stays cheap. */
#define SPLIT_MIN_KEY_TILES 4

tile_layout sdpa_tile_layout(const plan *pl)
{
    tile_layout L;
    L.rows = pl->Tq >= pl->bq ? pl->bq : pl->Tq;
    L.hpt = 1;
    if (pl->Tq > 0 && pl->Tq < pl->bq) {
        L.hpt = pl->bq / pl->Tq;
        if (L.hpt > pl->G)
            L.hpt = pl->G;
        if (L.hpt < 1)
            L.hpt = 1;
    }
    L.nrt = L.rows ? pl->Tq / L.rows + (pl->Tq % L.rows != 0) : 0;
    L.ngt = pl->G ? pl->G / L.hpt + (pl->G % L.hpt != 0) : 0; /* no G + hpt overflow */
    L.tiles = pl->B * pl->Hkv * L.ngt * L.nrt;
    L.nkt = pl->Tk / pl->bk + (pl->Tk % pl->bk != 0); /* no Tk + bk overflow */
    L.nsplit = 1;
    if (L.tiles > 0 && L.tiles < SPLIT_TARGET_ITEMS) {
        int64_t want = (SPLIT_TARGET_ITEMS + L.tiles - 1) / L.tiles;
        int64_t most = L.nkt / SPLIT_MIN_KEY_TILES;
        L.nsplit = want < most ? want : most;
        if (L.nsplit < 1)
            L.nsplit = 1;
    }
    return L;
}

void sdpa_tile_coords(const plan *pl, const tile_layout *L, int64_t t, int64_t *b, int64_t *hk, int64_t *h0,
                      int *nh, int64_t *i0, int *nr)
{
    const int64_t rt = t % L->nrt, gt = (t / L->nrt) % L->ngt, bh = t / (L->nrt * L->ngt);
    *b = bh / pl->Hkv;
    *hk = bh % pl->Hkv;
    const int64_t g0 = gt * L->hpt;
    *nh = (int)(pl->G - g0 < L->hpt ? pl->G - g0 : L->hpt);
    *h0 = *hk * pl->G + g0;
    *i0 = rt * L->rows;
    *nr = (int)(pl->Tq - *i0 < L->rows ? pl->Tq - *i0 : L->rows);
}

float *sdpa_alloc_floats(size_t floats)
{
    void *ptr = NULL;
    if (floats > SIZE_MAX / sizeof(float))
        return NULL;
    const size_t bytes = floats ? floats * sizeof(float) : SDPA_ALIGN_BYTES;
    if (posix_memalign(&ptr, SDPA_ALIGN_BYTES, bytes))
        return NULL;
    return ptr;
}

sdpa_status sdpa_workspace_bytes(size_t floats, size_t *bytes)
{
    if (floats > (SIZE_MAX - SDPA_ALIGN_BYTES) / sizeof(float))
        return SDPA_ERR_SIZE_OVERFLOW;
    /* room to align any pointer; nothing to compute needs no workspace at all */
    *bytes = floats ? floats * sizeof(float) + SDPA_ALIGN_BYTES : 0;
    return SDPA_OK;
}

sdpa_status sdpa_workspace_take(void *workspace, size_t bytes, size_t floats, float **ws)
{
    size_t need;
    const sdpa_status st = sdpa_workspace_bytes(floats, &need);
    if (st != SDPA_OK)
        return st;
    if (!workspace)
        return SDPA_ERR_NULL_ARGUMENT;
    if (bytes < need)
        return SDPA_ERR_WORKSPACE_TOO_SMALL;
    const uintptr_t a = ((uintptr_t)workspace + SDPA_ALIGN_BYTES - 1) & ~(uintptr_t)(SDPA_ALIGN_BYTES - 1);
    *ws = (float *)a;
    return SDPA_OK;
}

sdpa_status sdpa_workspace_acquire(int own, void *workspace, size_t bytes, size_t floats, float **ws)
{
    if (!own)
        return sdpa_workspace_take(workspace, bytes, floats, ws);
    return (*ws = sdpa_alloc_floats(floats)) != NULL ? SDPA_OK : SDPA_ERR_OUT_OF_MEMORY;
}
