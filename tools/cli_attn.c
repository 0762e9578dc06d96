/* SPDX-License-Identifier: MIT */
/* tools/cli_attn.c - `sdpa forward` and `sdpa backward` on .npy files.
 *
 * Every input is read and validated, and every output's temporary file is
 * created, before anything is computed (cli_out.c), so a bad input never
 * creates or changes an output file. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef struct job {
    cli_opts opt;
    tensor q, k, v, o, lse, dout;
    npy_array kvlen_raw, mask, bias, alibi, sinks;
    int32_t *kvlen;
    sdpa_problem p;
    int64_t osize[4]; /* O (B, Hq, Tq, Dv): element count, then strides (dims_sizes) */
    int64_t lsize[3]; /* LSE (B, Hq, Tq): element count, then strides */
} job;

static void job_free(job *j)
{
    npy_free(&j->q.a);
    npy_free(&j->k.a);
    npy_free(&j->v.a);
    npy_free(&j->o.a);
    npy_free(&j->lse.a);
    npy_free(&j->dout.a);
    npy_free(&j->kvlen_raw);
    npy_free(&j->mask);
    npy_free(&j->bias);
    npy_free(&j->alibi);
    npy_free(&j->sinks);
    free(j->kvlen);
}

/* The first output path that names one of the input files, or NULL (an output
 * must never replace an input by accident). */
static const char *output_clobbers_input(const cli_opts *o, const char *const *outs, int nout)
{
    const char *ins[] = {o->q, o->k, o->v, o->dout, o->kvlen, o->mask, o->bias, o->alibi, o->sinks};
    for (int i = 0; i < nout; i++)
        for (size_t j = 0; j < sizeof ins / sizeof ins[0]; j++)
            if (same_file(outs[i], ins[j]))
                return outs[i];
    return NULL;
}

/* ------------------------------------------------------------ inputs */

