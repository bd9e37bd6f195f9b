"""What a whole-step `mx.compile` would buy the batched decode step: the step over a cache of
fixed capacity (so its shapes hold still and one trace serves every step), built in Python each
step against the same step compiled once, next to mlx-lm's own step over a growing cache.

    python -m bench.probes.probe_compile --shape qwen3-0.6b --rows 1 8 32 --context 4096

Variants, each `steps` pipelined greedy steps (the next step queued before the previous token
is read, as BatchGenerator does), the figure the median of 4 blocks after one of warm-up:
- `mlx-lm`: KVCache at one row, BatchKVCache and MLX's attention above;
- `folded`: BatchKVCache with mlxd's folded attention (rows >= 2);
- `static`: a fixed-capacity buffer written at an array index, every key masked by position,
  folded attention over the whole buffer (the bits differ from mlx-lm's: opt-in if kept);
- `static+compile`: the same function under `mx.compile`;
- `folded+fused` (rows >= 2): `--batched-attention folded+fused`, q/k/v and gate/up each one
  matmul over stacked weights (a copy): 84 of a 0.6B step's 196 projection calls.
`equal` says whether the compiled static step made the same tokens as the uncompiled one.
"""

import statistics
import time
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, KVCache

from bench.probes.common import rows_parser
from mlxd.bench.models import SHAPES, build_random
from mlxd.model.folded_attention import attention, folded


class StaticCache:
    """One layer's keys and values in a buffer of fixed capacity; every row writes at `idx`
    (BatchKVCache's shared column), rows start at their left padding."""

    def __init__(self, keys: mx.array, values: mx.array, idx: mx.array, left: mx.array) -> None:
        self.keys, self.values, self.idx, self.left = keys, values, idx, left
        self.offset = idx - left  # RoPE positions, as BatchKVCache.offset

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        self.keys = mx.slice_update(self.keys, k, self.idx.reshape(1), axes=(2,))
        self.values = mx.slice_update(self.values, v, self.idx.reshape(1), axes=(2,))
        return self.keys, self.values

    def make_mask(self, N: int, **_: Any) -> mx.array:
        pos = mx.arange(self.keys.shape[2])
        ok = (pos[None] >= self.left[:, None]) & (pos[None] <= self.idx)
        return ok.reshape(-1, 1, 1, self.keys.shape[2])


