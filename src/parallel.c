/* SPDX-License-Identifier: MIT */
/* parallel.c - the only file of the library that knows OpenMP.
 *
 * A call with one thread never enters the OpenMP runtime: libgomp allocates
 * its team (and even the work share of an orphaned `omp for`) with an
 * allocator that prints and exits the process when memory runs out, which a
 * library must not let happen on its caller's behalf. So the driver writes its
 * parallel loops through these functions, which run plain loops for a team of
 * one. */
#include "config.h"
#include "driver.h"

#if HAVE_OPENMP
#include <omp.h>
#endif

int sdpa_threads_for_call(int requested)
{
#if HAVE_OPENMP
    if (requested == 1)
        return 1;
    /* At most 4 per processor: more never helps, and asking libgomp for
     * thousands of threads can make it print and exit the process when it
     * cannot create them. */
    int64_t t = requested > 0 ? requested : omp_get_max_threads();
    const int procs = omp_get_num_procs();
    const int64_t most = 4 * (int64_t)(procs > 0 ? procs : 1);
    return (int)(t < 1 ? 1 : t > most ? most : t);
#else
    (void)requested;
    return 1;
#endif
}

#if HAVE_OPENMP
/* The OpenMP constructs live in functions of their own, called only for a team
 * of more than one: clang's OpenMP code generation calls into the runtime
 * (__kmpc_global_thread_num) on entry to any function that contains a construct,
 * whether or not the construct runs. */
__attribute__((noinline)) static void team_parallel(int nthreads, sdpa_team_fn body, void *ctx)
{
#pragma omp parallel num_threads(nthreads)
    body(ctx, omp_get_thread_num(), omp_get_num_threads());
}

__attribute__((noinline)) static void team_for_dynamic(int64_t n, sdpa_item_fn fn, void *arg, int nowait)
{
    if (nowait) {
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t it = 0; it < n; it++)
            fn(arg, it);
    } else {
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < n; it++)
            fn(arg, it);
    }
}

__attribute__((noinline)) static void team_for_static(int64_t n, sdpa_item_fn fn, void *arg)
{
#pragma omp for schedule(static)
    for (int64_t it = 0; it < n; it++)
        fn(arg, it);
}
#endif

void sdpa_parallel(int nthreads, sdpa_team_fn body, void *ctx)
{
#if HAVE_OPENMP
    if (nthreads > 1) {
        team_parallel(nthreads, body, ctx);
        return;
    }
#endif
    (void)nthreads;
    body(ctx, 0, 1);
}

void sdpa_for_dynamic(int team, int64_t n, sdpa_item_fn fn, void *arg, int nowait)
{
#if HAVE_OPENMP
    if (team > 1) {
        team_for_dynamic(n, fn, arg, nowait);
        return;
    }
#endif
    (void)team;
    (void)nowait;
    for (int64_t it = 0; it < n; it++)
        fn(arg, it);
}

void sdpa_for_static(int team, int64_t n, sdpa_item_fn fn, void *arg)
{
#if HAVE_OPENMP
    if (team > 1) {
        team_for_static(n, fn, arg);
        return;
    }
#endif
    (void)team;
    for (int64_t it = 0; it < n; it++)
        fn(arg, it);
}
