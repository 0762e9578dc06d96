/* SPDX-License-Identifier: MIT */
/* tools/cli_load.c - the inputs of `sdpa forward` / `sdpa backward`: Q, K, V as
 * views over their files (dense bhsd/bshd, packed token lists, paged caches),
 * the cu_seqlens and block tables, masks, key lengths and the variants' slopes
 * and sinks, each checked before anything is computed. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_job.h"

/* ------------------------------------------------------------ inputs */

/* (batch, head, seq) strides of a C-order array of the given kind and shape
 * (lse: the array has no D dim, e.g. LSE), and its element count. Returns 0, or
 * -1 when the size overflows int64. */
static int strides_of(vkind kind, const int64_t *shape, int ndim, int lse, int64_t st[3], int64_t *count)
{
    int64_t dims[5], fs[5];
    int n = 0;
    st[0] = st[1] = st[2] = 0;
    if (kind == V_BHSD) /* (T, D) and (H, T, D): the missing leading dims are 1 */
        for (int i = ndim + (lse ? 1 : 0); i < 4; i++)
            dims[n++] = 1;
    for (int i = 0; i < ndim; i++)
        dims[n++] = shape[i];
    if (lse)
        dims[n++] = 1;
    if (dims_sizes(dims, n, fs) != 0)
        return -1;
    *count = fs[0];
    /* fs[i + 1]: the stride of file dim i */
    switch (kind) {
    case V_BHSD: st[0] = fs[1], st[1] = fs[2], st[2] = fs[3]; break;
    case V_BSHD: st[0] = fs[1], st[1] = fs[3], st[2] = fs[2]; break;
    case V_TOKENS: st[0] = 0, st[1] = fs[2], st[2] = fs[1]; break;
    case V_HND: st[0] = fs[1], st[1] = fs[2], st[2] = fs[3]; break;
    case V_NHD: st[0] = fs[1], st[1] = fs[3], st[2] = fs[2]; break;
    }
    return 0;
}

static sdpa_tensor view_of(const tensor *t, vkind kind)
{
    int64_t st[3], n;
    sdpa_tensor v = {t->a.data, 0, 0, 0};
    if (strides_of(kind, t->a.shape, t->a.ndim, 0, st, &n) == 0) /* load_tensor checked the size */
        v.batch_stride = st[0], v.head_stride = st[1], v.seq_stride = st[2];
    return v;
}

static int want_rank(const tensor *t, const char *role, int rank, const char *form)
{
    char sh[160];
    if (t->a.ndim == rank)
        return 0;
    file_error(t->path, "%s has shape %s; %s", role, npy_shape_str(t->a.shape, t->a.ndim, sh, sizeof sh), form);
    return EXIT_BAD;
}

/* Reads the logical sizes of a file of the given kind into t->b, h, t, d
 * (paged: b = num_blocks, t = block_size). */
static void logical_dims(tensor *t, vkind kind)
{
    const int64_t *s = t->a.shape;
    switch (kind) {
    case V_BHSD: break; /* load_tensor's reading */
    case V_BSHD: t->b = s[0], t->t = s[1], t->h = s[2], t->d = s[3]; break;
    case V_TOKENS: t->b = 1, t->t = s[0], t->h = s[1], t->d = s[2]; break;
    case V_HND: t->b = s[0], t->h = s[1], t->t = s[2], t->d = s[3]; break;
    case V_NHD: t->b = s[0], t->t = s[1], t->h = s[2], t->d = s[3]; break;
    }
}

static const char *kind_form(vkind kind, int kv)
{
    switch (kind) {
    case V_BSHD: return kv ? "with --layout bshd it must be (B, Tk, Hkv, D)" : "with --layout bshd it must be (B, Tq, Hq, D)";
    case V_TOKENS:
        return kv ? "with --cu-seqlens-k it must be a token list (total_k, Hkv, D)"
                  : "with --cu-seqlens-q it must be a token list (total_q, Hq, D)";
    case V_HND: return "with --block-table it must be a cache (num_blocks, Hkv, block_size, D) (--page-layout HND)";
    case V_NHD: return "with --block-table and --page-layout NHD it must be a cache (num_blocks, block_size, Hkv, D)";
    default: return "";
    }
}

