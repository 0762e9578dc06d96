/* SPDX-License-Identifier: MIT */
/* tests/test_dispatch.c - the ISA dispatcher: detection against an independent
 * probe, sdpa_force_isa, ISA names, and the SDPA_ISA environment cap (tested in
 * child processes, since the library reads it once at load), and
 * sdpa_force_isa racing with computing calls.
 *
 * Criterion forks every test from a parent in which the library constructor has
 * already run, so the environment a test sees at run time is the one the
 * dispatcher saw at load, and a change made by sdpa_force_isa() in one test
 * cannot leak into another (each test still restores SDPA_ISA_AUTO). */
#include "sdpa.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

extern char **environ;

static const sdpa_isa all_isas[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX, SDPA_ISA_NEON};
#define N_ISAS ((int)(sizeof all_isas / sizeof all_isas[0]))
/* x86-64's ladder, lowest first (the enum's numbers are not its order: neon is 3) */
static const sdpa_isa x86_ladder[] = {SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512, SDPA_ISA_AMX};
#define N_X86 ((int)(sizeof x86_ladder / sizeof x86_ladder[0]))

#if defined(__x86_64__)
static int x86_rung(sdpa_isa isa)
{
    for (int i = 0; i < N_X86; i++)
        if (x86_ladder[i] == isa)
            return i;
    return -1;
}
#endif

/* The best ISA this process may use without any cap: the largest supported one of
 * this architecture (NEON on AArch64). */
static sdpa_isa best_supported(void)
{
    if (sdpa_isa_supported(SDPA_ISA_NEON))
        return SDPA_ISA_NEON;
    sdpa_isa best = SDPA_ISA_SCALAR;
    for (int i = 0; i < N_X86; i++)
        if (sdpa_isa_supported(x86_ladder[i]))
            best = x86_ladder[i];
    return best;
}

/* What SDPA_ISA=value must give: a same-architecture name caps the choice at the
 * highest supported level not above it; "auto", an empty or invalid value
 * changes nothing. For a name of the other architecture only "some supported
 * ISA" is required (returns SDPA_ISA_AUTO to say so). */
static sdpa_isa expected_for_env(const char *value)
{
    const sdpa_isa best = best_supported();
    sdpa_isa cap;
    if (!value || !*value || sdpa_isa_from_name(value, &cap) != 0 || cap == SDPA_ISA_AUTO)
        return best;
    if (cap == SDPA_ISA_SCALAR)
        return SDPA_ISA_SCALAR;
#if defined(__x86_64__)
    if (cap == SDPA_ISA_NEON) /* another architecture's ISA: rejected, ignored */
        return best;
    int e = x86_rung(cap) < x86_rung(best) ? x86_rung(cap) : x86_rung(best);
    while (e > 0 && !sdpa_isa_supported(x86_ladder[e]))
        e--;
    return x86_ladder[e];
#else
    return best; /* neon is the best; avx2/avx512/amx name another architecture: ignored */
#endif
}

static int has_token(const char *list, const char *tok)
{
    const size_t n = strlen(tok);
    for (const char *s = list; (s = strstr(s, tok)) != NULL; s += n)
        if ((s == list || s[-1] == ' ') && (s[n] == ' ' || s[n] == '\0'))
            return 1;
    return 0;
}

Test(dispatch, compiled_and_supported_are_consistent)
{
    cr_assert(sdpa_isa_compiled(SDPA_ISA_SCALAR));
    cr_assert(sdpa_isa_supported(SDPA_ISA_SCALAR));
    for (int i = 0; i < N_ISAS; i++)
        if (sdpa_isa_supported(all_isas[i]))
            cr_assert(sdpa_isa_compiled(all_isas[i]), "%s supported but not compiled",
                      sdpa_isa_name(all_isas[i]));
    /* Values outside the enum are neither compiled nor supported. */
    cr_assert_not(sdpa_isa_compiled(SDPA_ISA_AUTO));
    cr_assert_not(sdpa_isa_supported(SDPA_ISA_AUTO));
    cr_assert_not(sdpa_isa_compiled((sdpa_isa)SDPA_ISA_COUNT));
    cr_assert_not(sdpa_isa_supported((sdpa_isa)SDPA_ISA_COUNT));
    cr_assert_not(sdpa_isa_supported((sdpa_isa)-7));
#if defined(__x86_64__)
    cr_assert_not(sdpa_isa_compiled(SDPA_ISA_NEON));
    cr_assert_not(sdpa_isa_supported(SDPA_ISA_NEON));
#elif defined(__aarch64__)
    cr_assert_not(sdpa_isa_compiled(SDPA_ISA_AVX2));
    cr_assert_not(sdpa_isa_compiled(SDPA_ISA_AVX512));
#endif
}

