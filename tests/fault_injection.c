/* SPDX-License-Identifier: MIT */
/* tests/fault_injection.c - allocation failures at every point of a forward and
 * a backward (issue 14, defect 2).
 *
 * malloc, calloc, realloc, free, posix_memalign, aligned_alloc, memalign and
 * valloc are defined here for the whole process (the library's and libgomp's
 * calls included) and forwarded to glibc's __libc_* entry points. While armed,
 * allocation number k of the call fails; for k = 1, 2, ... until a call
 * completes with no failure injected, every call must
 *   - return SDPA_ERR_OUT_OF_MEMORY with every output untouched (or SDPA_OK
 *     with the bits of an uninjected run),
 *   - leave no allocation of its own alive (live count back to 0),
 *   - never exit the process (an atexit hook reports an exit while armed).
 * All with num_threads = 1, on every supported ISA, over prefill, GQA with
 * masks, split-KV decode and rows with |LSE| >= 256; and sdpa_merge_states_typed over
 * the 9 type pairs. Prints the number of fault points. Before the fix (tree eafc80f) a one-thread call still entered
 * GOMP_parallel, whose team allocation failing printed "libgomp: Out of memory
 * allocating N bytes" and exited 1: this program died at its first fault point.
 *
 * --two-threads additionally documents (asserts nothing) what happens with
 * num_threads = 2 in a fresh child process per fault point: how many points
 * come back as OUT_OF_MEMORY and how many exit inside libgomp.
 *
 * Not built under sanitizers (they define the allocator themselves). */
#include <errno.h>
#include <malloc.h> /* memalign, valloc */
#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdpa.h"

/* ------------------------------------------------------- the allocator -- */

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void __libc_free(void *);

static atomic_int g_armed;       /* count and fail allocations */
static atomic_long g_count;      /* allocations seen while armed */
static atomic_long g_fail_at;    /* fail allocation number g_fail_at (1-based); 0: none */
static atomic_int g_failed;      /* a failure was injected in this call */
static atomic_int g_current_point;

/* Pointers handed out while armed and not yet freed (a tiny open set: the
 * library allocates one workspace per call). */
#define LIVE_MAX 1024
static void *_Atomic g_live[LIVE_MAX];
static atomic_long g_live_count;

static void live_add(void *p)
{
    for (int i = 0; i < LIVE_MAX; i++) {
        void *expected = NULL;
        if (atomic_compare_exchange_strong(&g_live[i], &expected, p)) {
            atomic_fetch_add(&g_live_count, 1);
            return;
        }
    }
    static const char m[] = "fault_injection: live set full\n";
    (void)!write(2, m, sizeof m - 1);
    abort();
}

static void live_remove(void *p)
{
    if (!p || atomic_load(&g_live_count) == 0)
        return;
    for (int i = 0; i < LIVE_MAX; i++) {
        void *expected = p;
        if (atomic_compare_exchange_strong(&g_live[i], &expected, NULL)) {
            atomic_fetch_sub(&g_live_count, 1);
            return;
        }
    }
}

/* 1 if this allocation must fail. */
static int inject(void)
{
    if (!atomic_load(&g_armed))
        return 0;
    const long n = atomic_fetch_add(&g_count, 1) + 1;
    if (n == atomic_load(&g_fail_at)) {
        atomic_store(&g_failed, 1);
        return 1;
    }
    return 0;
}

/* The project builds with -fvisibility=hidden: the definitions below must be
 * exported for libsdpa and libgomp to bind to them. */
#define FI_EXPORT __attribute__((visibility("default")))

static void *track(void *p)
{
    if (p && atomic_load(&g_armed))
        live_add(p);
    return p;
}

FI_EXPORT void *malloc(size_t n)
{
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return track(__libc_malloc(n));
}

FI_EXPORT void *calloc(size_t a, size_t b)
{
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return track(__libc_calloc(a, b));
}

