/* SPDX-License-Identifier: MIT */
/* tests/test_serving.c - issue 17's serving layouts (sdpa_seqs) against the float64
 * reference, on every ISA, 1 and 2 threads bitwise equal:
 *  - packed variable-length sequences (cu_seqlens_q/k), forward and backward: every
 *    sequence is a dense B = 1 problem over offset views of the same token lists,
 *    and the reference is the existing one (tests/ref.c) on that problem; mixed
 *    lengths with 0-query and 0-key sequences, decode rows, prefill chunks under
 *    bottom-right causal over a longer key prefix, windows, GQA, Dk != Dv, softcap,
 *    ALiBi and sinks (dsinks summed over the sequences); strided token lists whose
 *    gaps must stay untouched;
 *  - paged K/V (block_table, seq_lens_k): block sizes 1, 3, 16, 64, pages shuffled,
 *    HND and NHD caches, pages shared between sequences (prefix caching), table
 *    entries past a sequence's last page set to garbage, cache slots past a
 *    sequence's length left NaN, the caches' guard zones intact, HND and NHD equal
 *    bit for bit;
 *  - a mixed step (decode rows and prefill chunks of many sequences) and batch
 *    invariance: a sequence alone, inside other mixes (other positions, other
 *    neighbours, other thread counts) and as a dense sdpa_forward call of its own
 *    gives the same bits;
 *  - bad lengths, tables and aliased outputs: their own status, outputs untouched;
 *  - the caller-owned workspace with seqs: the same bits as the allocating calls.
 * SDPA_TEST_REDUCED=1 (CI under ASan / emulation) shortens the long key lists. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "util.h"

enum { V_CAP = 1, V_ALIBI = 2, V_SINK = 4, V_ALL = 7 };
enum { MAXH = 16 };

static int reduced(void)
{
    const char *e = getenv("SDPA_TEST_REDUCED");
    return e && *e && strcmp(e, "0") != 0;
}

/* Long key lists shrink under SDPA_TEST_REDUCED (their shape, not their kind). */
static int red(int tk)
{
    return reduced() && tk > 200 ? 200 + (tk - 200) / 4 : tk;
}

/* ------------------------------------------------------------------ setup */

typedef struct cfg {
    int64_t Hq, Hkv, Dk, Dv;
    sdpa_causal causal;
    sdpa_alignment align;
    int window;     /* 0: both bounds unbounded */
    int64_t wl, wr; /* with window */
    int var;        /* V_* bits */
    int pad;        /* token lists with gaps between heads and tokens */
} cfg;

/* One sequence: tq queries over tk keys; share: its first `share` keys are those
 * of the step's sequence 0 (prefix caching: the paged cache shares the pages). */
typedef struct spec {
    int tq, tk, share;
} spec;

/* The variants' values: fixed, so every problem built from a cfg is the same. */
static float g_slopes[MAXH], g_sinks[MAXH];

static void init_variants(void)
{
    for (int h = 0; h < MAXH; h++) {
        g_slopes[h] = 0.03f * (float)(h + 1);
        g_sinks[h] = h == 1 ? -INFINITY : 0.4f * (float)h - 0.7f;
    }
}

static sdpa_problem base_problem(const cfg *c, int64_t B, int64_t Tq, int64_t Tk)
{
    sdpa_problem p = util_problem(B, c->Hq, c->Hkv, Tq, Tk, c->Dk, c->Dv);
    p.causal = c->causal;
    p.window_alignment = c->align;
    p.window_left = c->window ? c->wl : SDPA_WINDOW_UNBOUNDED;
    p.window_right = c->window ? c->wr : SDPA_WINDOW_UNBOUNDED;
    if (c->var & V_CAP)
        p.softcap = 4.0f;
    if (c->var & V_ALIBI)
        p.alibi_slopes = g_slopes;
    if (c->var & V_SINK)
        p.sinks = g_sinks;
    return p;
}

/* One sequence's inputs as a dense B = 1 problem: contiguous [H, T, D]. */
typedef struct seqdata {
    int tq, tk;
    float *q, *k, *v, *dout;
    const struct seqdata *prefix_of; /* its first `share` keys are prefix_of's */
    int share;
} seqdata;

static seqdata *seqs_make(const cfg *c, const spec *sp, int n, util_rng *r)
{
    seqdata *s = calloc((size_t)n, sizeof *s);
    cr_assert(s);
    for (int i = 0; i < n; i++) {
        seqdata *x = &s[i];
        x->tq = sp[i].tq;
        x->tk = sp[i].tk;
        const size_t nq = (size_t)(c->Hq * x->tq * c->Dk), nk = (size_t)(c->Hkv * x->tk * c->Dk),
                     nv = (size_t)(c->Hkv * x->tk * c->Dv), no = (size_t)(c->Hq * x->tq * c->Dv);
        x->q = util_falloc(nq);
        x->k = util_falloc(nk);
        x->v = util_falloc(nv);
        x->dout = util_falloc(no);
        util_fill_uniform(r, x->q, nq, -1.5f, 1.5f);
        util_fill_uniform(r, x->k, nk, -1.5f, 1.5f);
        util_fill_uniform(r, x->v, nv, -1.0f, 1.0f);
        util_fill_uniform(r, x->dout, no, -1.0f, 1.0f);
        if (sp[i].share) {
            const seqdata *z = &s[0];
            cr_assert(i > 0 && sp[i].share <= x->tk && sp[i].share <= z->tk, "bad share in spec %d", i);
            x->prefix_of = z;
            x->share = sp[i].share;
            for (int64_t h = 0; h < c->Hkv; h++) {
                memcpy(x->k + h * x->tk * c->Dk, z->k + h * z->tk * c->Dk, sizeof(float) * (size_t)(x->share * c->Dk));
                memcpy(x->v + h * x->tk * c->Dv, z->v + h * z->tk * c->Dv, sizeof(float) * (size_t)(x->share * c->Dv));
            }
        }
    }
    return s;
}

static void seqs_free(seqdata *s, int n)
{
    for (int i = 0; i < n; i++) {
        free(s[i].q);
        free(s[i].k);
        free(s[i].v);
        free(s[i].dout);
    }
    free(s);
}

/* ------------------------------------------------------------ token lists */

/* A [n, H, D] token list in a guarded buffer (util_galloc: guard zones and the
 * gaps hold the sentinel): element (t, h, d) at t * st + h * sh + d. */
typedef struct toks {
    int64_t n, H, D, sh, st;
    float *buf;
} toks;

static toks toks_alloc(int64_t n, int64_t H, int64_t D, int pad)
{
    toks t = {n, H, D, D + (pad ? 3 : 0), 0, NULL};
    t.st = H * t.sh + (pad ? 5 : 0);
    t.buf = util_galloc((size_t)(n * t.st));
    return t;
}

static float *toks_at(const toks *t, int64_t tok, int64_t h)
{
    return t->buf + tok * t->st + h * t->sh;
}

static sdpa_tensor toks_in(const toks *t)
{
    const sdpa_tensor v = {t->buf, 0, t->sh, t->st};
    return v;
}

static sdpa_tensor_out toks_out(const toks *t)
{
    const sdpa_tensor_out v = {t->buf, 0, t->sh, t->st};
    return v;
}

/* A view of the tokens from t0 on (a dense B = 1 problem over the same list). */
static sdpa_tensor toks_in_at(const toks *t, int64_t t0)
{
    sdpa_tensor v = toks_in(t);
    v.data = (const float *)v.data + t0 * t->st;
    return v;
}

/* [H, T, D] contiguous -> tokens t0 .. t0 + T. */
static void toks_put(const toks *t, int64_t t0, const float *src, int64_t T)
{
    for (int64_t h = 0; h < t->H; h++)
        for (int64_t i = 0; i < T; i++)
            memcpy(toks_at(t, t0 + i, h), src + (h * T + i) * t->D, sizeof(float) * (size_t)t->D);
}

/* The elements, token-major [n][H][D]. */
static float *toks_unpack(const toks *t)
{
    float *d = util_falloc((size_t)(t->n * t->H * t->D));
    for (int64_t i = 0; i < t->n; i++)
        for (int64_t h = 0; h < t->H; h++)
            memcpy(d + (i * t->H + h) * t->D, toks_at(t, i, h), sizeof(float) * (size_t)t->D);
    return d;
}

/* Guard zones and the gaps between heads and tokens still the sentinel. */
static int toks_gaps_ok(const toks *t, const char *what)
{
    int ok = util_gintact(t->buf, what);
    for (int64_t i = 0; i < t->n && ok; i++)
        for (int64_t x = 0; x < t->st; x++) {
            const int64_t h = x / t->sh, d = x % t->sh;
            if ((h >= t->H || d >= t->D) && !util_is_sentinel(t->buf[i * t->st + x])) {
                cr_log_error("%s: gap written at token %ld, offset %ld", what, (long)i, (long)x);
                ok = 0;
                break;
            }
        }
    return ok;
}

/* Nothing at all written: every float of the buffer still the sentinel. */
static int toks_untouched(const toks *t)
{
    const size_t n = util_glen(t->buf);
    for (size_t i = 0; i < n; i++)
        if (!util_is_sentinel(t->buf[i]))
            return 0;
    return util_gcheck(t->buf, NULL, 0);
}

/* The element bits of tokens a0 .. a0 + n of a and b0 .. of b are equal. */
static int toks_rows_same(const toks *a, int64_t a0, const toks *b, int64_t b0, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < a->H; h++)
            if (!util_same_bits(toks_at(a, a0 + i, h), toks_at(b, b0 + i, h), (size_t)a->D))
                return 0;
    return 1;
}

static void toks_free(toks *t)
{
    util_gfree(t->buf);
    t->buf = NULL;
}

/* ------------------------------------------------------------------ steps */

/* A call: B sequences packed into token lists Q, DO [total_q, Hq, D] and K, V
 * [total_k, Hkv, D] (the paged caches are built from the same sequences). */
typedef struct step {
    const cfg *c;
    int B;
    const seqdata **s;
    int32_t *cuq, *cuk;
    int64_t tq, tk;
    toks Q, K, V, DO;
} step;

static step step_build(const cfg *c, const seqdata *const *list, int B)
{
    step st;
    memset(&st, 0, sizeof st);
    st.c = c;
    st.B = B;
    st.s = malloc(sizeof *st.s * (size_t)(B ? B : 1));
    st.cuq = malloc(sizeof(int32_t) * (size_t)(B + 1));
    st.cuk = malloc(sizeof(int32_t) * (size_t)(B + 1));
    cr_assert(st.s && st.cuq && st.cuk);
    st.cuq[0] = st.cuk[0] = 0;
    for (int b = 0; b < B; b++) {
        st.s[b] = list[b];
        st.cuq[b + 1] = st.cuq[b] + list[b]->tq;
        st.cuk[b + 1] = st.cuk[b] + list[b]->tk;
    }
    st.tq = st.cuq[B];
    st.tk = st.cuk[B];
    st.Q = toks_alloc(st.tq, c->Hq, c->Dk, c->pad);
    st.DO = toks_alloc(st.tq, c->Hq, c->Dv, c->pad);
    st.K = toks_alloc(st.tk, c->Hkv, c->Dk, c->pad);
    st.V = toks_alloc(st.tk, c->Hkv, c->Dv, c->pad);
    for (int b = 0; b < B; b++) {
        toks_put(&st.Q, st.cuq[b], list[b]->q, list[b]->tq);
        toks_put(&st.DO, st.cuq[b], list[b]->dout, list[b]->tq);
        toks_put(&st.K, st.cuk[b], list[b]->k, list[b]->tk);
        toks_put(&st.V, st.cuk[b], list[b]->v, list[b]->tk);
    }
    return st;
}

/* A step of the sequences s[idx[0]], s[idx[1]], ... */
static step step_of(const cfg *c, const seqdata *s, const int *idx, int B)
{
    const seqdata *list[64];
    cr_assert(B <= 64);
    for (int b = 0; b < B; b++)
        list[b] = &s[idx[b]];
    return step_build(c, list, B);
}