/* Detection against an independent probe.
 *
 * x86: GCC's __builtin_cpu_supports() reads libgcc's own CPUID results (the
 * __cpu_model / __cpu_features2 tables filled by __builtin_cpu_init). Since
 * GCC 5 libgcc also consults XGETBV and clears "avx", "avx2", "fma" when the OS
 * does not save YMM state, and the "avx512*" bits when it does not save the
 * opmask/ZMM state, so it is a genuine second opinion on the CPUID + OS gate.
 * Its limits: it is libgcc's reading, not the kernel's (no /proc/cpuinfo or
 * prctl/arch_prctl masks, e.g. AMX permission), it is not the same code path as
 * a hypervisor hiding a bit after boot, and clang's compiler-rt implementation
 * has historically been laxer about the OS check (older compiler-rt did not
 * check XCR0 for AVX-512). Under qemu-user it reports whatever CPUID qemu
 * emulates for -cpu, which is exactly what the dispatcher sees too.
 * AArch64: AT_HWCAP's HWCAP_ASIMD bit from the kernel. */
Test(dispatch, detection_matches_independent_probe)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    const int probe_avx2 =
        __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c");
    const int probe_avx512 = probe_avx2 && __builtin_cpu_supports("avx512f") &&
                             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
    cr_log_info("probe: avx2+fma %d, avx512 f/dq/bw/vl %d; library features: %s", probe_avx2,
                probe_avx512, sdpa_cpu_features());
    if (sdpa_isa_compiled(SDPA_ISA_AVX2))
        cr_expect_eq(sdpa_isa_supported(SDPA_ISA_AVX2), probe_avx2, "AVX2: library %d, probe %d",
                     sdpa_isa_supported(SDPA_ISA_AVX2), probe_avx2);
    else
        cr_expect_not(sdpa_isa_supported(SDPA_ISA_AVX2));
    if (sdpa_isa_compiled(SDPA_ISA_AVX512))
        cr_expect_eq(sdpa_isa_supported(SDPA_ISA_AVX512), probe_avx512,
                     "AVX-512: library %d, probe %d", sdpa_isa_supported(SDPA_ISA_AVX512), probe_avx512);
    else
        cr_expect_not(sdpa_isa_supported(SDPA_ISA_AVX512));
    /* The feature string reports what was seen. */
    const char *f = sdpa_cpu_features();
    cr_assert_not_null(f);
    if (probe_avx2) {
        cr_expect(has_token(f, "avx2"), "features \"%s\" lack avx2", f);
        cr_expect(has_token(f, "fma"), "features \"%s\" lack fma", f);
        cr_expect(has_token(f, "os-ymm"), "features \"%s\" lack os-ymm", f);
    }
    if (probe_avx512) {
        cr_expect(has_token(f, "avx512f"), "features \"%s\" lack avx512f", f);
        cr_expect(has_token(f, "os-zmm"), "features \"%s\" lack os-zmm", f);
    }
    cr_expect_not(sdpa_isa_supported(SDPA_ISA_NEON));
#elif defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
    const int probe_neon = (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
    if (sdpa_isa_compiled(SDPA_ISA_NEON))
        cr_expect_eq(sdpa_isa_supported(SDPA_ISA_NEON), probe_neon);
    cr_expect_not(sdpa_isa_supported(SDPA_ISA_AVX2));
    cr_expect_not(sdpa_isa_supported(SDPA_ISA_AVX512));
#else
    cr_skip_test("no independent CPU probe on this platform");
#endif
}

/* The ISA chosen at load is the best supported one, capped by SDPA_ISA exactly
 * as the environment of this process says (usually unset). The env tests below
 * re-run this very test in child processes with SDPA_ISA set. */
