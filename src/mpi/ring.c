/* SPDX-License-Identifier: MIT */
/* src/mpi/ring.c - ring attention over MPI (include/sdpa_mpi.h): forward and backward.
 *
 * Uses the public API of libsdpa only (sdpa_forward_with_workspace,
 * sdpa_backward_with_workspace, sdpa_merge_states); the plan of the local calls and
 * the checks are in ring_setup.c.
 *
 * Step s of P: rank r holds the K/V block of rank src = r - s (mod P), packed
 * contiguously [B, Hkv, Tkl, Dk] then [B, Hkv, Tkl, Dv]. It posts the send of that
 * block to r + 1 and the receive of the next one from r - 1, runs the local calls
 * of its query chunks against the key chunks of src (sdpa_ring_plan_calls), merges or
 * accumulates, then waits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ring_internal.h"
#include "../dtype.h"
#include "../view_copy.h"

/* ----------------------------------------------------------- messages */

typedef struct msgs {
    MPI_Request req[MAX_MSGS];
    int n;
} msgs;

/* One message of count floats as at most two requests (whatever count): the whole
 * blocks of MSG_FLOATS floats as one count of a contiguous datatype (freed at once:
 * a pending operation completes normally, MPI 4.0 sec. 5.1.8), then the remainder
 * (or an empty message when count is 0, so that sends and receives still pair). The
 * receiver splits the same count the same way, and messages of one tag between two
 * ranks do not overtake each other. count is a packed K/V block's floats, so
 * count / MSG_FLOATS stays far below INT_MAX. (Until session 29 every block was a
 * request of its own in a fixed array of 64: a slice of more than 2^33 floats wrote
 * past it.) */
static void post(msgs *m, int send, float *buf, int64_t count, int peer, int tag, MPI_Comm comm)
{
    const int64_t blocks = count / MSG_FLOATS, rest = count % MSG_FLOATS;
    if (blocks > 0) {
        MPI_Datatype block;
        MPI_Type_contiguous((int)MSG_FLOATS, MPI_FLOAT, &block);
        MPI_Type_commit(&block);
        if (send)
            MPI_Isend(buf, (int)blocks, block, peer, tag, comm, &m->req[m->n++]);
        else
            MPI_Irecv(buf, (int)blocks, block, peer, tag, comm, &m->req[m->n++]);
        MPI_Type_free(&block);
    }
    if (rest > 0 || blocks == 0) {
        float *at = buf + blocks * MSG_FLOATS;
        if (send)
            MPI_Isend(at, (int)rest, MPI_FLOAT, peer, tag, comm, &m->req[m->n++]);
        else
            MPI_Irecv(at, (int)rest, MPI_FLOAT, peer, tag, comm, &m->req[m->n++]);
    }
}

static void wait_all(msgs *m)
{
    if (m->n)
        MPI_Waitall(m->n, m->req, MPI_STATUSES_IGNORE);
    m->n = 0;
}

/* Bytes of one element of type dt. */
static size_t elem_size(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

/* Packs a [B, H, Tl, D] view of type dt into dst (contiguous fp32; 16-bit values widened,
 * exactly). */
static void pack(float *dst, const sdpa_tensor *t, sdpa_dtype dt, int64_t B, int64_t H, int64_t Tl, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++) {
                float *d = dst + ((b * H + h) * Tl + i) * D;
                const int64_t off = b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
                if (dt == SDPA_DTYPE_F32) {
                    if (D)
                        memcpy(d, (const float *)t->data + off, (size_t)D * sizeof(float));
                } else {
                    const uint16_t *x = (const uint16_t *)t->data + off;
                    for (int64_t e = 0; e < D; e++)
                        d[e] = dt == SDPA_DTYPE_BF16 ? sdpa_bf16_to_f32(x[e]) : sdpa_f16_to_f32(x[e]);
                }
            }
}

/* Writes contiguous fp32 src [B, H, Tl, D] to the view t of type dt (16-bit: rounded to
 * nearest even, as the library rounds its outputs). */