/* Loads Q, K and V and checks that they fit each other. */
static int load_qkv(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    j->mode = !o->cuq ? MODE_DENSE : o->btab ? MODE_PAGED : MODE_PACKED;
    j->qkind = j->mode != MODE_DENSE ? V_TOKENS : o->bshd ? V_BSHD : V_BHSD;
    j->kvkind = j->mode == MODE_PAGED ? (o->page_nhd ? V_NHD : V_HND) : j->qkind;
    if ((rc = load_tensor_as(o->q, "Q", o->dtype, &j->q)) || (rc = load_tensor_as(o->k, "K", o->kv_dtype, &j->k)) ||
        (rc = load_tensor_as(o->v, "V", o->kv_dtype, &j->v)))
        return rc;
    tensor *q = &j->q, *k = &j->k, *v = &j->v;
    const int r = q->a.ndim;
    if (j->qkind != V_BHSD) {
        const int qr = j->qkind == V_TOKENS ? 3 : 4, kr = j->kvkind == V_TOKENS ? 3 : 4;
        if ((rc = want_rank(q, "Q", qr, kind_form(j->qkind, 0))) || (rc = want_rank(k, "K", kr, kind_form(j->kvkind, 1))) ||
            (rc = want_rank(v, "V", kr, kind_form(j->kvkind, 1))))
            return rc;
        logical_dims(q, j->qkind);
        logical_dims(k, j->kvkind);
        logical_dims(v, j->kvkind);
    } else {
        if (k->a.ndim != r) {
            file_error(k->path, "K has rank %d but Q has rank %d (Q, K, V must have the same rank)", k->a.ndim, r);
            return EXIT_BAD;
        }
        if (v->a.ndim != r) {
            file_error(v->path, "V has rank %d but Q has rank %d (Q, K, V must have the same rank)", v->a.ndim, r);
            return EXIT_BAD;
        }
    }
    if (j->mode == MODE_DENSE && k->b != q->b) {
        file_error(k->path, "K has batch %lld but Q has batch %lld", (long long)k->b, (long long)q->b);
        return EXIT_BAD;
    }
    if (k->d != q->d) {
        file_error(k->path, "K has head_dim %lld but Q has head_dim %lld (Q and K share head_dim)",
                   (long long)k->d, (long long)q->d);
        return EXIT_BAD;
    }
    if ((k->h == 0 && q->h > 0) || (k->h > 0 && q->h % k->h != 0)) {
        file_error(k->path, "K has %lld heads; Q's %lld heads are not a multiple of it (GQA)", (long long)k->h,
                   (long long)q->h);
        return EXIT_BAD;
    }
    if (j->kvkind == V_BHSD) {
        if ((rc = check_shape(v, "V", r, k->b, k->h, k->t, v->d, "V must match K in batch, heads and length")))
            return rc;
    } else if (v->b != k->b || v->h != k->h || v->t != k->t) {
        char s1[160], s2[160];
        file_error(v->path, "V has shape %s but K has shape %s (V must match K in all but head_dim)",
                   npy_shape_str(v->a.shape, v->a.ndim, s1, sizeof s1),
                   npy_shape_str(k->a.shape, k->a.ndim, s2, sizeof s2));
        return EXIT_BAD;
    }
    if (j->kvkind == V_HND || j->kvkind == V_NHD) {
        j->num_blocks = k->b;
        j->block_size = k->t;
        if (j->block_size < 1) {
            file_error(k->path, "the K cache has block_size %lld; pages hold at least one key",
                       (long long)j->block_size);
            return EXIT_BAD;
        }
    }
    j->vq = view_of(q, j->qkind);
    j->vk = view_of(k, j->kvkind);
    j->vv = view_of(v, j->kvkind);
    return 0;
}

/* ------------------------------------------------------------ packed and paged (issue 17) */

/* Reads an int32 or int64 .npy of rank 1 or 2 as int32 values; an int64 value
 * outside int32 becomes INT32_MIN when keep_bad (a block-table entry that may be
 * unused), else it is refused. */
