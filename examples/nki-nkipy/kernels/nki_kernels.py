"""Example NKI kernels (nki.jit). nkibuild extracts them through torch-xla on a Neuron
build host; with `--toolchain fake` through nkibuild's toolchain double."""

import nki
import nki.language as nl


@nki.jit
def matmul_tiled(lhsT, rhs):
    """result = lhsT.T @ rhs, tiled for the tensor engine.

    lhsT is [K, M] (the stationary operand, already transposed), rhs is [K, N].
    K and M must be multiples of 128, N a multiple of 512.
    """
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_K = nl.tile_size.pmax
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            accumulator = nl.zeros((TILE_M, TILE_N), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                stationary = nl.load(
                    lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M]
                )
                moving = nl.load(rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N])
                accumulator += nl.matmul(stationary, moving, transpose_x=True)
            tile = nl.copy(accumulator, dtype=result.dtype)
            nl.store(
                result[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], value=tile
            )
    return result
