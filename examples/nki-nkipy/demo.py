"""Call the installed acme-nki-kernels bundle and check it against NumPy."""

import numpy as np
from acme_nki_kernels import matmul_tiled, rmsnorm

rng = np.random.default_rng(0)
lhsT = rng.standard_normal((512, 512), dtype=np.float32)
rhs = rng.standard_normal((512, 1024), dtype=np.float32)
np.testing.assert_allclose(matmul_tiled(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-3)
print("matmul_tiled (variant narrow): lhsT.T @ rhs, ok")

x = rng.standard_normal((512, 1024), dtype=np.float32)
normed = rmsnorm(x, np.ones(1024, dtype=np.float32))
np.testing.assert_allclose(np.sqrt(np.mean(normed**2, axis=-1)), 1.0, rtol=1e-3)
print("rmsnorm (variant tokens_512): unit RMS per row, ok")
