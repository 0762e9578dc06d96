# SPDX-License-Identifier: MIT
"""libsdpa: streaming scaled dot-product attention on CPUs, from NumPy and PyTorch.

    import numpy as np, libsdpa
    o = libsdpa.attention(q, k, v, causal=True)          # float32 [B, H, T, D]
    o = libsdpa.attention(q16, k16, v16)                 # float16 (or ml_dtypes bfloat16)
    o, lse = libsdpa.attention(q, k, v, return_lse=True)
    dq, dk, dv = libsdpa.attention_backward(q, k, v, o, lse, do)

The C library (a copy bundled in this package) does the work; arrays are passed
without copying. libsdpa.torch (needs PyTorch) has scaled_dot_product_attention
with autograd and torch.compile support.
"""
from ._config import VERSION as __version__
from ._api import (SdpaError, attention, attention_backward, force_isa, info, isa_names,
                   merge_states)

__all__ = ["__version__", "SdpaError", "attention", "attention_backward", "merge_states", "info",
           "force_isa", "isa_names"]