/* The step of the first n (at most 64) sequences of s, in order. */
static step step_first(const cfg *c, const seqdata *s, int n)
{
    int idx[64] = {0};
    for (int i = 0; i < n; i++)
        idx[i] = i;
    return step_of(c, s, idx, n);
}

static void step_free(step *st)
{
    toks_free(&st->Q);
    toks_free(&st->DO);
    toks_free(&st->K);
    toks_free(&st->V);
    free(st->s);
    free(st->cuq);
    free(st->cuk);
}

/* ------------------------------------------------------------- paged K/V */

typedef struct paged {
    int64_t bs, nb, maxb;
    int nhd;
    int32_t *table, *lens;
    float *kc, *vc; /* guarded caches, slots no sequence uses left NaN (the sentinel) */
    sdpa_tensor k, v;
} paged;

static size_t cache_off(const paged *pg, int64_t Hkv, int64_t D, int64_t page, int64_t h, int64_t slot)
{
    if (pg->nhd) /* [num_blocks, block_size, Hkv, D] */
        return (size_t)(((page * pg->bs + slot) * Hkv + h) * D);
    return (size_t)(((page * Hkv + h) * pg->bs + slot) * D); /* [num_blocks, Hkv, block_size, D] */
}

static sdpa_tensor cache_view(const paged *pg, const float *data, int64_t Hkv, int64_t D)
{
    sdpa_tensor t = {data, pg->bs * Hkv * D, pg->bs * D, D};
    if (pg->nhd) {
        t.head_stride = D;
        t.seq_stride = Hkv * D;
    }
    return t;
}

/* The step's keys in pages of bs slots: page ids shuffled, a sequence that shares a
 * prefix with an earlier one of the step uses that one's pages for it (whole pages,
 * or all of them, the last one part-used, when the sequence is that prefix), table
 * entries past each sequence's last page garbage. */
static paged paged_build_ex(const step *st, int64_t bs, int nhd, int in_order, util_rng *r)
{
    const cfg *c = st->c;
    const int B = st->B;
    paged pg;
    memset(&pg, 0, sizeof pg);
    pg.bs = bs;
    pg.nhd = nhd;
    int64_t *need = calloc((size_t)B + 1, sizeof(int64_t)), *shared = calloc((size_t)B + 1, sizeof(int64_t));
    int *src = calloc((size_t)B + 1, sizeof(int));
    int64_t total = 0, most = 0;
    for (int b = 0; b < B; b++) {
        const seqdata *s = st->s[b];
        need[b] = (s->tk + bs - 1) / bs;
        src[b] = -1;
        for (int a = 0; a < b && s->prefix_of; a++)
            if (st->s[a] == s->prefix_of) {
                src[b] = a;
                shared[b] = s->share == s->tk ? need[b] : s->share / bs;
                break;
            }
        total += need[b] - shared[b];
        most = need[b] > most ? need[b] : most;
    }
    pg.nb = total + 3; /* three pages nobody uses */
    pg.maxb = most + 2;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)pg.nb);
    pg.table = malloc(sizeof(int32_t) * (size_t)(B * pg.maxb + 1));
    pg.lens = malloc(sizeof(int32_t) * (size_t)(B + 1));
    cr_assert(need && shared && src && perm && pg.table && pg.lens);
    for (int64_t i = 0; i < pg.nb; i++)
        perm[i] = (int32_t)i;
    for (int64_t i = pg.nb - 1; i > 0 && !in_order; i--) {
        const int64_t j = util_rng_int(r, 0, i);
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t garbage[5] = {-1, INT32_MAX, (int32_t)pg.nb, INT32_MIN, 123456789};
    int64_t next = 0;
    for (int b = 0; b < B; b++) {
        pg.lens[b] = st->s[b]->tk;
        for (int64_t j = 0; j < pg.maxb; j++)
            pg.table[b * pg.maxb + j] = j < shared[b]  ? pg.table[src[b] * pg.maxb + j]
                                        : j < need[b] ? perm[next++]
                                                      : garbage[(b + j) % 5];
    }
    const int64_t Hkv = c->Hkv, Dk = c->Dk, Dv = c->Dv;
    pg.kc = util_galloc((size_t)(pg.nb * bs * Hkv * Dk));
    pg.vc = util_galloc((size_t)(pg.nb * bs * Hkv * Dv));
    for (int b = 0; b < B; b++) {
        const seqdata *s = st->s[b];
        for (int64_t j = 0; j < s->tk; j++) {
            const int64_t page = pg.table[b * pg.maxb + j / bs], slot = j % bs;
            for (int64_t h = 0; h < Hkv; h++) {
                float *kd = pg.kc + cache_off(&pg, Hkv, Dk, page, h, slot);
                float *vd = pg.vc + cache_off(&pg, Hkv, Dv, page, h, slot);
                const float *ks = s->k + (h * s->tk + j) * Dk, *vs = s->v + (h * s->tk + j) * Dv;
                /* a shared slot already holds the same key (the test's own consistency) */
                cr_assert(util_is_sentinel(kd[0]) || Dk == 0 || util_same_bits(kd, ks, (size_t)Dk),
                          "test bug: shared page holds another key");
                memcpy(kd, ks, sizeof(float) * (size_t)Dk);
                memcpy(vd, vs, sizeof(float) * (size_t)Dv);
            }
        }
    }
    pg.k = cache_view(&pg, pg.kc, Hkv, Dk);
    pg.v = cache_view(&pg, pg.vc, Hkv, Dv);
    free(need);
    free(shared);
    free(src);
    free(perm);
    return pg;
}

static paged paged_build(const step *st, int64_t bs, int nhd, util_rng *r)
{
    return paged_build_ex(st, bs, nhd, 0, r);
}

static void paged_free(paged *pg)
{
    util_gfree(pg->kc);
    util_gfree(pg->vc);
    free(pg->table);
    free(pg->lens);
}

/* The call's descriptor: packed K/V (pg NULL) or the paged cache pg. */
static sdpa_problem step_problem(const step *st, const paged *pg, sdpa_seqs *sq)
{
    sdpa_problem p = base_problem(st->c, st->B, st->tq, pg ? 0 : st->tk);
    memset(sq, 0, sizeof *sq);
    sq->cu_seqlens_q = st->cuq;
    if (pg) {
        sq->block_table = pg->table;
        sq->max_blocks_per_seq = pg->maxb;
        sq->seq_lens_k = pg->lens;
        sq->block_size = pg->bs;
        sq->num_blocks = pg->nb;
    } else {
        sq->cu_seqlens_k = st->cuk;
    }
    p.seqs = sq;
    return p;
}

/* ------------------------------------------------------------ references */

/* The forward reference of a step, token-major: o [total_q][Hq][Dv], l [total_q][Hq],
 * and the naive fp32 yardstick no, nl. Sequence b is the dense B = 1 problem of
 * its own lengths over views of the token lists offset to its first query and key. */
typedef struct fref {
    double *o, *l;
    float *no, *nl;
    size_t n_o, n_l;
} fref;

static fref ref_step_forward(const step *st)
{
    const cfg *c = st->c;
    const int64_t Hq = c->Hq, Dv = c->Dv;
    fref R;
    R.n_o = (size_t)(st->tq * Hq * Dv);
    R.n_l = (size_t)(st->tq * Hq);
    R.o = util_dalloc(R.n_o);
    R.l = util_dalloc(R.n_l);
    R.no = util_falloc(R.n_o);
    R.nl = util_falloc(R.n_l);
    for (int b = 0; b < st->B; b++) {
        const seqdata *s = st->s[b];
        const int64_t tq = s->tq, t0 = st->cuq[b];
        const sdpa_problem sp = base_problem(c, 1, tq, s->tk);
        const sdpa_tensor q = toks_in_at(&st->Q, t0), k = toks_in_at(&st->K, st->cuk[b]),
                          v = toks_in_at(&st->V, st->cuk[b]);
        double *o = util_dalloc((size_t)(Hq * tq * Dv)), *l = util_dalloc((size_t)(Hq * tq));
        float *no = util_falloc((size_t)(Hq * tq * Dv)), *nl = util_falloc((size_t)(Hq * tq));
        ref_forward_views(&sp, &q, &k, &v, o, l);
        naive32_forward(&sp, s->q, s->k, s->v, no, nl);
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < tq; i++) {
                const size_t dst = (size_t)((t0 + i) * Hq + h), srow = (size_t)(h * tq + i);
                R.l[dst] = l[srow];
                R.nl[dst] = nl[srow];
                for (int64_t d = 0; d < Dv; d++) {
                    R.o[dst * (size_t)Dv + (size_t)d] = o[srow * (size_t)Dv + (size_t)d];
                    R.no[dst * (size_t)Dv + (size_t)d] = no[srow * (size_t)Dv + (size_t)d];
                }
            }
        free(o), free(l), free(no), free(nl);
    }
    return R;
}

static void fref_free(fref *R)
{
    free(R->o), free(R->l), free(R->no), free(R->nl);
}

/* ------------------------------------------------------- library forward */

typedef struct fout {
    toks O, L;
} fout;

static sdpa_status fwd_call(const step *st, const paged *pg, sdpa_isa isa, int threads, fout *out)
{
    sdpa_seqs sq;
    sdpa_problem p = step_problem(st, pg, &sq);
    p.isa = isa;
    p.num_threads = threads;
    out->O = toks_alloc(st->tq, st->c->Hq, st->c->Dv, st->c->pad);
    out->L = toks_alloc(st->tq, st->c->Hq, 1, st->c->pad);
    const sdpa_tensor q = toks_in(&st->Q), k = pg ? pg->k : toks_in(&st->K), v = pg ? pg->v : toks_in(&st->V);
    const sdpa_tensor_out o = toks_out(&out->O), l = toks_out(&out->L);
    return sdpa_forward(&p, &q, &k, &v, &o, &l);
}

static void fout_free(fout *f)
{
    toks_free(&f->O);
    toks_free(&f->L);
}

static int fout_same(const fout *a, const fout *b)
{
    return a->O.n == b->O.n && toks_rows_same(&a->O, 0, &b->O, 0, a->O.n) && toks_rows_same(&a->L, 0, &b->L, 0, a->L.n);
}

/* O and LSE against the reference (FlashAttention rule: 2x the naive fp32 error),
 * gaps and guards untouched. */
static int check_fwd(const char *what, const fref *R, const fout *f)
{
    char w[400];
    float *o = toks_unpack(&f->O), *l = toks_unpack(&f->L);
    int ok = 1;
    snprintf(w, sizeof w, "%s: O", what);
    ok &= util_fa_expect(w, o, R->no, R->o, R->n_o, 2.0);
    ok &= toks_gaps_ok(&f->O, w);
    snprintf(w, sizeof w, "%s: LSE", what);
    ok &= util_fa_expect(w, l, R->nl, R->l, R->n_l, 2.0);
    ok &= toks_gaps_ok(&f->L, w);
    cr_expect(ok, "%s: differs from the float64 reference", what);
    free(o);
    free(l);
    return ok;
}

/* Every ISA, 1 and 2 threads: against the reference, bitwise equal. Keeps the
 * 1-thread outputs of each ISA in keep[isa] when keep is not NULL. */
static void run_all_isas(const char *what, const step *st, const paged *pg, const fref *R, fout *keep)
{
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        char w[300];
        fout f1, f2;
        snprintf(w, sizeof w, "%s [%s, 1 thread]", what, sdpa_isa_name(isas[ii]));
        sdpa_status s = fwd_call(st, pg, isas[ii], 1, &f1);
        cr_assert_eq(s, SDPA_OK, "%s: %s", w, sdpa_status_string(s));
        check_fwd(w, R, &f1);
        snprintf(w, sizeof w, "%s [%s, 2 threads]", what, sdpa_isa_name(isas[ii]));
        s = fwd_call(st, pg, isas[ii], 2, &f2);
        cr_assert_eq(s, SDPA_OK, "%s: %s", w, sdpa_status_string(s));
        cr_expect(fout_same(&f1, &f2), "%s: differs bitwise from 1 thread", w);
        fout_free(&f2);
        if (keep)
            keep[isas[ii]] = f1;
        else
            fout_free(&f1);
    }
}

