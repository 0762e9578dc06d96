/* SPDX-License-Identifier: MIT */
/* examples/train_char_attention.c - trains a one-layer causal self-attention
 * character model in plain C; the attention goes through sdpa_forward() and
 * sdpa_backward(), everything else (embeddings, projections, cross-entropy,
 * backprop, Adam) is written out by hand below.
 *
 * Model, for a batch of B sequences of T characters (N = B*T rows, C = H*D):
 *     x      = tok_emb[c_t] + pos_emb[t]                    [N, C]
 *     q,k,v  = x Wq, x Wk, x Wv                             [N, C] = [B, T, H, D]
 *     a      = causal multi-head attention(q, k, v)         [N, C]  (libsdpa)
 *     y      = x + a Wo                                     [N, C]  (residual)
 *     logits = y Wlm + blm                                  [N, V]
 *     loss   = mean cross-entropy(logits, next character)
 * The [N, C] buffers are handed to libsdpa as [B, H, T, D] strided views
 * (batch stride T*C, head stride D, row stride C), so no transposes are needed.
 *
 * Usage: train_char_attention [options] [textfile]
 *   (default text: /usr/share/common-licenses/GPL-3; --help lists the options)
 *   --gradcheck compares the hand-written gradients (the sdpa_backward path
 *   included) with central finite differences on a tiny model and exits. */
#if !defined(_GNU_SOURCE) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#endif
#include <sdpa.h>

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#define OMP_FOR _Pragma("omp parallel for schedule(static)")
#define OMP_FOR_SUM_LOSS _Pragma("omp parallel for schedule(static) reduction(+ : loss)")
#else
#define OMP_FOR
#define OMP_FOR_SUM_LOSS
#endif

#define DEFAULT_TEXT "/usr/share/common-licenses/GPL-3"

/* ------------------------------------------------------------------ options */

typedef struct options {
    const char *path;
    int steps, seq, batch, heads, head_dim, threads, eval_every, gen_len;
    double lr, time_limit, temperature;
    uint64_t seed;
    int gradcheck;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: train_char_attention [options] [textfile]\n"
            "  textfile            training text (default " DEFAULT_TEXT ")\n"
            "  --steps N           maximum optimizer steps (default 3000)\n"
            "  --seq T             sequence length (default 64)\n"
            "  --batch B           sequences per batch (default 16)\n"
            "  --heads H           attention heads (default 4)\n"
            "  --head-dim D        head_dim; d_model = H*D (default 32)\n"
            "  --lr X              Adam learning rate (default 0.006)\n"
            "  --threads N         OpenMP threads, 0 = OpenMP default (default 0)\n"
            "  --seed S            random seed (default 1)\n"
            "  --time-limit S      stop training after S seconds of wall time (default 50)\n"
            "  --eval-every N      print losses every N steps (default 25)\n"
            "  --gen N             characters to sample at the end (default 300)\n"
            "  --temperature X     sampling temperature, 0 = greedy (default 0.8)\n"
            "  --gradcheck         finite-difference check of the gradients, then exit\n");
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.path = DEFAULT_TEXT, .steps = 3000, .seq = 64, .batch = 16, .heads = 4,
                   .head_dim = 32, .threads = 0, .eval_every = 25, .gen_len = 300,
                   .lr = 6e-3, .time_limit = 50.0, .temperature = 0.8, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        long l;
        double d;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--gradcheck")) {
            o->gradcheck = 1;
        } else if (a[0] == '-' && a[1] == '-' && i + 1 < argc) {
            const char *v = argv[++i];
            int bad = 0;
            if (!strcmp(a, "--steps"))
                bad = parse_long(v, 0, 100000000, &l), o->steps = (int)l;
            else if (!strcmp(a, "--seq"))
                bad = parse_long(v, 2, 4096, &l), o->seq = (int)l;
            else if (!strcmp(a, "--batch"))
                bad = parse_long(v, 1, 4096, &l), o->batch = (int)l;
            else if (!strcmp(a, "--heads"))
                bad = parse_long(v, 1, 64, &l), o->heads = (int)l;
            else if (!strcmp(a, "--head-dim"))
                bad = parse_long(v, 1, 256, &l), o->head_dim = (int)l;
            else if (!strcmp(a, "--threads"))
                bad = parse_long(v, 0, 1024, &l), o->threads = (int)l;
            else if (!strcmp(a, "--seed"))
                bad = parse_long(v, 0, 2147483647, &l), o->seed = (uint64_t)l;
            else if (!strcmp(a, "--eval-every"))
                bad = parse_long(v, 1, 100000000, &l), o->eval_every = (int)l;
            else if (!strcmp(a, "--gen"))
                bad = parse_long(v, 0, 1000000, &l), o->gen_len = (int)l;
            else if (!strcmp(a, "--lr"))
                bad = parse_double(v, 0.0, 10.0, &d), o->lr = d;
            else if (!strcmp(a, "--time-limit"))
                bad = parse_double(v, 0.0, 1e9, &d), o->time_limit = d;
            else if (!strcmp(a, "--temperature"))
                bad = parse_double(v, 0.0, 100.0, &d), o->temperature = d;
            else {
                fprintf(stderr, "unknown option %s\n", a);
                return -1;
            }
            if (bad) {
                fprintf(stderr, "bad value for %s: %s\n", a, v);
                return -1;
            }
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "unknown option or missing value: %s\n", a);
            return -1;
        } else {
            o->path = a;
        }
    }
    return 0;
}

