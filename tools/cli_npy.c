/* SPDX-License-Identifier: MIT */
/* tools/cli_npy.c - .npy inputs as tensors: loading, shape checks, sizes checked
 * against int64 overflow, broadcasting of masks and biases.
 *
 * A header-only .npy with a 0 in its shape passes the reader (it holds no data),
 * whatever its other dims: every product of dims is therefore computed here with
 * an overflow check, never with a plain multiplication. */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "dtype.h" /* src/dtype.h: the library's exact fp32 <-> bf16 / fp16 conversions */

size_t dtype_size(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
}

const char *dtype_name(sdpa_dtype dt)
{
    return dt == SDPA_DTYPE_BF16 ? "bf16" : dt == SDPA_DTYPE_F16 ? "fp16" : "fp32";
}

int dtype_parse(const char *s, sdpa_dtype *dt)
{
    if (strcmp(s, "fp32") == 0)
        *dt = SDPA_DTYPE_F32;
    else if (strcmp(s, "bf16") == 0)
        *dt = SDPA_DTYPE_BF16;
    else if (strcmp(s, "fp16") == 0)
        *dt = SDPA_DTYPE_F16;
    else
        return -1;
    return 0;
}

/* Element i of a float32 ('<f4') or float16 ('<f2') array, as a float (exact). */
static float npy_elem_f32(const npy_array *a, size_t i)
{
    if (a->dtype == NPY_F2)
        return sdpa_f16_to_f32(((const uint16_t *)a->data)[i]);
    return ((const float *)a->data)[i];
}

int npy_store_as(npy_array *a, sdpa_dtype dt)
{
    const npy_dtype have = a->dtype;
    if ((have == NPY_F4 && dt == SDPA_DTYPE_F32) || (have == NPY_F2 && dt == SDPA_DTYPE_F16))
        return 0; /* already stored so */
    void *buf = alloc_elems((int64_t)a->count, dt);
    if (!buf)
        return -1;
    for (size_t i = 0; i < a->count; i++) {
        const float x = npy_elem_f32(a, i);
        if (dt == SDPA_DTYPE_F32)
            ((float *)buf)[i] = x;
        else /* one rounding: a float16 value is exact in fp32 */
            ((uint16_t *)buf)[i] = dt == SDPA_DTYPE_BF16 ? sdpa_f32_to_bf16(x) : sdpa_f32_to_f16(x);
    }
    free(a->data);
    a->data = buf;
    return 0;
}

static int mul_ok(int64_t a, int64_t b, int64_t *r)
{
    return !__builtin_mul_overflow(a, b, r);
}

int dims_sizes(const int64_t *dims, int n, int64_t *size)
{
    int64_t p = 1;
    for (int i = n - 1; i >= 0; i--) {
        if (dims[i] < 0 || !mul_ok(p, dims[i], &p))
            return -1;
        size[i] = p;
    }
    return 0;
}

int load_npy(const char *path, npy_array *a)
{
    char err[256];
    if (npy_read(path, a, err, sizeof err) != 0) {
        file_error(path, "%s", err);
        return EXIT_BAD;
    }
    return 0;
}

int load_tensor(const char *path, const char *role, tensor *t)
{
    return load_tensor_as(path, role, SDPA_DTYPE_F32, t);
}

