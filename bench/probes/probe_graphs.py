"""Batched decode steps that advance through the cache, as a server's do, timed per step: MLX's
attention against folded attention with its keys rounded up to 8 or to 256. Run it once with
MLX_USE_CUDA_GRAPHS=0 and once without: a step whose shapes hold still should let MLX-CUDA
reuse its captured graphs (docs/performance.md, CUDA graphs at 32 rows).

    python -m bench.probes.probe_graphs --shape qwen3-8b --rows 32 --context 512 --steps 64

Each variant runs `steps` greedy steps with the next step queued before the previous token is
read (BatchGenerator's pipelining); the figure is the median of 4 blocks of steps / 4.
`--step engine` adds what BatchGenerator's step does beyond the model: log-probabilities over the
vocabulary, both arrays queued, and the previous tokens read back to the host every step.
"""

import os
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from bench.probes.common import rows_parser
from mlxd.bench.models import SHAPES, build_random
from mlxd.model.folded_attention import folded


def _caches(model, B: int, L: int, kv: int, D: int, room: int) -> list[BatchKVCache]:
    """BatchKVCache layers holding L random tokens, with a buffer that has `room` free slots
    rounded up to 256 (left padding varied)."""
    out = []
    n = (L + room + 255) // 256 * 256
    for _ in model.layers:
        c = BatchKVCache([(i * 37) % min(300, L) for i in range(B)])
        c.keys, c.values = (mx.random.normal((B, kv, n, D)).astype(mx.bfloat16) for _ in range(2))
        c._idx, c.offset = L, c.offset + L
        out.append(c)
    mx.eval([c.keys for c in out], [c.values for c in out])
    return out


def _engine_step(model, tokens: mx.array, caches: list) -> mx.array:
    """BatchGenerator's greedy step: log-probabilities, both queued, the last tokens read."""
    logits = model(tokens, cache=caches)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nxt = mx.argmax(logprobs, axis=-1, keepdims=True)
    mx.async_eval(nxt, logprobs)
    tokens.tolist()
    return nxt


def run(model, B: int, L: int, kv: int, D: int, steps: int, engine: bool = False) -> float:
    """Median ms per step over 4 blocks of steps // 4 pipelined steps."""
    caches = _caches(model, B, L, kv, D, steps + 8)
    tokens = mx.zeros((B, 1), mx.int32)
    blocks = []
    for _ in range(4):
        mx.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps // 4):
            if engine:
                tokens = _engine_step(model, tokens, caches)
                continue
            nxt = mx.argmax(model(tokens, cache=caches)[:, -1, :], axis=-1, keepdims=True)
            mx.async_eval(nxt)
            tokens = nxt
        mx.eval(tokens)
        blocks.append(1000 * (time.perf_counter() - t0) / (steps // 4))
    return statistics.median(blocks)


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-8b", [8, 32])
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--step", choices=("argmax", "engine"), default="argmax")
    args = p.parse_args(argv)
    cfg = SHAPES[args.shape]
    model = build_random(args.shape, "bfloat16", 0).model
    kv, D = cfg["num_key_value_heads"], cfg.get("head_dim") or 128
    graphs = os.environ.get("MLX_USE_CUDA_GRAPHS", "default")
    variants = [("mlx", model), ("folded/8", folded(model, 8)), ("folded/256", folded(model, 256))]
    L, steps = args.context, args.steps
    for B in args.rows:
        engine = args.step == "engine"
        cells = (f"{name} {run(m, B, L, kv, D, steps, engine):7.2f}" for name, m in variants)
        head = f"graphs={graphs} step={args.step} B={B:2d} L={L:5d}+{steps}"
        print(f"{head}: {' | '.join(cells)} ms/step", flush=True)


if __name__ == "__main__":
    main()
