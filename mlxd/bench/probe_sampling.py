"""What sampling costs a batched step: BatchGenerator's decode step with greedy rows, with one
sampler object shared by every row (one batched call), and with a sampler per row, as
mlx_lm.server builds them for requests that carry a temperature (a slice, the filter chain and
a draw per row, then a concatenate), and with those per-row samplers drawn by mlxd's batched
step (`batched`: engine/batch_sampling.py, the same tokens).

    python -m mlxd.bench.probe_sampling --shape qwen3-0.6b --rows 8 32 --context 512 --steps 64

Each figure is the median time between BatchGenerator's decode steps, after the first 8.
On the CPU (qwen3-host, 32 rows, temperature 0.7, top_p 0.95) per-row samplers added 11-14%
to a step and the shared one 1% (docs/performance.md, §4).
"""

import statistics
import time

from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_sampler

from ..engine.batch_logits import BiasedGenerationBatch
from ..engine.sampling import SamplingParams
from .models import build_random, random_prompts, rows_parser

KINDS = ("greedy", "shared", "per-row", "batched")


def step_ms(
    model, prompts: list[list[int]], steps: int, kind: str, temp: float, top_p: float,
    penalty: float = 0.0,
) -> float:  # fmt: skip
    """Median ms between decode steps of `len(prompts)` rows admitted together; `penalty`: a
    repetition penalty on every row (mlx-lm's processors, or mlxd's for `batched`)."""
    B = len(prompts)
    samplers = None
    procs = None
    if penalty:
        rep = SamplingParams(repetition_penalty=penalty)
        procs = [
            rep.processors() if kind == "batched" else _mlx_lm_penalty(penalty) for _ in prompts
        ]
    if kind == "shared":
        samplers = [make_sampler(temp, top_p=top_p)] * B
    elif kind in ("per-row", "batched"):
        params = SamplingParams(temp=temp, top_p=top_p)
        samplers = [params.sampler() for _ in range(B)]  # mlx-lm's, one object per row
    gen = BatchGenerator(model, completion_batch_size=B, prefill_batch_size=B)
    if kind == "batched":  # mlxd's step with the batched draw (engine/batch_sampling.py)
        BiasedGenerationBatch.install(gen, model, batch_sampling=True)
    gen.insert(prompts, max_tokens=[steps + 8] * B, samplers=samplers, logits_processors=procs)
    gaps, last = [], None
    while gen.next_generated():
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    gen.close()
    return 1e3 * statistics.median(gaps[8:] or gaps)


def _mlx_lm_penalty(penalty: float) -> list:
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(repetition_penalty=penalty)


def main(argv: list[str] | None = None) -> None:
    p = rows_parser(__doc__, "qwen3-0.6b", [8, 32])
    p.add_argument("--context", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--steps", type=int, default=64, help="decode steps timed per run")
    p.add_argument("--temp", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument(
        "--repetition-penalty", type=float, default=0.0,
        help="on every row (0: none); `batched` then also runs mlxd's batched penalties",
    )  # fmt: skip
    args = p.parse_args(argv)
    bm = build_random(args.shape, "bfloat16", 0)
    for B in args.rows:
        prompts = random_prompts(bm.vocab_size, B, args.context, 1)
        pen = args.repetition_penalty
        step_ms(bm.model, prompts, 8, "greedy", args.temp, args.top_p, pen)  # warm-up
        cells = [
            f"{k} {step_ms(bm.model, prompts, args.steps, k, args.temp, args.top_p, pen):7.2f}"
            for k in KINDS
        ]
        print(f"B={B:2d} L={args.context:5d}: {' | '.join(cells)} ms/step", flush=True)


if __name__ == "__main__":
    main()