class StaticAttention(nn.Module):
    """A layer's projections, norms and RoPE, then folded attention over the whole buffer."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        a = self.inner
        B, L, _ = x.shape
        q, k, v = a.q_proj(x), a.k_proj(x), a.v_proj(x)
        q, k = q.reshape(B, L, a.n_heads, -1), k.reshape(B, L, a.n_kv_heads, -1)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)
        v = v.reshape(B, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q, k = a.rope(q, offset=cache.offset), a.rope(k, offset=cache.offset)
        k, v = cache.update_and_fetch(k, v)
        out = attention(q, k, v, a.scale, mask)
        return a.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def static_model(model: nn.Module) -> nn.Module:
    """A shallow copy of `model` whose layers attend with StaticAttention (weights shared)."""
    shadow = folded(model, 1, rows=False)  # its own 3-D attention below
    for layer in shadow.model.layers:
        layer.self_attn = StaticAttention(layer.self_attn.inner)
    return shadow


def fused_model(model: nn.Module) -> nn.Module:
    """folded(model) whose batched decode steps run q/k/v and gate/up as one matmul each."""
    return folded(model, fuse=True)


def static_step(model: nn.Module):
    """step(tokens, idx, left, *buffers) -> [next tokens, logprobs, idx + 1, *buffers]."""

    def step(tokens: mx.array, idx: mx.array, left: mx.array, *bufs: mx.array) -> list[mx.array]:
        caches = [
            StaticCache(bufs[2 * i], bufs[2 * i + 1], idx, left) for i in range(len(bufs) // 2)
        ]
        logits = model(tokens, cache=caches)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = mx.argmax(logprobs, axis=-1, keepdims=True)
        return [nxt, logprobs, idx + 1] + [a for c in caches for a in (c.keys, c.values)]

    return step


def _filled(B: int, kv: int, n: int, D: int, layers: int) -> list[mx.array]:
    bufs = [mx.random.normal((B, kv, n, D)).astype(mx.bfloat16) for _ in range(2 * layers)]
    mx.eval(bufs)
    return bufs


def _left(B: int, L: int) -> list[int]:
    return [(i * 37) % min(300, L) for i in range(B)]


def _timed(steps: int, one_step) -> tuple[float, list[int]]:
    """Median ms per step over 4 blocks; the tokens of the last row, read as the loop goes."""
    seen: list[int] = []
    blocks = []
    for _ in range(5):  # the first block warms up (MLX-CUDA's first-use compiles), not counted
        mx.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps // 4):
            seen.append(one_step()[-1])
        mx.synchronize()
        blocks.append(1000 * (time.perf_counter() - t0) / (steps // 4))
    return statistics.median(blocks[1:]), seen


def run_growing(model, B: int, L: int, kv: int, D: int, steps: int) -> float:
    """mlx-lm's step: KVCache at one row, BatchKVCache above, the cache growing."""
    n = (L + steps * 5 // 4 + 8 + 255) // 256 * 256
    bufs = _filled(B, kv, n, D, len(model.layers))
    caches: list[Any] = []
    for i in range(len(model.layers)):
        c = KVCache() if B == 1 else BatchKVCache(_left(B, L))
        c.keys, c.values = bufs[2 * i], bufs[2 * i + 1]
        if B == 1:
            c.offset = L
        else:
            c._idx, c.offset = L, c.offset + L
        caches.append(c)
    state = {"tokens": mx.zeros((B, 1), mx.int32)}

    def one() -> list[int]:
        logits = model(state["tokens"], cache=caches)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = mx.argmax(logprobs, axis=-1, keepdims=True)
        mx.async_eval(nxt, logprobs)
        prev, state["tokens"] = state["tokens"], nxt
        return prev.reshape(-1).tolist()

    return _timed(steps, one)[0]


def run_static(model, B: int, L: int, kv: int, D: int, steps: int, compiled: bool):
    n = (L + steps * 5 // 4 + 8 + 255) // 256 * 256
    fn = static_step(static_model(model))
    fn = mx.compile(fn) if compiled else fn
    mx.random.seed(1)
    state = {
        "tokens": mx.zeros((B, 1), mx.int32),
        "idx": mx.array(L, mx.int32),
        "bufs": _filled(B, kv, n, D, len(model.layers)),
    }
    left = mx.array(_left(B, L), mx.int32)

    def one() -> list[int]:
        prev = state["tokens"]
        out = fn(prev, state["idx"], left, *state.pop("bufs"))  # the step holds the only refs
        state["tokens"], state["idx"], state["bufs"] = out[0], out[2], out[3:]
        mx.async_eval(out)  # buffers updated in place: their inputs are donated
        del out
        return prev.reshape(-1).tolist()

    return _timed(steps, one)


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [1, 8, 32])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--growing-only", action="store_true", help="mlx-lm's step and folded only")
    args = p.parse_args(argv)
    cfg = SHAPES[args.shape]
    model = build_random(args.shape, "bfloat16", 0).model
    kv, D = cfg["num_key_value_heads"], cfg.get("head_dim") or 128
    L, steps = args.context, args.steps
    for B in args.rows:
        cells = [f"mlx-lm {run_growing(model, B, L, kv, D, steps):7.2f}"]
        if B > 1:
            cells.append(f"folded {run_growing(folded(model), B, L, kv, D, steps):7.2f}")
            cells.append(f"folded+fused {run_growing(fused_model(model), B, L, kv, D, steps):7.2f}")
        tail = ""
        if not args.growing_only:
            plain, seen_plain = run_static(model, B, L, kv, D, steps, compiled=False)
            fast, seen_fast = run_static(model, B, L, kv, D, steps, compiled=True)
            cells += [f"static {plain:7.2f}", f"static+compile {fast:7.2f}"]
            tail = f" | equal {seen_plain == seen_fast}"
        print(f"B={B:2d} L={L:5d}+{steps}: {' | '.join(cells)} ms/step{tail}", flush=True)


if __name__ == "__main__":
    main()
