"""The engine turn in which several agents' next turns join a batch, timed part by part: each
row brings restored caches (its cached context) and new tokens. docs/performance.md (TTFT).

    python -m bench.probes.probe_join --shape qwen3-0.6b --rows 8 --cached 3660 --new 300 \
        [--attention folded+fused]

Per repeat (new lengths, other new lengths, then the same lengths again): the merge of the
restored caches, the right-padded prefill forward and its eval, `mx.clear_cache()`, `finalize`
(the roll) and its eval, the first decode step, and mlx-lm's BatchGenerator doing all of it
(insert_segments + next) end to end, with mlx-lm's row caches and with mlxd's (kv/batch_roll.py).
`prefill_row_by_row` prefills the same new tokens one row at a time over unpadded caches (causal
attention, no mask array, no roll): what a join would cost without the padded batch.
`--caches mlxd` (default) times the merge, prefill and roll over mlxd's row caches (its roll:
one kernel on CUDA; its prefill mask additive where MLX-CUDA takes one), `mlx` over mlx-lm's.
`--kernels` (device only: PyTorch's CUPTI, as probe_kernels) lists the last repeat's merge,
prefill, roll and first step kernel by kernel.
"""

import argparse
import contextlib
import random
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, _merge_caches, _right_pad_prompts
from mlx_lm.models.cache import make_prompt_cache

from bench.probes.probe_kernels import exported
from mlxd.bench.models import SHAPES, build_random
from mlxd.engine.kernel_profile import summarize
from mlxd.kv.additive_mask import takes_additive
from mlxd.kv.batch_quantized import mergeable
from mlxd.kv.batch_roll import roll_rows
from mlxd.model.folded_attention import for_mode


def _ms(t0: float) -> float:
    mx.synchronize()
    return 1000 * (time.perf_counter() - t0)