/* --------------------------------------------------------------- utilities */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* splitmix64: small, seedable, good enough for initialization and sampling. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *s) /* in [0, 1) */
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

static double rng_normal(uint64_t *s)
{
    double u1 = rng_uniform(s), u2 = rng_uniform(s);
    return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);
}

static long rng_below(uint64_t *s, long n) /* in [0, n) */
{
    return (long)(rng_uniform(s) * (double)n);
}

/* ----------------------------------------------------- dense matrix helpers
 * Row-major, float. Each output element is accumulated in a fixed order, so
 * results do not depend on the thread count. */

/* out[M,N] (=|+=) A[M,K] W[K,N] */
static void mm_nn(int M, int K, int N, const float *A, const float *W, float *out, int accumulate)
{
    OMP_FOR
    for (int i = 0; i < M; i++) {
        float *o = out + (size_t)i * N;
        const float *ai = A + (size_t)i * K;
        if (!accumulate)
            memset(o, 0, (size_t)N * sizeof(float));
        for (int kk = 0; kk < K; kk++) {
            const float s = ai[kk];
            const float *w = W + (size_t)kk * N;
            for (int j = 0; j < N; j++)
                o[j] += s * w[j];
        }
    }
}

/* dW[K,N] += A[M,K]^T D[M,N]: blocked so that a block of D stays in cache
 * while a thread walks its rows of dW. */
static void mm_tn_acc(int M, int K, int N, const float *A, const float *D, float *dW)
{
    enum { KB = 8, IB = 64 };
    OMP_FOR
    for (int kb = 0; kb < K; kb += KB) {
        const int kend = kb + KB < K ? kb + KB : K;
        for (int i0 = 0; i0 < M; i0 += IB) {
            const int iend = i0 + IB < M ? i0 + IB : M;
            for (int kk = kb; kk < kend; kk++) {
                float *g = dW + (size_t)kk * N;
                for (int i = i0; i < iend; i++) {
                    const float s = A[(size_t)i * K + kk];
                    const float *d = D + (size_t)i * N;
                    for (int j = 0; j < N; j++)
                        g[j] += s * d[j];
                }
            }
        }
    }
}

/* out[N,K] = W[K,N]^T */
static void transpose(int K, int N, const float *W, float *out)
{
    for (int kk = 0; kk < K; kk++)
        for (int j = 0; j < N; j++)
            out[(size_t)j * K + kk] = W[(size_t)kk * N + j];
}

/* ------------------------------------------------------------------- model */

