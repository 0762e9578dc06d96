/* SPDX-License-Identifier: MIT */
/* tests/header_alone.c - the public header compiles alone (first and only
 * include) as strict C11 and C99: -std=c11 / c99 -Wall -Wextra -pedantic -Werror. Built with the
 * flags users get (libsdpa.so through sdpa.h, nothing from src/); runs one call
 * so that the declarations also link. tests/header_alone.cpp does the same as C++. */
#include "sdpa.h"

int main(void)
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    return p.struct_size == (uint32_t)sizeof p && sdpa_status_string(SDPA_OK) != 0 ? 0 : 1;
}