def restored(model, n: int, rng: random.Random) -> list:
    """A row's caches as the prefix store hands them over: n tokens of real prefill."""
    cache = make_prompt_cache(model)
    model(mx.array([[rng.randrange(10, 1000) for _ in range(n)]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


Watch = Callable[[str], contextlib.AbstractContextManager[Any]]


def _unwatched(part: str) -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def join_once(
    model, rows: int, cached: int, new: int, jitter: int, seed: int, watch: Watch = _unwatched,
    ours: bool = False,
) -> dict[str, float]:  # fmt: skip
    """One join's parts; `ours`: the merge, prefill and roll over mlxd's row caches (its roll,
    and its prefill mask additive where MLX-CUDA takes one: kv/batch_roll.py), not mlx-lm's."""
    rng = random.Random(seed)
    lens = [cached + (i * jitter) % 13 for i in range(rows)]
    feeds = [[rng.randrange(10, 1000) for _ in range(new + (i * jitter) % 11)] for i in range(rows)]
    out: dict[str, float] = {}
    caches = [restored(model, n, rng) for n in lens]
    if ours:
        caches = [mergeable(c, takes_additive(model)) for c in caches]
    with watch("merge"):
        t = time.perf_counter()
        batch = _merge_caches(caches)
        mx.eval([c.state for c in batch])
        out["merge"] = _ms(t)
    lengths = [len(f) for f in feeds]
    longest = max(lengths)
    with watch("prefill"):
        t = time.perf_counter()
        tokens = _right_pad_prompts(feeds, max_length=longest)
        for c in batch:
            c.prepare(lengths=lengths, right_padding=[longest - n for n in lengths])
        model(tokens, cache=batch)
        mx.eval([c.state for c in batch])
        out["prefill"] = _ms(t)
    t = time.perf_counter()
    mx.clear_cache()
    out["clear_cache"] = _ms(t)
    shifts = batch[0]._right_padding.tolist() if batch[0]._right_padding is not None else None
    before = [(c.keys, c.values) for c in batch]
    t = time.perf_counter()
    for c in batch:
        c.finalize()
    mx.eval([c.state for c in batch])
    out["finalize"] = _ms(t)
    if shifts is not None:  # mlxd's roll (kv/batch_roll.py) on the same arrays, checked equal
        with watch("roll"):
            t = time.perf_counter()
            rolled = [(roll_rows(k, shifts), roll_rows(v, shifts)) for k, v in before]
            mx.eval(rolled)
            out["finalize_by_slices"] = _ms(t)
        same = all(
            mx.array_equal(a, c.keys).item() and mx.array_equal(b, c.values).item()
            for (a, b), c in zip(rolled, batch, strict=True)
        )
        out["finalize_by_slices_equal"] = float(same)
        del before, rolled
    with watch("decode_step"):
        t = time.perf_counter()
        mx.eval(model(mx.array([[1]] * rows), cache=batch))
        out["decode_step"] = _ms(t)
    # The same new tokens prefilled row by row, each over its own unpadded cache: no array
    # mask (the causal kernels), no roll; other kernels than the padded batch, so other bits.
    caches = [restored(model, n, rng) for n in lens]
    mx.synchronize()
    t = time.perf_counter()
    for f, cache in zip(feeds, caches, strict=True):
        model(mx.array([f]), cache=cache)
        mx.eval([c.state for c in cache])
    out["prefill_row_by_row"] = _ms(t)
    caches = [restored(model, n, rng) for n in lens]
    gen = BatchGenerator(model, completion_batch_size=max(rows, 8), prefill_batch_size=rows)
    mx.synchronize()
    t = time.perf_counter()
    gen.insert_segments([[f] for f in feeds], max_tokens=[4] * rows, caches=caches)
    gen.next()
    out["batch_generator"] = _ms(t)
    gen.close()
    caches = [mergeable(restored(model, n, rng), takes_additive(model)) for n in lens]  # mlxd's
    gen = BatchGenerator(model, completion_batch_size=max(rows, 8), prefill_batch_size=rows)
    mx.synchronize()
    t = time.perf_counter()
    gen.insert_segments([[f] for f in feeds], max_tokens=[4] * rows, caches=caches)
    gen.next()
    out["batch_generator_mlxd_caches"] = _ms(t)
    gen.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--cached", type=int, default=3660, help="restored tokens per row")
    p.add_argument("--new", type=int, default=300, help="new tokens per row")
    p.add_argument("--attention", default="mlx", help="a --batched-attention mode's model")
    p.add_argument(
        "--caches", choices=["mlx", "mlxd"], default="mlxd",
        help="the timed parts over mlx-lm's row caches or mlxd's (its roll and prefill mask)",
    )  # fmt: skip
    p.add_argument("--kernels", action="store_true", help="the last repeat's parts' kernels")
    p.add_argument("--top", type=int, default=12, help="with --kernels: kernels listed a part")
    args = p.parse_args(argv)
    model = for_mode(build_random(args.shape, "bfloat16", 0).model, args.attention)
    seen: dict[str, list] = {}
    for rep, jitter in enumerate([3, 7, 7]):
        watch = _profiled(seen) if args.kernels and rep == 2 else _unwatched
        parts = join_once(
            model, args.rows, args.cached, args.new, jitter, jitter, watch, args.caches == "mlxd"
        )
        line = " | ".join(
            f"{k} {bool(v)}" if k.endswith("_equal") else f"{k} {v:.1f} ms"
            for k, v in parts.items()
        )
        print(f"repeat {rep}: {line}", flush=True)
    for part, ks in seen.items():  # probe_kernels' summary, the part as one "step"
        print(f"== kernels, repeat 2, {part}", flush=True)
        print("\n".join(summarize(ks, 1, args.top)), flush=True)


def _profiled(seen: dict[str, list]) -> Watch:
    """A watch that records each part's kernels under torch.profiler into `seen`."""

    @contextlib.contextmanager
    def watch(part: str):
        import torch.profiler as tp

        with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
            yield
        seen[part] = exported(prof)

    return watch


if __name__ == "__main__":
    main()
