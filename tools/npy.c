/* SPDX-License-Identifier: MIT */
/* tools/npy.c - minimal reader and writer of NumPy .npy files for the sdpa tool.
 *
 * File layout (numpy.lib.format): the magic "\x93NUMPY", one byte major and one
 * byte minor version, the header length (2 bytes little-endian in 1.0, 4 bytes
 * in 2.0 and 3.0), then the header: a Python dict literal
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }
 * padded with spaces and a newline, then the raw data. The header is parsed by
 * a small strict parser (no Python evaluation): exactly the three keys, string
 * / bool / tuple-of-int values. */
#include "npy.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
/* Headers beyond this are garbage, not arrays (numpy itself caps them at 10000
 * bytes unless told otherwise). */
#define NPY_MAX_HEADER (1u << 20)

static const struct {
    const char *descr;
    const char *name;
    size_t size;
} dtype_info[] = {
    [NPY_F4] = {"<f4", "float32", 4}, [NPY_B1] = {"|b1", "bool", 1}, [NPY_U1] = {"|u1", "uint8", 1},
    [NPY_I4] = {"<i4", "int32", 4},   [NPY_I8] = {"<i8", "int64", 8}, [NPY_F2] = {"<f2", "float16", 2},
};

size_t npy_dtype_size(npy_dtype dtype)
{
    return dtype_info[dtype].size;
}

const char *npy_dtype_descr(npy_dtype dtype)
{
    return dtype_info[dtype].descr;
}

const char *npy_dtype_name(npy_dtype dtype)
{
    return dtype_info[dtype].name;
}

static void set_err(char *err, size_t len, const char *fmt, ...)
{
    va_list ap;
    if (!err || len == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static void byteswap(void *data, size_t count, size_t size)
{
    unsigned char *p = data;
    for (size_t i = 0; i < count; i++, p += size)
        for (size_t a = 0, b = size - 1; a < b; a++, b--) {
            unsigned char t = p[a];
            p[a] = p[b];
            p[b] = t;
        }
}

char *npy_shape_str(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t n = 0;
    if (len == 0)
        return buf;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, len - n, "(");
    for (int i = 0; i < ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, ndim == 1 ? ",)" : ")");
    return buf;
}

/* ---- header parser ---------------------------------------------------- */

typedef struct parser {
    const char *start, *p, *end;
    char *err;
    size_t errlen;
} parser;

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int expect(parser *ps, char c)
{
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != c) {
        set_err(ps->err, ps->errlen, "malformed header: expected '%c' at offset %ld", c,
                (long)(ps->p - ps->start));
        return -1;
    }
    ps->p++;
    return 0;
}

/* A Python string literal in single or double quotes (no escapes needed for
 * the values that matter; an escape makes the string unusable, not the parse). */
static int parse_string(parser *ps, char *out, size_t outlen)
{
    char q;
    size_t n = 0;
    skip_ws(ps);
    if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"')) {
        set_err(ps->err, ps->errlen, "malformed header: expected a quoted string");
        return -1;
    }
    q = *ps->p++;
    while (ps->p < ps->end && *ps->p != q) {
        if (*ps->p == '\\' || *ps->p == '\n') {
            set_err(ps->err, ps->errlen, "malformed header: unsupported character in a string");
            return -1;
        }
        if (n + 1 < outlen)
            out[n++] = *ps->p;
        ps->p++;
    }
    if (ps->p >= ps->end) {
        set_err(ps->err, ps->errlen, "malformed header: unterminated string");
        return -1;
    }
    ps->p++;
    out[n] = '\0';
    return 0;
}

static int parse_word(parser *ps, const char *word)
{
    size_t n = strlen(word);
    skip_ws(ps);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return 0;
    }
    return -1;
}

static int parse_shape(parser *ps, int64_t *shape, int *ndim)
{
    int n = 0;
    if (expect(ps, '(') != 0)
        return -1;
    for (;;) {
        int64_t v = 0;
        int digits = 0;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ')') {
            ps->p++;
            break;
        }
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            int d = *ps->p - '0';
            if (v > (INT64_MAX - d) / 10) {
                set_err(ps->err, ps->errlen, "shape: dimension too large");
                return -1;
            }
            v = v * 10 + d;
            digits++;
            ps->p++;
        }
        if (!digits) {
            set_err(ps->err, ps->errlen, "malformed header: shape must be a tuple of non-negative integers");
            return -1;
        }
        if (ps->p < ps->end && *ps->p == 'L') /* written by Python 2 */
            ps->p++;
        if (n >= NPY_MAX_DIMS) {
            set_err(ps->err, ps->errlen, "shape: more than %d dimensions", NPY_MAX_DIMS);
            return -1;
        }
        shape[n++] = v;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (expect(ps, ')') != 0)
            return -1;
        break;
    }
    *ndim = n;
    return 0;
}