/* ============================================================ 1. packed */

/* The data of a packed case (seeded by name, fallback) in *s, and its step of all n sequences. */
static step packed_case_step(const char *name, const cfg *c, const spec *sp, int n, uint64_t fallback, seqdata **s)
{
    init_variants();
    util_rng r;
    util_rng_seed(&r, name, fallback);
    *s = seqs_make(c, sp, n, &r);
    return step_first(c, *s, n);
}

static void packed_forward_case(const char *name, const cfg *c, const spec *sp, int n, uint64_t fallback)
{
    seqdata *s;
    step st = packed_case_step(name, c, sp, n, fallback, &s);
    fref R = ref_step_forward(&st);
    run_all_isas(name, &st, NULL, &R, NULL);
    fref_free(&R);
    step_free(&st);
    seqs_free(s, n);
}

#define NSPEC(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Bottom-right causal: 0-query and 0-key sequences, decode rows over long key lists,
 * prefill chunks over a longer prefix, a chunk longer than its keys (its first row
 * sees no key: O = 0, LSE = -inf). */
Test(serving, packed_forward_causal_bottom_right)
{
    const cfg c = {4, 2, 32, 32, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 1};
    const spec sp[] = {{5, 5, 0},   {0, 7, 0},  {3, 0, 0},   {1, red(300), 0}, {70, 130, 0},
                       {1, 1, 0},   {0, 0, 0},  {17, 17, 0}, {2, 1, 0},        {40, red(260), 0}};
    packed_forward_case("serving/packed causal-br", &c, sp, NSPEC(sp), 0x5e41);
}

/* Top-left causal, GQA with 3 query heads per kv head, Dk != Dv, contiguous lists. */
Test(serving, packed_forward_causal_top_left_gqa)
{
    const cfg c = {6, 2, 40, 24, SDPA_CAUSAL_TOP_LEFT, 0, 0, 0, 0, 0, 0};
    const spec sp[] = {{9, 4, 0}, {1, 50, 0}, {33, 33, 0}, {0, 3, 0}, {65, 100, 0}, {4, 0, 0}};
    packed_forward_case("serving/packed causal-tl gqa", &c, sp, NSPEC(sp), 0x5e42);
}

/* Windows: a bottom-right aligned band (no causal), and a causal sliding window. */
Test(serving, packed_forward_windows)
{
    const cfg c = {4, 4, 16, 48, SDPA_CAUSAL_NONE, SDPA_ALIGN_BOTTOM_RIGHT, 1, 7, 2, 0, 1};
    const spec sp[] = {{1, red(200), 0}, {50, 90, 0}, {13, 13, 0}, {3, 0, 0}, {20, 5, 0}};
    packed_forward_case("serving/packed window-br", &c, sp, NSPEC(sp), 0x5e43);
    const cfg c2 = {8, 2, 16, 16, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 1, 16, SDPA_WINDOW_UNBOUNDED, 0, 0};
    const spec sp2[] = {{1, 300, 0}, {64, 200, 0}, {0, 9, 0}, {30, 30, 0}};
    packed_forward_case("serving/packed sliding-causal", &c2, sp2, NSPEC(sp2), 0x5e44);
}

/* The variants: softcap, ALiBi and sinks together (one sink -inf) under a causal
 * window; and softcap + ALiBi without masks. */
Test(serving, packed_forward_variants)
{
    const cfg c = {4, 1, 24, 24, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 1, 31, 0, V_ALL, 1};
    const spec sp[] = {{1, 150, 0}, {0, 0, 0}, {2, 0, 0}, {40, 90, 0}, {7, 7, 0}, {1, 1, 0}};
    packed_forward_case("serving/packed variants", &c, sp, NSPEC(sp), 0x5e45);
    const cfg c2 = {8, 2, 64, 32, SDPA_CAUSAL_NONE, 0, 0, 0, 0, V_CAP | V_ALIBI, 0};
    const spec sp2[] = {{1, red(500), 0}, {30, 30, 0}, {0, 10, 0}, {5, 64, 0}};
    packed_forward_case("serving/packed softcap+alibi", &c2, sp2, NSPEC(sp2), 0x5e46);
}

/* ------------------------------------------------------- packed backward */

typedef struct bout {
    fout f;
    toks dQ, dK, dV;
    float *ds; /* guarded, Hq, or NULL */
} bout;

static void bout_free(bout *b)
{
    fout_free(&b->f);
    toks_free(&b->dQ);
    toks_free(&b->dK);
    toks_free(&b->dV);
    util_gfree(b->ds);
}

static void bwd_call(const step *st, sdpa_isa isa, int threads, bout *out)
{
    const cfg *c = st->c;
    cr_assert_eq(fwd_call(st, NULL, isa, 1, &out->f), SDPA_OK);
    sdpa_seqs sq;
    sdpa_problem p = step_problem(st, NULL, &sq);
    p.isa = isa;
    p.num_threads = threads;
    out->ds = NULL;
    if (c->var & V_SINK) {
        out->ds = util_galloc((size_t)c->Hq);
        p.dsinks = out->ds;
    }
    out->dQ = toks_alloc(st->tq, c->Hq, c->Dk, c->pad);
    out->dK = toks_alloc(st->tk, c->Hkv, c->Dk, c->pad);
    out->dV = toks_alloc(st->tk, c->Hkv, c->Dv, c->pad);
    const sdpa_tensor q = toks_in(&st->Q), k = toks_in(&st->K), v = toks_in(&st->V), o = toks_in(&out->f.O),
                      l = toks_in(&out->f.L), dout = toks_in(&st->DO);
    const sdpa_tensor_out dq = toks_out(&out->dQ), dk = toks_out(&out->dK), dv = toks_out(&out->dV);
    const sdpa_status s = sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv);
    cr_assert_eq(s, SDPA_OK, "backward: %s", sdpa_status_string(s));
}

/* Reference gradients token-major (dq [total_q][Hq][Dk], dk/dv [total_k][Hkv][D]),
 * each sequence's own B = 1 problem; dsinks the sum over the sequences. */
typedef struct bref {
    double *dq, *dk, *dv, *ds;
    float *ndq, *ndk, *ndv, *nds;
} bref;

static void scatter(const step *st, int64_t H, int64_t D, int64_t t0, int64_t T, const double *r, const float *n,
                    double *R, float *N)
{
    (void)st;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t d = 0; d < D; d++) {
                R[((t0 + i) * H + h) * D + d] = r[(h * T + i) * D + d];
                N[((t0 + i) * H + h) * D + d] = n[(h * T + i) * D + d];
            }
}

static bref ref_step_backward(const step *st)
{
    const cfg *c = st->c;
    const int64_t Hq = c->Hq, Hkv = c->Hkv, Dk = c->Dk, Dv = c->Dv;
    bref R;
    R.dq = util_dalloc((size_t)(st->tq * Hq * Dk));
    R.dk = util_dalloc((size_t)(st->tk * Hkv * Dk));
    R.dv = util_dalloc((size_t)(st->tk * Hkv * Dv));
    R.ds = util_dalloc((size_t)Hq);
    R.ndq = util_falloc((size_t)(st->tq * Hq * Dk));
    R.ndk = util_falloc((size_t)(st->tk * Hkv * Dk));
    R.ndv = util_falloc((size_t)(st->tk * Hkv * Dv));
    R.nds = util_falloc((size_t)Hq);
    for (int b = 0; b < st->B; b++) {
        const seqdata *s = st->s[b];
        const int64_t tq = s->tq, tk = s->tk;
        const sdpa_problem sp = base_problem(c, 1, tq, tk);
        double *dq = util_dalloc((size_t)(Hq * tq * Dk)), *dk = util_dalloc((size_t)(Hkv * tk * Dk)),
               *dv = util_dalloc((size_t)(Hkv * tk * Dv)), *ds = util_dalloc((size_t)Hq);
        float *ndq = util_falloc((size_t)(Hq * tq * Dk)), *ndk = util_falloc((size_t)(Hkv * tk * Dk)),
              *ndv = util_falloc((size_t)(Hkv * tk * Dv)), *nds = util_falloc((size_t)Hq);
        ref_backward_dsinks(&sp, s->q, s->k, s->v, s->dout, dq, dk, dv, ds);
        naive32_backward_dsinks(&sp, s->q, s->k, s->v, s->dout, ndq, ndk, ndv, nds);
        scatter(st, Hq, Dk, st->cuq[b], tq, dq, ndq, R.dq, R.ndq);
        scatter(st, Hkv, Dk, st->cuk[b], tk, dk, ndk, R.dk, R.ndk);
        scatter(st, Hkv, Dv, st->cuk[b], tk, dv, ndv, R.dv, R.ndv);
        for (int64_t h = 0; h < Hq; h++) {
            R.ds[h] += ds[h];
            R.nds[h] += nds[h];
        }
        free(dq), free(dk), free(dv), free(ds), free(ndq), free(ndk), free(ndv), free(nds);
    }
    return R;
}

static void bref_free(bref *R)
{
    free(R->dq), free(R->dk), free(R->dv), free(R->ds);
    free(R->ndq), free(R->ndk), free(R->ndv), free(R->nds);
}

static void check_grad(const char *what, const char *name, const toks *t, const float *naive, const double *ref)
{
    char w[400];
    snprintf(w, sizeof w, "%s: %s", what, name);
    float *g = toks_unpack(t);
    cr_expect(util_fa_expect(w, g, naive, ref, (size_t)(t->n * t->H * t->D), 3.0), "%s: off the reference", w);
    cr_expect(toks_gaps_ok(t, w), "%s: gaps or guards written", w);
    free(g);
}

static void packed_backward_case(const char *name, const cfg *c, const spec *sp, int n, uint64_t fallback)
{
    seqdata *s;
    step st = packed_case_step(name, c, sp, n, fallback, &s);
    bref R = ref_step_backward(&st);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        char w[300];
        bout b1, b2;
        snprintf(w, sizeof w, "%s [%s]", name, sdpa_isa_name(isas[ii]));
        bwd_call(&st, isas[ii], 1, &b1);
        check_grad(w, "dQ", &b1.dQ, R.ndq, R.dq);
        check_grad(w, "dK", &b1.dK, R.ndk, R.dk);
        check_grad(w, "dV", &b1.dV, R.ndv, R.dv);
        if (b1.ds) {
            char wd[320];
            snprintf(wd, sizeof wd, "%s: dsinks", w);
            cr_expect(util_fa_expect(wd, b1.ds, R.nds, R.ds, (size_t)c->Hq, 3.0), "%s off the reference", wd);
            cr_expect(util_gintact(b1.ds, wd));
        }
        bwd_call(&st, isas[ii], 2, &b2);
        cr_expect(toks_rows_same(&b1.dQ, 0, &b2.dQ, 0, st.tq) && toks_rows_same(&b1.dK, 0, &b2.dK, 0, st.tk) &&
                      toks_rows_same(&b1.dV, 0, &b2.dV, 0, st.tk) &&
                      (!b1.ds || util_same_bits(b1.ds, b2.ds, (size_t)c->Hq)),
                  "%s: 2 threads differ bitwise from 1", w);
        /* each sequence's gradients = its own dense B = 1 backward, bit for bit */
        for (int b = 0; b < st.B; b++) {
            const seqdata *x = st.s[b];
            sdpa_problem p = base_problem(c, 1, x->tq, x->tk);
            p.isa = isas[ii];
            p.num_threads = 2;
            const int64_t t0 = st.cuq[b], k0 = st.cuk[b];
            const sdpa_tensor q = toks_in_at(&st.Q, t0), k = toks_in_at(&st.K, k0), v = toks_in_at(&st.V, k0),
                              o = toks_in_at(&b1.f.O, t0), l = toks_in_at(&b1.f.L, t0),
                              dout = toks_in_at(&st.DO, t0);
            toks dq = toks_alloc(x->tq, c->Hq, c->Dk, 0), dk = toks_alloc(x->tk, c->Hkv, c->Dk, 0),
                 dv = toks_alloc(x->tk, c->Hkv, c->Dv, 0);
            const sdpa_tensor_out gq = toks_out(&dq), gk = toks_out(&dk), gv = toks_out(&dv);
            cr_assert_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &gq, &gk, &gv), SDPA_OK);
            cr_expect(toks_rows_same(&b1.dQ, t0, &dq, 0, x->tq) && toks_rows_same(&b1.dK, k0, &dk, 0, x->tk) &&
                          toks_rows_same(&b1.dV, k0, &dv, 0, x->tk),
                      "%s: sequence %d differs bitwise from its own dense backward", w, b);
            toks_free(&dq), toks_free(&dk), toks_free(&dv);
        }
        bout_free(&b1);
        bout_free(&b2);
    }
    bref_free(&R);
    step_free(&st);
    seqs_free(s, n);
}