Test(dispatch, load_choice_follows_environment)
{
    const char *env = getenv("SDPA_ISA");
    const sdpa_isa want = expected_for_env(env);
    const sdpa_isa got = sdpa_isa_active();
    cr_log_info("SDPA_ISA=%s: active %s", env ? env : "(unset)", sdpa_isa_name(got));
    cr_assert(sdpa_isa_supported(got), "active ISA %s is not supported", sdpa_isa_name(got));
    if (want != SDPA_ISA_AUTO)
        cr_assert_eq(got, want, "SDPA_ISA=%s: active %s, expected %s", env ? env : "(unset)",
                     sdpa_isa_name(got), sdpa_isa_name(want));
    /* An invalid non-empty value, or an ISA of another architecture, is
     * ignored and reported verbatim. */
    sdpa_isa parsed = SDPA_ISA_AUTO;
    int invalid = env && *env && sdpa_isa_from_name(env, &parsed) != 0;
#if defined(__x86_64__)
    invalid = invalid || (env && *env && !invalid && parsed == SDPA_ISA_NEON);
#elif defined(__aarch64__)
    invalid = invalid || (env && *env && !invalid &&
                          (parsed == SDPA_ISA_AVX2 || parsed == SDPA_ISA_AVX512 || parsed == SDPA_ISA_AMX));
#endif
    /* a cap below amx: the tile permission is never asked for, so amx is not runnable */
    const int below_amx = parsed == SDPA_ISA_SCALAR || parsed == SDPA_ISA_AVX2 || parsed == SDPA_ISA_AVX512;
    if (env && *env && !invalid && below_amx) {
        cr_assert_not(sdpa_isa_supported(SDPA_ISA_AMX), "SDPA_ISA=%s: amx supported", env);
        cr_assert_not(has_token(sdpa_cpu_features(), "amx-permitted"), "SDPA_ISA=%s: %s", env, sdpa_cpu_features());
    }
    const char *rej = sdpa_isa_env_rejected();
    if (invalid) {
        cr_assert_not_null(rej, "SDPA_ISA=%s was not reported as rejected", env);
        cr_assert_str_eq(rej, env);
    } else {
        cr_assert_null(rej, "SDPA_ISA=%s reported as rejected (\"%s\")", env ? env : "(unset)",
                       rej ? rej : "");
    }
}

Test(dispatch, force_refuses_unavailable)
{
    const sdpa_isa before = sdpa_isa_active();
    for (int i = 0; i < N_ISAS; i++) {
        if (sdpa_isa_supported(all_isas[i]))
            continue;
        cr_expect_eq(sdpa_force_isa(all_isas[i]), SDPA_ERR_ISA_UNAVAILABLE, "force %s",
                     sdpa_isa_name(all_isas[i]));
        cr_expect_eq(sdpa_isa_active(), before, "refused force of %s changed the active ISA",
                     sdpa_isa_name(all_isas[i]));
    }
    cr_expect_eq(sdpa_force_isa((sdpa_isa)SDPA_ISA_COUNT), SDPA_ERR_ISA_UNAVAILABLE);
    cr_expect_eq(sdpa_force_isa((sdpa_isa)-2), SDPA_ERR_ISA_UNAVAILABLE);
    cr_expect_eq(sdpa_force_isa((sdpa_isa)1000), SDPA_ERR_ISA_UNAVAILABLE);
    cr_expect_eq(sdpa_isa_active(), before);
#if defined(__x86_64__)
    cr_expect_eq(sdpa_force_isa(SDPA_ISA_NEON), SDPA_ERR_ISA_UNAVAILABLE);
    cr_expect_eq(sdpa_isa_active(), before);
#endif
}

Test(dispatch, force_supported_and_auto_restores)
{
    const sdpa_isa load = sdpa_isa_active();
    for (int i = 0; i < N_ISAS; i++) {
        if (!sdpa_isa_supported(all_isas[i]))
            continue;
        cr_assert_eq(sdpa_force_isa(all_isas[i]), SDPA_OK, "force %s", sdpa_isa_name(all_isas[i]));
        cr_assert_eq(sdpa_isa_active(), all_isas[i], "after forcing %s, active is %s",
                     sdpa_isa_name(all_isas[i]), sdpa_isa_name(sdpa_isa_active()));
        /* A refused force in between keeps the forced one. */
        for (int j = 0; j < N_ISAS; j++)
            if (!sdpa_isa_supported(all_isas[j])) {
                cr_assert_eq(sdpa_force_isa(all_isas[j]), SDPA_ERR_ISA_UNAVAILABLE);
                cr_assert_eq(sdpa_isa_active(), all_isas[i]);
            }
        cr_assert_eq(sdpa_force_isa(SDPA_ISA_AUTO), SDPA_OK);
        cr_assert_eq(sdpa_isa_active(), load, "AUTO gave %s, load-time choice was %s",
                     sdpa_isa_name(sdpa_isa_active()), sdpa_isa_name(load));
    }
}

