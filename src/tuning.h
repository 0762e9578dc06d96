/* SPDX-License-Identifier: MIT */
/* tuning.h - per-microarchitecture parameters of the kernel tables (tuning.c). Internal. */
#ifndef SDPA_TUNING_H
#define SDPA_TUNING_H

#include "kernels.h"

/* Once, after the tables of the runnable ISAs are built: the detected
 * microarchitecture's block sizes, then SDPA_TUNE's overrides. */
void sdpa_tuning_apply(sdpa_kernels *tables, const int *runnable);
/* What was chosen, in words (static; valid for the life of the process). */
const char *sdpa_tuning_description(void);

#endif