static void unpack(const sdpa_tensor_out *t, sdpa_dtype dt, const float *src, int64_t B, int64_t H, int64_t Tl,
                   int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Tl; i++) {
                const float *x = src + ((b * H + h) * Tl + i) * D;
                const int64_t off = b * t->batch_stride + h * t->head_stride + i * t->seq_stride;
                if (dt == SDPA_DTYPE_F32) {
                    if (D)
                        memcpy((float *)t->data + off, x, (size_t)D * sizeof(float));
                } else {
                    uint16_t *d = (uint16_t *)t->data + off;
                    for (int64_t e = 0; e < D; e++)
                        d[e] = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(x[e]) : sdpa_f32_to_f16(x[e]);
                }
            }
}

/* acc[B, H, Tl, D] rows [r0, r0 + n) += part[B, H, n, D] */
static void add_rows(float *acc, const float *part, int64_t B, int64_t H, int64_t Tl, int64_t r0, int64_t n,
                     int64_t D)
{
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *a = acc + (bh * Tl + r0) * D;
        const float *x = part + bh * n * D;
        for (int64_t e = 0; e < n * D; e++)
            a[e] += x[e];
    }
}

/* The state of rows [r0, r0 + n) of every (batch, head) that has seen no key yet:
 * O = 0, LSE = -inf (what the library writes for a row with no allowed key). */
static void empty_state(const sdpa_tensor_out *o, const sdpa_tensor_out *lse, int64_t B, int64_t H, int64_t r0,
                        int64_t n, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = r0; t < r0 + n; t++) {
                float *orow = (float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                for (int64_t d = 0; d < D; d++)
                    orow[d] = 0.0f;
                ((float *)lse->data)[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride] = -INFINITY;
            }
}

/* The sinks joined to the rows' states (gpt-oss; vLLM s_aux): the sink of head h is one
 * more logit s_h in every row's softmax, carrying no value, so the merged state is
 * LSE' = log(exp(LSE) + exp(s_h)), O' = O exp(LSE - LSE') (computed in double). A row
 * with no allowed key (LSE = -inf) gets O = 0, LSE = s_h; s_h = -inf changes nothing. */
static void merge_sinks(const float *sinks, const sdpa_tensor_out *o, const sdpa_tensor_out *lse, int64_t B,
                        int64_t H, int64_t Tl, int64_t D)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const double s = sinks[h];
            if (s == -INFINITY)
                continue;
            for (int64_t t = 0; t < Tl; t++) {
                float *l = (float *)lse->data + b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride;
                float *orow = (float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                const double L = *l, m = L > s ? L : s;
                const double nl = m + log(exp(L - m) + exp(s - m)), w = exp(L - nl);
                for (int64_t d = 0; d < D; d++)
                    orow[d] = (float)((double)orow[d] * w);
                *l = (float)nl;
            }
        }
}

/* This rank's part of d loss / d sinks[h] = -sum over batch and rows of
 * exp(s_h - LSE) * rowsum(dO * O) (sdpa_backward's dsinks), in double, into part[H]. */
static void dsinks_part(const float *sinks, const sdpa_tensor *o, const sdpa_tensor *lse, const sdpa_tensor *dout,
                        int64_t B, int64_t H, int64_t Tl, int64_t D, double *part)
{
    for (int64_t h = 0; h < H; h++) {
        double acc = 0;
        const double s = sinks[h];
        for (int64_t b = 0; b < B && s != -INFINITY; b++)
            for (int64_t t = 0; t < Tl; t++) {
                const double L = ((const float *)lse->data)[b * lse->batch_stride + h * lse->head_stride + t * lse->seq_stride];
                if (L == -INFINITY)
                    continue;
                const float *orow = (const float *)o->data + b * o->batch_stride + h * o->head_stride + t * o->seq_stride;
                const float *grow = (const float *)dout->data + b * dout->batch_stride + h * dout->head_stride +
                                    t * dout->seq_stride;
                double dsum = 0;
                for (int64_t d = 0; d < D; d++)
                    dsum += (double)grow[d] * (double)orow[d];
                acc -= exp(s - L) * dsum;
            }
        part[h] = acc;
    }
}

