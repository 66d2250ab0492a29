"""NumPy references for the NKI and nkipy examples (what bundles run off-device)."""

import numpy as np


def matmul_tiled(lhsT, rhs):
    return np.matmul(lhsT.T, rhs)


def rmsnorm(x, weight, eps):
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight
