/* SPDX-License-Identifier: MIT */
/* tuning.c - per-microarchitecture parameters of the kernel tables.
 *
 * Each ISA's init (src/x86/kernels_*.c, src/arm/kernels_neon.c) sets the block
 * sizes it was first tuned with (on Zen 4); here, once at load, the detected
 * microarchitecture may replace them with its own measured values (BLIS keeps
 * one context per microarchitecture beside its micro-kernels; docs/perf-notes.md
 * has the measurements behind each entry). Then the SDPA_TUNE environment
 * variable may override them for every ISA, e.g.
 *     SDPA_TUNE=block_q=64,block_k=256,nt_max_cols=8,wide_prefetch=2,bf16_dot=0,tile_pad=0
 * (keys block_q and block_k in 1..SDPA_MAX_BLOCK, nt_max_cols in 0..64: tiles of
 * at most that many query columns take the decode path; wide_prefetch 0 never,
 * 1 always, 2 streaming: the prefill path's prefetch of the next key tile, see
 * forward.c; bf16_dot 0 or 1: bf16 prefill tiles through the ISA's bf16 pair
 * products, where it has them; bwd_bf16_dot 0 or 1: the same for the backward's
 * products, backward_tile.c; tile_pad 0, 16, 32, 48 or 64: floats added to a tile
 * buffer's row stride when it is a multiple of 256 bytes, kernels.h); a value that does not parse is recorded and ignored, like
 * SDPA_ISA's, never printed. A descriptor's own block_q / block_k still win for
 * its call. sdpa_tuning() says what was chosen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "cpu.h"
#include "kernels.h"
#include "tuning.h"

typedef struct uarch_entry {
    sdpa_uarch uarch;
    sdpa_isa isa;
    int block_q, block_k, nt_max_cols; /* 0: keep the ISA's */
    int wide_prefetch;                  /* -1: keep the ISA's */
    int bf16_dot;                       /* -1: keep the ISA's (0) */
    int bwd_bf16_dot;                   /* -1: keep the ISA's (0; amx's 1) */
} uarch_entry;

static const char *const uarch_names[SDPA_UARCH_COUNT] = {
    [SDPA_UARCH_GENERIC] = "generic",
    [SDPA_UARCH_ZEN4] = "zen4",
    [SDPA_UARCH_ZEN5] = "zen5",
    [SDPA_UARCH_INTEL_SERVER] = "intel-server (sapphire/emerald/granite rapids)",
};

/* The ISA defaults are Zen 4's (and the generic choice); entries here only where
 * a microarchitecture measured better with other values (docs/perf-notes.md,
 * "Block sizes on Emerald Rapids", "The wide path's next-tile prefetch,
 * measured in one process", "Zen 4 again" and "The bf16 backward on AVX512-BF16,
 * Zen 4"). */
static const uarch_entry entries[] = {
    {SDPA_UARCH_INTEL_SERVER, SDPA_ISA_AVX512, 64, 64, 0, SDPA_PREFETCH_STREAMING, -1, -1},
    {SDPA_UARCH_ZEN4, SDPA_ISA_AVX512, 0, 0, 0, SDPA_PREFETCH_STREAMING, 1, 1},
};

static const char *const prefetch_names[] = {"never", "always", "streaming"};

static char description[1024];

/* Parses "key=value[,key=value..]" into *bq, *bk, *nt, *pf, *bd, *bbd, *tp (left
 * alone when absent); 0 when every pair is known and in range: decimal digits only (no
 * sign, no space), no empty pair, at most SDPA_TUNE_MAX_LEN bytes in all. (Until
 * session 29 the string had to fit 128 bytes, and strtol's leading spaces and '+' and
 * strtok's empty pairs were taken.) */
#define SDPA_TUNE_MAX_LEN 1023
static int parse_env(const char *s, int *bq, int *bk, int *nt, int *pf, int *bd, int *bbd, int *tp)
{
    char buf[SDPA_TUNE_MAX_LEN + 1];
    if (strlen(s) > SDPA_TUNE_MAX_LEN)
        return -1;
    strcpy(buf, s);
    for (char *tok = buf, *next; tok; tok = next) {
        next = strchr(tok, ',');
        if (next)
            *next++ = '\0';
        char *eq = strchr(tok, '=');
        if (!eq || eq == tok)
            return -1;
        *eq = '\0';
        const char *d = eq + 1;
        if (*d < '0' || *d > '9' || strlen(d) > 6)
            return -1;
        char *end;
        const long v = strtol(d, &end, 10);
        if (*end)
            return -1;
        if (!strcmp(tok, "block_q") && v >= 1 && v <= SDPA_MAX_BLOCK)
            *bq = (int)v;
        else if (!strcmp(tok, "block_k") && v >= 1 && v <= SDPA_MAX_BLOCK)
            *bk = (int)v;
        else if (!strcmp(tok, "nt_max_cols") && v >= 0 && v <= 64)
            *nt = (int)v;
        else if (!strcmp(tok, "wide_prefetch") && v >= SDPA_PREFETCH_NEVER && v <= SDPA_PREFETCH_STREAMING)
            *pf = (int)v;
        else if (!strcmp(tok, "bf16_dot") && (v == 0 || v == 1))
            *bd = (int)v;
        else if (!strcmp(tok, "bwd_bf16_dot") && (v == 0 || v == 1))
            *bbd = (int)v;
        else if (!strcmp(tok, "tile_pad") && v >= 0 && v <= 64 && v % 16 == 0)
            *tp = (int)v;
        else
            return -1;
    }
    return 0;
}