int load_tensor_as(const char *path, const char *role, sdpa_dtype dt, tensor *t)
{
    int rc;
    char sh[160];
    t->path = path;
    t->dt = dt;
    if ((rc = load_npy(path, &t->a)) != 0)
        return rc;
    if (t->a.dtype != NPY_F4 && t->a.dtype != NPY_F2) {
        file_error(path, "%s must be float32 ('<f4') or float16 ('<f2'), got %s ('%s')", role,
                   npy_dtype_name(t->a.dtype), npy_dtype_descr(t->a.dtype));
        return EXIT_BAD;
    }
    if (t->a.ndim < 2 || t->a.ndim > 4) {
        file_error(path, "%s must have rank 2 (T, D), 3 (H, T, D) or 4 (B, H, T, D), got shape %s", role,
                   npy_shape_str(t->a.shape, t->a.ndim, sh, sizeof sh));
        return EXIT_BAD;
    }
    const int64_t *s = t->a.shape;
    switch (t->a.ndim) {
    case 2: t->b = 1, t->h = 1, t->t = s[0], t->d = s[1]; break;
    case 3: t->b = 1, t->h = s[0], t->t = s[1], t->d = s[2]; break;
    default: t->b = s[0], t->h = s[1], t->t = s[2], t->d = s[3]; break;
    }
    const int64_t dims[4] = {t->b, t->h, t->t, t->d};
    if (dims_sizes(dims, 4, t->size) != 0) {
        file_error(path, "%s of shape %s is too large: its size overflows 64 bits", role,
                   npy_shape_str(t->a.shape, t->a.ndim, sh, sizeof sh));
        return EXIT_BAD;
    }
    if (npy_store_as(&t->a, dt) != 0) {
        file_error(path, "out of memory converting %s to %s", role, dtype_name(dt));
        return EXIT_BAD;
    }
    return 0;
}

sdpa_tensor tensor_view(const tensor *t)
{
    sdpa_tensor v = {t->a.data, t->size[1], t->size[2], t->size[3]};
    return v;
}

void shape_in_rank(int rank, int64_t b, int64_t h, int64_t t, int64_t d, int64_t *shape)
{
    const int64_t all[4] = {b, h, t, d};
    for (int i = 0; i < rank; i++)
        shape[i] = all[4 - rank + i];
}

int check_shape(const tensor *t, const char *role, int rank, int64_t b, int64_t h, int64_t tt, int64_t d,
                const char *what)
{
    int64_t want[4];
    char s1[160], s2[160];
    shape_in_rank(rank, b, h, tt, d, want);
    if (t->a.ndim == rank && memcmp(want, t->a.shape, (size_t)rank * sizeof want[0]) == 0)
        return 0;
    file_error(t->path, "%s has shape %s, expected %s (%s)", role,
               npy_shape_str(t->a.shape, t->a.ndim, s1, sizeof s1), npy_shape_str(want, rank, s2, sizeof s2),
               what);
    return EXIT_BAD;
}

int broadcast_strides(const char *path, const char *role, const npy_array *a, const int64_t target[4],
                      int64_t strides[4])
{
    char s1[160], s2[160];
    int64_t cstride = 1;
    if (a->ndim > 4) {
        file_error(path, "%s has rank %d, more than 4 (B, Hq, Tq, Tk)", role, a->ndim);
        return EXIT_BAD;
    }
    for (int i = 0; i < 4; i++)
        strides[i] = 0;
    for (int i = a->ndim - 1; i >= 0; i--) {
        const int ti = 4 - a->ndim + i;
        if (a->shape[i] == target[ti])
            strides[ti] = target[ti] == 1 ? 0 : cstride;
        else if (a->shape[i] == 1)
            strides[ti] = 0;
        else {
            file_error(path, "%s of shape %s is not broadcastable to (B, Hq, Tq, Tk) = %s", role,
                       npy_shape_str(a->shape, a->ndim, s1, sizeof s1), npy_shape_str(target, 4, s2, sizeof s2));
            return EXIT_BAD;
        }
        if (!mul_ok(cstride, a->shape[i], &cstride)) {
            file_error(path, "%s of shape %s is too large: its size overflows 64 bits", role,
                       npy_shape_str(a->shape, a->ndim, s1, sizeof s1));
            return EXIT_BAD;
        }
    }
    return 0;
}

float *alloc_floats(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float))
        return NULL;
    return malloc(n ? (size_t)n * sizeof(float) : 1);
}

void *alloc_elems(int64_t n, sdpa_dtype dt)
{
    const size_t es = dtype_size(dt);
    if (n < 0 || (uint64_t)n > SIZE_MAX / es)
        return NULL;
    return malloc(n ? (size_t)n * es : 1);
}