/* A forced ISA is what SDPA_ISA_AUTO problems run on: forcing scalar must give
 * exactly the scalar results of problem.isa = SCALAR. */
Test(dispatch, forced_isa_is_used_by_auto_calls)
{
    enum { T = 37, D = 19 };
    static float q[T * D], k[T * D], v[T * D], o1[T * D], o2[T * D], l1[T], l2[T];
    unsigned s = 12345u;
    for (int i = 0; i < T * D; i++) {
        s = s * 1664525u + 1013904223u;
        q[i] = (float)((int)(s >> 9) % 2001 - 1000) / 512.0f;
        s = s * 1664525u + 1013904223u;
        k[i] = (float)((int)(s >> 9) % 2001 - 1000) / 512.0f;
        s = s * 1664525u + 1013904223u;
        v[i] = (float)((int)(s >> 9) % 2001 - 1000) / 512.0f;
    }
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = p.q_heads = p.kv_heads = 1;
    p.q_len = p.kv_len = T;
    p.head_dim_qk = p.head_dim_v = D;
    p.causal = SDPA_CAUSAL_TOP_LEFT;
    p.num_threads = 1;
    const sdpa_tensor tq = {q, T * D, T * D, D}, tk = {k, T * D, T * D, D}, tv = {v, T * D, T * D, D};
    const sdpa_tensor_out to1 = {o1, T * D, T * D, D}, tl1 = {l1, T, T, 1};
    const sdpa_tensor_out to2 = {o2, T * D, T * D, D}, tl2 = {l2, T, T, 1};
    for (int i = 0; i < N_ISAS; i++) {
        if (!sdpa_isa_supported(all_isas[i]))
            continue;
        p.isa = all_isas[i];
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to1, &tl1), SDPA_OK);
        cr_assert_eq(sdpa_force_isa(all_isas[i]), SDPA_OK);
        p.isa = SDPA_ISA_AUTO;
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to2, &tl2), SDPA_OK);
        cr_assert(memcmp(o1, o2, sizeof o1) == 0 && memcmp(l1, l2, sizeof l1) == 0,
                  "forced %s differs from problem.isa = %s", sdpa_isa_name(all_isas[i]),
                  sdpa_isa_name(all_isas[i]));
    }
    cr_assert_eq(sdpa_force_isa(SDPA_ISA_AUTO), SDPA_OK);
}

/* sdpa_isa_bf16_pairs: AVX-512 on a CPU with AVX512_BF16 whose tuning turns the pair
 * products on, and amx, whose tiles compute them, unless SDPA_TUNE turned them off
 * ("bf16_dot 1" in the ISA's sdpa_tuning() entry); never an ISA the CPU cannot run or
 * an out-of-range value; AUTO answers for the process default. */
Test(dispatch, bf16_pairs_query)
{
    const char *tuning = sdpa_tuning();
    const char *entry = strstr(tuning, "; avx512 block_q ");
    const char *amx = strstr(tuning, "; amx block_q ");
    const int listed = entry && strstr(entry, " bf16_dot 1") != NULL && (!amx || strstr(entry, " bf16_dot 1") < amx);
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_AVX512), listed, "%s", tuning);
    if (listed)
        cr_assert_not_null(strstr(sdpa_cpu_features(), "avx512_bf16"));
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_AMX), amx && strstr(amx, " bf16_dot 1") != NULL, "%s", tuning);
    cr_assert_eq(amx != NULL, sdpa_isa_supported(SDPA_ISA_AMX), "%s", tuning);
    if (amx)
        cr_assert_not_null(strstr(sdpa_cpu_features(), "amx-permitted"));
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_SCALAR), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_AVX2), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_NEON), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs((sdpa_isa)99), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs((sdpa_isa)-7), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs(SDPA_ISA_AUTO), sdpa_isa_bf16_pairs(sdpa_isa_active()));
}

/* sdpa_isa_bf16_pairs_backward: what "bwd_bf16_dot 1" in the ISA's sdpa_tuning() entry
 * says (amx by default; AVX-512 only where SDPA_TUNE asks); never an ISA the CPU cannot
 * run or an out-of-range value; AUTO answers for the process default. */