enum { P_TOK, P_POS, P_WQ, P_WK, P_WV, P_WO, P_WLM, P_BLM, NPARAM };
static const char *const param_names[NPARAM] = {"tok_emb", "pos_emb", "Wq", "Wk",
                                                "Wv",      "Wo",      "Wlm", "blm"};

typedef struct param {
    float *w, *g, *m, *v; /* weights, gradient, Adam moments */
    size_t n;
} param;

typedef struct model {
    int V, T, C, H, D; /* vocabulary, max sequence, d_model, heads, head_dim */
    param p[NPARAM];
} model;

/* Activations and their gradients for up to Bmax sequences of T rows. */
typedef struct acts {
    int Bmax;
    float *x, *q, *k, *v, *att, *lse, *y, *probs;
    float *dy, *datt, *dq, *dk, *dv, *dx, *wt;
} acts;

static void model_init(model *m, int V, int T, int H, int D, double emb_std, double lm_std,
                       uint64_t *rng)
{
    m->V = V, m->T = T, m->H = H, m->D = D, m->C = H * D;
    const size_t C = (size_t)m->C;
    const size_t sizes[NPARAM] = {(size_t)V * C, (size_t)T * C, C * C, C * C,
                                  C * C,         C * C,         C * (size_t)V, (size_t)V};
    const double proj_std = 1.0 / sqrt((double)C);
    const double stds[NPARAM] = {emb_std, emb_std, proj_std, proj_std,
                                 proj_std, proj_std, lm_std,  0.0};
    for (int i = 0; i < NPARAM; i++) {
        param *p = &m->p[i];
        p->n = sizes[i];
        p->w = xcalloc(p->n, sizeof(float));
        p->g = xcalloc(p->n, sizeof(float));
        p->m = xcalloc(p->n, sizeof(float));
        p->v = xcalloc(p->n, sizeof(float));
        for (size_t j = 0; j < p->n; j++)
            p->w[j] = (float)(stds[i] * rng_normal(rng));
    }
}

static void model_free(model *m)
{
    for (int i = 0; i < NPARAM; i++) {
        free(m->p[i].w), free(m->p[i].g), free(m->p[i].m), free(m->p[i].v);
    }
}

static size_t model_param_count(const model *m)
{
    size_t n = 0;
    for (int i = 0; i < NPARAM; i++)
        n += m->p[i].n;
    return n;
}

static void acts_init(acts *a, const model *m, int Bmax)
{
    const size_t NC = (size_t)Bmax * m->T * m->C;
    const size_t NV = (size_t)Bmax * m->T * m->V;
    a->Bmax = Bmax;
    a->x = xcalloc(NC, sizeof(float));
    a->q = xcalloc(NC, sizeof(float));
    a->k = xcalloc(NC, sizeof(float));
    a->v = xcalloc(NC, sizeof(float));
    a->att = xcalloc(NC, sizeof(float));
    a->lse = xcalloc((size_t)Bmax * m->H * m->T, sizeof(float));
    a->y = xcalloc(NC, sizeof(float));
    a->probs = xcalloc(NV, sizeof(float));
    a->dy = xcalloc(NC, sizeof(float));
    a->datt = xcalloc(NC, sizeof(float));
    a->dq = xcalloc(NC, sizeof(float));
    a->dk = xcalloc(NC, sizeof(float));
    a->dv = xcalloc(NC, sizeof(float));
    a->dx = xcalloc(NC, sizeof(float));
    const size_t wt = (size_t)m->C * (m->C > m->V ? m->C : m->V);
    a->wt = xcalloc(wt, sizeof(float));
}

static void acts_free(acts *a)
{
    float *bufs[] = {a->x,  a->q,    a->k,  a->v,  a->att, a->lse, a->y,  a->probs,
                     a->dy, a->datt, a->dq, a->dk, a->dv,  a->dx,  a->wt};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
}

