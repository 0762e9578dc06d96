#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# examples/make_worked_example.py - writes examples/worked_example/{Q,K,V,O_expected}.npy
#
# The textbook worked example of scaled dot-product attention (3 queries, 3 keys,
# head_dim 2, scale 1/sqrt(2)). O_expected is computed in float64 with NumPy and
# stored as float32 (the dtype the sdpa tool reads). Uses Debian's python3-numpy:
#     apt-get install -y python3-numpy && /usr/bin/python3 examples/make_worked_example.py
import os
import numpy as np

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worked_example")
os.makedirs(here, exist_ok=True)

Q = np.array([[1, 0], [0, 1], [1, 1]], dtype=np.float64)
K = np.array([[1, 0], [0, 1], [0.5, 0.5]], dtype=np.float64)
V = np.array([[10, 0], [0, 10], [5, 5]], dtype=np.float64)

S = Q @ K.T / np.sqrt(Q.shape[-1])
P = np.exp(S - S.max(axis=-1, keepdims=True))
P /= P.sum(axis=-1, keepdims=True)
O = P @ V
# O = [[6.1546, 3.8454], [3.8454, 6.1546], [5, 5]] (each row sums to 10: rows of P sum to 1).
assert np.allclose(O, [[6.1546057, 3.8453943], [3.8453943, 6.1546057], [5.0, 5.0]], atol=1e-7)

for name, a in (("Q", Q), ("K", K), ("V", V), ("O_expected", O)):
    np.save(os.path.join(here, name + ".npy"), a.astype("<f4"))
print("O (float64) =\n", O)