Test(dispatch, bf16_pairs_backward_query)
{
    const char *tuning = sdpa_tuning();
    const char *entry = strstr(tuning, "; avx512 block_q ");
    const char *amx = strstr(tuning, "; amx block_q ");
    const int listed = entry && strstr(entry, " bwd_bf16_dot 1") != NULL &&
                       (!amx || strstr(entry, " bwd_bf16_dot 1") < amx);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_AVX512), listed, "%s", tuning);
    const char *tune = getenv("SDPA_TUNE");
    if (!tune || !strstr(tune, "bwd_bf16_dot")) /* the defaults: amx only */
        cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_AMX), amx != NULL, "%s", tuning);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_AMX), amx && strstr(amx, " bwd_bf16_dot 1") != NULL, "%s",
                 tuning);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_SCALAR), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_AVX2), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_NEON), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward((sdpa_isa)99), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward((sdpa_isa)-7), 0);
    cr_assert_eq(sdpa_isa_bf16_pairs_backward(SDPA_ISA_AUTO), sdpa_isa_bf16_pairs_backward(sdpa_isa_active()));
}

Test(dispatch, names_round_trip)
{
    const sdpa_isa every[] = {SDPA_ISA_AUTO, SDPA_ISA_SCALAR, SDPA_ISA_AVX2, SDPA_ISA_AVX512,
                              SDPA_ISA_NEON};
    const char *names[] = {"auto", "scalar", "avx2", "avx512", "neon"};
    for (size_t i = 0; i < sizeof every / sizeof every[0]; i++) {
        const char *n = sdpa_isa_name(every[i]);
        cr_assert_not_null(n);
        cr_assert_str_eq(n, names[i]);
        sdpa_isa back = (sdpa_isa)77;
        cr_assert_eq(sdpa_isa_from_name(n, &back), 0, "\"%s\" not parsed", n);
        cr_assert_eq(back, every[i], "\"%s\" parsed as %d", n, (int)back);
        for (size_t j = 0; j < i; j++) /* distinct names */
            cr_assert_str_neq(n, sdpa_isa_name(every[j]));
    }
    cr_assert_str_eq(sdpa_isa_name((sdpa_isa)SDPA_ISA_COUNT), "unknown");
    cr_assert_str_eq(sdpa_isa_name((sdpa_isa)-2), "unknown");
    const char *bad[] = {"", "unknown", "bogus", "avx", "avx-512", "sse", " scalar", "scalar ",
                         "avx5120", "neo"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sdpa_isa out = (sdpa_isa)77;
        cr_assert_eq(sdpa_isa_from_name(bad[i], &out), -1, "\"%s\" accepted", bad[i]);
        cr_assert_eq((int)out, 77, "\"%s\" rejected but *isa written", bad[i]);
    }
    sdpa_isa out = (sdpa_isa)77;
    cr_assert_eq(sdpa_isa_from_name(NULL, &out), -1);
    cr_assert_eq((int)out, 77);
    cr_assert_eq(sdpa_isa_from_name("scalar", NULL), -1);
}

/* ------------------------------------------------------- child processes */

/* Runs argv with SDPA_ISA set to env_value (NULL: removed) on top of this
 * process's environment; stdout+stderr go to out (NUL-terminated). Returns the
 * wait status, or -1 if the child could not be started. */
static int run_child(char *const argv[], const char *env_value, char *out, size_t cap)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = calloc(n + 2, sizeof *envp);
    cr_assert_not_null(envp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        /* BXFI_*: Criterion's (BoxFort's) marker of a sandboxed worker; a
         * re-executed test binary that saw it would act as one and abort. */
        if (strncmp(environ[i], "SDPA_ISA=", 9) != 0 && strncmp(environ[i], "BXFI_", 5) != 0)
            envp[m++] = environ[i];
    char envbuf[128];
    if (env_value) {
        snprintf(envbuf, sizeof envbuf, "SDPA_ISA=%s", env_value);
        envp[m++] = envbuf;
    }
    envp[m] = NULL;

    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    const int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    free(envp);
    if (rc != 0) {
        close(fds[0]);
        snprintf(out, cap, "posix_spawn(%s): %s", argv[0], strerror(rc));
        return -1;
    }
    size_t len = 0;
    for (;;) {
        char tmp[512];
        const ssize_t r = read(fds[0], tmp, sizeof tmp);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r && len + 1 < cap; i++)
            out[len++] = tmp[i];
    }
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return status;
}