FI_EXPORT void *realloc(void *p, size_t n)
{
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    void *r = __libc_realloc(p, n);
    if (r || n == 0)
        live_remove(p);
    return track(r);
}

FI_EXPORT void free(void *p)
{
    live_remove(p);
    __libc_free(p);
}

FI_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    if (inject())
        return ENOMEM;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = track(p);
    return 0;
}

FI_EXPORT void *aligned_alloc(size_t align, size_t n)
{
    if (inject()) {
        errno = ENOMEM;
        return NULL;
    }
    return track(__libc_memalign(align, n));
}

FI_EXPORT void *memalign(size_t align, size_t n)
{
    return aligned_alloc(align, n);
}

FI_EXPORT void *valloc(size_t n)
{
    return aligned_alloc((size_t)sysconf(_SC_PAGESIZE), n);
}

static void exit_hook(void)
{
    if (atomic_load(&g_armed)) {
        char m[160];
        const int len = snprintf(m, sizeof m,
                                 "fault_injection: FAIL: the process exits inside a call (fault point %d, "
                                 "allocation %ld failed)\n",
                                 atomic_load(&g_current_point), atomic_load(&g_fail_at));
        (void)!write(2, m, (size_t)len);
    }
}

/* ------------------------------------------------------------ problems -- */

typedef struct fi_case {
    const char *name;
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    int causal;     /* 0, 1, 2 */
    int masks;      /* kv_lengths + boolean mask + bias */
    int big_lse;    /* a bias of -FLT_MAX on every key of query row 0: |LSE| >= 256 */
} fi_case;

static const fi_case cases[] = {
    {"prefill causal", 1, 2, 2, 33, 33, 16, 16, 1, 0, 0},
    {"GQA masks", 2, 4, 2, 17, 40, 8, 12, 0, 1, 0},
    {"split-KV decode", 1, 2, 1, 1, 700, 32, 32, 0, 0, 0},
    {"decode bottom-right masks", 2, 2, 2, 3, 300, 16, 8, 2, 1, 0},
    {"|LSE| >= 256 rows", 1, 1, 1, 9, 21, 8, 8, 0, 0, 1},
    {"Dk = 0", 1, 1, 1, 5, 7, 0, 4, 0, 0, 0},
};