/* Packed documents: 0-query sequences (their keys get dK = dV = 0), 0-key ones
 * (dQ = 0), decode rows, chunks over longer prefixes, a chunk with a keyless row. */
Test(serving, packed_backward_causal_bottom_right, .timeout = 120)
{
    const cfg c = {4, 2, 32, 16, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 1};
    const spec sp[] = {{5, 5, 0}, {0, 7, 0}, {3, 0, 0}, {1, 90, 0}, {40, 70, 0}, {1, 1, 0}, {17, 17, 0}, {2, 1, 0}};
    packed_backward_case("serving/packed backward causal-br", &c, sp, NSPEC(sp), 0xb0c1);
}

/* The variants, dsinks summed over the sequences (a sequence without keys adds
 * nothing), under a top-left causal window. */
Test(serving, packed_backward_variants_dsinks, .timeout = 120)
{
    const cfg c = {4, 2, 24, 24, SDPA_CAUSAL_TOP_LEFT, 0, 1, 9, 0, V_ALL, 0};
    const spec sp[] = {{1, 60, 0}, {0, 0, 0}, {20, 33, 0}, {6, 0, 0}, {12, 12, 0}, {0, 5, 0}};
    packed_backward_case("serving/packed backward variants", &c, sp, NSPEC(sp), 0xb0c2);
}

/* A bottom-right band without causal, MQA, Dk != Dv, strided lists. */
Test(serving, packed_backward_window_mqa, .timeout = 120)
{
    const cfg c = {4, 1, 16, 40, SDPA_CAUSAL_NONE, SDPA_ALIGN_BOTTOM_RIGHT, 1, 5, 3, V_SINK, 1};
    const spec sp[] = {{9, 30, 0}, {1, 1, 0}, {25, 20, 0}, {0, 4, 0}, {3, 0, 0}};
    packed_backward_case("serving/packed backward window mqa", &c, sp, NSPEC(sp), 0xb0c3);
}

/* ============================================================== 2. paged */

/* Decode rows, chunks, a 0-query sequence with keys, a 1-query one without keys;
 * sequences 2, 5 and 8 share a prefix with sequence 0 (8 is that whole prefix: it
 * ends inside a page of sequence 0). */
static const spec paged_specs[] = {{1, 300, 0}, {1, 1, 0},   {6, 250, 200}, {0, 40, 0},    {1, 0, 0},
                                   {37, 100, 100}, {1, 130, 0}, {2, 2, 0},   {24, 170, 170}};

static void paged_case(int64_t bs)
{
    init_variants();
    const cfg c = {4, 2, 32, 24, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 1};
    char who[64];
    snprintf(who, sizeof who, "serving/paged bs=%ld", (long)bs);
    util_rng r;
    util_rng_seed(&r, who, 0x9a9e + (uint64_t)bs);
    const int n = NSPEC(paged_specs);
    seqdata *s = seqs_make(&c, paged_specs, n, &r);
    step st = step_first(&c, s, n);
    fref R = ref_step_forward(&st);
    fout hnd[SDPA_ISA_COUNT];
    memset(hnd, 0, sizeof hnd);
    for (int nhd = 0; nhd < 2; nhd++) {
        paged pg = paged_build(&st, bs, nhd, &r);
        char w[128];
        snprintf(w, sizeof w, "%s %s", who, nhd ? "NHD" : "HND");
        fout got[SDPA_ISA_COUNT];
        memset(got, 0, sizeof got);
        run_all_isas(w, &st, &pg, &R, got);
        cr_expect(util_gintact(pg.kc, "K cache") && util_gintact(pg.vc, "V cache"), "%s: cache guards written", w);
        for (int i = 0; i < SDPA_ISA_COUNT; i++) {
            if (!got[i].O.buf)
                continue;
            if (!nhd) {
                hnd[i] = got[i];
                continue;
            }
            cr_expect(fout_same(&hnd[i], &got[i]), "%s [%s]: NHD differs bitwise from HND", w,
                      sdpa_isa_name((sdpa_isa)i));
            fout_free(&hnd[i]);
            fout_free(&got[i]);
        }
        paged_free(&pg);
    }
    fref_free(&R);
    step_free(&st);
    seqs_free(s, n);
}

Test(serving, paged_block_size_1, .timeout = 120)
{
    paged_case(1);
}

Test(serving, paged_block_size_3, .timeout = 120)
{
    paged_case(3);
}

Test(serving, paged_block_size_16, .timeout = 120)
{
    paged_case(16);
}

Test(serving, paged_block_size_64, .timeout = 120)
{
    paged_case(64);
}

/* The page ids do not change the bits: each sequence's own pages in order (as a
 * fresh allocator hands them out, so that an NHD cache's pages form one stretch of
 * memory; shared prefix pages stay shared) against the same pages shuffled, for
 * block sizes 3, 16 and 64, on every ISA, 1 and 2 threads. (Reading such stretches
 * as one run instead of one per page was tried and measured no faster:
 * docs/perf-notes.md.) */
Test(serving, paged_consecutive_pages_same_bits_as_shuffled, .timeout = 120)
{
    init_variants();
    const cfg c = {4, 2, 32, 24, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0};
    const int64_t sizes[] = {3, 16, 64};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        util_rng r;
        util_rng_seed(&r, "serving/paged in order", 0x51 + (uint64_t)z);
        const int n = NSPEC(paged_specs);
        seqdata *s = seqs_make(&c, paged_specs, n, &r);
        step st = step_first(&c, s, n);
        /* NHD [num_blocks, block_size, Hkv, D]: a page's stride is a page of rows, so
         * pages that follow on are one stretch (HND's are not: other heads between) */
        paged shuffled = paged_build_ex(&st, sizes[z], 1, 0, &r), ordered = paged_build_ex(&st, sizes[z], 1, 1, &r);
        sdpa_isa isas[SDPA_ISA_COUNT];
        const int nisa = util_isas(isas);
        for (int ii = 0; ii < nisa; ii++)
            for (int th = 1; th <= 2; th++) {
                fout a, b;
                cr_assert_eq(fwd_call(&st, &shuffled, isas[ii], th, &a), SDPA_OK);
                cr_assert_eq(fwd_call(&st, &ordered, isas[ii], th, &b), SDPA_OK);
                cr_expect(fout_same(&a, &b), "[%s] block size %lld, %d threads: consecutive pages differ from shuffled",
                          sdpa_isa_name(isas[ii]), (long long)sizes[z], th);
                fout_free(&a);
                fout_free(&b);
            }
        paged_free(&shuffled);
        paged_free(&ordered);
        step_free(&st);
        seqs_free(s, n);
    }
}

/* Table entries past a sequence's last page are never read: the same call with
 * every such entry changed (to other garbage, and to valid page ids) gives the
 * same bits. */
Test(serving, paged_entries_past_the_last_page_do_not_matter)
{
    init_variants();
    const cfg c = {4, 2, 32, 24, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0};
    util_rng r;
    util_rng_seed(&r, "serving/paged garbage", 0x6a4b);
    const int n = NSPEC(paged_specs);
    seqdata *s = seqs_make(&c, paged_specs, n, &r);
    step st = step_first(&c, s, n);
    paged pg = paged_build(&st, 16, 0, &r);
    fout a, b;
    cr_assert_eq(fwd_call(&st, &pg, SDPA_ISA_AUTO, 2, &a), SDPA_OK);
    const int32_t other[3] = {-1000000, INT32_MAX - 1, 0};
    for (int k = 0; k < 3; k++) {
        for (int x = 0; x < n; x++)
            for (int64_t j = (st.s[x]->tk + 15) / 16; j < pg.maxb; j++)
                pg.table[x * pg.maxb + j] = k == 2 ? (int32_t)((x + j) % pg.nb) : other[k];
        cr_assert_eq(fwd_call(&st, &pg, SDPA_ISA_AUTO, 2, &b), SDPA_OK);
        cr_expect(fout_same(&a, &b), "table entries past the last page changed the bits (%d)", k);
        fout_free(&b);
    }
    fout_free(&a);
    paged_free(&pg);
    step_free(&st);
    seqs_free(s, n);
}

/* ========================================================= 3. mixed step */

/* 14 sequences: decode rows over key lists spread 5..1300 (the long ones split
 * their keys), 96- and 128-row prefill chunks over 300- and 200-key prefixes, a
 * fresh 60-token prefill, a 0-query sequence, and two that share sequence 0's
 * prefix (one of them a 16-row chunk). */
static int mixed_specs(spec *sp)
{
    const spec base[] = {{1, 1300, 0}, {1, 37, 0},  {96, 396, 0}, {1, 700, 0},  {1, 1000, 0},
                         {1, 513, 0},  {60, 60, 0}, {1, 64, 0},   {128, 328, 0}, {0, 80, 0},
                         {1, 256, 0},  {1, 900, 512}, {16, 1040, 1024}, {1, 5, 0}};
    const int n = NSPEC(base);
    for (int i = 0; i < n; i++) {
        sp[i] = base[i];
        if (reduced()) {
            sp[i].tk = red(sp[i].tk);
            if (sp[i].tk < sp[i].tq)
                sp[i].tk = sp[i].tq;
            if (sp[i].share > sp[i].tk)
                sp[i].share = sp[i].tk;
        }
    }
    if (reduced()) /* the shared prefixes stay within sequence 0 */
        for (int i = 1; i < n; i++)
            if (sp[i].share > sp[0].tk)
                sp[i].share = sp[0].tk;
    return n;
}

static const cfg mixed_cfg = {4, 2, 64, 64, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 0};
/* The invariance checks add a causal sliding window of 600 keys: it limits the
 * long sequences, and is wider than the short ones (their own plans drop it). */
static const cfg mixed_win_cfg = {4, 2, 64, 64, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 1, 600, 0, 0, 0};

/* The step against the reference, packed and paged (block size 16), every ISA,
 * 1 and 2 threads. */
Test(serving, mixed_step_against_the_reference, .timeout = 180)
{
    init_variants();
    spec sp[32];
    const int n = mixed_specs(sp);
    util_rng r;
    util_rng_seed(&r, "serving/mixed", 0x313d);
    seqdata *s = seqs_make(&mixed_cfg, sp, n, &r);
    step st = step_first(&mixed_cfg, s, n);
    fref R = ref_step_forward(&st);
    run_all_isas("serving/mixed packed", &st, NULL, &R, NULL);
    paged pg = paged_build(&st, 16, 0, &r);
    run_all_isas("serving/mixed paged bs=16", &st, &pg, &R, NULL);
    cr_expect(util_gintact(pg.kc, "K cache") && util_gintact(pg.vc, "V cache"));
    paged_free(&pg);
    fref_free(&R);
    step_free(&st);
    seqs_free(s, n);
}

/* Sequence b of step `in` (its index in s: sb) has the bits of sequence `ref_b` of
 * the reference outputs. */
static int rows_match(const step *in, const fout *fin, int b, const step *ref, const fout *fref_, int rb)
{
    const int64_t tq = in->s[b]->tq;
    return toks_rows_same(&fin->O, in->cuq[b], &fref_->O, ref->cuq[rb], tq) &&
           toks_rows_same(&fin->L, in->cuq[b], &fref_->L, ref->cuq[rb], tq);
}