/* Loads Q, K and V and checks that they fit each other. */
static int load_qkv(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    if ((rc = load_tensor(o->q, "Q", &j->q)) || (rc = load_tensor(o->k, "K", &j->k)) ||
        (rc = load_tensor(o->v, "V", &j->v)))
        return rc;
    const tensor *q = &j->q, *k = &j->k, *v = &j->v;
    const int r = q->a.ndim;
    if (k->a.ndim != r) {
        file_error(k->path, "K has rank %d but Q has rank %d (Q, K, V must have the same rank)", k->a.ndim, r);
        return EXIT_BAD;
    }
    if (v->a.ndim != r) {
        file_error(v->path, "V has rank %d but Q has rank %d (Q, K, V must have the same rank)", v->a.ndim, r);
        return EXIT_BAD;
    }
    if (k->b != q->b) {
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
    return check_shape(v, "V", r, k->b, k->h, k->t, v->d, "V must match K in batch, heads and length");
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
    p->num_threads = o->threads;
    p->isa = o->isa;
    p->softcap = o->softcap;
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

/* Sizes of O (B, Hq, Tq, Dv) and LSE (B, Hq, Tq): no input bounds them (Q's Dk
 * and V's Tk may be 0), so they are checked here. */
static int output_sizes(job *j)
{
    const sdpa_problem *p = &j->p;
    const int64_t od[4] = {p->batch, p->q_heads, p->q_len, p->head_dim_v};
    char sh[160];
    if (dims_sizes(od, 4, j->osize) != 0) {
        plain_error("O would have shape (B, Hq, Tq, Dv) = %s: too large, its size overflows 64 bits",
                    npy_shape_str(od, 4, sh, sizeof sh));
        return EXIT_BAD;
    }
    if (dims_sizes(od, 3, j->lsize) != 0) {
        plain_error("(B, Hq, Tq) = %s: too large, the B * Hq * Tq query rows overflow 64 bits",
                    npy_shape_str(od, 3, sh, sizeof sh));
        return EXIT_BAD;
    }
    return 0;
}

/* Loads Q, K, V and the mask inputs, checks that they fit, fills j->p and the
 * output sizes. */
static int load_common(job *j)
{
    const cli_opts *o = &j->opt;
    int rc;
    if ((rc = load_qkv(j)))
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

/* ------------------------------------------------------------ forward */

static int forward_args(const cli_opts *op)
{
    if (!op->q || !op->k || !op->v || !op->o)
        return usage_error(CMD_FORWARD, "missing %s", !op->q ? "-q Q.npy" : !op->k ? "-k K.npy"
                                                     : !op->v ? "-v V.npy" : "-o O.npy");
    const char *outp[2] = {op->o, op->lse};
    if (same_paths(outp, 2))
        return usage_error(CMD_FORWARD, "-o and --lse name the same file");
    const char *clob = output_clobbers_input(op, outp, op->lse ? 2 : 1);
    if (clob)
        return usage_error(CMD_FORWARD, "output %s is also an input", clob);
    return 0;
}

/* The output files of the forward: O, and LSE if asked for. Returns their number. */
static int forward_outputs(const job *j, float *o, float *lse, out_file *outs)
{
    const sdpa_problem *p = &j->p;
    const int r = j->q.a.ndim;
    int n = 0;
    outs[n].path = j->opt.o;
    outs[n].data = o;
    outs[n].ndim = r;
    shape_in_rank(r, p->batch, p->q_heads, p->q_len, p->head_dim_v, outs[n].shape);
    n++;
    if (j->opt.lse) {
        outs[n].path = j->opt.lse;
        outs[n].data = lse;
        outs[n].ndim = r - 1;
        memcpy(outs[n].shape, j->q.a.shape, (size_t)(r - 1) * sizeof(int64_t));
        n++;
    }
    return n;
}

int cmd_forward(int argc, char **argv)
{
    job j;
    int rc, help, nout = 0;
    float *o = NULL, *lse = NULL;
    out_file outs[2];
    memset(&j, 0, sizeof j);
    memset(outs, 0, sizeof outs);
    if ((rc = parse_options(CMD_FORWARD, argc, argv, &j.opt, &help)))
        return rc;
    if (help) {
        print_help(CMD_FORWARD);
        return 0;
    }
    if ((rc = forward_args(&j.opt)) || (rc = load_common(&j)))
        goto done;
    o = alloc_floats(j.osize[0]);
    lse = j.opt.lse ? alloc_floats(j.lsize[0]) : NULL;
    if (!o || (j.opt.lse && !lse)) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    nout = forward_outputs(&j, o, lse, outs);
    for (int i = 0; i < nout; i++)
        if ((rc = out_prepare(&outs[i])))
            goto done;
    const sdpa_tensor tq = tensor_view(&j.q), tk = tensor_view(&j.k), tv = tensor_view(&j.v);
    const sdpa_tensor_out to = {o, j.osize[1], j.osize[2], j.osize[3]}, tl = {lse, j.lsize[1], j.lsize[2], 1};
    const sdpa_status st = sdpa_forward(&j.p, &tq, &tk, &tv, &to, lse ? &tl : NULL);
    rc = st != SDPA_OK ? library_error(st) : out_commit(outs, nout);
done:
    out_discard(outs, nout);
    free(o);
    free(lse);
    job_free(&j);
    return rc;
}

/* ------------------------------------------------------------ backward */

static int backward_args(const cli_opts *op)
{
    if (!op->q || !op->k || !op->v || !op->dout || !op->dq || !op->dk || !op->dv)
        return usage_error(CMD_BACKWARD, "missing %s",
                           !op->q ? "-q Q.npy" : !op->k ? "-k K.npy" : !op->v ? "-v V.npy"
                           : !op->dout ? "--do dO.npy" : !op->dq ? "--dq dQ.npy" : !op->dk ? "--dk dK.npy"
                                                                                           : "--dv dV.npy");
    if (!op->o != !op->lse)
        return usage_error(CMD_BACKWARD, "give both -o O.npy and --lse LSE.npy (the forward's outputs) or "
                                         "neither (they are then recomputed)");
    const char *outp[4] = {op->dq, op->dk, op->dv, op->dsinks};
    const int nout = op->dsinks ? 4 : 3;
    if (same_paths(outp, nout))
        return usage_error(CMD_BACKWARD, "--dq, --dk, --dv%s must name different files",
                           op->dsinks ? " and --dsinks" : "");
    const char *clob = output_clobbers_input(op, outp, nout);
    for (int i = 0; i < nout && !clob; i++)
        if (same_file(op->o, outp[i]) || same_file(op->lse, outp[i]))
            clob = outp[i];
    if (clob)
        return usage_error(CMD_BACKWARD, "output %s is also an input", clob);
    return 0;
}

/* The forward's LSE given with --lse: float32 of shape Q.shape[:-1]. */
static int load_given_lse(job *j)
{
    const char *path = j->opt.lse;
    const int r = j->q.a.ndim;
    char s1[160], s2[160];
    int rc;
    if ((rc = load_npy(path, &j->lse.a)))
        return rc;
    j->lse.path = path;
    if (j->lse.a.dtype != NPY_F4) {
        file_error(path, "LSE must be float32 ('<f4'), got %s ('%s')", npy_dtype_name(j->lse.a.dtype),
                   npy_dtype_descr(j->lse.a.dtype));
        return EXIT_BAD;
    }
    if (j->lse.a.ndim != r - 1 || memcmp(j->lse.a.shape, j->q.a.shape, (size_t)(r - 1) * sizeof(int64_t))) {
        file_error(path, "LSE has shape %s, expected Q.shape[:-1] = %s",
                   npy_shape_str(j->lse.a.shape, j->lse.a.ndim, s1, sizeof s1),
                   npy_shape_str(j->q.a.shape, r - 1, s2, sizeof s2));
        return EXIT_BAD;
    }
    return 0;
}

/* dO, and the forward's O and LSE when given. */
static int load_backward_inputs(job *j)
{
    const cli_opts *op = &j->opt;
    const sdpa_problem *p = &j->p;
    const int r = j->q.a.ndim;
    const int64_t B = p->batch, Hq = p->q_heads, Tq = p->q_len, Dv = p->head_dim_v;
    int rc;
    if ((rc = load_tensor(op->dout, "dO", &j->dout)) ||
        (rc = check_shape(&j->dout, "dO", r, B, Hq, Tq, Dv, "dO is shaped like O: (B, Hq, Tq, Dv)")))
        return rc;
    if (!op->o)
        return 0;
    if ((rc = load_tensor(op->o, "O", &j->o)) ||
        (rc = check_shape(&j->o, "O", r, B, Hq, Tq, Dv, "the forward's O: (B, Hq, Tq, Dv)")))
        return rc;
    return load_given_lse(j);
}

/* Runs the backward into dq, dk, dv (shaped like Q, K, V), recomputing O and
 * LSE first (into buffers freed here) when they were not given. */
static int run_backward(job *j, float *dq, float *dk, float *dv, float *dsinks)
{
    const sdpa_tensor tq = tensor_view(&j->q), tk = tensor_view(&j->k), tv = tensor_view(&j->v),
                      tdo = tensor_view(&j->dout);
    const int64_t *os = j->osize, *ls = j->lsize;
    float *o = NULL, *lse = NULL;
    sdpa_tensor to = tensor_view(&j->o), tl = {(const float *)j->lse.a.data, ls[1], ls[2], 1};
    sdpa_status st = SDPA_OK;
    if (!j->opt.o) {
        o = alloc_floats(os[0]);
        lse = alloc_floats(ls[0]);
        if (!o || !lse)
            st = SDPA_ERR_OUT_OF_MEMORY;
        const sdpa_tensor_out wo = {o, os[1], os[2], os[3]}, wl = {lse, ls[1], ls[2], 1};
        if (st == SDPA_OK)
            st = sdpa_forward(&j->p, &tq, &tk, &tv, &wo, &wl);
        to = (sdpa_tensor){o, os[1], os[2], os[3]};
        tl.data = lse;
    }
    const sdpa_tensor_out odq = {dq, tq.batch_stride, tq.head_stride, tq.seq_stride},
                          odk = {dk, tk.batch_stride, tk.head_stride, tk.seq_stride},
                          odv = {dv, tv.batch_stride, tv.head_stride, tv.seq_stride};
    j->p.dsinks = dsinks; /* sdpa_forward above ignores it */
    if (st == SDPA_OK)
        st = sdpa_backward(&j->p, &tq, &tk, &tv, &to, &tl, &tdo, &odq, &odk, &odv);
    free(o);
    free(lse);
    return st == SDPA_OK ? 0 : library_error(st);
}

int cmd_backward(int argc, char **argv)
{
    job j;
    int rc, help;
    float *dq = NULL, *dk = NULL, *dv = NULL, *dsinks = NULL;
    out_file outs[4];
    int nout = 0;
    memset(&j, 0, sizeof j);
    memset(outs, 0, sizeof outs);
    if ((rc = parse_options(CMD_BACKWARD, argc, argv, &j.opt, &help)))
        return rc;
    if (help) {
        print_help(CMD_BACKWARD);
        return 0;
    }
    if ((rc = backward_args(&j.opt)) || (rc = load_common(&j)) || (rc = load_backward_inputs(&j)))
        goto done;
    dq = alloc_floats((int64_t)j.q.a.count);
    dk = alloc_floats((int64_t)j.k.a.count);
    dv = alloc_floats((int64_t)j.v.a.count);
    dsinks = j.opt.dsinks ? alloc_floats(j.p.q_heads) : NULL;
    if (!dq || !dk || !dv || (j.opt.dsinks && !dsinks)) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    const tensor *in[3] = {&j.q, &j.k, &j.v};
    const char *paths[3] = {j.opt.dq, j.opt.dk, j.opt.dv};
    const float *data[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        outs[i] = (out_file){paths[i], NULL, data[i], in[i]->a.ndim, {0}};
        memcpy(outs[i].shape, in[i]->a.shape, (size_t)in[i]->a.ndim * sizeof(int64_t));
    }
    nout = 3;
    if (j.opt.dsinks) /* float32 (Hq,), like the sinks */
        outs[nout++] = (out_file){j.opt.dsinks, NULL, dsinks, 1, {j.p.q_heads}};
    for (int i = 0; i < nout; i++)
        if ((rc = out_prepare(&outs[i])))
            goto done;
    if ((rc = run_backward(&j, dq, dk, dv, dsinks)) == 0)
        rc = out_commit(outs, nout);
done:
    out_discard(outs, nout);
    free(dq);
    free(dk);
    free(dv);
    free(dsinks);
    job_free(&j);
    return rc;
}