static int load_int32s(const char *path, const char *flag, npy_array *raw, int32_t **out, int keep_bad)
{
    int rc;
    if ((rc = load_npy(path, raw)))
        return rc;
    if (raw->dtype != NPY_I4 && raw->dtype != NPY_I8) {
        file_error(path, "%s: must be int32 ('<i4') or int64 ('<i8'), got %s ('%s')", flag,
                   npy_dtype_name(raw->dtype), npy_dtype_descr(raw->dtype));
        return EXIT_BAD;
    }
    *out = malloc(raw->count ? raw->count * sizeof(int32_t) : 1);
    if (!*out) {
        file_error(path, "out of memory");
        return EXIT_BAD;
    }
    for (size_t i = 0; i < raw->count; i++) {
        int64_t x;
        if (raw->dtype == NPY_I4) {
            int32_t y;
            memcpy(&y, (const char *)raw->data + 4 * i, 4);
            x = y;
        } else
            memcpy(&x, (const char *)raw->data + 8 * i, 8);
        if (x < INT32_MIN || x > INT32_MAX) {
            if (!keep_bad) {
                file_error(path, "%s: entry [%zu] = %lld does not fit int32", flag, i, (long long)x);
                return EXIT_BAD;
            }
            x = INT32_MIN;
        }
        (*out)[i] = (int32_t)x;
    }
    return 0;
}

/* --cu-seqlens-q / --cu-seqlens-k: (B+1,) offsets, cu[0] = 0, nondecreasing, cu[B]
 * = the token count of the file (`what`, e.g. "Q.shape[0]"). nseq < 0: B is
 * set from this file. */
static int load_cu(job *j, const char *path, const char *flag, npy_array *raw, int32_t **cu, int64_t total,
                   const char *what)
{
    char sh[160];
    int rc;
    if ((rc = load_int32s(path, flag, raw, cu, 0)))
        return rc;
    if (raw->ndim != 1 || raw->shape[0] < 1 || (j->nseq >= 0 && raw->shape[0] != j->nseq + 1)) {
        if (j->nseq >= 0)
            file_error(path, "%s: shape %s, expected (B+1,) = (%lld,) as --cu-seqlens-q", flag,
                       npy_shape_str(raw->shape, raw->ndim, sh, sizeof sh), (long long)(j->nseq + 1));
        else
            file_error(path, "%s: shape %s, expected (B+1,): B+1 offsets, the first 0", flag,
                       npy_shape_str(raw->shape, raw->ndim, sh, sizeof sh));
        return EXIT_BAD;
    }
    const int32_t *c = *cu;
    const int64_t B = raw->shape[0] - 1;
    if (c[0] != 0) {
        file_error(path, "%s: the first offset is %d, expected 0", flag, (int)c[0]);
        return EXIT_BAD;
    }
    for (int64_t b = 0; b < B; b++)
        if (c[b + 1] < c[b]) {
            file_error(path, "%s: offsets decrease at [%lld] = %d > [%lld] = %d (they must be nondecreasing)", flag,
                       (long long)b, (int)c[b], (long long)(b + 1), (int)c[b + 1]);
            return EXIT_BAD;
        }
    if (c[B] != total) {
        file_error(path, "%s: the last offset is %d but %s = %lld (it must equal the token count)", flag,
                   (int)c[B], what, (long long)total);
        return EXIT_BAD;
    }
    j->nseq = B;
    return 0;
}

/* --block-table BT.npy (B, M) and --seq-lens-k LK.npy (B,): every page a
 * sequence uses (the first ceil(LK[b] / block_size) of its row) in
 * [0, num_blocks); entries past them are not read. */
