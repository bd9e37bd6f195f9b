"""What the engine thread's hand-off costs a lone stream: mlx-lm's `stream_generate` against the
engine read token by token and against the engine left alone until the row ends (the reader
sleeps), in interleaved rounds. docs/benchmarks.md (B=1 on the CPU, session 8).

    python -m mlxd.bench.probe_handoff --shape qwen3-host --rounds 32

mlx-lm does its per-token work (detokenize, response) on the thread that runs the model; mlxd
does it on the reader's thread, which needs a core of its own to run beside the engine's.
"mlx-lm on a thread" runs mlx-lm's own loop behind the same kind of hand-off, to tell a cost of
the hand-off from a cost of mlxd's engine; "serial row, no engine" runs mlxd's B=1 step on the
caller's thread with no hand-off at all; "mlxd stream_generate" is the whole Python API path;
"engine detokenizes" moves the detokenizer onto the engine thread, as the server has it.
Figures: ms per generated token (first to last token), median and quartile per variant, and the
per-round ratio to mlx-lm's.
"""

import queue
import statistics
import time
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import stream_generate

from ..engine import stream_generate as mlxd_stream_generate
from ..engine.engine import Engine
from ..engine.registry import engine_for
from ..engine.request import GenerationRequest
from ..engine.serial import SerialRow
from ..engine.threads import run_soon
from .models import build_random, stream_parser


def _per_token(stamps: list[float]) -> float:
    return 1e3 * (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def _mlx_lm(model, tokenizer, prompt: mx.array, n: int) -> float:
    return _per_token(
        [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=n)]
    )


def _mlx_lm_thread(model, tokenizer, prompt: mx.array, n: int) -> float:
    """mlx-lm's loop on a worker thread, each response handed to this thread as mlxd's are.
    The worker is pooled and never exits: a thread that ran MLX and ended can abort the
    process (threads.py), and on the H200 this variant on a fresh thread per round was the
    likely cause of a CUDA graph capture abort (session 13)."""
    q: queue.Queue = queue.Queue()

    def work() -> None:
        for r in stream_generate(model, tokenizer, prompt, max_tokens=n):
            q.put(r)
        q.put(None)

    run_soon(work)
    stamps = []
    while q.get() is not None:
        stamps.append(time.perf_counter())
    return _per_token(stamps)


def _mlxd_api(model, tokenizer, prompt: mx.array, n: int) -> float:
    """mlxd's stream_generate: the engine plus the reader's detokenizing and responses."""
    gen = mlxd_stream_generate(model, tokenizer, prompt, max_tokens=n)
    return _per_token([time.perf_counter() for _ in gen])


def _serial_here(model, prompt: mx.array, n: int) -> float:
    """mlxd's B=1 row (serial.py) driven on this thread, no engine: its step against
    generate_step's without any hand-off, to tell a cost of the step from one of the thread."""
    from mlx_lm.generate import generation_stream

    row = SerialRow(model, GenerationRequest(prompt=prompt, max_tokens=n), generation_stream)
    while row.prefilling:
        row.prefill_chunk()
    stamps = []
    while row.decode() is not None:
        stamps.append(time.perf_counter())
    return _per_token(stamps)


def _engine(model, prompt: mx.array, n: int, read: bool) -> float:
    engine = engine_for(model)
    handle = engine.submit(GenerationRequest(prompt=prompt, max_tokens=n))
    if read:
        for _ in handle:
            pass
    else:  # poll the engine, not the handle, so no token wakes this thread
        while (s := engine.stats())["active"] + s["waiting"] > 0:
            time.sleep(0.02)
    done = handle.wait()
    return 1e3 * done.timings["decode_s"] / (done.completion_tokens - 1)


def _engine_detok(engine: Engine, prompt: mx.array, n: int) -> float:
    """An engine that detokenizes on its own thread (the server's split): the reader only
    takes each token's text, as mlx-lm's loop hands it over."""
    handle = engine.submit(GenerationRequest(prompt=prompt, max_tokens=n))
    return _per_token([time.perf_counter() for _ in handle])  # each event holds its text


def run(shape: str, rounds: int, prompt_tokens: int, gen: int) -> dict[str, list[float]]:
    bm = build_random(shape, "bfloat16")
    detok = Engine(bm.model, tokenizer=bm.tokenizer)
    prompt = mx.array([1 + i % (bm.vocab_size - 1) for i in range(prompt_tokens)])
    variants: dict[str, Callable[[], float]] = {
        "mlx-lm": lambda: _mlx_lm(bm.model, bm.tokenizer, prompt, gen),
        "mlx-lm on a thread": lambda: _mlx_lm_thread(bm.model, bm.tokenizer, prompt, gen),
        "engine, read per token": lambda: _engine(bm.model, prompt, gen, read=True),
        "engine, reader asleep": lambda: _engine(bm.model, prompt, gen, read=False),
        "mlxd stream_generate": lambda: _mlxd_api(bm.model, bm.tokenizer, prompt, gen),
        "serial row, no engine": lambda: _serial_here(bm.model, prompt, gen),
        "engine detokenizes": lambda: _engine_detok(detok, prompt, gen),
    }
    for fn in variants.values():  # warm-up
        fn()
    out: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for k in list(variants)[:: 1 if r % 2 == 0 else -1]:
            out[k].append(variants[k]())
    detok.close()
    return out


def report(out: dict[str, list[float]]) -> list[str]:
    base = out["mlx-lm"]
    lines = []
    for k, v in out.items():
        s = sorted(v)
        line = f"{k:24s} {statistics.median(v):7.3f} ms/token (q25 {s[len(s) // 4]:.3f})"
        if k != "mlx-lm":
            r = sorted(b / a for a, b in zip(base, v, strict=True))
            line += f"  per-round / mlx-lm {statistics.median(r):.3f} [{r[0]:.3f}-{r[-1]:.3f}]"
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> None:
    p = stream_parser(__doc__, rounds=32, prompt_tokens=64, gen_tokens=256)
    a = p.parse_args(argv)
    print("\n".join(report(run(a.shape, a.rounds, a.prompt_tokens, a.gen_tokens))))


if __name__ == "__main__":
    main()