/* The attention problem: B sequences of L rows, H heads of head_dim D, causal. */
static void attention_problem(const model *m, int B, int L, int threads, sdpa_problem *pb)
{
    sdpa_problem_init(pb);
    pb->batch = B;
    pb->q_heads = pb->kv_heads = m->H;
    pb->q_len = pb->kv_len = L;
    pb->head_dim_qk = pb->head_dim_v = m->D;
    pb->causal = SDPA_CAUSAL_TOP_LEFT; /* query t sees keys 0..t */
    pb->num_threads = threads;
}

/* A [N, C] row-major buffer seen as [B, H, L, D]. */
static sdpa_tensor view_in(const model *m, const float *data, int L)
{
    return (sdpa_tensor){data, (int64_t)L * m->C, m->D, m->C};
}

static sdpa_tensor_out view_out(const model *m, float *data, int L)
{
    return (sdpa_tensor_out){data, (int64_t)L * m->C, m->D, m->C};
}

static void check_status(sdpa_status st, const char *what)
{
    if (st != SDPA_OK) {
        fprintf(stderr, "%s failed: %s\n", what, sdpa_status_string(st));
        exit(1);
    }
}

/* Forward pass over B sequences of L tokens (tok[B*L]). If tgt is not NULL,
 * returns the summed cross-entropy (nats) over the B*L rows, else 0. Leaves
 * the softmax probabilities in a->probs. */
static double forward(const model *m, acts *a, int B, int L, const int *tok, const int *tgt,
                      int threads)
{
    const int N = B * L, C = m->C, V = m->V;
    const float *tok_emb = m->p[P_TOK].w, *pos_emb = m->p[P_POS].w;

    for (int n = 0; n < N; n++) {
        const float *e = tok_emb + (size_t)tok[n] * C, *pe = pos_emb + (size_t)(n % L) * C;
        float *x = a->x + (size_t)n * C;
        for (int c = 0; c < C; c++)
            x[c] = e[c] + pe[c];
    }
    mm_nn(N, C, C, a->x, m->p[P_WQ].w, a->q, 0);
    mm_nn(N, C, C, a->x, m->p[P_WK].w, a->k, 0);
    mm_nn(N, C, C, a->x, m->p[P_WV].w, a->v, 0);

    sdpa_problem pb;
    attention_problem(m, B, L, threads, &pb);
    const sdpa_tensor q = view_in(m, a->q, L), k = view_in(m, a->k, L), v = view_in(m, a->v, L);
    const sdpa_tensor_out o = view_out(m, a->att, L);
    const sdpa_tensor_out lse = {a->lse, (int64_t)m->H * L, L, 1};
    check_status(sdpa_forward(&pb, &q, &k, &v, &o, &lse), "sdpa_forward");

    memcpy(a->y, a->x, (size_t)N * C * sizeof(float)); /* residual */
    mm_nn(N, C, C, a->att, m->p[P_WO].w, a->y, 1);
    mm_nn(N, C, V, a->y, m->p[P_WLM].w, a->probs, 0);

    const float *blm = m->p[P_BLM].w;
    double loss = 0.0;
    OMP_FOR_SUM_LOSS
    for (int n = 0; n < N; n++) {
        float *row = a->probs + (size_t)n * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) {
            row[j] += blm[j];
            mx = row[j] > mx ? row[j] : mx;
        }
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)row[j] - mx);
        if (tgt)
            loss += log(sum) + mx - row[tgt[n]];
        for (int j = 0; j < V; j++)
            row[j] = (float)(exp((double)row[j] - mx) / sum);
    }
    return loss;
}