static int parse_dtype(const char *descr, npy_dtype *dtype, char *err, size_t errlen)
{
    char order;
    const char *t;
    static const char *const supported =
        "supported: float32 '<f4', float16 '<f2', bool '|b1', uint8 '|u1', int32 '<i4', int64 '<i8'";
    if (strlen(descr) < 2) {
        set_err(err, errlen, "unsupported dtype '%s' (%s)", descr, supported);
        return -1;
    }
    order = descr[0];
    t = descr + 1;
    if (order != '<' && order != '>' && order != '|' && order != '=') {
        order = '=';
        t = descr;
    }
    if (strcmp(t, "b1") == 0 || strcmp(t, "?") == 0) {
        *dtype = NPY_B1;
        return 0;
    }
    if (strcmp(t, "u1") == 0) {
        *dtype = NPY_U1;
        return 0;
    }
    if (strcmp(t, "f4") == 0)
        *dtype = NPY_F4;
    else if (strcmp(t, "f2") == 0)
        *dtype = NPY_F2;
    else if (strcmp(t, "i4") == 0)
        *dtype = NPY_I4;
    else if (strcmp(t, "i8") == 0)
        *dtype = NPY_I8;
    else {
        set_err(err, errlen, "unsupported dtype '%s' (%s)", descr, supported);
        return -1;
    }
    if (order == '>' || (order == '=' && !host_is_little_endian())) {
        set_err(err, errlen, "big-endian dtype '%s' is not supported (convert with a.astype('<%s'))",
                descr, t);
        return -1;
    }
    if (order == '|') {
        set_err(err, errlen, "dtype '%s' lacks a byte order (%s)", descr, supported);
        return -1;
    }
    return 0;
}

static int parse_header(const char *h, size_t len, npy_array *a, char *err, size_t errlen)
{
    parser ps = {h, h, h + len, err, errlen};
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0;
    char descr[64];

    if (expect(&ps, '{') != 0)
        return -1;
    for (;;) {
        char key[32];
        skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == '}') {
            ps.p++;
            break;
        }
        if (parse_string(&ps, key, sizeof key) != 0 || expect(&ps, ':') != 0)
            return -1;
        if (strcmp(key, "descr") == 0 && !have_descr) {
            skip_ws(&ps);
            if (ps.p < ps.end && *ps.p == '[') {
                set_err(err, errlen, "structured dtypes are not supported");
                return -1;
            }
            if (parse_string(&ps, descr, sizeof descr) != 0)
                return -1;
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0 && !have_order) {
            if (parse_word(&ps, "True") == 0)
                fortran = 1;
            else if (parse_word(&ps, "False") == 0)
                fortran = 0;
            else {
                set_err(err, errlen, "malformed header: fortran_order must be True or False");
                return -1;
            }
            have_order = 1;
        } else if (strcmp(key, "shape") == 0 && !have_shape) {
            if (parse_shape(&ps, a->shape, &a->ndim) != 0)
                return -1;
            have_shape = 1;
        } else {
            set_err(err, errlen, "malformed header: unexpected or repeated key '%s'", key);
            return -1;
        }
        skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == ',') {
            ps.p++;
            continue;
        }
        if (expect(&ps, '}') != 0)
            return -1;
        break;
    }
    skip_ws(&ps);
    while (ps.p < ps.end && *ps.p == '\0') /* some writers pad with NULs */
        ps.p++;
    if (ps.p != ps.end) {
        set_err(err, errlen, "malformed header: trailing characters after the dictionary");
        return -1;
    }
    if (!have_descr || !have_order || !have_shape) {
        set_err(err, errlen, "malformed header: missing key '%s'",
                !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
        return -1;
    }
    if (parse_dtype(descr, &a->dtype, err, errlen) != 0)
        return -1;
    /* Fortran order of a rank <= 1 array is the same layout as C order. */
    if (fortran && a->ndim > 1) {
        set_err(err, errlen, "Fortran-order arrays are not supported (save np.ascontiguousarray(a))");
        return -1;
    }
    return 0;
}

