"""Example JAX kernels. nkibuild traces them on CPU; JAX is only needed at build time."""

import jax.numpy as jnp


def scaled_add(x, y, alpha):
    return alpha * x + y


def matmul_rowsum(lhsT, rhs):
    product = jnp.matmul(lhsT.T, rhs, preferred_element_type=jnp.float32)
    return product, product.sum(axis=1)


def softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = jnp.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)
