"""A batch cache's rows rolled along the token axis in one CUDA kernel: the same values as
`roll_rows`' slices (batch_roll.py), bit for bit, since every element is a copy.

After a right-padded prefill every row rolls by its padding. By slices that is two copies a
row and a concatenation, ~96 kernels for each of a layer's keys and values at 32 rows: a 0.6B
join of 32 rows spent ~0.1 s of host time launching 5,040 of them for ~29 ms of GPU work (an
H100, `probe_join --kernels`, docs/performance.md). Here it is one launch per array. MLX-CUDA
only (`mx.fast.cuda_kernel`); elsewhere the slices stay.
"""

from functools import cache

import mlx.core as mx

# One thread moves VEC elements of one token's row: out[b, h, t] = x[b, h, (t - shift[b]) mod N].
_SOURCE = """
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int H = x_shape[1], N = x_shape[2], DV = x_shape[3] / VEC;
  if (i >= (int64_t)x_shape[0] * H * N * DV) return;
  const int c = i % DV;
  const int64_t row_t = i / DV;
  const int t = row_t % N;
  const int64_t bh = row_t / N;
  const int b = bh / H;
  int s = shifts[b] % N;
  if (s < 0) s += N;
  const int src = t >= s ? t - s : t - s + N;
  const int64_t from = (bh * N + src) * DV + c, to = row_t * DV + c;
  if constexpr (VEC * sizeof(T) == 16) {
    reinterpret_cast<uint4*>(out)[to] = reinterpret_cast<const uint4*>(x)[from];
  } else {
    out[to] = x[from];
  }
"""

_THREADS = 256


@cache
def _kernel() -> object:
    return mx.fast.cuda_kernel(
        name="mlxd_roll_rows",
        input_names=["x", "shifts"],
        output_names=["out"],
        source=_SOURCE,
    )


def available(x: mx.array) -> bool:
    """Whether `x` rolls in the kernel here: a 4-D array on an MLX-CUDA GPU."""
    return x.ndim == 4 and mx.default_device() == mx.gpu and mx.cuda.is_available()


def roll(x: mx.array, shifts: list[int]) -> mx.array:
    """x (B, H, N, D) with row b rolled by shifts[b] along N (np.roll's direction)."""
    B, H, N, D = x.shape
    vec = 16 // x.itemsize if (D * x.itemsize) % 16 == 0 else 1
    total = B * H * N * (D // vec)
    (out,) = _kernel()(  # type: ignore[operator]
        inputs=[x, mx.array(shifts, dtype=mx.int32)],
        template=[("T", x.dtype), ("VEC", vec)],
        grid=(-(-total // _THREADS) * _THREADS, 1, 1),
        threadgroup=(_THREADS, 1, 1),
        output_shapes=[x.shape],
        output_dtypes=[x.dtype],
    )
    return out
