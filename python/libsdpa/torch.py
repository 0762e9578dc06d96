# SPDX-License-Identifier: MIT
"""PyTorch binding (needs torch): in progress."""