/* Backward pass for the last forward(); adds d(mean loss)/dw to every p.g. */
static void backward(const model *m, acts *a, int B, int L, const int *tok, const int *tgt,
                     int threads)
{
    const int N = B * L, C = m->C, V = m->V;
    const float inv_n = 1.0f / (float)N;

    /* d logits = (softmax - onehot) / N, in place */
    float *dlogits = a->probs;
    for (int n = 0; n < N; n++) {
        float *row = dlogits + (size_t)n * V;
        row[tgt[n]] -= 1.0f;
        for (int j = 0; j < V; j++)
            row[j] *= inv_n;
    }
    /* logits = y Wlm + blm */
    float *gb = m->p[P_BLM].g;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < V; j++)
            gb[j] += dlogits[(size_t)n * V + j];
    mm_tn_acc(N, C, V, a->y, dlogits, m->p[P_WLM].g);
    transpose(C, V, m->p[P_WLM].w, a->wt);
    mm_nn(N, V, C, dlogits, a->wt, a->dy, 0);

    /* y = x + att Wo */
    memcpy(a->dx, a->dy, (size_t)N * C * sizeof(float));
    mm_tn_acc(N, C, C, a->att, a->dy, m->p[P_WO].g);
    transpose(C, C, m->p[P_WO].w, a->wt);
    mm_nn(N, C, C, a->dy, a->wt, a->datt, 0);

    /* att = attention(q, k, v) */
    sdpa_problem pb;
    attention_problem(m, B, L, threads, &pb);
    const sdpa_tensor q = view_in(m, a->q, L), k = view_in(m, a->k, L), v = view_in(m, a->v, L);
    const sdpa_tensor o = view_in(m, a->att, L), dout = view_in(m, a->datt, L);
    const sdpa_tensor lse = {a->lse, (int64_t)m->H * L, L, 1};
    const sdpa_tensor_out dq = view_out(m, a->dq, L), dk = view_out(m, a->dk, L),
                          dv = view_out(m, a->dv, L);
    check_status(sdpa_backward(&pb, &q, &k, &v, &o, &lse, &dout, &dq, &dk, &dv), "sdpa_backward");

    /* q, k, v = x Wq, x Wk, x Wv */
    const float *dqkv[3] = {a->dq, a->dk, a->dv};
    for (int i = 0; i < 3; i++) {
        mm_tn_acc(N, C, C, a->x, dqkv[i], m->p[P_WQ + i].g);
        transpose(C, C, m->p[P_WQ + i].w, a->wt);
        mm_nn(N, C, C, dqkv[i], a->wt, a->dx, 1);
    }

    /* x = tok_emb[tok] + pos_emb[t] */
    float *gt = m->p[P_TOK].g, *gp = m->p[P_POS].g;
    for (int n = 0; n < N; n++) {
        const float *dx = a->dx + (size_t)n * C;
        float *et = gt + (size_t)tok[n] * C, *ep = gp + (size_t)(n % L) * C;
        for (int c = 0; c < C; c++) {
            et[c] += dx[c];
            ep[c] += dx[c];
        }
    }
}

static void zero_grads(model *m)
{
    for (int i = 0; i < NPARAM; i++)
        memset(m->p[i].g, 0, m->p[i].n * sizeof(float));
}

static void adam_step(model *m, double lr, int t)
{
    const double b1 = 0.9, b2 = 0.99, eps = 1e-8;
    const float c1 = (float)(1.0 / (1.0 - pow(b1, t))), c2 = (float)(1.0 / (1.0 - pow(b2, t)));
    for (int i = 0; i < NPARAM; i++) {
        param *p = &m->p[i];
        for (size_t j = 0; j < p->n; j++) {
            const float g = p->g[j];
            p->m[j] = (float)b1 * p->m[j] + (float)(1.0 - b1) * g;
            p->v[j] = (float)b2 * p->v[j] + (float)(1.0 - b2) * g * g;
            p->w[j] -= (float)lr * (p->m[j] * c1) / (sqrtf(p->v[j] * c2) + (float)eps);
        }
    }
}

/* -------------------------------------------------------------------- data */

typedef struct corpus {
    unsigned char *bytes;
    long len;
    int *ids; /* bytes mapped to 0..V-1 */
    int V;
    unsigned char chars[256]; /* id -> byte */
} corpus;

static int corpus_load(corpus *c, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 1 << 16, len = 0;
    unsigned char *buf = xcalloc(cap, 1);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            unsigned char *nb = realloc(buf, cap * 2);
            if (!nb) {
                fclose(f);
                free(buf);
                return -1;
            }
            buf = nb, cap *= 2;
        }
    }
    fclose(f);
    c->bytes = buf;
    c->len = (long)len;
    return 0;
}