/* ---- reading ---------------------------------------------------------- */

static int read_exact(FILE *f, void *buf, size_t n)
{
    return fread(buf, 1, n, f) == n ? 0 : -1;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen)
{
    FILE *f;
    unsigned char pre[NPY_MAGIC_LEN + 2], lenb[4];
    uint32_t hlen;
    size_t hdr_total, nbytes, elsize;
    char *header = NULL;
    struct stat st;
    npy_array a;

    memset(out, 0, sizeof *out);
    memset(&a, 0, sizeof a);
    f = fopen(path, "rb");
    if (!f) {
        set_err(err, errlen, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        set_err(err, errlen, "is a directory");
        goto fail;
    }
    if (read_exact(f, pre, sizeof pre) != 0 || memcmp(pre, NPY_MAGIC, NPY_MAGIC_LEN) != 0) {
        set_err(err, errlen, "not a .npy file (bad magic)");
        goto fail;
    }
    if (pre[6] == 1 && pre[7] == 0) {
        if (read_exact(f, lenb, 2) != 0) {
            set_err(err, errlen, "truncated header");
            goto fail;
        }
        hlen = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8;
        hdr_total = NPY_MAGIC_LEN + 2 + 2 + hlen;
    } else if ((pre[6] == 2 || pre[6] == 3) && pre[7] == 0) {
        if (read_exact(f, lenb, 4) != 0) {
            set_err(err, errlen, "truncated header");
            goto fail;
        }
        hlen = (uint32_t)lenb[0] | (uint32_t)lenb[1] << 8 | (uint32_t)lenb[2] << 16 |
               (uint32_t)lenb[3] << 24;
        hdr_total = NPY_MAGIC_LEN + 2 + 4 + (size_t)hlen;
    } else {
        set_err(err, errlen, "unsupported .npy format version %u.%u (supported: 1.0, 2.0, 3.0)",
                pre[6], pre[7]);
        goto fail;
    }
    if (hlen > NPY_MAX_HEADER) {
        set_err(err, errlen, "malformed header: length %lu is implausible", (unsigned long)hlen);
        goto fail;
    }
    header = malloc((size_t)hlen + 1);
    if (!header) {
        set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (read_exact(f, header, hlen) != 0) {
        set_err(err, errlen, "truncated header");
        goto fail;
    }
    header[hlen] = '\0';
    if (parse_header(header, hlen, &a, err, errlen) != 0)
        goto fail;
    free(header);
    header = NULL;

    elsize = npy_dtype_size(a.dtype);
    a.count = 1;
    for (int i = 0; i < a.ndim; i++) {
        if (a.shape[i] != 0 && a.count > (SIZE_MAX / elsize) / (uint64_t)a.shape[i]) {
            set_err(err, errlen, "array too large for this machine");
            goto fail;
        }
        a.count *= (size_t)a.shape[i];
    }
    nbytes = a.count * elsize;
    if (S_ISREG(st.st_mode)) {
        uint64_t have = st.st_size > (off_t)hdr_total ? (uint64_t)(st.st_size - (off_t)hdr_total) : 0;
        if (have < nbytes) {
            char sh[128];
            set_err(err, errlen, "truncated data: shape %s of %s needs %zu bytes, the file has %llu",
                    npy_shape_str(a.shape, a.ndim, sh, sizeof sh), npy_dtype_name(a.dtype), nbytes,
                    (unsigned long long)have);
            goto fail;
        }
    }
    a.data = malloc(nbytes ? nbytes : 1);
    if (!a.data) {
        set_err(err, errlen, "out of memory (%zu bytes)", nbytes);
        goto fail;
    }
    if (read_exact(f, a.data, nbytes) != 0) {
        char sh[128];
        set_err(err, errlen, "truncated data: shape %s of %s needs %zu bytes",
                npy_shape_str(a.shape, a.ndim, sh, sizeof sh), npy_dtype_name(a.dtype), nbytes);
        goto fail;
    }
    if (fgetc(f) != EOF) {
        set_err(err, errlen, "unexpected bytes after the array data (shape or dtype in the header is wrong?)");
        goto fail;
    }
    if (ferror(f)) {
        set_err(err, errlen, "read error: %s", strerror(errno));
        goto fail;
    }
    fclose(f);
    if (elsize > 1 && !host_is_little_endian())
        byteswap(a.data, a.count, elsize);
    *out = a;
    return 0;

fail:
    free(header);
    free(a.data);
    fclose(f);
    return -1;
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->data);
    a->data = NULL;
    a->count = 0;
}

/* ---- writing ---------------------------------------------------------- */

int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err,
                  size_t errlen)
{
    return npy_write(path, NPY_F4, data, ndim, shape, err, errlen);
}