static int load_pages(job *j)
{
    const cli_opts *o = &j->opt;
    const int64_t B = j->nseq, bs = j->block_size;
    char sh[160];
    int rc;
    if ((rc = load_int32s(o->btab, "--block-table", &j->bt_raw, &j->bt, 1)))
        return rc;
    if (j->bt_raw.ndim != 2 || j->bt_raw.shape[0] != B) {
        file_error(o->btab, "--block-table: shape %s, expected (B, M) = (%lld, M) (B from --cu-seqlens-q)",
                   npy_shape_str(j->bt_raw.shape, j->bt_raw.ndim, sh, sizeof sh), (long long)B);
        return EXIT_BAD;
    }
    j->max_blocks = j->bt_raw.shape[1];
    if ((rc = load_int32s(o->lensk, "--seq-lens-k", &j->lk_raw, &j->lk, 0)))
        return rc;
    if (j->lk_raw.ndim != 1 || j->lk_raw.shape[0] != B) {
        file_error(o->lensk, "--seq-lens-k: shape %s, expected (B,) = (%lld,) (B from --cu-seqlens-q)",
                   npy_shape_str(j->lk_raw.shape, j->lk_raw.ndim, sh, sizeof sh), (long long)B);
        return EXIT_BAD;
    }
    int64_t cap;
    if (__builtin_mul_overflow(j->max_blocks, bs, &cap))
        cap = INT64_MAX;
    for (int64_t b = 0; b < B; b++) {
        const int64_t n = j->lk[b];
        if (n < 0 || n > cap) {
            file_error(o->lensk,
                       "--seq-lens-k: [%lld] = %lld is outside [0, M * block_size = %lld * %lld] (the block "
                       "table's row holds that many keys)",
                       (long long)b, (long long)n, (long long)j->max_blocks, (long long)bs);
            return EXIT_BAD;
        }
        for (int64_t p = 0; p < (n + bs - 1) / bs; p++) {
            const int32_t id = j->bt[b * j->max_blocks + p];
            if (id < 0 || id >= j->num_blocks) {
                if (id == INT32_MIN)
                    file_error(o->btab, "--block-table: [%lld, %lld] does not fit int32 (sequence %lld uses it)",
                               (long long)b, (long long)p, (long long)b);
                else
                    file_error(o->btab,
                               "--block-table: [%lld, %lld] = %d is outside [0, num_blocks = %lld) (sequence "
                               "%lld has %lld keys: pages 0..%lld of its row are read)",
                               (long long)b, (long long)p, (int)id, (long long)j->num_blocks, (long long)b,
                               (long long)n, (long long)((n + bs - 1) / bs - 1));
                return EXIT_BAD;
            }
        }
    }
    return 0;
}

/* The offsets and tables of a packed / paged call; sets the logical sizes the
 * problem is filled from (q.b = B, q.t = total_q, k.t = total_k or 0). */
static int load_seqs(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    j->nseq = -1;
    if ((rc = load_cu(j, o->cuq, "--cu-seqlens-q", &j->cuq_raw, &j->cuq, j->q.t, "Q.shape[0]")))
        return rc;
    j->seqs.cu_seqlens_q = j->cuq;
    if (j->mode == MODE_PACKED) {
        if ((rc = load_cu(j, o->cuk, "--cu-seqlens-k", &j->cuk_raw, &j->cuk, j->k.t, "K.shape[0]")))
            return rc;
        j->seqs.cu_seqlens_k = j->cuk;
    } else {
        if ((rc = load_pages(j)))
            return rc;
        j->seqs.block_table = j->bt;
        j->seqs.max_blocks_per_seq = j->max_blocks;
        j->seqs.seq_lens_k = j->lk;
        j->seqs.block_size = j->block_size;
        j->seqs.num_blocks = j->num_blocks;
        j->k.t = j->v.t = 0; /* kv_len = 0: the keys are in the pages */
    }
    j->q.b = j->k.b = j->v.b = j->nseq;
    return 0;
}

static void fill_problem(job *j)
{
    const cli_opts *o = &j->opt;
    sdpa_problem *p = &j->p;
    sdpa_problem_init(p);
    p->batch = j->q.b;
    p->q_heads = j->q.h;
    p->kv_heads = j->k.h;
    p->q_len = j->q.t;
    p->kv_len = j->k.t;
    p->head_dim_qk = j->q.d;
    p->head_dim_v = j->v.d;
    if (o->have_scale) {
        p->use_default_scale = 0;
        p->scale = o->scale;
    }
    p->causal = o->causal;
    p->window_alignment = o->align;
    p->window_left = o->window_left;
    p->window_right = o->window_right;
    p->diagonal_offset = o->diagonal_offset;
    p->num_threads = o->threads;
    p->isa = o->isa;
    p->softcap = o->softcap;
    p->fpmath_mode = o->fpmath;
    p->q_dtype = o->dtype;     /* Q, O (dO, dQ) */
    p->o_dtype = o->dtype;
    p->kv_dtype = o->kv_dtype; /* K, V (dK, dV) */
    if (j->mode != MODE_DENSE)
        p->seqs = &j->seqs;
}

