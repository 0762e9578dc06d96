// SPDX-License-Identifier: MIT
// tests/header_alone.cpp - the public header compiles alone as C++ (-std=c++11
// -Wall -Wextra -pedantic -Werror) and its declarations link from C++ (extern "C").
#include "sdpa.h"

int main()
{
    sdpa_problem p;
    sdpa_problem_init(&p);
    return p.struct_size == static_cast<uint32_t>(sizeof p) && sdpa_status_string(SDPA_OK) != nullptr ? 0 : 1;
}