/* What npy_write and npy_write_stream can write: 0, or -1 with the reason in err. */
static int write_args_ok(npy_dtype dtype, int ndim, char *err, size_t errlen)
{
    if (ndim < 0 || ndim > NPY_MAX_DIMS) {
        set_err(err, errlen, "bad rank %d", ndim);
        return -1;
    }
    if (dtype != NPY_F4 && dtype != NPY_F2) {
        set_err(err, errlen, "cannot write dtype %s", npy_dtype_name(dtype));
        return -1;
    }
    return 0;
}

int npy_write(const char *path, npy_dtype dtype, const void *data, int ndim, const int64_t *shape, char *err,
              size_t errlen)
{
    if (write_args_ok(dtype, ndim, err, errlen) != 0)
        return -1; /* before the file is created */
    FILE *f = fopen(path, "wb");
    if (!f) {
        set_err(err, errlen, "cannot create: %s", strerror(errno));
        return -1;
    }
    return npy_write_stream(f, dtype, data, ndim, shape, err, errlen);
}

int npy_write_stream(FILE *f, npy_dtype dtype, const void *data, int ndim, const int64_t *shape, char *err,
                     size_t errlen)
{
    char dict[64 + 24 * NPY_MAX_DIMS], sh[24 * NPY_MAX_DIMS];
    unsigned char pre[12];
    size_t dlen, prelen, total, count = 1;
    int ok;

    if (write_args_ok(dtype, ndim, err, errlen) != 0) {
        fclose(f);
        return -1;
    }
    const size_t elsize = npy_dtype_size(dtype);
    for (int i = 0; i < ndim; i++)
        count *= (size_t)shape[i];
    snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", npy_dtype_descr(dtype),
             npy_shape_str(shape, ndim, sh, sizeof sh));
    dlen = strlen(dict);
    /* Version 1.0 if the header length fits in 16 bits. Pad with spaces so that
     * the data starts on a 64-byte boundary; the header ends with '\n'. */
    prelen = NPY_MAGIC_LEN + 2 + 2;
    total = (prelen + dlen + 1 + 63) / 64 * 64;
    if (total - prelen > 65535) {
        prelen = NPY_MAGIC_LEN + 2 + 4;
        total = (prelen + dlen + 1 + 63) / 64 * 64;
    }
    memcpy(pre, NPY_MAGIC, NPY_MAGIC_LEN);
    pre[6] = prelen == 10 ? 1 : 2;
    pre[7] = 0;
    {
        size_t hl = total - prelen;
        pre[8] = (unsigned char)(hl & 0xff);
        pre[9] = (unsigned char)((hl >> 8) & 0xff);
        pre[10] = (unsigned char)((hl >> 16) & 0xff);
        pre[11] = (unsigned char)((hl >> 24) & 0xff);
    }

    ok = fwrite(pre, 1, prelen, f) == prelen && fwrite(dict, 1, dlen, f) == dlen;
    for (size_t i = prelen + dlen; ok && i + 1 < total; i++)
        ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    if (ok && host_is_little_endian()) {
        ok = fwrite(data, elsize, count, f) == count;
    } else if (ok) {
        for (size_t i = 0; ok && i < count; i++) {
            unsigned char x[4];
            memcpy(x, (const unsigned char *)data + i * elsize, elsize);
            byteswap(x, 1, elsize);
            ok = fwrite(x, elsize, 1, f) == 1;
        }
    }
    if (!ok) {
        set_err(err, errlen, "write error: %s", strerror(errno));
        fclose(f);
        return -1;
    }
    if (fclose(f) != 0) {
        set_err(err, errlen, "write error: %s", strerror(errno));
        return -1;
    }
    return 0;
}
