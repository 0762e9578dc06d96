# SPDX-License-Identifier: MIT
"""ctypes declarations of include/sdpa.h and the loading of the bundled library.

The library is loaded by absolute path from this package's directory (the copy
that `pip install` put there), never through the loader's search path: Debian
ships an unrelated libsdpa. LIBSDPA_LIBRARY=/path/to/libsdpa.so overrides the
file (development against a meson build directory). ctypes.CDLL releases the
GIL around every foreign call.
"""
import ctypes
import os
import struct

from . import _config

c_int64 = ctypes.c_int64
c_void_p = ctypes.c_void_p


def _library_path():
    override = os.environ.get("LIBSDPA_LIBRARY")
    if override:
        return os.path.abspath(override)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), _config.LIBRARY_FILE)


LIBRARY_PATH = _library_path()
if not os.path.isfile(LIBRARY_PATH):
    raise ImportError(f"libsdpa: the bundled shared library {LIBRARY_PATH} is missing "
                      "(reinstall the package: python3 -m pip install .)")
lib = ctypes.CDLL(LIBRARY_PATH)

# sdpa_status values and names (include/sdpa.h)
STATUS_NAMES = {
    0: "SDPA_OK", -1: "SDPA_ERR_NULL_ARGUMENT", -2: "SDPA_ERR_BAD_DESCRIPTOR",
    -3: "SDPA_ERR_NEGATIVE_SIZE", -4: "SDPA_ERR_HEAD_GROUPING", -5: "SDPA_ERR_BAD_SCALE",
    -6: "SDPA_ERR_BAD_STRIDE", -7: "SDPA_ERR_BAD_WINDOW", -8: "SDPA_ERR_BAD_KV_LENGTH",
    -9: "SDPA_ERR_ALIASING", -10: "SDPA_ERR_BAD_THREADS", -11: "SDPA_ERR_ISA_UNAVAILABLE",
    -12: "SDPA_ERR_OUT_OF_MEMORY", -13: "SDPA_ERR_SIZE_OVERFLOW", -14: "SDPA_ERR_BAD_BLOCK_SIZE",
    -15: "SDPA_ERR_BAD_SOFTCAP", -16: "SDPA_ERR_BAD_ALIBI", -17: "SDPA_ERR_BAD_SINKS",
    -18: "SDPA_ERR_WORKSPACE_TOO_SMALL", -19: "SDPA_ERR_BAD_SEQLENS",
    -20: "SDPA_ERR_BAD_BLOCK_TABLE", -21: "SDPA_ERR_UNSUPPORTED", -22: "SDPA_ERR_MISALIGNED",
}
ERR_OUT_OF_MEMORY = -12

ISA_AUTO = -1
ISA_COUNT = 5
CAUSAL_NONE, CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 0, 1, 2
ALIGN_TOP_LEFT, ALIGN_BOTTOM_RIGHT = 0, 1
WINDOW_UNBOUNDED = -1


class Tensor(ctypes.Structure):
    """sdpa_tensor and sdpa_tensor_out (same layout)."""
    _fields_ = [("data", c_void_p), ("batch_stride", c_int64), ("head_stride", c_int64),
                ("seq_stride", c_int64)]


class Mask4(ctypes.Structure):
    """sdpa_bool_mask and sdpa_bias (same layout)."""
    _fields_ = [("data", c_void_p), ("batch_stride", c_int64), ("head_stride", c_int64),
                ("query_stride", c_int64), ("key_stride", c_int64)]


class Seqs(ctypes.Structure):
    _fields_ = [("cu_seqlens_q", c_void_p), ("cu_seqlens_k", c_void_p),
                ("block_table", c_void_p), ("max_blocks_per_seq", c_int64),
                ("seq_lens_k", c_void_p), ("block_size", c_int64), ("num_blocks", c_int64)]


class Problem(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_uint32), ("reserved0", ctypes.c_uint32),
        ("batch", c_int64), ("q_heads", c_int64), ("kv_heads", c_int64),
        ("q_len", c_int64), ("kv_len", c_int64), ("head_dim_qk", c_int64), ("head_dim_v", c_int64),
        ("use_default_scale", ctypes.c_int), ("scale", ctypes.c_float),
        ("causal", ctypes.c_int), ("window_alignment", ctypes.c_int),
        ("window_left", c_int64), ("window_right", c_int64),
        ("kv_lengths", c_void_p),
        ("bool_mask", Mask4), ("bias", Mask4),
        ("num_threads", ctypes.c_int), ("isa", ctypes.c_int),
        ("block_q", ctypes.c_int), ("block_k", ctypes.c_int),
        ("softcap", ctypes.c_float), ("reserved1", ctypes.c_uint32),
        ("alibi_slopes", c_void_p), ("sinks", c_void_p), ("dsinks", c_void_p),
        ("seqs", ctypes.POINTER(Seqs)),
        ("q_dtype", ctypes.c_int), ("kv_dtype", ctypes.c_int), ("o_dtype", ctypes.c_int),
        ("fpmath_mode", ctypes.c_int), ("diagonal_offset", ctypes.c_int64),
    ]