static const char *env_values[] = {"scalar", "avx2", "avx512", "amx", "neon", "auto", "AVX2", "bogus", "avx3"};

#ifdef SDPA_CLI_PATH
/* `sdpa info` prints a line "active isa: <name>". */
static int cli_active_isa(const char *env_value, sdpa_isa *isa, char *out, size_t cap)
{
    char *const argv[] = {(char *)SDPA_CLI_PATH, (char *)"info", NULL};
    const int st = run_child(argv, env_value, out, cap);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -2;
    const char *line = strstr(out, "active isa:");
    if (!line)
        return -3;
    line += strlen("active isa:");
    while (*line == ' ' || *line == '\t')
        line++;
    char name[32];
    size_t i = 0;
    while (line[i] && line[i] != '\n' && line[i] != ' ' && line[i] != '\r' && i + 1 < sizeof name) {
        name[i] = line[i];
        i++;
    }
    name[i] = '\0';
    return sdpa_isa_from_name(name, isa) == 0 ? 0 : -4;
}

Test(dispatch, env_var_caps_cli)
{
    static char out[1 << 16];
    for (size_t i = 0; i < sizeof env_values / sizeof env_values[0]; i++) {
        sdpa_isa got;
        const int rc = cli_active_isa(env_values[i], &got, out, sizeof out);
        cr_assert_eq(rc, 0, "SDPA_ISA=%s: `sdpa info` failed (%d); output:\n%s", env_values[i], rc, out);
        const sdpa_isa want = expected_for_env(env_values[i]);
        cr_assert(sdpa_isa_supported(got), "SDPA_ISA=%s: CLI reports unsupported %s", env_values[i],
                  sdpa_isa_name(got));
        if (want != SDPA_ISA_AUTO)
            cr_assert_eq(got, want, "SDPA_ISA=%s: CLI active isa %s, expected %s", env_values[i],
                         sdpa_isa_name(got), sdpa_isa_name(want));
    }
    sdpa_isa got;
    cr_assert_eq(cli_active_isa(NULL, &got, out, sizeof out), 0, "`sdpa info` failed:\n%s", out);
    cr_assert_eq(got, best_supported(), "unset SDPA_ISA: CLI active isa %s, expected %s",
                 sdpa_isa_name(got), sdpa_isa_name(best_supported()));
}
#endif

#if defined(__linux__)
/* Re-runs dispatch/load_choice_follows_environment in a fresh copy of this
 * binary with SDPA_ISA set: that child checks the load-time choice and
 * sdpa_isa_env_rejected() of its own process. */
Test(dispatch, env_var_in_fresh_process)
{
    static char self[4096], out[1 << 16];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        cr_skip_test("cannot find this executable (/proc/self/exe)");
    self[n] = '\0';
    for (size_t i = 0; i < sizeof env_values / sizeof env_values[0]; i++) {
        char *const argv[] = {self, (char *)"--filter", (char *)"dispatch/load_choice_follows_environment",
                              (char *)"-j1", (char *)"--verbose", NULL};
        const int st = run_child(argv, env_values[i], out, sizeof out);
        cr_assert(st != -1, "could not start the child: %s", out);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "SDPA_ISA=%s: child check failed (status %d); output:\n%s", env_values[i], st, out);
        /* Make sure the child did run that test (not an empty filter). */
        cr_assert(strstr(out, "Passing: 1") != NULL, "SDPA_ISA=%s: child ran no test:\n%s",
                  env_values[i], out);
    }
}
#endif

/* Outputs written concurrently with sdpa_force_isa() flipping the default ISA:
 * every AUTO call must equal, bit for bit, the result of one supported ISA. */
typedef struct race_ctx {
    const sdpa_tensor *q, *k, *v;
    const float *want[SDPA_ISA_COUNT];
    int nisa;
    sdpa_isa isas[SDPA_ISA_COUNT];
    atomic_int stop;
    atomic_int bad;
    atomic_int calls;
} race_ctx;

enum { RACE_T = 70, RACE_D = 24 };

