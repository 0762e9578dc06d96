/* SPDX-License-Identifier: MIT */
/* tools/cli_attn.c - `sdpa forward` and `sdpa backward` on .npy files.
 *
 * Every input is read and validated, and every output's temporary file is
 * created, before anything is computed (cli_out.c), so a bad input never
 * creates or changes an output file.
 *
 * File layouts, each a view (strides) over the file's own C-order data, never
 * a transposing copy; outputs are written in the layout of their input:
 *   dense (default --layout bhsd): (B, H, T, D), or rank 2 / 3 without B / H;
 *   dense --layout bshd: (B, T, H, D), LSE (B, T, H);
 *   packed (--cu-seqlens-q): token lists (total, H, D), LSE (total_q, Hq);
 *   paged K/V (--block-table): caches (num_blocks, Hkv, block_size, D) (HND)
 *     or (num_blocks, block_size, Hkv, D) (NHD), batch stride = page stride. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_job.h"

void job_free(job *j)
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
    npy_free(&j->cuq_raw);
    npy_free(&j->cuk_raw);
    npy_free(&j->bt_raw);
    npy_free(&j->lk_raw);
    free(j->kvlen);
    free(j->cuq);
    free(j->cuk);
    free(j->bt);
    free(j->lk);
}

/* The first output path that names one of the input files, or NULL (an output
 * must never replace an input by accident). */
const char *output_clobbers_input(const cli_opts *o, const char *const *outs, int nout)
{
    const char *ins[] = {o->q,    o->k,     o->v,   o->dout, o->kvlen, o->mask, o->bias,
                         o->alibi, o->sinks, o->cuq, o->cuk,  o->btab,  o->lensk};
    for (int i = 0; i < nout; i++)
        for (size_t j = 0; j < sizeof ins / sizeof ins[0]; j++)
            if (same_file(outs[i], ins[j]))
                return outs[i];
    return NULL;
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
static int forward_outputs(const job *j, void *o, float *lse, out_file *outs)
{
    int n = 0;
    outs[n].path = j->opt.o;
    outs[n].data = o;
    outs[n].dt = j->opt.dtype;
    outs[n].ndim = j->ondim;
    memcpy(outs[n].shape, j->oshape, sizeof j->oshape);
    n++;
    if (j->opt.lse) {
        outs[n].path = j->opt.lse;
        outs[n].data = lse;
        outs[n].dt = SDPA_DTYPE_F32;
        outs[n].ndim = j->lndim;
        memcpy(outs[n].shape, j->lshape, sizeof j->lshape);
        n++;
    }
    return n;
}

int cmd_forward(int argc, char **argv)
{
    job j;
    int rc, help, nout = 0;
    void *o = NULL;
    float *lse = NULL;
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
    o = alloc_elems(j.ocount, j.opt.dtype);
    lse = j.opt.lse ? alloc_floats(j.lcount) : NULL;
    if (!o || (j.opt.lse && !lse)) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    nout = forward_outputs(&j, o, lse, outs);
    for (int i = 0; i < nout; i++)
        if ((rc = out_prepare(&outs[i])))
            goto done;
    const sdpa_tensor_out to = {o, j.ostr[0], j.ostr[1], j.ostr[2]}, tl = {lse, j.lstr[0], j.lstr[1], j.lstr[2]};
    const sdpa_status st = sdpa_forward(&j.p, &j.vq, &j.vk, &j.vv, &to, lse ? &tl : NULL);
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

static int same_shape(const tensor *t, const char *role, const int64_t *shape, int ndim, const char *what)
{
    char s1[160], s2[160];
    if (t->a.ndim == ndim && memcmp(t->a.shape, shape, (size_t)ndim * sizeof(int64_t)) == 0)
        return 0;
    file_error(t->path, "%s has shape %s, expected %s (%s)", role, npy_shape_str(t->a.shape, t->a.ndim, s1, sizeof s1),
               npy_shape_str(shape, ndim, s2, sizeof s2), what);
    return EXIT_BAD;
}

/* dO, and the forward's O and LSE when given. */
static int load_backward_inputs(job *j)
{
    const cli_opts *op = &j->opt;
    int rc;
    if ((rc = load_tensor_as(op->dout, "dO", op->dtype, &j->dout)) ||
        (rc = same_shape(&j->dout, "dO", j->oshape, j->ondim, "dO is shaped like O: Q's shape with Dv last")))
        return rc;
    if (!op->o)
        return 0;
    if ((rc = load_tensor_as(op->o, "O", op->dtype, &j->o)) ||
        (rc = same_shape(&j->o, "O", j->oshape, j->ondim, "the forward's O: Q's shape with Dv last")))
        return rc;
    return load_given_lse(j);
}

/* Runs the backward into dq, dk, dv (shaped like Q, K, V; of the types of Q
 * and K/V), recomputing O (of --dtype's type) and LSE first (into buffers freed
 * here) when they were not given. */
static int run_backward(job *j, void *dq, void *dk, void *dv, float *dsinks)
{
    const sdpa_tensor tq = j->vq, tk = j->vk, tv = j->vv;
    const int64_t *os = j->ostr, *ls = j->lstr;
    const sdpa_tensor tdo = {j->dout.a.data, os[0], os[1], os[2]};
    void *o = NULL;
    float *lse = NULL;
    sdpa_tensor to = {j->o.a.data, os[0], os[1], os[2]}, tl = {j->lse.a.data, ls[0], ls[1], ls[2]};
    sdpa_status st = SDPA_OK;
    if (!j->opt.o) {
        o = alloc_elems(j->ocount, j->opt.dtype);
        lse = alloc_floats(j->lcount);
        if (!o || !lse)
            st = SDPA_ERR_OUT_OF_MEMORY;
        const sdpa_tensor_out wo = {o, os[0], os[1], os[2]}, wl = {lse, ls[0], ls[1], ls[2]};
        if (st == SDPA_OK)
            st = sdpa_forward(&j->p, &tq, &tk, &tv, &wo, &wl);
        to.data = o;
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
    void *dq = NULL, *dk = NULL, *dv = NULL;
    float *dsinks = NULL;
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
    dq = alloc_elems((int64_t)j.q.a.count, j.opt.dtype); /* a gradient has its tensor's type */
    dk = alloc_elems((int64_t)j.k.a.count, j.opt.kv_dtype);
    dv = alloc_elems((int64_t)j.v.a.count, j.opt.kv_dtype);
    dsinks = j.opt.dsinks ? alloc_floats(j.p.q_heads) : NULL;
    if (!dq || !dk || !dv || (j.opt.dsinks && !dsinks)) {
        rc = library_error(SDPA_ERR_OUT_OF_MEMORY);
        goto done;
    }
    const tensor *in[3] = {&j.q, &j.k, &j.v};
    const char *paths[3] = {j.opt.dq, j.opt.dk, j.opt.dv};
    const void *data[3] = {dq, dk, dv};
    for (int i = 0; i < 3; i++) {
        outs[i] = (out_file){.path = paths[i], .data = data[i], .ndim = in[i]->a.ndim, .dt = in[i]->dt};
        memcpy(outs[i].shape, in[i]->a.shape, (size_t)in[i]->a.ndim * sizeof(int64_t));
    }
    nout = 3;
    if (j.opt.dsinks) /* float32 (Hq,), like the sinks */
        outs[nout++] = (out_file){.path = j.opt.dsinks, .data = dsinks, .ndim = 1, .shape = {j.p.q_heads}, .dt = SDPA_DTYPE_F32};
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