void sdpa_tuning_apply(sdpa_kernels *tables, const int *runnable)
{
    char cpu[96] = "";
    sdpa_uarch u = SDPA_UARCH_GENERIC;
#if ARCH_X86_64
    u = sdpa_cpu_uarch_x86(cpu, sizeof cpu);
#endif
    /* the amx table takes the avx512 entry's shapes (its fp32 and fp16 problems run the
     * AVX-512 kernels and must get the avx512 table's bits), then its own entry */
    for (int isa = 0; isa < SDPA_ISA_COUNT; isa++)
        for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
            const uarch_entry *e = &entries[i];
            const int inherited = isa == SDPA_ISA_AMX && e->isa == SDPA_ISA_AVX512;
            if (e->uarch != u || !runnable[isa] || (e->isa != isa && !inherited))
                continue;
            sdpa_kernels *t = &tables[isa];
            if (e->block_q)
                t->block_q = e->block_q;
            if (e->block_k)
                t->block_k = e->block_k;
            if (e->nt_max_cols)
                t->nt_max_cols = e->nt_max_cols;
            if (e->wide_prefetch >= 0)
                t->wide_prefetch = e->wide_prefetch;
            if (e->bf16_dot >= 0 && !inherited)
                t->bf16_dot = e->bf16_dot && t->gemm_bf16_pairs;
            if (e->bwd_bf16_dot >= 0 && !inherited)
                t->bwd_bf16_dot = e->bwd_bf16_dot && t->gemm_bf16_pairs;
        }
    const char *env = getenv("SDPA_TUNE");
    int bq = 0, bk = 0, nt = -1, pf = -1, bd = -1, bbd = -1, tp = -1, env_ok = 1;
    if (env && *env && parse_env(env, &bq, &bk, &nt, &pf, &bd, &bbd, &tp) != 0)
        env_ok = 0;
    for (int isa = 0; env && *env && env_ok && isa < SDPA_ISA_COUNT; isa++) {
        if (!runnable[isa])
            continue;
        sdpa_kernels *t = &tables[isa];
        if (bq)
            t->block_q = bq;
        if (bk)
            t->block_k = bk;
        if (bq && t->pairs_block_q)
            t->pairs_block_q = bq;
        if (bk && t->pairs_block_k)
            t->pairs_block_k = bk;
        if (bq && t->bwd_pairs_block_q)
            t->bwd_pairs_block_q = bq;
        if (bk && t->bwd_pairs_block_k)
            t->bwd_pairs_block_k = bk;
        if (nt >= 0)
            t->nt_max_cols = nt;
        if (pf >= 0)
            t->wide_prefetch = pf;
        if (bd >= 0)
            t->bf16_dot = bd && t->gemm_bf16_pairs;
        if (bbd >= 0)
            t->bwd_bf16_dot = bbd && t->gemm_bf16_pairs;
        if (tp >= 0)
            t->tile_pad = tp;
    }
    size_t n = (size_t)snprintf(description, sizeof description, "uarch %s%s%s%s", uarch_names[u],
                                *cpu ? " (" : "", cpu, *cpu ? ")" : "");
    for (int isa = 0; isa < SDPA_ISA_COUNT && n < sizeof description; isa++)
        if (runnable[isa])
            n += (size_t)snprintf(description + n, sizeof description - n,
                                  "; %s block_q %d block_k %d nt_max_cols %d wide_prefetch %s%s%s tile_pad %d",
                                  tables[isa].name,
                                  tables[isa].block_q, tables[isa].block_k, tables[isa].nt_max_cols,
                                  prefetch_names[tables[isa].wide_prefetch],
                                  tables[isa].gemm_bf16_pairs ? (tables[isa].bf16_dot ? " bf16_dot 1" : " bf16_dot 0")
                                                              : "",
                                  tables[isa].gemm_bf16_pairs
                                      ? (tables[isa].bwd_bf16_dot ? " bwd_bf16_dot 1" : " bwd_bf16_dot 0")
                                      : "",
                                  tables[isa].tile_pad);
    for (int isa = 0; isa < SDPA_ISA_COUNT && n < sizeof description; isa++)
        if (runnable[isa] && tables[isa].pairs_block_q)
            n += (size_t)snprintf(description + n, sizeof description - n,
                                  "; %s bf16 tiles block_q %d block_k %d, backward block_q %d block_k %d",
                                  tables[isa].name, tables[isa].pairs_block_q, tables[isa].pairs_block_k,
                                  tables[isa].bwd_pairs_block_q, tables[isa].bwd_pairs_block_k);
    if (env && *env && n < sizeof description)
        snprintf(description + n, sizeof description - n, "; SDPA_TUNE '%.60s' %s", env,
                 env_ok ? "applied" : "rejected (ignored)");
}

const char *sdpa_tuning_description(void)
{
    return description;
}