static void corpus_index(corpus *c)
{
    int id_of[256], seen[256] = {0};
    for (long i = 0; i < c->len; i++)
        seen[c->bytes[i]] = 1;
    c->V = 0;
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            id_of[b] = c->V;
            c->chars[c->V++] = (unsigned char)b;
        }
    c->ids = xcalloc((size_t)c->len, sizeof(int));
    for (long i = 0; i < c->len; i++)
        c->ids[i] = id_of[c->bytes[i]];
}

/* Entropy in nats/char of the character frequencies of the whole text. */
static double unigram_entropy(const corpus *c)
{
    long count[256] = {0};
    for (long i = 0; i < c->len; i++)
        count[c->ids[i]]++;
    double h = 0.0;
    for (int j = 0; j < c->V; j++)
        if (count[j]) {
            const double p = (double)count[j] / (double)c->len;
            h -= p * log(p);
        }
    return h;
}

/* B random windows of L+1 characters from [lo, hi). */
static void sample_batch(const corpus *c, long lo, long hi, int B, int L, uint64_t *rng, int *tok,
                         int *tgt)
{
    for (int b = 0; b < B; b++) {
        const long s = lo + rng_below(rng, hi - lo - L);
        for (int t = 0; t < L; t++) {
            tok[b * L + t] = c->ids[s + t];
            tgt[b * L + t] = c->ids[s + t + 1];
        }
    }
}

/* Mean cross-entropy over the consecutive non-overlapping windows of [lo, hi). */
static double evaluate(const model *m, acts *a, const corpus *c, long lo, long hi, int *tok,
                       int *tgt, int threads)
{
    const int L = m->T;
    const long windows = (hi - lo - 1) / L;
    double sum = 0.0;
    long rows = 0;
    for (long w0 = 0; w0 < windows; w0 += a->Bmax) {
        const int B = (int)(windows - w0 < a->Bmax ? windows - w0 : a->Bmax);
        for (int b = 0; b < B; b++) {
            const long s = lo + (w0 + b) * L;
            for (int t = 0; t < L; t++) {
                tok[b * L + t] = c->ids[s + t];
                tgt[b * L + t] = c->ids[s + t + 1];
            }
        }
        sum += forward(m, a, B, L, tok, tgt, threads);
        rows += (long)B * L;
    }
    return rows ? sum / (double)rows : NAN;
}

/* Samples n characters after a prompt, feeding the last <= T characters back. */
static void generate(const model *m, acts *a, const corpus *c, const int *prompt, int plen, int n,
                     double temperature, uint64_t *rng, int threads)
{
    const int T = m->T, V = m->V;
    int *ctx = xcalloc((size_t)T, sizeof(int));
    int len = 0;
    for (int i = 0; i < plen; i++) {
        if (len == T)
            memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof(int)), len--;
        ctx[len++] = prompt[i];
        fputc(c->chars[prompt[i]], stdout);
    }
    for (int i = 0; i < n; i++) {
        forward(m, a, 1, len, ctx, NULL, threads);
        const float *p = a->probs + (size_t)(len - 1) * V;
        int next = 0;
        if (temperature <= 0.0) { /* greedy */
            for (int j = 1; j < V; j++)
                next = p[j] > p[next] ? j : next;
        } else { /* p^(1/temperature), renormalized */
            double z = 0.0;
            for (int j = 0; j < V; j++)
                z += pow((double)p[j], 1.0 / temperature);
            double u = rng_uniform(rng) * z, acc = 0.0;
            for (next = 0; next < V - 1; next++) {
                acc += pow((double)p[next], 1.0 / temperature);
                if (u < acc)
                    break;
            }
        }
        fputc(c->chars[next], stdout);
        if (len == T)
            memmove(ctx, ctx + 1, (size_t)(T - 1) * sizeof(int)), len--;
        ctx[len++] = next;
    }
    fputc('\n', stdout);
    free(ctx);
}

/* ---------------------------------------------------------------- gradcheck */

