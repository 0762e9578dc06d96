/* SPDX-License-Identifier: MIT */
/* libsdpa._fastpath: attention()'s common case (libsdpa/_api.py, _fast_forward) as a
 * CPython extension, so that a plain call on float32 / float16 ndarrays runs no Python
 * bytecode and no ctypes conversion between attention() and the library.
 *
 * It does exactly what _fast_forward does and nothing else: the same acceptance rules
 * (anything else returns None and attention() goes on to the Python paths, which check
 * and word every error), the same descriptor (a copy of the template that
 * sdpa_problem_init() filled, handed over by the package at import) and the same tensor
 * views, byte for byte (python/tests/test_numpy.py compares them through describe()).
 *
 * It does not link the library: the package passes the address of the sdpa_forward that
 * its ctypes handle resolved, so both routes call the same copy of the library (one
 * process-wide ISA choice, one sdpa_force_isa). The GIL is released around the call, as
 * ctypes does. A nonzero status returns None too: the general path then repeats the call
 * (the library wrote nothing) and raises its error with the library's message.
 *
 * Arrays are read through NumPy's C API: exact numpy.ndarray instances of float32 or
 * float16 in native byte order; ml_dtypes' bfloat16 and everything else take the Python
 * paths. Outputs are new C-contiguous arrays (PyArray_EMPTY, as numpy.empty). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "sdpa.h"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

typedef sdpa_status (*forward_fn)(const sdpa_problem *, const sdpa_tensor *,
                                  const sdpa_tensor *, const sdpa_tensor *,
                                  const sdpa_tensor_out *, const sdpa_tensor_out *);

static forward_fn g_forward;        /* NULL until init() */
static sdpa_problem g_template;     /* sdpa_problem_init()'s bytes */
static PyObject *g_causal;          /* _api._CAUSAL: dict of causal= values -> sdpa_causal */
static int g_clock = -1;            /* timing(): the clock that times the library call, or -1 */
static long long g_inside_ns;       /* ns spent in the library call since inside_ns() */

/* One operand: a 4-d exact ndarray of a supported type, or not (0). */
typedef struct {
    PyArrayObject *array;
    void *data;
    npy_intp shape[4], strides[4]; /* copies: the causal= lookup may run Python code that
                                      reshapes the array and frees numpy's own arrays */
    int code;          /* sdpa_dtype: 0 fp32, 2 fp16 */
    npy_intp item;     /* bytes per element */
} operand;

/* 1 when x is an operand the fast path takes, 0 when not. */
static int take(PyObject *x, operand *op)
{
    if (!PyArray_CheckExact(x))
        return 0;
    PyArrayObject *a = (PyArrayObject *)x;
    if (PyArray_NDIM(a) != 4 || !PyArray_ISNOTSWAPPED(a))
        return 0;
    int type = PyArray_TYPE(a);
    if (type == NPY_FLOAT) {
        op->code = SDPA_DTYPE_F32;
        op->item = 4;
    } else if (type == NPY_HALF) {
        op->code = SDPA_DTYPE_F16;
        op->item = 2;
    } else {
        return 0;
    }
    const npy_intp *sh = PyArray_DIMS(a), *st = PyArray_STRIDES(a);
    for (int i = 0; i < 4; i++)
        if (sh[i] == 0)
            return 0;
    /* the last dimension contiguous (or of size 1), the leading strides non-negative
     * multiples of the item size below 2^62, the data aligned to it: _fast_forward's
     * rules (its _BAD masks) */
    if (sh[3] > 1 && st[3] != op->item)
        return 0;
    for (int i = 0; i < 3; i++)
        if (st[i] < 0 || st[i] >= ((npy_intp)1 << 62) || st[i] % op->item)
            return 0;
    op->data = PyArray_DATA(a);
    if ((uintptr_t)op->data % (uintptr_t)op->item)
        return 0;
    op->array = a;
    memcpy(op->shape, sh, sizeof op->shape);
    memcpy(op->strides, st, sizeof op->strides);
    return 1;
}

/* The tensor view of a taken operand, a stride of 0 where the dimension (by `some`,
 * whether it is longer than 1) has one entry, as _fast_forward writes it. */
static sdpa_tensor view_of(const operand *op, int b1, int h1, int t1)
{
    const npy_intp *st = op->strides;
    sdpa_tensor t;
    t.data = op->data;
    t.batch_stride = b1 ? st[0] / op->item : 0;
    t.head_stride = h1 ? st[1] / op->item : 0;
    t.seq_stride = t1 ? st[2] / op->item : 0;
    return t;
}

/* What the fast path would hand the library: 1 with *p and the three views filled, 0 when
 * the call is not its case. */