typedef struct fi_bufs {
    float *q, *k, *v, *dout, *bias;
    uint8_t *bm;
    int32_t *kvl;
    float *o, *lse, *dq, *dk, *dv; /* outputs */
    size_t nq, nk, nv, no, nl;
} fi_bufs;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fi_setup(const fi_case *c, sdpa_problem *p, fi_bufs *b)
{
    sdpa_problem_init(p);
    p->batch = c->B;
    p->q_heads = c->Hq;
    p->kv_heads = c->Hkv;
    p->q_len = c->Tq;
    p->kv_len = c->Tk;
    p->head_dim_qk = c->Dk;
    p->head_dim_v = c->Dv;
    if (c->Dk == 0) {
        p->use_default_scale = 0;
        p->scale = 1.0f;
    }
    p->causal = (sdpa_causal)c->causal;
    p->num_threads = 1;
    memset(b, 0, sizeof *b);
    b->nq = (size_t)(c->B * c->Hq * c->Tq * c->Dk);
    b->nk = (size_t)(c->B * c->Hkv * c->Tk * c->Dk);
    b->nv = (size_t)(c->B * c->Hkv * c->Tk * c->Dv);
    b->no = (size_t)(c->B * c->Hq * c->Tq * c->Dv);
    b->nl = (size_t)(c->B * c->Hq * c->Tq);
    const size_t nmask = (size_t)(c->B * c->Hq * c->Tq * c->Tk);
    b->q = __libc_malloc((b->nq + 1) * sizeof(float));
    b->k = __libc_malloc((b->nk + 1) * sizeof(float));
    b->v = __libc_malloc((b->nv + 1) * sizeof(float));
    b->dout = __libc_malloc((b->no + 1) * sizeof(float));
    b->o = __libc_malloc((b->no + 1) * sizeof(float));
    b->lse = __libc_malloc((b->nl + 1) * sizeof(float));
    b->dq = __libc_malloc((b->nq + 1) * sizeof(float));
    b->dk = __libc_malloc((b->nk + 1) * sizeof(float));
    b->dv = __libc_malloc((b->nv + 1) * sizeof(float));
    for (size_t i = 0; i < b->nq; i++)
        b->q[i] = rnd();
    for (size_t i = 0; i < b->nk; i++)
        b->k[i] = rnd();
    for (size_t i = 0; i < b->nv; i++)
        b->v[i] = rnd();
    for (size_t i = 0; i < b->no; i++)
        b->dout[i] = rnd();
    if (c->masks || c->big_lse) {
        b->bias = __libc_malloc(nmask * sizeof(float));
        for (size_t i = 0; i < nmask; i++)
            b->bias[i] = 0.25f * rnd();
        if (c->big_lse)
            for (int64_t j = 0; j < c->Tk; j++)
                b->bias[j] = -FLT_MAX; /* (b 0, h 0, row 0) */
        p->bias.data = b->bias;
        p->bias.key_stride = 1;
        p->bias.query_stride = c->Tk;
        p->bias.head_stride = c->Tq * c->Tk;
        p->bias.batch_stride = c->Hq * c->Tq * c->Tk;
    }
    if (c->masks) {
        b->bm = __libc_malloc(nmask);
        for (size_t i = 0; i < nmask; i++)
            b->bm[i] = rnd() > -0.8f;
        p->bool_mask.data = b->bm;
        p->bool_mask.key_stride = 1;
        p->bool_mask.query_stride = c->Tk;
        p->bool_mask.head_stride = c->Tq * c->Tk;
        p->bool_mask.batch_stride = c->Hq * c->Tq * c->Tk;
        b->kvl = __libc_malloc((size_t)c->B * sizeof(int32_t));
        for (int64_t i = 0; i < c->B; i++)
            b->kvl[i] = (int32_t)(c->Tk - 3 * i);
        p->kv_lengths = b->kvl;
    }
}

static void fi_free(fi_bufs *b)
{
    void *all[] = {b->q, b->k, b->v, b->dout, b->bias, b->bm, b->kvl, b->o, b->lse, b->dq, b->dk, b->dv};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        __libc_free(all[i]);
}

static sdpa_tensor view(const float *d, int64_t H, int64_t T, int64_t D)
{
    sdpa_tensor t = {D ? d : NULL, H * T * D, T * D, D};
    return t;
}

static sdpa_tensor_out view_out(float *d, int64_t H, int64_t T, int64_t D)
{
    sdpa_tensor_out t = {D ? d : NULL, H * T * D, T * D, D};
    return t;
}

#define SENTINEL_BITS 0x7fc5a17bu
static void fill_sentinel(float *x, size_t n)
{
    const uint32_t s = SENTINEL_BITS;
    for (size_t i = 0; i < n; i++)
        memcpy(&x[i], &s, 4);
}

static int all_sentinel(const float *x, size_t n)
{
    const uint32_t s = SENTINEL_BITS;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &s, 4) != 0)
            return 0;
    return 1;
}

/* One pass (forward when bwd == 0) of case c; outputs to b. */
static sdpa_status fi_call(const fi_case *c, const sdpa_problem *p, fi_bufs *b, int bwd)
{
    sdpa_tensor q = view(b->q, c->Hq, c->Tq, c->Dk), k = view(b->k, c->Hkv, c->Tk, c->Dk),
                v = view(b->v, c->Hkv, c->Tk, c->Dv);
    if (!bwd) {
        sdpa_tensor_out o = view_out(b->o, c->Hq, c->Tq, c->Dv), l = view_out(b->lse, c->Hq, c->Tq, 1);
        return sdpa_forward(p, &q, &k, &v, &o, &l);
    }
    sdpa_tensor o = view(b->o, c->Hq, c->Tq, c->Dv), l = view(b->lse, c->Hq, c->Tq, 1),
                dO = view(b->dout, c->Hq, c->Tq, c->Dv);
    sdpa_tensor_out dq = view_out(b->dq, c->Hq, c->Tq, c->Dk), dk = view_out(b->dk, c->Hkv, c->Tk, c->Dk),
                    dv = view_out(b->dv, c->Hkv, c->Tk, c->Dv);
    return sdpa_backward(p, &q, &k, &v, &o, &l, &dO, &dq, &dk, &dv);
}