/* Batch invariance: every sequence of the mixed step gives the same bits alone
 * (a B = 1 call with seqs), in the reversed batch with two more neighbours, in a
 * batch of every other sequence, with 1, 2 and 3 threads; packed, also as a dense
 * sdpa_forward call of its own over the same token lists (the library runs every
 * sequence as its own problem); paged, with its pages placed anew in each call.
 * Under a causal sliding window (mixed_win_cfg). */
static void invariance(int paged_kv)
{
    init_variants();
    spec sp[32];
    const int n = mixed_specs(sp);
    spec all[34];
    memcpy(all, sp, sizeof(spec) * (size_t)n);
    const spec extra[2] = {{1, 777, 0}, {50, 150, 0}}; /* neighbours only in the reversed batch */
    all[n] = extra[0];
    all[n + 1] = extra[1];
    util_rng r;
    util_rng_seed(&r, paged_kv ? "serving/invariance paged" : "serving/invariance packed", 0x1a7 + (uint64_t)paged_kv);
    const cfg *c = &mixed_win_cfg;
    seqdata *s = seqs_make(c, all, n + 2, &r);
    step M = step_first(c, s, n);
    int rev[64], nrev = 0;
    rev[nrev++] = n; /* a new neighbour first */
    for (int i = n - 1; i >= 0; i--) {
        rev[nrev++] = i;
        if (i == n / 2)
            rev[nrev++] = n + 1;
    }
    step Rv = step_of(c, s, rev, nrev);
    int half[64], nhalf = 0;
    for (int i = 1; i < n; i += 2)
        half[nhalf++] = i;
    step Hf = step_of(c, s, half, nhalf);
    paged pM, pR, pH;
    memset(&pM, 0, sizeof pM), memset(&pR, 0, sizeof pR), memset(&pH, 0, sizeof pH);
    if (paged_kv) {
        pM = paged_build(&M, 16, 0, &r);
        pR = paged_build(&Rv, 16, 1, &r); /* also the other cache layout */
        pH = paged_build(&Hf, 16, 0, &r);
    }
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        const sdpa_isa isa = isas[ii];
        const char *in = sdpa_isa_name(isa);
        fout fm, fr, fh;
        cr_assert_eq(fwd_call(&M, paged_kv ? &pM : NULL, isa, 2, &fm), SDPA_OK);
        cr_assert_eq(fwd_call(&Rv, paged_kv ? &pR : NULL, isa, 1, &fr), SDPA_OK);
        cr_assert_eq(fwd_call(&Hf, paged_kv ? &pH : NULL, isa, 3, &fh), SDPA_OK);
        for (int j = 0; j < nrev; j++)
            if (rev[j] < n)
                cr_expect(rows_match(&Rv, &fr, j, &M, &fm, rev[j]),
                          "[%s] sequence %d: reversed batch with other neighbours, 1 thread, differs bitwise", in,
                          rev[j]);
        for (int j = 0; j < nhalf; j++)
            cr_expect(rows_match(&Hf, &fh, j, &M, &fm, half[j]),
                      "[%s] sequence %d: every-other batch, 3 threads, differs bitwise", in, half[j]);
        for (int b = 0; b < n; b++) {
            const seqdata *one[1] = {&s[b]};
            step A = step_build(c, one, 1);
            fout fa;
            if (paged_kv) {
                paged pA = paged_build(&A, 16, 0, &r);
                cr_assert_eq(fwd_call(&A, &pA, isa, 1 + b % 2, &fa), SDPA_OK);
                paged_free(&pA);
            } else {
                cr_assert_eq(fwd_call(&A, NULL, isa, 1 + b % 2, &fa), SDPA_OK);
            }
            cr_expect(rows_match(&A, &fa, 0, &M, &fm, b), "[%s] sequence %d alone differs bitwise from the batch",
                      in, b);
            fout_free(&fa);
            if (!paged_kv) { /* dense B = 1 over offset views of the batch's token lists */
                sdpa_problem p = base_problem(c, 1, s[b].tq, s[b].tk);
                p.isa = isa;
                p.num_threads = 2;
                const sdpa_tensor q = toks_in_at(&M.Q, M.cuq[b]), k = toks_in_at(&M.K, M.cuk[b]),
                                  v = toks_in_at(&M.V, M.cuk[b]);
                toks o = toks_alloc(s[b].tq, c->Hq, c->Dv, 0), l = toks_alloc(s[b].tq, c->Hq, 1, 0);
                const sdpa_tensor_out to = toks_out(&o), tl = toks_out(&l);
                cr_assert_eq(sdpa_forward(&p, &q, &k, &v, &to, &tl), SDPA_OK);
                cr_expect(toks_rows_same(&o, 0, &fm.O, M.cuq[b], s[b].tq) &&
                              toks_rows_same(&l, 0, &fm.L, M.cuq[b], s[b].tq),
                          "[%s] sequence %d: the dense sdpa_forward of it differs bitwise from the packed call", in,
                          b);
                toks_free(&o), toks_free(&l);
            }
            step_free(&A);
        }
        fout_free(&fm), fout_free(&fr), fout_free(&fh);
    }
    if (paged_kv) {
        paged_free(&pM), paged_free(&pR), paged_free(&pH);
    }
    step_free(&M), step_free(&Rv), step_free(&Hf);
    seqs_free(s, n + 2);
}

Test(serving, batch_invariance_packed, .timeout = 180)
{
    invariance(0);
}

Test(serving, batch_invariance_paged, .timeout = 180)
{
    invariance(1);
}

/* ========================================================= 4. bad input */

/* A small valid call to break: 3 sequences, packed and paged (block size 16). */
typedef struct small {
    cfg c;
    seqdata *s;
    step st;
    paged pg;
} small;

static const spec small_specs[] = {{1, 17, 0}, {2, 40, 0}, {3, 5, 0}};

static void small_make(small *x)
{
    init_variants();
    const cfg c = {2, 1, 8, 8, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, 0, 1};
    x->c = c;
    util_rng r;
    util_rng_init(&r, 0xbad);
    x->s = seqs_make(&x->c, small_specs, 3, &r);
    int idx[3] = {0, 1, 2};
    x->st = step_of(&x->c, x->s, idx, 3);
    x->pg = paged_build(&x->st, 16, 0, &r);
}

static void small_free(small *x)
{
    paged_free(&x->pg);
    step_free(&x->st);
    seqs_free(x->s, 3);
}

/* The call with problem p on fresh (sentinel) outputs: status `want`, and O, LSE
 * never written; the workspace query agrees where it sees the descriptor alone. */
static void expect_refused(const char *what, const small *x, const sdpa_problem *p, int paged_kv, sdpa_status want)
{
    toks O = toks_alloc(x->st.tq + 4, x->c.Hq, x->c.Dv, 1), L = toks_alloc(x->st.tq + 4, x->c.Hq, 1, 1);
    const sdpa_tensor q = toks_in(&x->st.Q), k = paged_kv ? x->pg.k : toks_in(&x->st.K),
                      v = paged_kv ? x->pg.v : toks_in(&x->st.V);
    const sdpa_tensor_out o = toks_out(&O), l = toks_out(&L);
    const sdpa_status s = sdpa_forward(p, &q, &k, &v, &o, &l);
    cr_expect_eq(s, want, "%s: got %d (%s), want %d (%s)", what, s, sdpa_status_string(s), want,
                 sdpa_status_string(want));
    if (want != SDPA_OK || p->q_len == 0)
        cr_expect(toks_untouched(&O) && toks_untouched(&L), "%s: refused, but the outputs were written", what);
    size_t bytes = 0;
    if (want != SDPA_OK && want != SDPA_ERR_ALIASING) {
        const sdpa_status ws = sdpa_forward_workspace_size(p, &bytes);
        cr_expect_eq(ws, want, "%s: the workspace query says %s", what, sdpa_status_string(ws));
    }
    toks_free(&O);
    toks_free(&L);
}

/* One side's cu_seqlens (*cu of p's seqs, whose total is *len): a first entry
 * other than 0 (bad_start), a decreasing one (decr), and a last entry below and
 * above *len are each refused with SDPA_ERR_BAD_SEQLENS; *cu and *len are restored. */
static void expect_bad_cu(const small *x, const sdpa_problem *p, const int32_t **cu, int64_t *len, char side,
                          const char *len_name, const int32_t bad_start[4], const int32_t decr[4])
{
    const int32_t *good = *cu;
    const int64_t good_len = *len;
    int32_t buf[4];
    char w[64];
    memcpy(buf, bad_start, sizeof buf);
    *cu = buf;
    snprintf(w, sizeof w, "cu_seqlens_%c[0] = %d", side, (int)bad_start[0]);
    expect_refused(w, x, p, 0, SDPA_ERR_BAD_SEQLENS);
    memcpy(buf, decr, sizeof buf);
    snprintf(w, sizeof w, "cu_seqlens_%c decreasing", side);
    expect_refused(w, x, p, 0, SDPA_ERR_BAD_SEQLENS);
    *cu = good;
    *len = good_len + 1;
    snprintf(w, sizeof w, "cu_seqlens_%c[B] < %s", side, len_name);
    expect_refused(w, x, p, 0, SDPA_ERR_BAD_SEQLENS);
    *len = good_len - 1;
    snprintf(w, sizeof w, "cu_seqlens_%c[B] > %s", side, len_name);
    expect_refused(w, x, p, 0, SDPA_ERR_BAD_SEQLENS);
    *len = good_len;
}

/* A bool mask, then an additive bias, set on p (with seqs, and pages when
 * paged_kv) are each refused with SDPA_ERR_UNSUPPORTED ("... with <with>"). */
static void expect_element_masks_refused(const small *x, sdpa_problem *p, int paged_kv, const char *with)
{
    static const uint8_t ones[64] = {1};
    static const float zeros[64] = {0};
    char w[64];
    p->bool_mask.data = ones;
    snprintf(w, sizeof w, "bool_mask with %s", with);
    expect_refused(w, x, p, paged_kv, SDPA_ERR_UNSUPPORTED);
    p->bool_mask.data = NULL;
    p->bias.data = zeros;
    snprintf(w, sizeof w, "bias with %s", with);
    expect_refused(w, x, p, paged_kv, SDPA_ERR_UNSUPPORTED);
    p->bias.data = NULL;
}

Test(serving, bad_cu_seqlens)
{
    small x;
    small_make(&x);
    sdpa_seqs sq;
    sdpa_problem p0 = step_problem(&x.st, NULL, &sq); /* cuq {0,1,3,6}, cuk {0,17,57,62} */
    expect_refused("valid packed call", &x, &p0, 0, SDPA_OK);
    sdpa_problem p = p0;
    sdpa_seqs b = sq;
    p.seqs = &b;
    /* cu_seqlens_q */
    const int32_t q_start1[4] = {1, 2, 4, 6}, q_decr[4] = {0, 3, 1, 6};
    expect_bad_cu(&x, &p, &b.cu_seqlens_q, &p.q_len, 'q', "q_len", q_start1, q_decr);
    /* cu_seqlens_k */
    const int32_t k_start[4] = {5, 17, 57, 62}, k_decr[4] = {0, 40, 30, 62};
    expect_bad_cu(&x, &p, &b.cu_seqlens_k, &p.kv_len, 'k', "kv_len", k_start, k_decr);
    /* NULL cu_seqlens_q */
    b.cu_seqlens_q = NULL;
    expect_refused("cu_seqlens_q NULL", &x, &p, 0, SDPA_ERR_NULL_ARGUMENT);
    b.cu_seqlens_q = x.st.cuq;
    /* both packed and paged keys: refused, whatever the status */
    b.block_table = x.pg.table;
    {
        toks O = toks_alloc(x.st.tq, x.c.Hq, x.c.Dv, 0), L = toks_alloc(x.st.tq, x.c.Hq, 1, 0);
        const sdpa_tensor q = toks_in(&x.st.Q), k = toks_in(&x.st.K), v = toks_in(&x.st.V);
        const sdpa_tensor_out o = toks_out(&O), l = toks_out(&L);
        cr_expect_neq(sdpa_forward(&p, &q, &k, &v, &o, &l), SDPA_OK, "cu_seqlens_k with a block table accepted");
        cr_expect(toks_untouched(&O) && toks_untouched(&L));
        toks_free(&O), toks_free(&L);
    }
    b.block_table = NULL;
    /* the element masks and kv_lengths are not taken with seqs */
    const int32_t kvl[3] = {1, 1, 1};
    p.kv_lengths = kvl;
    expect_refused("kv_lengths with seqs", &x, &p, 0, SDPA_ERR_UNSUPPORTED);
    p.kv_lengths = NULL;
    expect_element_masks_refused(&x, &p, 0, "seqs");
    /* no sequences at all: nothing to do, nothing written */
    const int32_t zero[1] = {0};
    sdpa_seqs e = {zero, zero, NULL, 0, NULL, 0, 0};
    sdpa_problem pe = base_problem(&x.c, 0, 0, 0);
    pe.seqs = &e;
    expect_refused("B = 0", &x, &pe, 0, SDPA_OK);
    small_free(&x);
}

