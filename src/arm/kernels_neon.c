/* SPDX-License-Identifier: MIT */
/* arm/kernels_neon.c - placeholder until the NEON micro-kernels land: keeps the scalar entries. */
#include "kernels.h"

void sdpa_kernels_init_neon(sdpa_kernels *t)
{
    t->name = "neon";
}