static int g_errors;
#define FAIL(...)                                                                                                     \
    do {                                                                                                              \
        fprintf(stderr, "fault_injection: FAIL: " __VA_ARGS__);                                                       \
        fputc('\n', stderr);                                                                                          \
        g_errors++;                                                                                                   \
    } while (0)

/* Every fault point of one pass; returns how many there were. */
static int fi_points(const fi_case *c, sdpa_isa isa, int bwd)
{
    sdpa_problem p;
    fi_bufs b;
    fi_setup(c, &p, &b);
    p.isa = isa;
    /* The uninjected result (the forward's O and LSE feed the backward). */
    sdpa_status st = fi_call(c, &p, &b, 0);
    if (st != SDPA_OK) {
        FAIL("%s: uninjected forward: %s", c->name, sdpa_status_string(st));
        fi_free(&b);
        return 0;
    }
    float *out[3] = {bwd ? b.dq : b.o, bwd ? b.dk : b.lse, bwd ? b.dv : NULL};
    const size_t n[3] = {bwd ? b.nq : b.no, bwd ? b.nk : b.nl, bwd ? b.nv : 0};
    float *ref[3];
    if (bwd && (st = fi_call(c, &p, &b, 1)) != SDPA_OK)
        FAIL("%s: uninjected backward: %s", c->name, sdpa_status_string(st));
    for (int i = 0; i < 3; i++) {
        ref[i] = __libc_malloc((n[i] + 1) * sizeof(float));
        memcpy(ref[i], out[i], n[i] * sizeof(float));
    }
    int points = 0;
    for (long at = 1;; at++) {
        for (int i = 0; i < 3; i++)
            fill_sentinel(out[i], n[i]);
        atomic_store(&g_count, 0);
        atomic_store(&g_failed, 0);
        atomic_store(&g_fail_at, at);
        atomic_store(&g_current_point, points + 1);
        atomic_store(&g_armed, 1);
        st = fi_call(c, &p, &b, bwd);
        atomic_store(&g_armed, 0);
        const long live = atomic_load(&g_live_count), seen = atomic_load(&g_count);
        const int failed = atomic_load(&g_failed);
        if (live != 0)
            FAIL("%s %s %s: allocation %ld failed: %ld allocations left alive (leak)", sdpa_isa_name(isa), c->name,
                 bwd ? "backward" : "forward", at, live);
        if (!failed) {
            if (st != SDPA_OK)
                FAIL("%s %s: no failure injected but %s", c->name, bwd ? "backward" : "forward",
                     sdpa_status_string(st));
            break;
        }
        points++;
        if (st == SDPA_ERR_OUT_OF_MEMORY) {
            for (int i = 0; i < 3; i++)
                if (!all_sentinel(out[i], n[i]))
                    FAIL("%s %s %s: allocation %ld of %ld failed: OUT_OF_MEMORY but output %d was written",
                         sdpa_isa_name(isa), c->name, bwd ? "backward" : "forward", at, seen, i);
        } else if (st == SDPA_OK) {
            for (int i = 0; i < 3; i++)
                if (n[i] && memcmp(out[i], ref[i], n[i] * sizeof(float)) != 0)
                    FAIL("%s %s %s: allocation %ld failed, SDPA_OK, but output %d differs from the uninjected run",
                         sdpa_isa_name(isa), c->name, bwd ? "backward" : "forward", at, i);
        } else {
            FAIL("%s %s %s: allocation %ld failed: status %d (%s), expected OUT_OF_MEMORY", sdpa_isa_name(isa),
                 c->name, bwd ? "backward" : "forward", at, st, sdpa_status_string(st));
        }
    }
    for (int i = 0; i < 3; i++)
        __libc_free(ref[i]);
    fi_free(&b);
    return points;
}