/* Compares analytic gradients with central differences on a tiny model.
 * Wq and Wk receive gradient only through sdpa_backward's dQ and dK, Wv only
 * through its dV, so this also checks the library's backward pass. */
static int gradcheck(const corpus *c, uint64_t seed, int threads)
{
    const int B = 3, L = 12, H = 2, D = 4;
    uint64_t rng = seed;
    model m;
    acts a;
    model_init(&m, c->V, L, H, D, 0.7, 0.5, &rng); /* large init: non-uniform attention */
    acts_init(&a, &m, B);
    int *tok = xcalloc((size_t)B * L, sizeof(int)), *tgt = xcalloc((size_t)B * L, sizeof(int));
    sample_batch(c, 0, c->len, B, L, &rng, tok, tgt);

    zero_grads(&m);
    const double loss0 = forward(&m, &a, B, L, tok, tgt, threads) / (B * L);
    backward(&m, &a, B, L, tok, tgt, threads);
    printf("gradcheck: B=%d T=%d H=%d head_dim=%d, loss %.6f, central differences (h=1e-3)\n", B,
           L, H, D, loss0);

    int failures = 0, checked = 0;
    for (int i = 0; i < NPARAM; i++) {
        param *p = &m.p[i];
        size_t idx[3];
        idx[0] = 0; /* the entry with the largest gradient, then two random ones */
        for (size_t j = 1; j < p->n; j++)
            if (fabsf(p->g[j]) > fabsf(p->g[idx[0]]))
                idx[0] = j;
        idx[1] = (size_t)rng_below(&rng, (long)p->n);
        idx[2] = (size_t)rng_below(&rng, (long)p->n);
        for (int r = 0; r < 3; r++) {
            const size_t j = idx[r];
            const float w0 = p->w[j], h = 1e-3f;
            p->w[j] = w0 + h;
            const double up = forward(&m, &a, B, L, tok, tgt, threads) / (B * L);
            const float wu = p->w[j];
            p->w[j] = w0 - h;
            const double dn = forward(&m, &a, B, L, tok, tgt, threads) / (B * L);
            const float wd = p->w[j];
            p->w[j] = w0;
            const double num = (up - dn) / ((double)wu - (double)wd);
            const double ana = p->g[j];
            const double err = fabs(num - ana);
            const int ok = err <= 2e-4 + 1e-2 * fabs(ana);
            failures += !ok;
            checked++;
            printf("  %-8s[%6zu]  analytic % .6e  numeric % .6e  |diff| %.1e  %s\n",
                   param_names[i], j, ana, num, err, ok ? "ok" : "FAIL");
        }
    }
    printf("gradcheck: %d/%d entries agree: %s\n", checked - failures, checked,
           failures ? "FAILED" : "PASSED");
    free(tok), free(tgt);
    acts_free(&a);
    model_free(&m);
    return failures ? 1 : 0;
}