Test(serving, bad_block_table)
{
    small x;
    small_make(&x);
    sdpa_seqs sq;
    sdpa_problem p0 = step_problem(&x.st, &x.pg, &sq);
    expect_refused("valid paged call", &x, &p0, 1, SDPA_OK);
    sdpa_problem p = p0;
    sdpa_seqs b = sq;
    p.seqs = &b;
    const int64_t M = x.pg.maxb, nb = x.pg.nb;
    int32_t *t = malloc(sizeof(int32_t) * (size_t)(3 * M)), lens[3];
    memcpy(t, x.pg.table, sizeof(int32_t) * (size_t)(3 * M));
    memcpy(lens, x.pg.lens, sizeof lens);
    b.block_table = t;
    b.seq_lens_k = lens;
    /* sequence 0 has 17 keys: pages 0 and 1 (one key in page 1) */
    const int32_t bad_ids[4] = {-1, (int32_t)nb, INT32_MAX, INT32_MIN};
    for (int i = 0; i < 4; i++) {
        char w[96];
        t[1] = bad_ids[i];
        snprintf(w, sizeof w, "the last, part-used page of sequence 0 = %ld", (long)bad_ids[i]);
        expect_refused(w, &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
        t[0] = bad_ids[i];
        t[1] = x.pg.table[1];
        snprintf(w, sizeof w, "the first page of sequence 0 = %ld", (long)bad_ids[i]);
        expect_refused(w, &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
        t[0] = x.pg.table[0];
        t[2 * M] = bad_ids[i]; /* sequence 2 (5 keys): its only page */
        snprintf(w, sizeof w, "the page of sequence 2 = %ld", (long)bad_ids[i]);
        expect_refused(w, &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
        t[2 * M] = x.pg.table[2 * M];
    }
    t[1] = (int32_t)(nb - 1); /* the largest valid id */
    expect_refused("page id num_blocks - 1", &x, &p, 1, SDPA_OK);
    t[1] = x.pg.table[1];
    /* seq_lens_k */
    lens[1] = -1;
    expect_refused("seq_lens_k = -1", &x, &p, 1, SDPA_ERR_BAD_SEQLENS);
    lens[1] = (int32_t)(M * 16 + 1);
    expect_refused("seq_lens_k = max_blocks_per_seq * block_size + 1", &x, &p, 1, SDPA_ERR_BAD_SEQLENS);
    for (int64_t j = 0; j < M; j++)
        t[M + j] = (int32_t)(j % nb); /* every page of the row valid */
    lens[1] = (int32_t)(M * 16);
    expect_refused("seq_lens_k = max_blocks_per_seq * block_size", &x, &p, 1, SDPA_OK);
    memcpy(t, x.pg.table, sizeof(int32_t) * (size_t)(3 * M));
    lens[1] = x.pg.lens[1];
    /* sizes */
    b.block_size = 0;
    expect_refused("block_size = 0", &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
    b.block_size = -16;
    expect_refused("block_size = -16", &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
    b.block_size = 16;
    b.max_blocks_per_seq = -1;
    expect_refused("max_blocks_per_seq = -1", &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
    b.max_blocks_per_seq = M;
    b.num_blocks = -1;
    expect_refused("num_blocks = -1", &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
    b.num_blocks = 2; /* the table uses ids up to nb - 1 */
    expect_refused("num_blocks smaller than the ids used", &x, &p, 1, SDPA_ERR_BAD_BLOCK_TABLE);
    b.num_blocks = nb;
    /* kv_len must be 0 with pages */
    p.kv_len = 62;
    expect_refused("kv_len != 0 with a paged cache", &x, &p, 1, SDPA_ERR_BAD_SEQLENS);
    p.kv_len = 0;
    /* NULL tables */
    b.block_table = NULL;
    expect_refused("block_table NULL", &x, &p, 1, SDPA_ERR_NULL_ARGUMENT);
    b.block_table = t;
    b.seq_lens_k = NULL;
    expect_refused("seq_lens_k NULL", &x, &p, 1, SDPA_ERR_NULL_ARGUMENT);
    b.seq_lens_k = lens;
    b.cu_seqlens_q = NULL;
    expect_refused("cu_seqlens_q NULL (paged)", &x, &p, 1, SDPA_ERR_NULL_ARGUMENT);
    b.cu_seqlens_q = x.st.cuq;
    /* arrays (and the struct) ending past the top of the address space: garbage
     * pointers, refused before they are read (session 32 review: a SEGV) */
    b.block_table = (const int32_t *)(UINTPTR_MAX - 7);
    expect_refused("block_table ending past the top of memory", &x, &p, 1, SDPA_ERR_SIZE_OVERFLOW);
    b.block_table = t;
    b.seq_lens_k = (const int32_t *)(UINTPTR_MAX - 3);
    expect_refused("seq_lens_k ending past the top of memory", &x, &p, 1, SDPA_ERR_SIZE_OVERFLOW);
    b.seq_lens_k = lens;
    b.cu_seqlens_q = (const int32_t *)(UINTPTR_MAX - 7);
    expect_refused("cu_seqlens_q ending past the top of memory", &x, &p, 1, SDPA_ERR_SIZE_OVERFLOW);
    b.cu_seqlens_q = x.st.cuq;
    p.seqs = (const sdpa_seqs *)(UINTPTR_MAX - 15);
    expect_refused("the seqs struct ending past the top of memory", &x, &p, 1, SDPA_ERR_SIZE_OVERFLOW);
    p.seqs = &b;
    /* element masks with pages */
    expect_element_masks_refused(&x, &p, 1, "pages");
    expect_refused("restored", &x, &p, 1, SDPA_OK);
    free(t);
    small_free(&x);
}

/* kv_lengths with seqs is SDPA_ERR_UNSUPPORTED (sdpa.h), whatever its values. With
 * a paged cache kv_len is 0, so any key length is also "larger than kv_len", and
 * the descriptor's kv_lengths check runs first: the call gets BAD_KV_LENGTH, which
 * tells a caller to fix lengths that are not the problem (likewise with packed K/V
 * and a kv_lengths entry above kv_len). Found with this suite; fails on f4bd79a. */
Test(serving, bug_kv_lengths_with_seqs_is_unsupported_whatever_its_values)
{
    small x;
    small_make(&x);
    sdpa_seqs sq;
    sdpa_problem p = step_problem(&x.st, &x.pg, &sq);
    const int32_t kvl[3] = {1, 1, 1};
    p.kv_lengths = kvl;
    expect_refused("kv_lengths {1, 1, 1} with pages (kv_len 0)", &x, &p, 1, SDPA_ERR_UNSUPPORTED);
    const int32_t zero[3] = {0, 0, 0};
    p.kv_lengths = zero;
    expect_refused("kv_lengths {0, 0, 0} with pages", &x, &p, 1, SDPA_ERR_UNSUPPORTED);
    sdpa_seqs sk;
    sdpa_problem pk = step_problem(&x.st, NULL, &sk);
    const int32_t big[3] = {1000, 1, 1};
    pk.kv_lengths = big;
    expect_refused("kv_lengths {1000, 1, 1} with packed K/V", &x, &pk, 0, SDPA_ERR_UNSUPPORTED);
    small_free(&x);
}

/* An output inside a cache, a packed K/V list or the other output: ALIASING,
 * nothing written (the caches keep their bits). */
Test(serving, aliased_outputs)
{
    small x;
    small_make(&x);
    const size_t nk = util_glen(x.pg.kc), nv = util_glen(x.pg.vc);
    float *kcopy = util_gdup(x.pg.kc, nk), *vcopy = util_gdup(x.pg.vc, nv);
    sdpa_seqs sq;
    sdpa_problem p = step_problem(&x.st, &x.pg, &sq);
    const sdpa_tensor q = toks_in(&x.st.Q);
    toks O = toks_alloc(x.st.tq, x.c.Hq, x.c.Dv, 1), L = toks_alloc(x.st.tq, x.c.Hq, 1, 1);
    sdpa_tensor_out o = toks_out(&O), l = toks_out(&L);
    /* O in the K cache (its second page) */
    sdpa_tensor_out oa = o;
    oa.data = x.pg.kc + x.pg.k.batch_stride;
    cr_expect_eq(sdpa_forward(&p, &q, &x.pg.k, &x.pg.v, &oa, &l), SDPA_ERR_ALIASING, "O in the K cache");
    /* LSE in the V cache */
    sdpa_tensor_out la = l;
    la.data = x.pg.vc + 3;
    cr_expect_eq(sdpa_forward(&p, &q, &x.pg.k, &x.pg.v, &o, &la), SDPA_ERR_ALIASING, "LSE in the V cache");
    /* O over the last page's slots past every sequence's keys: still the cache */
    oa.data = x.pg.kc + (x.pg.nb - 2) * x.pg.k.batch_stride;
    cr_expect_eq(sdpa_forward(&p, &q, &x.pg.k, &x.pg.v, &oa, &l), SDPA_ERR_ALIASING, "O in an unused page");
    cr_expect(util_same_bits(kcopy, x.pg.kc, nk) && util_same_bits(vcopy, x.pg.vc, nv), "a cache was written");
    cr_expect(util_gintact(x.pg.kc, "K cache") && util_gintact(x.pg.vc, "V cache"));
    cr_expect(toks_untouched(&O) && toks_untouched(&L), "outputs written by a refused call");
    /* packed: O inside the K token list */
    sdpa_seqs sp;
    sdpa_problem pp = step_problem(&x.st, NULL, &sp);
    const sdpa_tensor k = toks_in(&x.st.K), v = toks_in(&x.st.V);
    oa = o;
    oa.data = x.st.K.buf + x.st.K.st;
    cr_expect_eq(sdpa_forward(&pp, &q, &k, &v, &oa, &l), SDPA_ERR_ALIASING, "O in the packed K list");
    /* LSE inside O */
    la = l;
    la.data = O.buf + 1;
    cr_expect_eq(sdpa_forward(&pp, &q, &k, &v, &o, &la), SDPA_ERR_ALIASING, "LSE inside O");
    cr_expect(toks_untouched(&O) && toks_untouched(&L), "outputs written by a refused call");
    toks_free(&O), toks_free(&L);
    util_gfree(kcopy), util_gfree(vcopy);
    small_free(&x);
}

/* The backward: a paged cache is refused (UNSUPPORTED), and so are bad lengths,
 * element masks and aliased gradients; the gradients stay untouched. */
Test(serving, bad_backward)
{
    small x;
    small_make(&x);
    sdpa_seqs sq;
    sdpa_problem p = step_problem(&x.st, NULL, &sq);
    fout f;
    cr_assert_eq(fwd_call(&x.st, NULL, SDPA_ISA_AUTO, 1, &f), SDPA_OK);
    toks dQ = toks_alloc(x.st.tq, x.c.Hq, x.c.Dk, 1), dK = toks_alloc(x.st.tk, x.c.Hkv, x.c.Dk, 1),
         dV = toks_alloc(x.st.tk, x.c.Hkv, x.c.Dv, 1);
    const sdpa_tensor q = toks_in(&x.st.Q), k = toks_in(&x.st.K), v = toks_in(&x.st.V), o = toks_in(&f.O),
                      l = toks_in(&f.L), dout = toks_in(&x.st.DO);
    const sdpa_tensor_out dq = toks_out(&dQ), dk = toks_out(&dK), dv = toks_out(&dV);
#define UNTOUCHED() (toks_untouched(&dQ) && toks_untouched(&dK) && toks_untouched(&dV))
    /* paged backward */
    sdpa_seqs sg;
    sdpa_problem pg = step_problem(&x.st, &x.pg, &sg);
    toks dKc = toks_alloc(x.pg.nb * 16, x.c.Hkv, x.c.Dk, 0), dVc = toks_alloc(x.pg.nb * 16, x.c.Hkv, x.c.Dv, 0);
    const sdpa_tensor_out dkc = {dKc.buf, x.pg.k.batch_stride, x.pg.k.head_stride, x.pg.k.seq_stride},
                          dvc = {dVc.buf, x.pg.v.batch_stride, x.pg.v.head_stride, x.pg.v.seq_stride};
    cr_expect_eq(sdpa_backward(&pg, &q, &x.pg.k, &x.pg.v, &o, &l, &dout, &dq, &dkc, &dvc), SDPA_ERR_UNSUPPORTED,
                 "paged backward");
    cr_expect(toks_untouched(&dQ) && toks_untouched(&dKc) && toks_untouched(&dVc), "paged backward wrote");
    size_t bytes = 123;
    cr_expect_eq(sdpa_backward_workspace_size(&pg, &bytes), SDPA_ERR_UNSUPPORTED,
                 "the size query of a paged backward (it said OK and a size before, session 30)");
    cr_expect_eq(bytes, 123, "a refused size query wrote its size");
    toks_free(&dKc), toks_free(&dVc);
    /* bad cu_seqlens */
    sdpa_seqs b = sq;
    p.seqs = &b;
    const int32_t decr[4] = {0, 3, 1, 6};
    b.cu_seqlens_q = decr;
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv), SDPA_ERR_BAD_SEQLENS);
    b.cu_seqlens_q = x.st.cuq;
    p.kv_len = x.st.tk - 1;
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv), SDPA_ERR_BAD_SEQLENS);
    p.kv_len = x.st.tk;
    b.cu_seqlens_q = NULL;
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv), SDPA_ERR_NULL_ARGUMENT);
    b.cu_seqlens_q = x.st.cuq;
    const float zeros[64] = {0};
    p.bias.data = zeros;
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv), SDPA_ERR_UNSUPPORTED);
    p.bias.data = NULL;
    /* dK inside the packed V list */
    sdpa_tensor_out dka = dk;
    dka.data = x.st.V.buf;
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dka, &dv), SDPA_ERR_ALIASING);
    cr_expect(UNTOUCHED(), "a refused backward wrote its gradients");
    /* and the valid call */
    cr_expect_eq(sdpa_backward(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv), SDPA_OK);