/* Every fault point of sdpa_merge_states_typed (parts of type pt merged into an O of
 * type ot: its one allocation, the views and, with a 16-bit type, the row buffers):
 * OUT_OF_MEMORY with O and LSE untouched and nothing left alive, or the uninjected bits.
 * Returns how many points there were. */
static int merge_points(sdpa_dtype pt, sdpa_dtype ot)
{
    enum { MH = 3, MT = 5, MD = 24, MN = 3 };
    const size_t no = (size_t)MH * MT * MD, nl = (size_t)MH * MT;
    uint16_t parts16[MN][MH * MT * MD];
    float parts32[MN][MH * MT * MD], lses[MN][MH * MT];
    for (int s = 0; s < MN; s++) {
        for (size_t i = 0; i < no; i++) {
            parts32[s][i] = rnd();
            uint32_t u;
            memcpy(&u, &parts32[s][i], 4);
            parts16[s][i] = (uint16_t)(u >> 16); /* any bf16 / fp16 pattern will do */
            if ((parts16[s][i] & 0x7c00) == 0x7c00)
                parts16[s][i] &= 0xbfff; /* no fp16 inf or NaN */
        }
        for (size_t i = 0; i < nl; i++)
            lses[s][i] = 2.0f * rnd();
    }
    sdpa_tensor po[MN], pl[MN];
    for (int s = 0; s < MN; s++) {
        po[s] = (sdpa_tensor){pt == SDPA_DTYPE_F32 ? (const void *)parts32[s] : (const void *)parts16[s], MH * MT * MD,
                              MT * MD, MD};
        pl[s] = view(lses[s], MH, MT, 1);
    }
    float o[MH * MT * MD], l[MH * MT], o_ref[MH * MT * MD], l_ref[MH * MT];
    const size_t ob = no * (ot == SDPA_DTYPE_F32 ? 4 : 2);
    const sdpa_tensor_out to = view_out(o, MH, MT, MD), tl = view_out(l, MH, MT, 1);
    sdpa_status st = sdpa_merge_states_typed(MN, 1, MH, MT, MD, pt, po, pl, ot, &to, &tl);
    if (st != SDPA_OK) {
        FAIL("merge %d -> %d: uninjected: %s", (int)pt, (int)ot, sdpa_status_string(st));
        return 0;
    }
    memcpy(o_ref, o, ob);
    memcpy(l_ref, l, sizeof l);
    int points = 0;
    for (long at = 1;; at++) {
        memset(o, 0x5a, sizeof o);
        memset(l, 0x5a, sizeof l);
        atomic_store(&g_count, 0);
        atomic_store(&g_failed, 0);
        atomic_store(&g_fail_at, at);
        atomic_store(&g_armed, 1);
        st = sdpa_merge_states_typed(MN, 1, MH, MT, MD, pt, po, pl, ot, &to, &tl);
        atomic_store(&g_armed, 0);
        if (atomic_load(&g_live_count) != 0)
            FAIL("merge %d -> %d: allocation %ld failed: allocations left alive (leak)", (int)pt, (int)ot, at);
        if (!atomic_load(&g_failed)) {
            if (st != SDPA_OK || memcmp(o, o_ref, ob) != 0 || memcmp(l, l_ref, sizeof l) != 0)
                FAIL("merge %d -> %d: no failure injected but %s or other bits", (int)pt, (int)ot,
                     sdpa_status_string(st));
            break;
        }
        points++;
        int untouched = 1;
        for (size_t i = 0; i < sizeof o; i++)
            untouched &= ((const unsigned char *)o)[i] == 0x5a;
        for (size_t i = 0; i < sizeof l; i++)
            untouched &= ((const unsigned char *)l)[i] == 0x5a;
        if (st != SDPA_ERR_OUT_OF_MEMORY || !untouched)
            FAIL("merge %d -> %d: allocation %ld failed: %s, outputs %s", (int)pt, (int)ot, at,
                 sdpa_status_string(st), untouched ? "untouched" : "written");
    }
    return points;
}

