/* SPDX-License-Identifier: MIT */
/* x86/kernels_avx512.c - placeholder until the avx512 micro-kernels land: keeps the scalar entries. */
#include "kernels.h"

void sdpa_kernels_init_avx512(sdpa_kernels *t)
{
    t->name = "avx512";
}
