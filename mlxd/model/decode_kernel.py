"""Flash-decoding attention for a batched one-token step, as two CUDA kernels (opt-in:
`--batched-attention flash`). Folded attention (folded_attention.py) runs MLX's formula as ~6
kernels a layer (scores, mask, softmax, weights x values), with bfloat16 scores and weights
between them in memory. Here each block streams a chunk of one row's keys and values, with an
online softmax in float32 for its KV head's whole query group; a second kernel merges the
chunks. The formula is the same, the rounding is not (no bfloat16 scores or weights): it changes
bits, like folded attention on CUDA, and exists only on MLX's CUDA backend.

Measured on the H200 (session 20): 3-7x closer to the float32 formula than folded, and faster
than it at short contexts (1.5-1.7x at 512 keys), but slower at 4k keys (0.85x at 0.6B, 0.66x
at 8B, 32 rows): its SIMT dot products and per-key rescales cost more than cuBLAS's two matmuls.
"""

import os
from dataclasses import dataclass
from functools import cache

import mlx.core as mx

HEAD_DIMS = (64, 128, 256)  # 8 elements a lane, so D / 8 lanes a key divides a warp
_MIN_CHUNK = 64  # keys a block streams at least
_SHARED = 48 * 1024  # static shared memory a block may hold
_MAX_GROUP = 8  # query heads per KV head: 2 x 8 x 8 float registers a lane for q and the sums


@dataclass(frozen=True)
class Tiling:
    """How the partials kernel splits the work (bench/h200/flash.sh sweeps these)."""

    # The H200 sweep's most even choice over 0.6B / 8B shapes at 8-32 rows x 512-4k keys
    # (docs/performance.md, session 20).
    keys: int = 2  # keys a lane group loads and scores per tile (one rescale a tile)
    warps: int = 2  # warps a block
    blocks: int = 1056  # blocks wanted over the whole grid (~8 per H200 SM)


# MLXD_FLASH_TILING="keys,warps,blocks" overrides the default, for the device sweeps.
_ENV = os.environ.get("MLXD_FLASH_TILING")
TILING = Tiling(*map(int, _ENV.split(","))) if _ENV else Tiling()

_HEADER = """
constexpr float NEG_INF = -cuda::std::numeric_limits<float>::infinity();

template <typename T>
__device__ inline void load8(const T* p, float* out) {
  if constexpr (sizeof(T) == 2) {
    uint4 raw = *reinterpret_cast<const uint4*>(p);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = static_cast<float>(h[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = static_cast<float>(p[e]);
  }
}
"""

# grid (S * NW * 32, Hkv, B), block (NW * 32, 1, 1): block (s, hk, b) attends row b's keys in
# chunk s for the G query heads of KV head hk. Lane groups of D/8 lanes take KT keys a tile; the
# softmax runs in the log2 domain (q carries scale * log2(e)), rescaling once a tile.
_PARTIALS = """
  constexpr int LPK = D / 8;
  constexpr int KPW = 32 / LPK;
  constexpr int NG = NW * KPW;
  __shared__ float sm_m[NG * G];
  __shared__ float sm_l[NG * G];
  __shared__ float sm_o[NG * G * D];
  const int s = blockIdx.x, hk = blockIdx.y, b = blockIdx.z, S = gridDim.x;
  const int tid = threadIdx.x, lane = tid % 32;
  const int grp = (tid / 32) * KPW + lane / LPK, sub = lane % LPK;
  const int L = k_shape[2];
  const int chunk = (L + S - 1) / S;
  const int start = s * chunk, stop = min(L, start + chunk);
  const int Hq = q_shape[1];
  const float sc = scale[0] * 1.4426950408889634f;
  float qv[G][8], acc[G][8], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    load8(q + b * q_strides[0] + (hk * G + g) * q_strides[1] + sub * 8, qv[g]);
#pragma unroll
    for (int e = 0; e < 8; ++e) { qv[g][e] *= sc; acc[g][e] = 0.f; }
    m[g] = NEG_INF;
    l[g] = 0.f;
  }
  const T* kb = k + b * k_strides[0] + hk * k_strides[1] + sub * 8;
  const T* vb = v + b * v_strides[0] + hk * v_strides[1] + sub * 8;
  const bool* mb = mask + b * mask_strides[0];
  const int64_t mstep = mask_strides[mask_ndim - 1];
  for (int base = start; base < stop; base += KT * NG) {  // uniform over the block: shuffles agree
    float kf[KT][8], vf[KT][8];
    bool valid[KT];
#pragma unroll
    for (int u = 0; u < KT; ++u) {  // the tile's loads all in flight before any is used
      const int j = base + u * NG + grp;
      valid[u] = j < stop && mb[j * mstep];
      if (valid[u]) {
        load8(kb + j * k_strides[2], kf[u]);
        load8(vb + j * v_strides[2], vf[u]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) { kf[u][e] = 0.f; vf[u][e] = 0.f; }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot[KT];
      float mt = m[g];
#pragma unroll
      for (int u = 0; u < KT; ++u) {
        float x = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) x += qv[g][e] * kf[u][e];
#pragma unroll
        for (int off = LPK / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffff, x, off);
        dot[u] = valid[u] ? x : NEG_INF;
        mt = fmaxf(mt, dot[u]);
      }
      if (mt == NEG_INF) continue;  // nothing valid yet for this group
      const float c = exp2f(m[g] - mt);
      l[g] *= c;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= c;
#pragma unroll
      for (int u = 0; u < KT; ++u) {
        const float p = exp2f(dot[u] - mt);  // 0 for a masked key
        l[g] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[u][e];
      }
      m[g] = mt;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (sub == 0) { sm_m[grp * G + g] = m[g]; sm_l[grp * G + g] = l[g]; }
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_o[(grp * G + g) * D + sub * 8 + e] = acc[g][e];
  }
  __syncthreads();
  for (int o = tid; o < G * D; o += NW * 32) {
    const int g = o / D, d = o % D;
    float M = NEG_INF;
    for (int r = 0; r < NG; ++r) M = fmaxf(M, sm_m[r * G + g]);
    float num = 0.f, den = 0.f;
    if (M != NEG_INF) {
      for (int r = 0; r < NG; ++r) {
        const float mr = sm_m[r * G + g];
        if (mr == NEG_INF) continue;
        const float w = exp2f(mr - M);
        num += w * sm_o[(r * G + g) * D + d];
        den += w * sm_l[r * G + g];
      }
    }
    const int64_t row = ((int64_t)b * Hq + hk * G + g) * S + s;
    part_o[row * D + d] = num;
    if (d == 0) { part_m[row] = M; part_l[row] = den; }
  }
"""

