/* SPDX-License-Identifier: MIT */
/* view_copy.h - a call's view structs (sdpa_tensor, sdpa_tensor_out), copied at entry.
 *
 * The views are no operand of the aliasing rule, so a caller may keep them anywhere, an
 * output buffer included; every entry point reads its copies only, taken before
 * anything is written. Header-only: the MPI ring library (public API only) uses it too. */
#ifndef SDPA_VIEW_COPY_H
#define SDPA_VIEW_COPY_H

#include "sdpa.h"

typedef struct sdpa_view_copies {
    sdpa_tensor in[6];
    sdpa_tensor_out out[3];
} sdpa_view_copies;

/* Points every non-NULL view among *in[0..nin) and *out[0..nout) (nin <= 6, nout <= 3)
 * at its copy in c; NULL views stay NULL. */
static inline void sdpa_copy_views(sdpa_view_copies *c, const sdpa_tensor **const in[], int nin,
                                   const sdpa_tensor_out **const out[], int nout)
{
    for (int i = 0; i < nin; i++)
        if (*in[i]) {
            c->in[i] = **in[i];
            *in[i] = &c->in[i];
        }
    for (int i = 0; i < nout; i++)
        if (*out[i]) {
            c->out[i] = **out[i];
            *out[i] = &c->out[i];
        }
}

#endif /* SDPA_VIEW_COPY_H */