#undef UNTOUCHED
    toks_free(&dQ), toks_free(&dK), toks_free(&dV);
    fout_free(&f);
    small_free(&x);
}

/* ================================================ 5. caller-owned workspace */

/* sdpa_forward_with_workspace on a mixed paged step (a misaligned workspace of
 * exactly the queried size): the bits of sdpa_forward; one byte less is refused
 * with nothing written. The packed backward likewise. */
Test(serving, workspace_mixed_paged_step, .timeout = 120)
{
    init_variants();
    const cfg c = {8, 2, 64, 64, SDPA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0, V_SINK, 1};
    const spec sp[] = {{1, 1200, 0}, {1, 40, 0}, {64, 264, 0}, {0, 30, 0}, {1, 600, 512}, {30, 30, 0}};
    const int n = NSPEC(sp);
    util_rng r;
    util_rng_seed(&r, "serving/workspace", 0x3a5c);
    seqdata *s = seqs_make(&c, sp, n, &r);
    int idx[8] = {0, 1, 2, 3, 4, 5};
    step st = step_of(&c, s, idx, n);
    paged pg = paged_build(&st, 16, 1, &r);
    sdpa_isa isas[SDPA_ISA_COUNT];
    const int ni = util_isas(isas);
    for (int ii = 0; ii < ni; ii++) {
        for (int threads = 1; threads <= 2; threads++) {
            const char *in = sdpa_isa_name(isas[ii]);
            fout a;
            cr_assert_eq(fwd_call(&st, &pg, isas[ii], threads, &a), SDPA_OK);
            sdpa_seqs sq;
            sdpa_problem p = step_problem(&st, &pg, &sq);
            p.isa = isas[ii];
            p.num_threads = threads;
            size_t bytes = 0;
            cr_assert_eq(sdpa_forward_workspace_size(&p, &bytes), SDPA_OK);
            cr_assert(bytes > 0);
            char *ws = malloc(bytes + 3);
            fout b;
            b.O = toks_alloc(st.tq, c.Hq, c.Dv, c.pad);
            b.L = toks_alloc(st.tq, c.Hq, 1, c.pad);
            const sdpa_tensor q = toks_in(&st.Q);
            const sdpa_tensor_out o = toks_out(&b.O), l = toks_out(&b.L);
            cr_expect_eq(sdpa_forward_with_workspace(&p, &q, &pg.k, &pg.v, &o, &l, ws + 3, bytes - 1),
                         SDPA_ERR_WORKSPACE_TOO_SMALL, "[%s] one byte less", in);
            cr_expect(toks_untouched(&b.O) && toks_untouched(&b.L), "[%s] a refused call wrote", in);
            cr_assert_eq(sdpa_forward_with_workspace(&p, &q, &pg.k, &pg.v, &o, &l, ws + 3, bytes), SDPA_OK);
            cr_expect(fout_same(&a, &b), "[%s, %d threads] the caller's workspace changes the bits", in, threads);
            cr_expect(toks_gaps_ok(&b.O, "O") && toks_gaps_ok(&b.L, "LSE"));
            free(ws);
            fout_free(&a), fout_free(&b);
        }
    }
    /* packed backward with dsinks */
    bout b1;
    bwd_call(&st, SDPA_ISA_AUTO, 2, &b1);
    sdpa_seqs sq;
    sdpa_problem p = step_problem(&st, NULL, &sq);
    p.num_threads = 2;
    float *ds = util_galloc((size_t)c.Hq);
    p.dsinks = ds;
    size_t bytes = 0;
    cr_assert_eq(sdpa_backward_workspace_size(&p, &bytes), SDPA_OK);
    char *ws = malloc(bytes + 1);
    toks dQ = toks_alloc(st.tq, c.Hq, c.Dk, c.pad), dK = toks_alloc(st.tk, c.Hkv, c.Dk, c.pad),
         dV = toks_alloc(st.tk, c.Hkv, c.Dv, c.pad);
    const sdpa_tensor q = toks_in(&st.Q), k = toks_in(&st.K), v = toks_in(&st.V), o = toks_in(&b1.f.O),
                      l = toks_in(&b1.f.L), dout = toks_in(&st.DO);
    const sdpa_tensor_out dq = toks_out(&dQ), dk = toks_out(&dK), dv = toks_out(&dV);
    cr_expect_eq(sdpa_backward_with_workspace(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv, ws + 1, bytes - 1),
                 SDPA_ERR_WORKSPACE_TOO_SMALL);
    cr_expect(toks_untouched(&dQ) && toks_untouched(&dK) && toks_untouched(&dV) && util_is_sentinel(ds[0]));
    cr_assert_eq(sdpa_backward_with_workspace(&p, &q, &k, &v, &o, &l, &dout, &dq, &dk, &dv, ws + 1, bytes), SDPA_OK);
    cr_expect(toks_rows_same(&dQ, 0, &b1.dQ, 0, st.tq) && toks_rows_same(&dK, 0, &b1.dK, 0, st.tk) &&
                  toks_rows_same(&dV, 0, &b1.dV, 0, st.tk) && util_same_bits(ds, b1.ds, (size_t)c.Hq),
              "backward: the caller's workspace changes the bits");
    free(ws);
    util_gfree(ds);
    toks_free(&dQ), toks_free(&dK), toks_free(&dV);
    bout_free(&b1);
    paged_free(&pg);
    step_free(&st);
    seqs_free(s, n);
}

/* ======================== 6. operands inside outputs, workspaces over operands */

/* A two-sequence step small enough to place its operands by hand: H = 1, D = 4,
 * Q 8 tokens (4 + 4), packed K/V of 8 tokens, or a paged cache of 2 pages of 4. */
enum { OP_D = 4, OP_T = 8, OP_PAGE = 4 };

typedef struct op_step {
    float q[OP_T * OP_D], k[OP_T * OP_D], v[OP_T * OP_D], o[OP_T * OP_D], lse[OP_T], dout[OP_T * OP_D];
    sdpa_seqs s;
    sdpa_problem p;
} op_step;

static void op_make(op_step *x, int paged, const int32_t *cu_q, const int32_t *cu_k, const int32_t *table,
                    const int32_t *lens)
{
    for (int i = 0; i < OP_T * OP_D; i++) {
        x->q[i] = 0.1f * (float)(i % 7);
        x->k[i] = 0.2f * (float)(i % 5);
        x->v[i] = 1.0f + (float)(i % 3);
        x->dout[i] = 0.5f;
    }
    memset(&x->s, 0, sizeof x->s);
    x->s.cu_seqlens_q = cu_q;
    if (paged) {
        x->s.block_table = table;
        x->s.max_blocks_per_seq = 1;
        x->s.seq_lens_k = lens;
        x->s.block_size = OP_PAGE;
        x->s.num_blocks = 2;
    } else {
        x->s.cu_seqlens_k = cu_k;
    }
    sdpa_problem_init(&x->p);
    x->p.batch = 2;
    x->p.q_heads = x->p.kv_heads = 1;
    x->p.q_len = OP_T;
    x->p.kv_len = paged ? 0 : OP_T;
    x->p.head_dim_qk = x->p.head_dim_v = OP_D;
    x->p.num_threads = 1;
    x->p.seqs = &x->s;
}

static sdpa_status op_forward(op_step *x, int paged, float *o, float *lse, void *ws, size_t ws_bytes)
{
    const sdpa_tensor q = {x->q, 0, OP_D, OP_D};
    const sdpa_tensor k = {x->k, paged ? OP_PAGE * OP_D : 0, paged ? OP_PAGE * OP_D : OP_D, OP_D};
    const sdpa_tensor v = {x->v, k.batch_stride, k.head_stride, OP_D};
    const sdpa_tensor_out to = {o, 0, OP_D, OP_D}, tl = {lse, 0, 1, 1};
    return ws ? sdpa_forward_with_workspace(&x->p, &q, &k, &v, &to, &tl, ws, ws_bytes)
              : sdpa_forward(&x->p, &q, &k, &v, &to, &tl);
}

static sdpa_status op_backward(op_step *x, float *dq, float *dk, float *dv, void *ws, size_t ws_bytes)
{
    const sdpa_tensor q = {x->q, 0, OP_D, OP_D}, k = {x->k, 0, OP_D, OP_D}, v = {x->v, 0, OP_D, OP_D},
                      o = {x->o, 0, OP_D, OP_D}, l = {x->lse, 0, 1, 1}, dout = {x->dout, 0, OP_D, OP_D};
    const sdpa_tensor_out tdq = {dq, 0, OP_D, OP_D}, tdk = {dk, 0, OP_D, OP_D}, tdv = {dv, 0, OP_D, OP_D};
    return ws ? sdpa_backward_with_workspace(&x->p, &q, &k, &v, &o, &l, &dout, &tdq, &tdk, &tdv, ws, ws_bytes)
              : sdpa_backward(&x->p, &q, &k, &v, &o, &l, &dout, &tdq, &tdk, &tdv);
}

static void op_fill_sentinel(float *buf, int n)
{
    for (int i = 0; i < n; i++)
        buf[i] = util_sentinel();
}

