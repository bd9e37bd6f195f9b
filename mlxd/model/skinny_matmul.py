"""A bf16 matmul for few rows on CUDA: `x (M, K) @ w (N, K).T` with 2 <= M <= 32.

MLX-CUDA sends a one-row matmul to its gemv kernel and anything wider to cuBLASLt. A batched
decode step multiplies every weight by a handful of rows; this kernel reads each weight once
with tensor cores (PTX mma m16n8k16, split over K between the warps of a block) so the step stays
near the weights' read time. Its float32 sums run in another order than cuBLAS's, so the bits
differ: it is opt-in (docs/performance.md).
"""

import mlx.core as mx
import mlx.nn as nn

_HEADER = """
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
"""

# One block: 32 rows of w; its KS warps split K and meet in shared memory. A warp runs m16n8k16
# MMAs over 2 row tiles x BT tiles of 8 x-rows (MT = M rounded up to 8; x arrives padded). The
# reduction axis is permuted: lane (g, t) loads 8 consecutive k (16 bytes) of its rows, and A and
# B take the same permutation, so every load is a full 16-byte vector.
_SOURCE = """
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane >> 2, t = lane & 3;
    const size_t n0 = (size_t)blockIdx.x * 32;
    constexpr int KW = K / KS;
    const size_t k0 = (size_t)warp * KW + t * 8;
    float c[2][BT][4];
    #pragma unroll
    for (int a = 0; a < 2; ++a)
        #pragma unroll
        for (int b = 0; b < BT; ++b)
            #pragma unroll
            for (int e = 0; e < 4; ++e) c[a][b][e] = 0.0f;
    const uint4* wr[4];
    #pragma unroll
    for (int r = 0; r < 4; ++r)
        wr[r] = reinterpret_cast<const uint4*>(w + (n0 + g + 8 * r) * K + k0);
    const uint4* xr[BT];
    #pragma unroll
    for (int b = 0; b < BT; ++b)
        xr[b] = reinterpret_cast<const uint4*>(x + (size_t)(8 * b + g) * K + k0);
    #pragma unroll 4
    for (int i = 0; i < KW / 8; i += 4) {
        uint4 A[4], X[BT];
        #pragma unroll
        for (int r = 0; r < 4; ++r) A[r] = wr[r][i];
        #pragma unroll
        for (int b = 0; b < BT; ++b) X[b] = xr[b][i];
        #pragma unroll
        for (int a = 0; a < 2; ++a) {
            const unsigned lo[4] = {A[2 * a].x, A[2 * a + 1].x, A[2 * a].y, A[2 * a + 1].y};
            const unsigned hi[4] = {A[2 * a].z, A[2 * a + 1].z, A[2 * a].w, A[2 * a + 1].w};
            #pragma unroll
            for (int b = 0; b < BT; ++b) {
                mma_bf16(c[a][b], lo, X[b].x, X[b].y);
                mma_bf16(c[a][b], hi, X[b].z, X[b].w);
            }
        }
    }
    __shared__ float red[KS * 32 * MT];
    float* mine = red + warp * 32 * MT;
    #pragma unroll
    for (int a = 0; a < 2; ++a)
        #pragma unroll
        for (int b = 0; b < BT; ++b) {
            const int n = 16 * a + g, m = 8 * b + 2 * t;
            mine[n * MT + m] = c[a][b][0];
            mine[n * MT + m + 1] = c[a][b][1];
            mine[(n + 8) * MT + m] = c[a][b][2];
            mine[(n + 8) * MT + m + 1] = c[a][b][3];
        }
    __syncthreads();
    for (int j = threadIdx.x; j < 32 * M; j += blockDim.x) {
        const int n = j % 32, m = j / 32;
        float s = 0.0f;
        #pragma unroll
        for (int q = 0; q < KS; ++q) s += red[q * 32 * MT + n * MT + m];
        y[(size_t)m * N + n0 + n] = __float2bfloat16(s);
    }
"""

_kernel = None


def _get_kernel():
    global _kernel
    if _kernel is None:
        _kernel = mx.fast.cuda_kernel(
            name="mlxd_skinny_matmul",
            input_names=["x", "w"],
            output_names=["y"],
            source=_SOURCE,
            header=_HEADER,
        )
    return _kernel


def supported(M: int, N: int, K: int, dtype: mx.Dtype) -> bool:
    """Shapes this kernel takes; anything else stays on MLX's matmul."""
    return dtype == mx.bfloat16 and 2 <= M <= 32 and N % 32 == 0 and K % 256 == 0


def _splits(MT: int, N: int, K: int) -> int:
    """Warps per block: enough warps over small N, shared memory within 48 KB, K/KS >= 64."""
    ks = 4
    while (
        ks < 32
        and (N // 32) * ks < 4096
        and K % (ks * 2 * 64) == 0
        and 2 * ks * 32 * MT * 4 <= 48 * 1024
    ):
        ks *= 2
    return ks


def skinny_matmul(x: mx.array, w: mx.array) -> mx.array:
    """`x @ w.T` for x of shape (M, K) and w of shape (N, K), both bf16 (see `supported`)."""
    M, K = x.shape
    N = w.shape[0]
    MT = (M + 7) // 8 * 8
    if MT != M:
        x = mx.concatenate([x, mx.zeros((MT - M, K), x.dtype)])
    KS = _splits(MT, N, K)
    return _get_kernel()(
        inputs=[x, w],
        template=[("M", M), ("MT", MT), ("BT", MT // 8), ("K", K), ("N", N), ("KS", KS)],
        grid=(N // 32 * KS * 32, 1, 1),
        threadgroup=(KS * 32, 1, 1),
        output_shapes=[(M, N)],
        output_dtypes=[x.dtype],
    )[0]


class SkinnyLinear(nn.Module):
    """A bias-free bf16 `nn.Linear` whose few-row calls take `skinny_matmul`."""

    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array) -> mx.array:
        w = self.inner.weight
        rows = x.size // x.shape[-1]
        if "bias" in self.inner or not supported(rows, w.shape[0], w.shape[1], x.dtype):
            return self.inner(x)
        y = skinny_matmul(x.reshape(rows, x.shape[-1]), w)
        return y.reshape(*x.shape[:-1], w.shape[0])


def wrap_linears(module: nn.Module) -> int:
    """Wrap, in place, every plain `nn.Linear` below `module`; returns how many."""
    count = 0
    for name, child in list(module.items()):
        if type(child) is nn.Linear:
            module[name] = SkinnyLinear(child)
            count += 1
        elif isinstance(child, nn.Module):
            count += wrap_linears(child)
        elif isinstance(child, list):
            count += sum(wrap_linears(c) for c in child if isinstance(c, nn.Module))
    return count