# grid (D, Hq, B), block (D, 1, 1): one thread per output element merges the S chunks.
_COMBINE = """
  const int d = threadIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int Hq = gridDim.y, S = part_m_shape[2];
  const int64_t row = ((int64_t)b * Hq + h) * S;
  float M = NEG_INF;
  for (int s = 0; s < S; ++s) M = fmaxf(M, part_m[row + s]);
  float num = 0.f, den = 0.f;
  if (M != NEG_INF) {
    for (int s = 0; s < S; ++s) {
      const float ms = part_m[row + s];
      if (ms == NEG_INF) continue;
      const float w = exp2f(ms - M);  // the partials' maxima are in the log2 domain
      num += w * part_o[(row + s) * D + d];
      den += w * part_l[row + s];
    }
  }
  out[((int64_t)b * Hq + h) * D + d] = static_cast<T>(den > 0.f ? num / den : 0.f);
"""


def available() -> str | None:
    """Why the flash kernels cannot run here, or None."""
    if not mx.cuda.is_available():
        return "--batched-attention flash needs MLX's CUDA backend (this MLX has none)"
    return None


def supports(q: mx.array, k: mx.array, mask: mx.array) -> bool:
    """Head sizes the lanes divide, a whole query group of at most _MAX_GROUP per KV head (its
    accumulators live in registers), a boolean mask."""
    D, G = q.shape[-1], q.shape[1] // k.shape[1]
    whole = q.shape[1] == G * k.shape[1]
    return D in HEAD_DIMS and whole and G <= _MAX_GROUP and mask.dtype == mx.bool_


def chunks(B: int, kv_heads: int, L: int, blocks: int = TILING.blocks) -> int:
    """How many key chunks each (row, KV head) is split into: enough blocks to fill the GPU,
    none shorter than _MIN_CHUNK keys."""
    want = -(-blocks // (B * kv_heads))
    return max(1, min(want, -(-L // _MIN_CHUNK)))


def warps_for(D: int, G: int, want: int) -> int:
    """The block's warps, halved until its lane groups' partial sums fit in shared memory."""
    warps = want
    while warps > 1 and warps * (32 // (D // 8)) * G * (D + 2) * 4 > _SHARED:
        warps //= 2
    return warps


@cache
def _kernels() -> tuple[object, object]:
    partials = mx.fast.cuda_kernel(
        name="mlxd_flash_decode_partials",
        input_names=["q", "k", "v", "mask", "scale"],
        output_names=["part_o", "part_m", "part_l"],
        source=_PARTIALS,
        header=_HEADER,
        ensure_row_contiguous=False,  # the cache's key/value views go in without copies
    )
    combine = mx.fast.cuda_kernel(
        name="mlxd_flash_decode_combine",
        input_names=["part_o", "part_m", "part_l"],
        output_names=["out"],
        source=_COMBINE,
        header=_HEADER,
    )
    return partials, combine


@cache
def _scale(scale: float) -> mx.array:
    return mx.array([scale], mx.float32)


def flash_attention(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array, tiling: Tiling = TILING
) -> mx.array:
    """softmax(q k^T * scale, masked) v for one query per row: q (B, Hq, 1, D), k and v
    (B, Hkv, L, D) with D contiguous, mask boolean with one entry per row and key. Returns
    (B, 1, Hq * D), o_proj's input."""
    B, Hq, _, D = q.shape
    Hkv, L = k.shape[1], k.shape[2]
    G = Hq // Hkv
    S, W = chunks(B, Hkv, L, tiling.blocks), warps_for(D, G, tiling.warps)
    partials, combine = _kernels()
    f32 = mx.float32
    part_o, part_m, part_l = partials(  # type: ignore[operator]
        inputs=[q, k, v, mask, _scale(scale)],
        template=[("T", q.dtype), ("D", D), ("G", G), ("NW", W), ("KT", tiling.keys)],
        grid=(S * W * 32, Hkv, B),
        threadgroup=(W * 32, 1, 1),
        output_shapes=[(B, Hq, S, D), (B, Hq, S), (B, Hq, S)],
        output_dtypes=[f32, f32, f32],
    )
    (out,) = combine(  # type: ignore[operator]
        inputs=[part_o, part_m, part_l],
        template=[("T", q.dtype), ("D", D)],
        grid=(D, Hq, B),
        threadgroup=(D, 1, 1),
        output_shapes=[(B, 1, Hq * D)],
        output_dtypes=[q.dtype],
    )
    return out
