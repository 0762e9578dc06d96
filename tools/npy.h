/* SPDX-License-Identifier: MIT */
/* tools/npy.h - minimal reader and writer of NumPy .npy files for the sdpa tool.
 *
 * Supported: format versions 1.0, 2.0 and 3.0; C-order arrays (Fortran order is
 * accepted only where it means the same, rank <= 1); the little-endian dtypes
 * '<f4' (float32), '<f2' (float16, IEEE binary16, read as raw uint16_t), '|b1'
 * (bool), '|u1' (uint8), '<i4' (int32), '<i8' (int64).
 * Everything else is rejected with a one-line reason. Reference:
 * https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html */
#ifndef SDPA_TOOLS_NPY_H
#define SDPA_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/** Highest rank read (NumPy's own limit is 32 or 64). */
#define NPY_MAX_DIMS 32

typedef enum npy_dtype {
    NPY_F4 = 0, /**< '<f4' float32 */
    NPY_B1,     /**< '|b1' bool */
    NPY_U1,     /**< '|u1' uint8 */
    NPY_I4,     /**< '<i4' int32 */
    NPY_I8,     /**< '<i8' int64 */
    NPY_F2      /**< '<f2' float16 (IEEE binary16 bits, as uint16_t) */
} npy_dtype;

typedef struct npy_array {
    npy_dtype dtype;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    size_t count;    /**< number of elements (product of shape; 1 for rank 0) */
    void *data;      /**< count elements, C order; malloc'ed (never NULL after a successful read) */
} npy_array;

/** Size in bytes of one element. */
size_t npy_dtype_size(npy_dtype dtype);
/** The dtype's .npy spelling, e.g. "<f4". */
const char *npy_dtype_descr(npy_dtype dtype);
/** A human name, e.g. "float32". */
const char *npy_dtype_name(npy_dtype dtype);

/** Reads a whole .npy file. Returns 0, or -1 with a one-line reason (no file
 *  name, no newline) in err; *out is then empty and needs no npy_free. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/** Writes a C-order array of dtype NPY_F4 ('<f4', data: float) or NPY_F2 ('<f2',
 *  data: uint16_t binary16 bits) with a version 1.0 header (2.0 if the header
 *  does not fit). Returns 0, or -1 with a reason in err (the file may then be
 *  partially written: callers write to a temporary file and rename it). */
int npy_write(const char *path, npy_dtype dtype, const void *data, int ndim, const int64_t *shape, char *err,
              size_t errlen);
/** npy_write to an open stream, which it closes (either way). */
int npy_write_stream(FILE *f, npy_dtype dtype, const void *data, int ndim, const int64_t *shape, char *err,
                     size_t errlen);
/** npy_write(path, NPY_F4, ...). */
int npy_write_f32(const char *path, const float *data, int ndim, const int64_t *shape, char *err,
                  size_t errlen);

/** Frees the data of *a (safe on a zeroed or already freed array). */
void npy_free(npy_array *a);

/** Formats a shape as "(2, 3)" / "(5,)" / "()" into buf. Returns buf. */
char *npy_shape_str(const int64_t *shape, int ndim, char *buf, size_t len);

#endif /* SDPA_TOOLS_NPY_H */