static void *alloc_f(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) - 16)
        return NULL;
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* The final agreement on a status after the data moved (only an allocation
 * inside sdpa_merge_states can fail there). */
static sdpa_status agree_final(MPI_Comm comm, sdpa_status st)
{
    int in = st, out;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MIN, comm);
    return (sdpa_status)out;
}

/* Agrees on an allocation failure before any data moves. */
static sdpa_status agree_alloc(MPI_Comm comm, int ok)
{
    return agree_final(comm, ok ? SDPA_OK : SDPA_ERR_OUT_OF_MEMORY);
}

/* ----------------------------------------------------------- forward */

sdpa_status sdpa_ring_forward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                              const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                              const sdpa_tensor_out *o, const sdpa_tensor_out *lse)
{
    /* the view structs, copied before anything is written (as sdpa_forward's) */
    sdpa_view_copies vc;
    sdpa_copy_views(&vc, (const sdpa_tensor **const[]){&q, &k, &v}, 3, (const sdpa_tensor_out **const[]){&o, &lse}, 2);
    ring R;
    sdpa_status st = sdpa_ring_begin(&R, comm, problem, layout, 0);
    if (st == SDPA_OK) {
        if (!q || !k || !v || !o)
            st = SDPA_ERR_NULL_ARGUMENT;
        else {
            sdpa_problem sp = sdpa_ring_slice_problem(&R);
            char dummy[1];
            st = sdpa_ring_probe_status(sdpa_forward_with_workspace(&sp, q, k, v, o, lse, dummy, 1));
            const size_t kb = R.kvlen ? (size_t)R.B * sizeof(int32_t) : 0;
            if (st == SDPA_OK && (sdpa_ring_overlaps(R.kvlen, kb, o, R.B, R.Hq, R.Tql, R.Dv, elem_size(R.o_dtype)) ||
                                  sdpa_ring_overlaps(R.kvlen, kb, lse, R.B, R.Hq, R.Tql, 1, sizeof(float))))
                st = SDPA_ERR_ALIASING;
        }
    }
    size_t ws_bytes;
    if ((st = sdpa_ring_checked(&R, st, 0, problem, layout, &ws_bytes)) != SDPA_OK)
        return st;
    const int64_t B = R.B, Hq = R.Hq, Hkv = R.Hkv, Tql = R.Tql, Tkl = R.Tkl, Dk = R.Dk, Dv = R.Dv;
    const int64_t kvn = B * Hkv * Tkl * (Dk + Dv);
    const int own_lse = !(lse && lse->data);
    /* a 16-bit Q: an fp32 copy of the slice; a 16-bit O: the state in an fp32 buffer,
       rounded into O at the end (the bits of the fp32 ring on the widened values) */
    const int wq = R.q_dtype != SDPA_DTYPE_F32, wo = R.o_dtype != SDPA_DTYPE_F32;
    float *kv[2] = {alloc_f(kvn), alloc_f(kvn)};
    float *ot = alloc_f(B * Hq * Tql * Dv), *lt = alloc_f(B * Hq * Tql), *la = own_lse ? alloc_f(B * Hq * Tql) : NULL;
    float *qf = wq ? alloc_f(B * Hq * Tql * Dk) : NULL, *of = wo ? alloc_f(B * Hq * Tql * Dv) : NULL;
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    st = agree_alloc(comm, kv[0] && kv[1] && ot && lt && (!own_lse || la) && (!wq || qf) && (!wo || of) && ws);
    if (st == SDPA_OK) {
        pack(kv[0], k, R.kv_dtype, B, Hkv, Tkl, Dk);
        pack(kv[0] + B * Hkv * Tkl * Dk, v, R.kv_dtype, B, Hkv, Tkl, Dv);
        if (wq)
            pack(qf, q, R.q_dtype, B, Hq, Tql, Dk);
        const sdpa_tensor qw = wq ? tv(qf, Hq * Tql * Dk, Tql * Dk, Dk) : *q;
        const sdpa_tensor_out ow = wo ? (sdpa_tensor_out){of, Hq * Tql * Dv, Tql * Dv, Dv} : *o;
        const sdpa_tensor_out lacc = own_lse ? (sdpa_tensor_out){la, Hq * Tql, Tql, 1} : *lse;
        int inited[2] = {0, 0}, sunk[2] = {0, 0}, cur = 0;
        for (int s = 0; s < R.P; s++) {
            const int src = (R.r - s + R.P) % R.P;
            msgs m = {.n = 0};
            if (s < R.P - 1) {
                post(&m, 0, kv[1 - cur], kvn, (R.r - 1 + R.P) % R.P, TAG_KV, comm);
                post(&m, 1, kv[cur], kvn, (R.r + 1) % R.P, TAG_KV, comm);
            }
            sub_call c[4];
            const int n = sdpa_ring_plan_calls(&R, src, c);
            for (int i = 0; i < n && st == SDPA_OK; i++) {
                const sdpa_problem p = sdpa_ring_call_problem(&R, src, &c[i]);
                const float *kb = kv[cur], *vb = kv[cur] + B * Hkv * Tkl * Dk;
                const sdpa_tensor kk = tv(kb + c[i].k0 * Dk, Hkv * Tkl * Dk, Tkl * Dk, Dk);
                const sdpa_tensor vv = tv(vb + c[i].k0 * Dv, Hkv * Tkl * Dv, Tkl * Dv, Dv);
                const sdpa_tensor qq = rows_in(&qw, c[i].q0);
                const sdpa_tensor_out oa = rows_out(&ow, c[i].q0), lsa = rows_out(&lacc, c[i].q0);
                const int c0 = (int)(c[i].q0 / R.Cq), c1 = (int)((c[i].q0 + c[i].nq - 1) / R.Cq);
                int any = 0, all = 1;
                for (int cc = c0; cc <= c1; cc++) {
                    any |= inited[cc];
                    all &= inited[cc];
                }
                if (!any) { /* the first state of these rows: straight into the accumulator,
                               with the sinks in the softmax as one call would have them */
                    sdpa_problem ps = p;
                    ps.sinks = R.sinks;
                    st = sdpa_forward_with_workspace(&ps, &qq, &kk, &vv, &oa, &lsa, ws, ws_bytes);
                    for (int cc = c0; cc <= c1; cc++)
                        sunk[cc] = 1;
                } else {
                    if (!all) /* a chunk without a state yet: an empty state (O = 0, LSE = -inf) */
                        for (int cc = c0; cc <= c1; cc++)
                            if (!inited[cc])
                                empty_state(&ow, &lacc, B, Hq, cc * R.Cq, R.Cq, Dv);
                    const int64_t nq = c[i].nq;
                    const sdpa_tensor_out op = {ot, Hq * nq * Dv, nq * Dv, Dv}, lp = {lt, Hq * nq, nq, 1};
                    st = sdpa_forward_with_workspace(&p, &qq, &kk, &vv, &op, &lp, ws, ws_bytes);
                    if (st == SDPA_OK) {
                        const sdpa_tensor a_o = tv(oa.data, oa.batch_stride, oa.head_stride, oa.seq_stride);
                        const sdpa_tensor a_l = tv(lsa.data, lsa.batch_stride, lsa.head_stride, lsa.seq_stride);
                        const sdpa_tensor b_o = tv(ot, op.batch_stride, op.head_stride, op.seq_stride);
                        const sdpa_tensor b_l = tv(lt, lp.batch_stride, lp.head_stride, lp.seq_stride);
                        st = sdpa_merge_states(B, Hq, nq, Dv, &a_o, &a_l, &b_o, &b_l, &oa, &lsa);
                    }
                }
                for (int cc = c0; cc <= c1; cc++)
                    inited[cc] = 1;
            }
            wait_all(&m);
            cur = 1 - cur;
        }
        /* chunks that met no key (queries before every key: Tq > Tk bottom-right) */
        for (int cc = 0; cc < R.nc && st == SDPA_OK; cc++)
            if (!inited[cc])
                empty_state(&ow, &lacc, B, Hq, cc * R.Cq, R.Cq, Dv);
        /* chunks whose first state was a merge into an empty state, or that met no key:
         * the sinks now (a row with no key gets O = 0, LSE = s_h) */
        for (int cc = 0; cc < R.nc && st == SDPA_OK && R.sinks; cc++)
            if (!sunk[cc]) {
                const sdpa_tensor_out oc = rows_out(&ow, cc * R.Cq), lc = rows_out(&lacc, cc * R.Cq);
                merge_sinks(R.sinks, &oc, &lc, B, Hq, R.Cq, Dv);
            }
        st = agree_final(comm, st);
        if (st == SDPA_OK && wo)
            unpack(o, R.o_dtype, of, B, Hq, Tql, Dv);
    }
    free(kv[0]);
    free(kv[1]);
    free(ot);
    free(lt);
    free(la);
    free(qf);
    free(of);
    free(ws);
    free(R.kvbuf);
    return st;
}

