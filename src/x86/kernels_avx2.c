/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx2.c - placeholder until the avx2 micro-kernels land: keeps the scalar entries. */
#include "kernels.h"

void sdpa_kernels_init_avx2(sdpa_kernels *t)
{
    t->name = "avx2";
}