static void *race_compute(void *arg)
{
    race_ctx *c = arg;
    float *o = malloc(RACE_T * RACE_D * sizeof(float));
    while (!atomic_load(&c->stop)) {
        sdpa_problem p = util_problem(1, 1, 1, RACE_T, RACE_T, RACE_D, RACE_D);
        p.causal = SDPA_CAUSAL_TOP_LEFT;
        p.num_threads = 1;
        const sdpa_tensor_out to = util_cview_out(o, 1, RACE_T, RACE_D);
        if (sdpa_forward(&p, c->q, c->k, c->v, &to, NULL) != SDPA_OK) {
            atomic_fetch_add(&c->bad, 1);
            continue;
        }
        int match = 0;
        for (int i = 0; i < c->nisa; i++)
            match |= util_same_bits(o, c->want[i], RACE_T * RACE_D);
        if (!match)
            atomic_fetch_add(&c->bad, 1);
        atomic_fetch_add(&c->calls, 1);
    }
    free(o);
    return NULL;
}

static void *race_force(void *arg)
{
    race_ctx *c = arg;
    unsigned i = 0;
    while (!atomic_load(&c->stop)) {
        if (sdpa_force_isa(c->isas[i++ % (unsigned)c->nisa]) != SDPA_OK)
            atomic_fetch_add(&c->bad, 1);
        (void)sdpa_force_isa((sdpa_isa)SDPA_ISA_COUNT); /* refused, changes nothing */
    }
    return NULL;
}

Test(dispatch, force_isa_races_with_computation, .timeout = 60)
{
    race_ctx c;
    memset(&c, 0, sizeof c);
    c.nisa = util_isas(c.isas);
    util_rng r;
    util_rng_seed(&r, "adversarial.race", 5);
    float *q = malloc(RACE_T * RACE_D * sizeof(float)), *k = malloc(RACE_T * RACE_D * sizeof(float)),
          *v = malloc(RACE_T * RACE_D * sizeof(float));
    util_fill_normal(&r, q, RACE_T * RACE_D, 1.0f);
    util_fill_normal(&r, k, RACE_T * RACE_D, 1.0f);
    util_fill_normal(&r, v, RACE_T * RACE_D, 1.0f);
    const sdpa_tensor tq = util_cview(q, 1, RACE_T, RACE_D), tk = util_cview(k, 1, RACE_T, RACE_D),
                      tv = util_cview(v, 1, RACE_T, RACE_D);
    c.q = &tq;
    c.k = &tk;
    c.v = &tv;
    for (int i = 0; i < c.nisa; i++) {
        float *o = malloc(RACE_T * RACE_D * sizeof(float));
        sdpa_problem p = util_problem(1, 1, 1, RACE_T, RACE_T, RACE_D, RACE_D);
        p.causal = SDPA_CAUSAL_TOP_LEFT;
        p.num_threads = 1;
        p.isa = c.isas[i];
        const sdpa_tensor_out to = util_cview_out(o, 1, RACE_T, RACE_D);
        cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, NULL), SDPA_OK);
        c.want[i] = o;
    }
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, i < 2 ? race_compute : race_force, &c);
    struct timespec ts = {0, 400 * 1000 * 1000};
    nanosleep(&ts, NULL);
    atomic_store(&c.stop, 1);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    cr_expect_eq(sdpa_force_isa(SDPA_ISA_AUTO), SDPA_OK);
    cr_expect_eq(atomic_load(&c.bad), 0, "%d bad results / refused forces", atomic_load(&c.bad));
    cr_expect_gt(atomic_load(&c.calls), 0);
    for (int i = 0; i < c.nisa; i++)
        free((void *)c.want[i]);
    free(q);
    free(k);
    free(v);
}

/* amx runs fp32 and fp16 problems, and everything but a forward over bf16 K/V and a
 * backward of bf16 Q, K/V and O, on the avx512 table's kernels with the avx512 entry's
 * shapes: the same bits as avx512 (forward and backward, fp32, fp16, and a backward of
 * bf16 Q and K/V with fp32 O and dO). This is what lets the other fp32 suites test
 * avx512 only (util_isas); the bf16 products on tiles are tested by the dtypes suite
 * on every ISA (util_isas_typed). */