/* --------------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    options opt;
    if (parse_options(argc, argv, &opt))
        return 2;
#ifdef _OPENMP
    if (opt.threads > 0)
        omp_set_num_threads(opt.threads);
#endif

    corpus c;
    if (corpus_load(&c, opt.path)) {
        fprintf(stderr, "cannot read %s: %s\n", opt.path, strerror(errno));
        return 1;
    }
    corpus_index(&c);
    if (opt.gradcheck) {
        const int rc = gradcheck(&c, opt.seed, opt.threads);
        free(c.bytes), free(c.ids);
        return rc;
    }

    /* train on the first 90% of the text, hold out the last 10% */
    const long split = c.len - c.len / 10;
    if (split - opt.seq - 1 < 1 || c.len - split < opt.seq + 1) {
        fprintf(stderr, "text too short for --seq %d (%ld bytes)\n", opt.seq, c.len);
        return 1;
    }
    const double h_unigram = unigram_entropy(&c);
    printf("libsdpa %s, ISA %s\n", sdpa_version(), sdpa_isa_name(sdpa_isa_active()));
    printf("text: %s, %ld chars (train %ld, held-out %ld)\n", opt.path, c.len, split,
           c.len - split);
    printf("vocabulary size: %d, ln(vocab) = %.4f nats\n", c.V, log((double)c.V));
    printf("unigram entropy of the text: %.4f nats/char\n", h_unigram);

    uint64_t rng = opt.seed * 0x2545f4914f6cdd1dull + 1;
    model m;
    acts a;
    model_init(&m, c.V, opt.seq, opt.heads, opt.head_dim, 0.3, 0.02, &rng);
    acts_init(&a, &m, opt.batch);
    printf("model: d_model %d, %d heads x head_dim %d, seq %d, batch %d, %zu parameters, "
           "lr %g, seed %llu\n",
           m.C, m.H, m.D, m.T, opt.batch, model_param_count(&m), opt.lr,
           (unsigned long long)opt.seed);

    const int B = opt.batch, L = opt.seq;
    int *tok = xcalloc((size_t)B * L, sizeof(int)), *tgt = xcalloc((size_t)B * L, sizeof(int));
    const double t0 = now_seconds();
    double train_sum = 0.0, last_train = NAN, last_val = NAN;
    int train_n = 0, step = 0;
    double below_train_t = -1.0, below_val_t = -1.0;

    printf("%6s %8s %10s %10s\n", "step", "time_s", "train", "held-out");
    for (step = 0; step < opt.steps; step++) {
        sample_batch(&c, 0, split, B, L, &rng, tok, tgt);
        zero_grads(&m);
        const double loss = forward(&m, &a, B, L, tok, tgt, opt.threads) / (B * L);
        backward(&m, &a, B, L, tok, tgt, opt.threads);
        adam_step(&m, opt.lr, step + 1);
        train_sum += loss, train_n++;
        if (step == 0 || (step + 1) % opt.eval_every == 0) {
            last_train = train_sum / train_n;
            train_sum = 0.0, train_n = 0;
            last_val = evaluate(&m, &a, &c, split, c.len, tok, tgt, opt.threads);
            const double t = now_seconds() - t0;
            if (below_train_t < 0 && last_train < h_unigram)
                below_train_t = t;
            if (below_val_t < 0 && last_val < h_unigram)
                below_val_t = t;
            /* step 0: the loss of the first batch, before the update */
            printf("%6d %8.1f %10.4f %10.4f\n", step + 1, t, last_train, last_val);
            fflush(stdout);
        }
        if (now_seconds() - t0 >= opt.time_limit) {
            step++;
            break;
        }
    }
    if (train_n) { /* steps since the last report */
        last_train = train_sum / train_n;
        last_val = evaluate(&m, &a, &c, split, c.len, tok, tgt, opt.threads);
        printf("%6d %8.1f %10.4f %10.4f\n", step, now_seconds() - t0, last_train, last_val);
    }
    const double elapsed = now_seconds() - t0;
    printf("trained %d steps in %.1f s (%.0f chars/s)\n", step, elapsed,
           (double)step * B * L / elapsed);
    printf("final: train %.4f, held-out %.4f nats/char (unigram entropy %.4f, ln(vocab) %.4f)\n",
           last_train, last_val, h_unigram, log((double)c.V));
    if (below_train_t >= 0)
        printf("train loss below unigram entropy at %.1f s\n", below_train_t);
    if (below_val_t >= 0)
        printf("held-out loss below unigram entropy at %.1f s\n", below_val_t);

    if (opt.gen_len > 0) {
        /* prompt: the first line start of the held-out text */
        const int plen = L / 2 < 24 ? L / 2 : 24;
        long start = split;
        while (start < c.len - plen - 1 && c.bytes[start] != '\n')
            start++;
        if (start < c.len - plen - 1)
            start++;
        printf("sample (%d chars, temperature %g) after a %d-char held-out prompt:\n",
               opt.gen_len, opt.temperature, plen);
        generate(&m, &a, &c, c.ids + start, plen, opt.gen_len, opt.temperature, &rng,
                 opt.threads);
    }

    free(tok), free(tgt);
    acts_free(&a);
    model_free(&m);
    free(c.bytes), free(c.ids);
    return 0;
}