/* num_threads = 2, one fresh child per fault point: documents what libgomp does. */
static void two_threads(void)
{
    const fi_case *c = &cases[0];
    int oom = 0, ok = 0, exited = 0, other = 0;
    for (long at = 1; at < 200; at++) {
        fflush(NULL);
        const pid_t pid = fork();
        if (pid == 0) {
            /* libgomp's own message ("Out of memory allocating ...", "Thread
             * creation failed") is counted, not shown. */
            FILE *nul = fopen("/dev/null", "w");
            if (nul)
                dup2(fileno(nul), 2);
            sdpa_problem p;
            fi_bufs b;
            fi_setup(c, &p, &b);
            p.num_threads = 2;
            atomic_store(&g_count, 0);
            atomic_store(&g_fail_at, at);
            atomic_store(&g_armed, 1);
            const sdpa_status st = fi_call(c, &p, &b, 1);
            atomic_store(&g_armed, 0);
            if (!atomic_load(&g_failed))
                _exit(100);
            _exit(st == SDPA_ERR_OUT_OF_MEMORY ? 101 : st == SDPA_OK ? 102 : 103);
        }
        int ws = 0;
        waitpid(pid, &ws, 0);
        const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        if (code == 100)
            break;
        if (code == 101)
            oom++;
        else if (code == 102)
            ok++;
        else if (code == 1)
            exited++;
        else
            other++;
    }
    printf("fault_injection: num_threads = 2 (documented, not asserted), %s backward in a fresh process: "
           "%d fault points: %d OUT_OF_MEMORY, %d SDPA_OK (failure outside the call's needs), %d exited 1 inside "
           "libgomp, %d other\n",
           c->name, oom + ok + exited + other, oom, ok, exited, other);
}

int main(int argc, char **argv)
{
    atexit(exit_hook);
    setvbuf(stdout, NULL, _IONBF, 0);
    int total = 0, calls = 0;
    for (int isa = SDPA_ISA_SCALAR; isa < SDPA_ISA_COUNT; isa++) {
        if (!sdpa_isa_supported((sdpa_isa)isa))
            continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int bwd = 0; bwd <= 1; bwd++) {
                const int n = fi_points(&cases[i], (sdpa_isa)isa, bwd);
                total += n;
                calls++;
            }
    }
    printf("fault_injection: num_threads = 1: %d fault points over %d forward/backward calls (every supported ISA, "
           "%zu shapes): OUT_OF_MEMORY with outputs untouched, no leak, no exit; %d failures\n",
           total, calls, sizeof cases / sizeof cases[0], g_errors);
    const int merge_before = g_errors;
    int merge_total = 0;
    for (int pt = SDPA_DTYPE_F32; pt <= SDPA_DTYPE_F16; pt++)
        for (int ot = SDPA_DTYPE_F32; ot <= SDPA_DTYPE_F16; ot++)
            merge_total += merge_points((sdpa_dtype)pt, (sdpa_dtype)ot);
    printf("fault_injection: sdpa_merge_states_typed: %d fault points over the 9 type pairs: OUT_OF_MEMORY with "
           "outputs untouched, no leak; %d failures\n",
           merge_total, g_errors - merge_before);
    if (merge_total < 9) {
        fprintf(stderr, "fault_injection: FAIL: a merge without its allocation's fault point\n");
        g_errors++;
    }
    if (total == 0) {
        fprintf(stderr, "fault_injection: FAIL: no fault point found (is the allocator interposed?)\n");
        g_errors++;
    }
    if (argc > 1 && strcmp(argv[1], "--two-threads") == 0)
        two_threads();
    return g_errors ? 1 : 0;
}
