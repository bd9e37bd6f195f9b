"""A few-row projection as one CUDA kernel that MLX launches itself (opt-in: the `+rows` modes
of `--batched-attention`).

On MLX-CUDA a matmul of 2+ rows goes to cuBLASLt: each call builds a descriptor, asks the
heuristic for an algorithm and is recorded into MLX's CUDA graph by stream capture, ~30-40 µs
of host time a call against ~15 µs for MLX's own one-row gemv (docs/performance.md). A 0.6B
batched step makes 169 of them, which is why its 8-row step costs twice a lone row's. This
kernel is a gemv over a tile of rows: each warp reads C weight rows once and dots them with up
to RT input rows, in float32. Its rounding is not cuBLAS's, so the modes are opt-in, CUDA only.
"""

from functools import cache

import mlx.core as mx

RT = 8  # input rows a warp holds (a grid row per tile of RT rows)
C = 2  # weight rows (output columns) a warp reads
NW = 4  # warps a block

_HEADER = """
template <typename T>
__device__ inline void load8(const T* p, float* out) {
  uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = static_cast<float>(h[e]);
}
"""

# grid (warps * 32, row tiles, 1), block (NW * 32, 1, 1): the warp's lanes walk K eight
# elements at a time, then a butterfly sums each (row, column) and lane r * C + c writes it.
_SOURCE = """
  const int lane = threadIdx.x % 32;
  const int N = w_shape[0], K = w_shape[1], B = x_shape[0];
  const int n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * C;
  const int r0 = blockIdx.y * RT;
  if (n0 >= N) return;
  float acc[RT][C];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[r][c] = 0.f;
  for (int k = lane * 8; k < K; k += 256) {
    float wv[C][8];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      if (n0 + c < N) load8(w + (int64_t)(n0 + c) * K + k, wv[c]);
      else for (int e = 0; e < 8; ++e) wv[c][e] = 0.f;
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (r0 + r >= B) break;
      float xv[8];
      load8(x + (int64_t)(r0 + r) * K + k, xv);
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][c] += xv[e] * wv[c][e];
    }
  }
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float v = acc[r][c];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffff, v, off);
      if (lane == r * C + c && r0 + r < B && n0 + c < N)
        y[(int64_t)(r0 + r) * N + n0 + c] = static_cast<T>(v);
    }
"""


def available() -> str | None:
    """Why the +rows modes cannot run here, or None."""
    if not mx.cuda.is_available():
        return "the +rows modes of --batched-attention need MLX's CUDA backend"
    return None


def supports(weight: mx.array) -> bool:
    """A 2-D half-precision weight whose rows split into 16-byte loads."""
    return (
        weight.ndim == 2 and weight.dtype in (mx.bfloat16, mx.float16) and weight.shape[1] % 8 == 0
    )


@cache
def _kernel() -> object:
    return mx.fast.cuda_kernel(
        name="mlxd_rows_matmul",
        input_names=["x", "w"],
        output_names=["y"],
        source=_SOURCE,
        header=_HEADER,
    )


def rows_matmul(x: mx.array, weight: mx.array) -> mx.array:
    """x @ weight.T for x (B, 1, K) and weight (N, K) of x's dtype (`supports`): (B, 1, N)."""
    B, _, K = x.shape
    N = weight.shape[0]
    warps = -(-N // C)
    (y,) = _kernel()(  # type: ignore[operator]
        inputs=[x.reshape(B, K), weight],
        template=[("T", x.dtype), ("RT", RT), ("C", C)],
        grid=(-(-warps // NW) * NW * 32, -(-B // RT), 1),
        threadgroup=(NW * 32, 1, 1),
        output_shapes=[(B, N)],
        output_dtypes=[x.dtype],
    )
    return y.reshape(B, 1, N)
