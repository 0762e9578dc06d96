/* SPDX-License-Identifier: MIT */
/* tests/mpi/header_alone_mpi.c - include/sdpa_mpi.h compiles alone (first and only
 * include: it brings sdpa.h and mpi.h itself) as strict C99, -Wall -Wextra -pedantic
 * -Werror, and its declarations link against libsdpa_mpi. Run by `meson test` (no
 * mpirun needed: it only calls the layout helpers, which use no MPI). */
#include "sdpa_mpi.h"

int main(void)
{
    /* 64 rows over 4 ranks: 16 each; zigzag rank 1 holds chunks 1 and 6 (rows 8.. and 48..) */
    return sdpa_ring_local_len(64, 4, SDPA_RING_ZIGZAG) == 16 &&
                   sdpa_ring_global_row(64, 4, 1, SDPA_RING_ZIGZAG, 8) == 48
               ? 0
               : 1;
}