/* ----------------------------------------------------------- backward */

sdpa_status sdpa_ring_backward(MPI_Comm comm, sdpa_ring_layout layout, const sdpa_problem *problem,
                               const sdpa_tensor *q, const sdpa_tensor *k, const sdpa_tensor *v,
                               const sdpa_tensor *o, const sdpa_tensor *lse, const sdpa_tensor *dout,
                               const sdpa_tensor_out *dq, const sdpa_tensor_out *dk, const sdpa_tensor_out *dv)
{
    /* the view structs, copied before anything is written (as sdpa_backward's) */
    sdpa_view_copies vc;
    sdpa_copy_views(&vc, (const sdpa_tensor **const[]){&q, &k, &v, &o, &lse, &dout}, 6,
                    (const sdpa_tensor_out **const[]){&dq, &dk, &dv}, 3);
    ring R;
    sdpa_status st = sdpa_ring_begin(&R, comm, problem, layout, 1);
    if (st == SDPA_OK) {
        if (!q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv)
            st = SDPA_ERR_NULL_ARGUMENT;
        else {
            sdpa_problem sp = sdpa_ring_slice_problem(&R);
            char dummy[1];
            st = sdpa_ring_probe_status(sdpa_backward_with_workspace(&sp, q, k, v, o, lse, dout, dq, dk, dv, dummy, 1));
            const size_t kb = R.kvlen ? (size_t)R.B * sizeof(int32_t) : 0;
            const sdpa_tensor_out ds = {R.dsinks, 0, 0, 1};
            const size_t eq = elem_size(R.q_dtype), ekv = elem_size(R.kv_dtype);
            if (st == SDPA_OK && (sdpa_ring_overlaps(R.kvlen, kb, dq, R.B, R.Hq, R.Tql, R.Dk, eq) ||
                                  sdpa_ring_overlaps(R.kvlen, kb, dk, R.B, R.Hkv, R.Tkl, R.Dk, ekv) ||
                                  sdpa_ring_overlaps(R.kvlen, kb, dv, R.B, R.Hkv, R.Tkl, R.Dv, ekv) ||
                                  sdpa_ring_overlaps(R.kvlen, kb, &ds, 1, 1, 1, R.Hq, sizeof(float))))
                st = SDPA_ERR_ALIASING;
            if (R.P == 1 && R.nc == 1) /* one call sees every key: the sinks go into it, so that */
                R.base.sinks = R.sinks; /* a row with |LSE| >= 256 has them in its recomputed sum */
            if (st == SDPA_OK && sdpa_ring_frame_rows(&R, lse) < 0)
                st = SDPA_ERR_OUT_OF_MEMORY;
        }
    }
    size_t ws_bytes;
    if ((st = sdpa_ring_checked(&R, st, 1, problem, layout, &ws_bytes)) != SDPA_OK) {
        free(R.frame_bias);
        free(R.frame_lse);
        return st;
    }
    const int64_t B = R.B, Hq = R.Hq, Hkv = R.Hkv, Tql = R.Tql, Tkl = R.Tkl, Dk = R.Dk, Dv = R.Dv;
    const int64_t kn = B * Hkv * Tkl * Dk, kvn = B * Hkv * Tkl * (Dk + Dv), qn = B * Hq * Tql * Dk;
    float *kv[2] = {alloc_f(kvn), alloc_f(kvn)}, *dkv[2] = {alloc_f(kvn), alloc_f(kvn)};
    float *dkv_t = alloc_f(kvn), *dkv_c = alloc_f(kvn), *dq_acc = alloc_f(qn), *dq_t = alloc_f(qn);
    void *ws = malloc(ws_bytes ? ws_bytes : 1);
    double *ds = R.dsinks ? malloc(sizeof(double) * 2 * (size_t)(Hq > 0 ? Hq : 1)) : NULL;
    /* 16-bit Q, O and dO: fp32 copies of the slices (the calls' dQ is then fp32, summed
       over the steps in fp32, and rounded to Q's type once at the end, as dK and dV are) */
    const int wq = R.q_dtype != SDPA_DTYPE_F32, wo = R.o_dtype != SDPA_DTYPE_F32;
    const int64_t on = B * Hq * Tql * Dv;
    float *qf = wq ? alloc_f(qn) : NULL, *of = wo ? alloc_f(on) : NULL, *gf = wo ? alloc_f(on) : NULL;
    st = agree_alloc(comm, kv[0] && kv[1] && dkv[0] && dkv[1] && dkv_t && dkv_c && dq_acc && dq_t && ws &&
                               (!R.dsinks || ds) && (!wq || qf) && (!wo || (of && gf)));
    if (st == SDPA_OK) {
        pack(kv[0], k, R.kv_dtype, B, Hkv, Tkl, Dk);
        pack(kv[0] + kn, v, R.kv_dtype, B, Hkv, Tkl, Dv);
        if (wq)
            pack(qf, q, R.q_dtype, B, Hq, Tql, Dk);
        if (wo) {
            pack(of, o, R.o_dtype, B, Hq, Tql, Dv);
            pack(gf, dout, R.o_dtype, B, Hq, Tql, Dv);
        }
        const sdpa_tensor qw = wq ? tv(qf, Hq * Tql * Dk, Tql * Dk, Dk) : *q;
        const sdpa_tensor ow = wo ? tv(of, Hq * Tql * Dv, Tql * Dv, Dv) : *o;
        const sdpa_tensor gw = wo ? tv(gf, Hq * Tql * Dv, Tql * Dv, Dv) : *dout;
        memset(dq_acc, 0, (size_t)qn * sizeof(float));
        const int prev = (R.r - 1 + R.P) % R.P, next = (R.r + 1) % R.P;
        int cur = 0, a = 0;
        msgs dsend = {.n = 0}, drecv = {.n = 0};
        for (int s = 0; s < R.P; s++) {
            const int src = (R.r - s + R.P) % R.P;
            msgs m = {.n = 0};
            if (s < R.P - 1) {
                post(&m, 0, kv[1 - cur], kvn, prev, TAG_KV, comm);
                post(&m, 1, kv[cur], kvn, next, TAG_KV, comm);
            }
            /* this rank's share of dK/dV of block src (dkv_c), and of its own dQ */
            memset(dkv_c, 0, (size_t)kvn * sizeof(float));
            sub_call c[4];
            const int n = sdpa_ring_plan_calls(&R, src, c);
            for (int i = 0; i < n && st == SDPA_OK; i++) {
                const sdpa_problem p = sdpa_ring_call_problem(&R, src, &c[i]);
                const int64_t nq = c[i].nq, nk = c[i].nk;
                const float *kb = kv[cur], *vb = kv[cur] + kn;
                const sdpa_tensor kk = tv(kb + c[i].k0 * Dk, Hkv * Tkl * Dk, Tkl * Dk, Dk);
                const sdpa_tensor vv = tv(vb + c[i].k0 * Dv, Hkv * Tkl * Dv, Tkl * Dv, Dv);
                const sdpa_tensor lf = {R.frame_lse, Hq * Tql, Tql, 1};
                const sdpa_tensor qq = rows_in(&qw, c[i].q0), oo = rows_in(&ow, c[i].q0),
                                  ll = rows_in(R.frame_lse ? &lf : lse, c[i].q0), gg = rows_in(&gw, c[i].q0);
                const sdpa_tensor_out dqo = {dq_t, Hq * nq * Dk, nq * Dk, Dk};
                const sdpa_tensor_out dko = {dkv_t, Hkv * nk * Dk, nk * Dk, Dk};
                const sdpa_tensor_out dvo = {dkv_t + B * Hkv * nk * Dk, Hkv * nk * Dv, nk * Dv, Dv};
                st = sdpa_backward_with_workspace(&p, &qq, &kk, &vv, &oo, &ll, &gg, &dqo, &dko, &dvo, ws, ws_bytes);
                if (st == SDPA_OK) {
                    add_rows(dq_acc, dq_t, B, Hq, Tql, c[i].q0, nq, Dk);
                    add_rows(dkv_c, dkv_t, B, Hkv, Tkl, c[i].k0, nk, Dk);
                    add_rows(dkv_c + kn, dkv_t + B * Hkv * nk * Dk, B, Hkv, Tkl, c[i].k0, nk, Dv);
                }
            }
            /* the traveling sum of block src: from rank r - 1 (or start it) */
            if (s == 0)
                memcpy(dkv[a], dkv_c, (size_t)kvn * sizeof(float));
            else {
                wait_all(&drecv);
                for (int64_t e = 0; e < kvn; e++)
                    dkv[a][e] += dkv_c[e];
            }
            if (R.P > 1) {
                wait_all(&dsend); /* dkv[1 - a] is free again */
                post(&drecv, 0, dkv[1 - a], kvn, prev, TAG_DKV, comm);
                post(&dsend, 1, dkv[a], kvn, next, TAG_DKV, comm);
                a = 1 - a;
            }
            wait_all(&m);
            cur = 1 - cur;
        }
        /* block r's sum, home after P steps */
        wait_all(&drecv);
        wait_all(&dsend);
        if (R.dsinks) { /* every rank's rows: summed over the ranks (every rank takes part) */
            dsinks_part(R.sinks, &ow, lse, &gw, B, Hq, Tql, Dv, ds);
            MPI_Allreduce(ds, ds + Hq, (int)Hq, MPI_DOUBLE, MPI_SUM, comm);
        }
        st = agree_final(comm, st);
        if (st == SDPA_OK) {
            unpack(dq, R.q_dtype, dq_acc, B, Hq, Tql, Dk);
            unpack(dk, R.kv_dtype, dkv[a], B, Hkv, Tkl, Dk);
            unpack(dv, R.kv_dtype, dkv[a] + kn, B, Hkv, Tkl, Dv);
            for (int64_t h = 0; R.dsinks && h < Hq; h++)
                R.dsinks[h] = (float)ds[Hq + h];
        }
    }
    free(kv[0]);
    free(kv[1]);
    free(dkv[0]);
    free(dkv[1]);
    free(dkv_t);
    free(dkv_c);
    free(dq_acc);
    free(dq_t);
    free(qf);
    free(of);
    free(gf);
    free(ws);
    free(ds);
    free(R.frame_bias);
    free(R.frame_lse);
    free(R.kvbuf);
    return st;
}
