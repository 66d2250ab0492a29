"""Call the kernels of the installed acme-kernels bundle and check them against NumPy.

On a host without a Neuron device (or with placeholder NEFFs from
`--toolchain fake`) each kernel runs its reference on the CPU and says so.
"""

import acme_kernels
import ml_dtypes  # bfloat16 arrays for NumPy
import numpy as np
from acme_kernels import matmul_rowsum, scaled_add, softmax

rng = np.random.default_rng(0)
x = rng.standard_normal((1024, 512), dtype=np.float32)
y = rng.standard_normal((1024, 512), dtype=np.float32)
out = scaled_add(x, y)
np.testing.assert_allclose(out, 0.5 * x + y, rtol=1e-6)
print(f"scaled_add (variant large): {out.shape} {out.dtype}, ok")

logits = rng.standard_normal((64, 1024), dtype=np.float32)
probabilities = softmax(logits)
np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
print(f"softmax: {probabilities.shape}, rows sum to 1, ok")

# softmax pads (see `padding:` in nkibuild.yaml): rows shorter than built are fine.
short = softmax(logits[:, :1000])
np.testing.assert_allclose(short.sum(axis=-1), 1.0, rtol=1e-5)
print(f"softmax padded to the [64, 1024] bucket and cut back: {short.shape}, ok")

lhsT = rng.standard_normal((128, 256)).astype(ml_dtypes.bfloat16)
rhs = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
product, rowsum = matmul_rowsum(lhsT, rhs)
print(f"matmul_rowsum: {product.shape} and {rowsum.shape}, ok")

info = acme_kernels.build_info()
print(
    f"built by nkibuild {info['nkibuild_version']} with neuronx-cc {info['compiler_versions']}"
    f"{' (placeholder NEFFs)' if info['placeholder'] else ''}"
)