Test(dispatch, amx_fp32_is_avx512)
{
    if (!sdpa_isa_supported(SDPA_ISA_AMX))
        cr_skip_test("amx not supported here (%s)", sdpa_cpu_features());
    enum { H = 4, HKV = 2, T = 150, D = 64 };
    const size_t nq = (size_t)H * T * D, nk = (size_t)HKV * T * D;
    util_rng r;
    util_rng_seed(&r, "dispatch.amx", 11);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2);
    cr_assert(q && k && v && dout && q16 && k16 && v16);
    util_fill_normal(&r, q, nq, 1.0f);
    util_fill_normal(&r, k, nk, 1.0f);
    util_fill_normal(&r, v, nk, 1.0f);
    util_fill_normal(&r, dout, nq, 1.0f);
    for (size_t i = 0; i < nq; i++) {
        uint32_t u;
        memcpy(&u, &q[i], 4);
        q16[i] = (uint16_t)(u >> 16); /* bf16 (truncated; any bf16 values do) */
    }
    for (size_t i = 0; i < nk; i++) {
        uint32_t u;
        memcpy(&u, &k[i], 4);
        k16[i] = (uint16_t)(u >> 16);
        memcpy(&u, &v[i], 4);
        v16[i] = (uint16_t)(u >> 16);
    }
    /* kind 0: fp32; 1: fp16 K/V (bf16 bits read as fp16: finite, of any size; fp32 Q);
     * 2: bf16 Q, K, V, fp32 O and dO (the backward only: its forward takes the tiles on amx) */
    for (int kind = 0; kind < 3; kind++) {
        float *out[2][5];
        for (int which = 0; which < 2; which++) {
            sdpa_problem p = util_problem(1, H, HKV, T, T, D, D);
            p.causal = SDPA_CAUSAL_BOTTOM_RIGHT;
            p.num_threads = 2;
            p.isa = which ? SDPA_ISA_AMX : SDPA_ISA_AVX512;
            p.q_dtype = kind == 2 ? SDPA_DTYPE_BF16 : SDPA_DTYPE_F32;
            p.kv_dtype = kind == 0 ? SDPA_DTYPE_F32 : kind == 1 ? SDPA_DTYPE_F16 : SDPA_DTYPE_BF16;
            p.o_dtype = SDPA_DTYPE_F32;
            const sdpa_tensor tq = {kind == 2 ? (const void *)q16 : (const void *)q, (int64_t)T * D * H,
                                    (int64_t)T * D, D};
            const sdpa_tensor tk = {kind ? (const void *)k16 : (const void *)k, (int64_t)T * D * HKV,
                                    (int64_t)T * D, D};
            const sdpa_tensor tv = {kind ? (const void *)v16 : (const void *)v, (int64_t)T * D * HKV,
                                    (int64_t)T * D, D};
            for (int j = 0; j < 5; j++)
                out[which][j] = calloc(nq, 4);
            sdpa_tensor_out to = {out[which][0], (int64_t)T * D * H, (int64_t)T * D, D};
            sdpa_tensor_out tl = util_lse_view_out(out[which][1], H, T);
            if (kind == 2) {
                /* O of the avx512 forward (no tiles) as the backward's input on both */
                sdpa_problem pf = p;
                pf.isa = SDPA_ISA_AVX512;
                cr_assert_eq(sdpa_forward(&pf, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            } else {
                cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to, &tl), SDPA_OK);
            }
            const sdpa_tensor o_in = {out[which][0], to.batch_stride, to.head_stride, to.seq_stride};
            const sdpa_tensor l_in = util_lse_view(out[which][1], H, T);
            const sdpa_tensor tdo = {dout, (int64_t)T * D * H, (int64_t)T * D, D};
            sdpa_tensor_out tdq = {out[which][2], to.batch_stride, to.head_stride, to.seq_stride};
            sdpa_tensor_out tdk = {out[which][3], (int64_t)T * D * HKV, (int64_t)T * D, D};
            sdpa_tensor_out tdv = {out[which][4], (int64_t)T * D * HKV, (int64_t)T * D, D};
            cr_assert_eq(sdpa_backward(&p, &tq, &tk, &tv, &o_in, &l_in, &tdo, &tdq, &tdk, &tdv), SDPA_OK,
                         "kind %d on %s", kind, sdpa_isa_name(p.isa));
        }
        for (int j = 0; j < 5; j++) {
            cr_expect(util_same_bits(out[0][j], out[1][j], nq), "kind %d output %d: amx differs from avx512", kind,
                      j);
            free(out[0][j]);
            free(out[1][j]);
        }
    }
    free(q), free(k), free(v), free(dout), free(q16), free(k16), free(v16);
}