/* --alibi-slopes / --sinks: float32 of shape (Hq,), one value per query head,
 * checked here (naming the option and the file) before the library sees them:
 * slopes finite, sinks finite or -inf. */
static int load_head_values(job *j, const char *flag, const char *path, const char *what, int sinks,
                            npy_array *a)
{
    char sh[160], err[256];
    if (npy_read(path, a, err, sizeof err) != 0) { /* e.g. float64: '<f8' is refused by the reader */
        file_error(path, "%s: %s", flag, err);
        return EXIT_BAD;
    }
    if (a->dtype != NPY_F4) {
        file_error(path, "%s: the %s must be float32 ('<f4'), got %s ('%s')", flag, what, npy_dtype_name(a->dtype),
                   npy_dtype_descr(a->dtype));
        return EXIT_BAD;
    }
    if (a->ndim != 1 || a->shape[0] != j->q.h) {
        file_error(path, "%s: the %s have shape %s, expected (Hq,) = (%lld,) (one per query head)", flag, what,
                   npy_shape_str(a->shape, a->ndim, sh, sizeof sh), (long long)j->q.h);
        return EXIT_BAD;
    }
    const float *x = a->data;
    for (size_t i = 0; i < a->count; i++)
        if (sinks ? (isnan(x[i]) || x[i] == INFINITY) : !isfinite(x[i])) {
            file_error(path, "%s: %s [%zu] is %s; each must be %s", flag, sinks ? "sink" : "slope", i,
                       isnan(x[i]) ? "NaN" : x[i] > 0 ? "+inf" : "-inf", sinks ? "finite or -inf" : "finite");
            return EXIT_BAD;
        }
    return 0;
}

/* --mask: bool or uint8, broadcast to target (B, Hq, Tq, Tk). */
static int load_mask(job *j, const int64_t target[4])
{
    const char *path = j->opt.mask;
    int64_t s[4];
    int rc;
    if ((rc = load_npy(path, &j->mask)))
        return rc;
    if (j->mask.dtype != NPY_B1 && j->mask.dtype != NPY_U1) {
        file_error(path, "the mask must be bool ('|b1') or uint8 ('|u1'), got %s ('%s')",
                   npy_dtype_name(j->mask.dtype), npy_dtype_descr(j->mask.dtype));
        return EXIT_BAD;
    }
    if ((rc = broadcast_strides(path, "the mask", &j->mask, target, s)))
        return rc;
    j->p.bool_mask.data = j->mask.data;
    j->p.bool_mask.batch_stride = s[0];
    j->p.bool_mask.head_stride = s[1];
    j->p.bool_mask.query_stride = s[2];
    j->p.bool_mask.key_stride = s[3];
    return 0;
}

/* --bias: float32, broadcast to target (B, Hq, Tq, Tk). */
static int load_bias(job *j, const int64_t target[4])
{
    const char *path = j->opt.bias;
    int64_t s[4];
    int rc;
    if ((rc = load_npy(path, &j->bias)))
        return rc;
    if (j->bias.dtype != NPY_F4) {
        file_error(path, "the bias must be float32 ('<f4'), got %s ('%s')", npy_dtype_name(j->bias.dtype),
                   npy_dtype_descr(j->bias.dtype));
        return EXIT_BAD;
    }
    if ((rc = broadcast_strides(path, "the bias", &j->bias, target, s)))
        return rc;
    j->p.bias.data = j->bias.data;
    j->p.bias.batch_stride = s[0];
    j->p.bias.head_stride = s[1];
    j->p.bias.query_stride = s[2];
    j->p.bias.key_stride = s[3];
    return 0;
}