/* buf[0..n) holds the sentinel except the int32 words [at, at + words), which hold w */
static int op_only_operand(const float *buf, int n, int at, int words, const int32_t *w)
{
    for (int i = 0; i < n; i++) {
        if (i >= at && i < at + words) {
            int32_t x;
            memcpy(&x, buf + i, sizeof x);
            if (x != w[i - at])
                return 0;
        } else if (!util_is_sentinel(buf[i])) {
            return 0;
        }
    }
    return 1;
}

/* Regression (found by an adversarial review, session 29): the sequence arrays and the
 * sdpa_seqs struct were not in the aliasing check, so an output over them was accepted
 * and rewrote them mid-call: a block table inside O sent the forward to a page id made
 * of float bits (a wild read), cu_seqlens_q inside dQ sent the backward out of bounds. */
Test(serving, sequence_operands_inside_outputs_are_refused)
{
    static const int32_t cu[3] = {0, 4, OP_T}, table[2] = {0, 1}, lens[2] = {4, 4};
    enum { N = OP_T * OP_D, AT = 5 };
    float *o = util_galloc(N), *lse = util_galloc(OP_T), *g = util_galloc(3 * N);
    op_step x;
    /* controls: the same operands elsewhere are accepted */
    op_make(&x, 1, cu, NULL, table, lens);
    cr_assert_eq(op_forward(&x, 1, o, lse, NULL, 0), SDPA_OK, "paged control");
    op_make(&x, 0, cu, cu, NULL, NULL);
    cr_assert_eq(op_forward(&x, 0, x.o, x.lse, NULL, 0), SDPA_OK, "packed control");
    cr_assert_eq(op_backward(&x, g, g + N, g + 2 * N, NULL, 0), SDPA_OK, "packed backward control");
    struct {
        const char *what;
        int paged, which; /* which: 0 cu_seqlens_q, 1 cu_seqlens_k, 2 block_table, 3 seq_lens_k, 4 the struct */
    } cases[] = {
        {"block_table inside O", 1, 2}, {"seq_lens_k inside O", 1, 3},  {"cu_seqlens_q inside O (paged)", 1, 0},
        {"cu_seqlens_q inside O", 0, 0}, {"cu_seqlens_k inside O", 0, 1}, {"the sdpa_seqs struct inside O", 1, 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        op_fill_sentinel(o, N);
        op_fill_sentinel(lse, OP_T);
        op_make(&x, cases[c].paged, cu, cu, table, lens);
        const int32_t *src = cases[c].which == 2 ? table : cases[c].which == 3 ? lens : cu;
        const int words = cases[c].which >= 2 ? 2 : 3;
        if (cases[c].which == 4) {
            const sdpa_seqs s = x.s;
            /* float index AT + 1 of a 16-byte-aligned buffer: 8-byte aligned for the struct's pointers */
            memcpy(o + AT + 1, &s, sizeof s);
            x.p.seqs = (const sdpa_seqs *)(void *)(o + AT + 1);
            const size_t fl = (sizeof s + sizeof(float) - 1) / sizeof(float);
            float keep[16];
            cr_assert(fl <= 16);
            memcpy(keep, o + AT + 1, fl * sizeof(float));
            cr_expect_eq(op_forward(&x, 1, o, lse, NULL, 0), SDPA_ERR_ALIASING, "%s", cases[c].what);
            cr_expect(memcmp(keep, o + AT + 1, fl * sizeof(float)) == 0, "%s: the struct was written", cases[c].what);
            cr_expect(util_gintact(o, "O"));
            continue;
        }
        memcpy(o + AT, src, (size_t)words * sizeof(int32_t));
        const int32_t *in_o = (const int32_t *)(void *)(o + AT);
        if (cases[c].which == 0)
            x.s.cu_seqlens_q = in_o;
        else if (cases[c].which == 1)
            x.s.cu_seqlens_k = in_o;
        else if (cases[c].which == 2)
            x.s.block_table = in_o;
        else
            x.s.seq_lens_k = in_o;
        cr_expect_eq(op_forward(&x, cases[c].paged, o, lse, NULL, 0), SDPA_ERR_ALIASING, "%s", cases[c].what);
        cr_expect(op_only_operand(o, N, AT, words, src), "%s: O written by a refused call", cases[c].what);
        cr_expect(util_is_sentinel(lse[0]) && util_is_sentinel(lse[OP_T - 1]), "%s: LSE written", cases[c].what);
    }
    /* the packed backward: cu_seqlens_q inside dQ, cu_seqlens_k inside dK */
    for (int side = 0; side < 2; side++) {
        op_make(&x, 0, cu, cu, NULL, NULL);
        cr_assert_eq(op_forward(&x, 0, x.o, x.lse, NULL, 0), SDPA_OK);
        op_fill_sentinel(g, 3 * N);
        float *host = g + side * N;
        memcpy(host + AT, cu, sizeof cu);
        if (side == 0)
            x.s.cu_seqlens_q = (const int32_t *)(void *)(host + AT);
        else
            x.s.cu_seqlens_k = (const int32_t *)(void *)(host + AT);
        cr_expect_eq(op_backward(&x, g, g + N, g + 2 * N, NULL, 0), SDPA_ERR_ALIASING, "cu_seqlens_%c inside d%c",
                     side ? 'k' : 'q', side ? 'K' : 'Q');
        cr_expect(op_only_operand(host, N, AT, 3, cu) && op_only_operand(g + (1 - side) * N, N, 0, 0, NULL) &&
                      op_only_operand(g + 2 * N, N, 0, 0, NULL),
                  "backward: a gradient written by a refused call");
    }
    util_gfree(o), util_gfree(lse), util_gfree(g);
}

/* Regression (session 29): a caller's workspace over the call's own tensors or
 * operands was accepted; the call then overwrote its inputs and returned a wrong O.
 * Now SDPA_ERR_ALIASING, nothing written; a workspace beside them is fine. */
Test(serving, workspace_over_tensors_or_operands_is_refused)
{
    static const int32_t cu[3] = {0, 4, OP_T}, lens[2] = {4, 4};
    enum { N = OP_T * OP_D };
    op_step x;
    int32_t *table = (int32_t *)util_galloc(64);
    table[0] = 0, table[1] = 1;
    op_make(&x, 1, cu, NULL, table, lens);
    size_t bytes = 0;
    cr_assert_eq(sdpa_forward_workspace_size(&x.p, &bytes), SDPA_OK);
    cr_assert(bytes > 0);
    char *arena = malloc(bytes + 64 * sizeof(float));
    cr_assert_not_null(arena);
    float *o = util_galloc(N), *lse = util_galloc(OP_T);
    float qkeep[N];
    memcpy(qkeep, x.q, sizeof qkeep);
    /* the workspace over Q, over the block table, over O (an output) */
    cr_expect_eq(op_forward(&x, 1, o, lse, x.q, bytes), SDPA_ERR_ALIASING, "workspace over Q");
    cr_expect(memcmp(qkeep, x.q, sizeof qkeep) == 0, "Q written");
    cr_expect_eq(op_forward(&x, 1, o, lse, table, bytes), SDPA_ERR_ALIASING, "workspace over the block table");
    cr_expect(table[0] == 0 && table[1] == 1, "the block table written");
    cr_expect_eq(op_forward(&x, 1, o, lse, (char *)o + 4, bytes), SDPA_ERR_ALIASING, "workspace over O");
    cr_expect(util_gintact(o, "O") && util_gintact(lse, "LSE"));
    for (int i = 0; i < N; i++)
        cr_expect(util_is_sentinel(o[i]), "O[%d] written by a refused call", i);
    /* beside everything: accepted, the bits of the call without a workspace */
    float *o2 = util_galloc(N), *lse2 = util_galloc(OP_T);
    cr_expect_eq(op_forward(&x, 1, o2, lse2, arena, bytes), SDPA_OK);
    cr_expect_eq(op_forward(&x, 1, o, lse, NULL, 0), SDPA_OK);
    cr_expect(util_same_bits(o, o2, N) && util_same_bits(lse, lse2, OP_T));
    /* the backward: a workspace over dO or over dK */
    op_make(&x, 0, cu, cu, NULL, NULL);
    cr_assert_eq(op_forward(&x, 0, x.o, x.lse, NULL, 0), SDPA_OK);
    cr_assert_eq(sdpa_backward_workspace_size(&x.p, &bytes), SDPA_OK);
    float *g = util_galloc(3 * N);
    char *bws = malloc(bytes);
    cr_assert_not_null(bws);
    cr_expect_eq(op_backward(&x, g, g + N, g + 2 * N, x.dout, bytes), SDPA_ERR_ALIASING, "workspace over dO");
    cr_expect_eq(op_backward(&x, g, g + N, g + 2 * N, g + N + 3, bytes), SDPA_ERR_ALIASING, "workspace over dK");
    for (int i = 0; i < 3 * N; i++)
        cr_expect(util_is_sentinel(g[i]), "gradient %d written by a refused call", i);
    cr_expect_eq(op_backward(&x, g, g + N, g + 2 * N, bws, bytes), SDPA_OK);
    free(bws), free(arena);
    util_gfree(g), util_gfree(o), util_gfree(lse), util_gfree(o2), util_gfree(lse2), util_gfree((float *)table);
}

/* A block table is read only up to the entries a sequence uses (the header's "table
 * entries past a sequence's last page are never read"): a row length far beyond what
 * the caller allocated is legal when the sequences use few pages. The wrap-around check
 * added in session 32 first bounded the whole [B, max_blocks_per_seq] table and refused
 * B = 1, max_blocks_per_seq = 2^61 with one page used (a review caught it). */
Test(serving, block_table_bounded_by_the_pages_used)
{
    enum { HQ = 2, HKV = 1, D = 8, NB = 2, BS = 1 };
    float kc[NB * HKV * BS * D], vc[NB * HKV * BS * D], q[HQ * D], o[HQ * D], o2[HQ * D];
    for (int i = 0; i < NB * HKV * BS * D; i++)
        kc[i] = 0.01f * (float)(i % 13), vc[i] = 0.02f * (float)(i % 7) - 0.05f;
    for (int i = 0; i < HQ * D; i++)
        q[i] = 0.03f * (float)i;
    const int32_t cuq[2] = {0, 1}, lens[1] = {1}, table[1] = {1};
    sdpa_seqs sq = {0};
    sq.cu_seqlens_q = cuq;
    sq.block_table = table;
    sq.seq_lens_k = lens;
    sq.block_size = BS;
    sq.num_blocks = NB;
    sdpa_problem p;
    sdpa_problem_init(&p);
    p.batch = 1, p.q_heads = HQ, p.kv_heads = HKV, p.q_len = 1, p.kv_len = 0;
    p.head_dim_qk = p.head_dim_v = D, p.num_threads = 1, p.seqs = &sq;
    const sdpa_tensor tq = {q, 0, D, HQ * D}, tk = {kc, HKV * BS * D, BS * D, D}, tv = {vc, HKV * BS * D, BS * D, D};
    const sdpa_tensor_out to = {o, 0, D, HQ * D}, to2 = {o2, 0, D, HQ * D};
    sq.max_blocks_per_seq = 1;
    cr_assert_eq(sdpa_forward(&p, &tq, &tk, &tv, &to2, NULL), SDPA_OK);
    const int64_t rows[3] = {(int64_t)1 << 40, (int64_t)1 << 61, (int64_t)1 << 62};
    for (int i = 0; i < 3; i++) {
        sq.max_blocks_per_seq = rows[i];
        memset(o, 0, sizeof o);
        const sdpa_status st = sdpa_forward(&p, &tq, &tk, &tv, &to, NULL);
        cr_expect_eq(st, SDPA_OK, "max_blocks_per_seq 2^%d: %s", i == 0 ? 40 : i == 1 ? 61 : 62,
                     sdpa_status_string(st));
        cr_expect(memcmp(o, o2, sizeof o) == 0, "max_blocks_per_seq 2^%d: another result", i == 0 ? 40 : 61 + i - 1);
    }
}