_P = ctypes.POINTER
_T = _P(Tensor)


def _proto(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


problem_init = _proto("sdpa_problem_init", None, _P(Problem))
forward = _proto("sdpa_forward", ctypes.c_int, _P(Problem), _T, _T, _T, _T, _T)
backward = _proto("sdpa_backward", ctypes.c_int, _P(Problem), _T, _T, _T, _T, _T, _T, _T, _T, _T)
merge_states_n = _proto("sdpa_merge_states_n", ctypes.c_int, ctypes.c_int, c_int64, c_int64,
                        c_int64, c_int64, _T, _T, _T, _T)
merge_states_typed = _proto("sdpa_merge_states_typed", ctypes.c_int, ctypes.c_int, c_int64, c_int64,
                            c_int64, c_int64, ctypes.c_int, _T, _T, ctypes.c_int, _T, _T)
status_string = _proto("sdpa_status_string", ctypes.c_char_p, ctypes.c_int)
isa_active = _proto("sdpa_isa_active", ctypes.c_int)
isa_compiled = _proto("sdpa_isa_compiled", ctypes.c_int, ctypes.c_int)
isa_supported = _proto("sdpa_isa_supported", ctypes.c_int, ctypes.c_int)
force_isa = _proto("sdpa_force_isa", ctypes.c_int, ctypes.c_int)
isa_name = _proto("sdpa_isa_name", ctypes.c_char_p, ctypes.c_int)
isa_from_name = _proto("sdpa_isa_from_name", ctypes.c_int, ctypes.c_char_p, _P(ctypes.c_int))
cpu_features = _proto("sdpa_cpu_features", ctypes.c_char_p)
tuning = _proto("sdpa_tuning", ctypes.c_char_p)
isa_bf16_pairs = _proto("sdpa_isa_bf16_pairs", ctypes.c_int, ctypes.c_int)
isa_bf16_pairs_backward = _proto("sdpa_isa_bf16_pairs_backward", ctypes.c_int, ctypes.c_int)
isa_env_rejected = _proto("sdpa_isa_env_rejected", ctypes.c_char_p)
version = _proto("sdpa_version", ctypes.c_char_p)
version_number = _proto("sdpa_version_number", ctypes.c_uint)

# The descriptor as sdpa_problem_init() fills it; struct_size must be ctypes' own
# size of the struct, or the declaration above does not match the header.
_template = Problem()
problem_init(ctypes.byref(_template))
if _template.struct_size != ctypes.sizeof(Problem):
    raise ImportError(f"libsdpa: the library's sdpa_problem is {_template.struct_size} bytes, "
                      f"this binding's {ctypes.sizeof(Problem)}: binding and library disagree")
PROBLEM_TEMPLATE = bytes(_template)
del _template


# The fast path of libsdpa._api and libsdpa.torch: the descriptor is a bytearray copy of
# the template with the fields that differ written by struct.pack_into at ctypes' own
# field offsets, the tensor views are struct-packed, and both go to the library as bytes
# through second declarations of the same functions. Those have no argtypes: ctypes passes
# a bytes object as a pointer to its buffer and None as NULL without a from_param call per
# argument, and the library only reads through them (every pointer parameter is const).
# Pass them bytes and None only (an int would go as a C int). A ctypes Structure per view
# and byref() per argument cost several microseconds per call; this is a fraction of one.
PROBLEM_OFFSETS = {name: getattr(Problem, name).offset for name, _ in Problem._fields_}
TENSOR = struct.Struct("@Pqqq")    # sdpa_tensor / sdpa_tensor_out
MASK = struct.Struct("@Pqqqq")     # sdpa_bool_mask / sdpa_bias
if TENSOR.size != ctypes.sizeof(Tensor) or MASK.size != ctypes.sizeof(Mask4) or \
        bytes(Tensor(1, 2, 3, 4)) != TENSOR.pack(1, 2, 3, 4) or \
        bytes(Mask4(1, 2, 3, 4, 5)) != MASK.pack(1, 2, 3, 4, 5):
    raise ImportError("libsdpa: struct's packing of sdpa_tensor / sdpa_bool_mask differs from "
                      "ctypes'")


def _proto_packed(name):
    f = lib[name]   # a new function object: the declarations above stay as they are
    f.restype = ctypes.c_int
    return f


forward_packed = _proto_packed("sdpa_forward")     # (bytes problem, q, k, v, o, lse or None)
backward_packed = _proto_packed("sdpa_backward")   # (bytes problem, q, k, v, o, lse, do, dq, dk, dv)


def new_problem():
    """A fresh descriptor with the library's defaults."""
    return Problem.from_buffer_copy(PROBLEM_TEMPLATE)


def omp_max_threads():
    """OpenMP's default team size as the library sees it (its own libgomp), 1 without OpenMP."""
    for name in ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so"):
        try:
            omp = ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)
        except OSError:
            continue
        try:
            f = omp.omp_get_max_threads
        except AttributeError:
            continue
        f.restype = ctypes.c_int
        f.argtypes = []
        return int(f())
    return 1