/* --kv-len: int32 or int64 of shape (B,), each in [0, min(Tk, 2^31 - 1)]. */
static int load_kv_lengths(job *j)
{
    const char *path = j->opt.kvlen;
    npy_array *a = &j->kvlen_raw;
    char sh[160];
    int rc;
    if ((rc = load_npy(path, a)))
        return rc;
    if (a->dtype != NPY_I4 && a->dtype != NPY_I8) {
        file_error(path, "kv lengths must be int32 ('<i4') or int64 ('<i8'), got %s ('%s')",
                   npy_dtype_name(a->dtype), npy_dtype_descr(a->dtype));
        return EXIT_BAD;
    }
    if (a->ndim != 1 || a->shape[0] != j->q.b) {
        file_error(path, "kv lengths have shape %s, expected (%lld,) (one per batch)",
                   npy_shape_str(a->shape, a->ndim, sh, sizeof sh), (long long)j->q.b);
        return EXIT_BAD;
    }
    j->kvlen = malloc(a->count ? a->count * sizeof(int32_t) : 1);
    if (!j->kvlen) {
        file_error(path, "out of memory");
        return EXIT_BAD;
    }
    for (size_t i = 0; i < a->count; i++) {
        int64_t x;
        if (a->dtype == NPY_I4) {
            int32_t y;
            memcpy(&y, (const char *)a->data + 4 * i, 4);
            x = y;
        } else
            memcpy(&x, (const char *)a->data + 8 * i, 8);
        if (x < 0 || x > j->k.t || x > INT32_MAX) {
            file_error(path, "kv length [%zu] = %lld is outside [0, min(Tk = %lld, 2^31 - 1)]", i, (long long)x,
                       (long long)j->k.t);
            return EXIT_BAD;
        }
        j->kvlen[i] = (int32_t)x;
    }
    j->p.kv_lengths = j->kvlen;
    return 0;
}

/* Shapes, sizes and strides of O (Q's shape with Dv last) and LSE
 * (Q.shape[:-1]), in Q's layout: no input bounds them (Q's Dk and V's Tk may be
 * 0), so their sizes are checked here. */
static int output_sizes(job *j)
{
    const int r = j->q.a.ndim;
    char sh[160];
    j->ondim = r;
    j->lndim = r - 1;
    memcpy(j->oshape, j->q.a.shape, (size_t)r * sizeof(int64_t));
    j->oshape[r - 1] = j->p.head_dim_v;
    memcpy(j->lshape, j->q.a.shape, (size_t)(r - 1) * sizeof(int64_t));
    if (strides_of(j->qkind, j->oshape, r, 0, j->ostr, &j->ocount) != 0) {
        plain_error("O would have shape %s: too large, its size overflows 64 bits",
                    npy_shape_str(j->oshape, r, sh, sizeof sh));
        return EXIT_BAD;
    }
    if (strides_of(j->qkind, j->lshape, r - 1, 1, j->lstr, &j->lcount) != 0) {
        plain_error("LSE would have shape %s: too large, its size overflows 64 bits",
                    npy_shape_str(j->lshape, r - 1, sh, sizeof sh));
        return EXIT_BAD;
    }
    return 0;
}

/* Loads Q, K, V and the mask inputs, checks that they fit, fills j->p and the
 * output sizes. */
int load_common(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    if ((rc = load_qkv(j)) || (j->mode != MODE_DENSE && (rc = load_seqs(j))))
        return rc;
    fill_problem(j);
    const int64_t target[4] = {j->q.b, j->q.h, j->q.t, j->k.t};
    if ((o->mask && (rc = load_mask(j, target))) || (o->bias && (rc = load_bias(j, target))) ||
        (o->kvlen && (rc = load_kv_lengths(j))))
        return rc;
    if (o->alibi) {
        if ((rc = load_head_values(j, "--alibi-slopes", o->alibi, "ALiBi slopes", 0, &j->alibi)))
            return rc;
        j->p.alibi_slopes = j->alibi.data;
    }
    if (o->sinks) {
        if ((rc = load_head_values(j, "--sinks", o->sinks, "sinks", 1, &j->sinks)))
            return rc;
        j->p.sinks = j->sinks.data;
    }
    return output_sizes(j);
}
