"""Example nkipy kernel: plain NumPy code, traced to HLO by nkipy."""

import numpy as np


def rmsnorm(x, weight, eps):
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return x / np.sqrt(variance + eps) * weight