static int prepare(PyObject *const *args, operand ops[3], sdpa_problem *p, sdpa_tensor t[3])
{
    PyObject *scale = args[3], *causal = args[4], *threads = args[5];
    /* the keywords first: the causal= lookup may run Python code (__hash__, __eq__),
     * which must not see the arrays taken */
    int ok = 1;
    int causal_code = 0;
    long nthreads = 0;
    if (scale != Py_None && !PyFloat_CheckExact(scale))
        ok = 0;
    if (ok && causal != Py_None && causal != Py_False && causal != Py_True && !PyUnicode_CheckExact(causal))
        ok = 0; /* 1 or 1.0 would find True's entry: the general path refuses them */
    if (ok && causal != Py_None && causal != Py_False) {
        PyObject *c = PyDict_GetItemWithError(g_causal, causal);
        long code = c ? PyLong_AsLong(c) : -1;
        if (!c || code < 0 || code > SDPA_CAUSAL_BOTTOM_RIGHT) {
            PyErr_Clear();          /* unhashable or unknown: the general path says why */
            ok = 0;
        } else {
            causal_code = (int)code;
        }
    }
    if (ok) {
        if (!PyLong_CheckExact(threads)) {
            ok = 0;
        } else {
            int overflow = 0;
            nthreads = PyLong_AsLongAndOverflow(threads, &overflow);
            if (overflow || nthreads < 0 || nthreads > INT32_MAX)
                ok = 0;
        }
    }
    if (!ok)
        return 0;
    for (int i = 0; i < 3; i++)
        if (!take(args[i], &ops[i]))
            return 0;
    const npy_intp *qs = ops[0].shape, *ks = ops[1].shape, *vs = ops[2].shape;
    if (ops[1].code != ops[2].code || ks[0] != qs[0] || vs[0] != qs[0] || ks[3] != qs[3] || vs[1] != ks[1] ||
        vs[2] != ks[2])
        return 0;
    *p = g_template;
    p->batch = qs[0];
    p->q_heads = qs[1];
    p->kv_heads = ks[1];
    p->q_len = qs[2];
    p->kv_len = ks[2];
    p->head_dim_qk = qs[3];
    p->head_dim_v = vs[3];
    if (scale != Py_None) {
        double s = PyFloat_AS_DOUBLE(scale);
        /* _api._f32: the float32 nearest to s; a finite value beyond FLT_MAX is not this
         * path's case (the general path stores it as _f32 does) */
        if (!(s >= -FLT_MAX && s <= FLT_MAX) && s == s)
            return 0;
        p->use_default_scale = 0;
        p->scale = (float)s;
    }
    p->causal = (sdpa_causal)causal_code;
    p->num_threads = (int)nthreads;
    p->q_dtype = (sdpa_dtype)ops[0].code;
    p->kv_dtype = (sdpa_dtype)ops[1].code;
    p->o_dtype = (sdpa_dtype)ops[0].code;
    int b1 = qs[0] > 1;
    t[0] = view_of(&ops[0], b1, qs[1] > 1, qs[2] > 1);
    t[1] = view_of(&ops[1], b1, ks[1] > 1, ks[2] > 1);
    t[2] = view_of(&ops[2], b1, ks[1] > 1, ks[2] > 1);
    return 1;
}

/* forward(q, k, v, scale, causal, threads, return_lse) -> O, (O, LSE), or None */
static PyObject *fp_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 7 || !g_forward) {
        PyErr_SetString(PyExc_TypeError, "forward: 7 arguments, after init()");
        return NULL;
    }
    operand ops[3];
    sdpa_problem p;
    sdpa_tensor t[3];
    /* before the arrays are taken (__bool__ may run Python code); an error in it is not
     * this path's case: the Python paths meet it again where they always did */
    int want_lse = PyObject_IsTrue(args[6]);
    if (want_lse < 0) {
        PyErr_Clear();
        return Py_NewRef(Py_None);
    }
    if (!prepare(args, ops, &p, t))
        return Py_NewRef(Py_None);
    PyObject *out = NULL, *lse = NULL, *result = NULL;
    int64_t B = p.batch, H = p.q_heads, T = p.q_len, Dv = p.head_dim_v;
    sdpa_tensor_out o_t, l_t;
    npy_intp shape[4] = {(npy_intp)B, (npy_intp)H, (npy_intp)T, (npy_intp)Dv};
    /* O of q's dtype object itself (its metadata too), as numpy.empty(shape, q.dtype) */
    PyArray_Descr *odt = PyArray_DESCR(ops[0].array);
    Py_INCREF(odt);
    out = PyArray_Empty(4, shape, odt, 0);
    if (!out)
        goto done;
    o_t.data = PyArray_DATA((PyArrayObject *)out);
    o_t.batch_stride = H * T * Dv;
    o_t.head_stride = T * Dv;
    o_t.seq_stride = Dv;
    if (want_lse) {
        lse = PyArray_EMPTY(3, shape, NPY_FLOAT, 0);
        if (!lse)
            goto done;
        l_t.data = PyArray_DATA((PyArrayObject *)lse);
        l_t.batch_stride = H * T;
        l_t.head_stride = T;
        l_t.seq_stride = 1;
    }
    sdpa_status st;
    struct timespec t0, t1;
    int clock = g_clock;
    Py_BEGIN_ALLOW_THREADS
    if (clock >= 0)
        clock_gettime((clockid_t)clock, &t0);
    st = g_forward(&p, &t[0], &t[1], &t[2], &o_t, want_lse ? &l_t : NULL);
    if (clock >= 0)
        clock_gettime((clockid_t)clock, &t1);
    Py_END_ALLOW_THREADS
    if (clock >= 0)
        g_inside_ns += (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL +
                       (t1.tv_nsec - t0.tv_nsec);
    if (st != SDPA_OK) {
        result = Py_NewRef(Py_None);
    } else if (want_lse) {
        result = PyTuple_Pack(2, out, lse);
    } else {
        result = Py_NewRef(out);
    }
done:
    Py_XDECREF(out);
    Py_XDECREF(lse);
    return result;
}

/* describe(q, k, v, scale, causal, threads) -> (problem bytes, q, k, v view bytes) or None:
 * what forward() would hand the library (for the tests) */
static PyObject *fp_describe(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 6 || !g_forward) {
        PyErr_SetString(PyExc_TypeError, "describe: 6 arguments, after init()");
        return NULL;
    }
    operand ops[3];
    sdpa_problem p;
    sdpa_tensor t[3];
    if (!prepare(args, ops, &p, t))
        return Py_NewRef(Py_None);
    return Py_BuildValue("(y#y#y#y#)", (const char *)&p, (Py_ssize_t)sizeof p,
                         (const char *)&t[0], (Py_ssize_t)sizeof t[0],
                         (const char *)&t[1], (Py_ssize_t)sizeof t[1],
                         (const char *)&t[2], (Py_ssize_t)sizeof t[2]);
}

/* timing(clock id or -1): time every library call of forward() by that clock
 * (time.CLOCK_MONOTONIC, time.CLOCK_THREAD_CPUTIME_ID) from now on, or stop; for
 * python/bench_overhead.py, which separates the time outside the library call */
static PyObject *fp_timing(PyObject *self, PyObject *arg)
{
    (void)self;
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred())
        return NULL;
    struct timespec ts;
    if (c >= 0 && (c > INT32_MAX || clock_gettime((clockid_t)c, &ts) != 0)) {
        PyErr_Format(PyExc_ValueError, "timing: clock %ld is not a clock of this system", c);
        return NULL;
    }
    g_clock = c < 0 ? -1 : (int)c;
    g_inside_ns = 0;
    return Py_NewRef(Py_None);
}

/* inside_ns() -> ns spent in library calls since the last inside_ns() or timing() */
static PyObject *fp_inside_ns(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    long long ns = g_inside_ns;
    g_inside_ns = 0;
    return PyLong_FromLongLong(ns);
}

/* init(forward address, template bytes, causal dict) */
static PyObject *fp_init(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long addr;
    Py_buffer tmpl;
    PyObject *causal;
    if (!PyArg_ParseTuple(args, "Ky*O!", &addr, &tmpl, &PyDict_Type, &causal))
        return NULL;
    if (tmpl.len != (Py_ssize_t)sizeof(sdpa_problem) || !addr) {
        PyBuffer_Release(&tmpl);
        PyErr_SetString(PyExc_ValueError, "init: the descriptor template's size differs "
                                          "from this module's sdpa_problem");
        return NULL;
    }
    memcpy(&g_template, tmpl.buf, sizeof g_template);
    PyBuffer_Release(&tmpl);
    Py_XSETREF(g_causal, Py_NewRef(causal));
    g_forward = (forward_fn)(uintptr_t)addr;
    return Py_NewRef(Py_None);
}

static PyMethodDef methods[] = {
    {"init", fp_init, METH_VARARGS, "init(forward_address, template, causal_dict)"},
    {"forward", (PyCFunction)(void (*)(void))fp_forward, METH_FASTCALL,
     "forward(q, k, v, scale, causal, threads, return_lse) -> O, (O, LSE) or None"},
    {"describe", (PyCFunction)(void (*)(void))fp_describe, METH_FASTCALL,
     "describe(q, k, v, scale, causal, threads) -> (problem, q, k, v) bytes or None"},
    {"timing", fp_timing, METH_O, "timing(clock_id or -1): time the library calls"},
    {"inside_ns", fp_inside_ns, METH_NOARGS, "ns in library calls since the last read"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastpath",
    "attention()'s common case in C (see libsdpa/_api.py)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void);
PyMODINIT_FUNC PyInit__fastpath(void)
{
    import_array();
    return PyModule_Create(&module);
}
