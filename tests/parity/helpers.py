"""Run mlx-lm and mlxd side by side and compare what they produce, bit for bit.

Every comparison here is exact: arrays are compared as their raw bit patterns (so 0.0 vs -0.0,
NaN payloads and a single ulp all count as differences), token ids and texts with ==. Nothing
is compared with a tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

# A prompt text (46 Qwen3 tokens) that the tests slice into prompts of the lengths they need.
PROMPT_TEXT = (
    "The lighthouse keeper counted the ships every evening, writing their names in a blue "
    "notebook. One night a vessel with no name appeared on the horizon, its lanterns green "
    "instead of white, and the keeper reached for his pen."
)

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_MX_UINT_OF_SIZE = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}

# GenerationResponse fields that must match exactly (timings and peak memory cannot).
EXACT_FIELDS = (
    "text",
    "token",
    "from_draft",
    "prompt_tokens",
    "generation_tokens",
    "finish_reason",
)


def bits(a: mx.array | np.ndarray) -> np.ndarray:
    """The raw bit pattern of an array as unsigned ints (works for bfloat16 too)."""
    if isinstance(a, mx.array):
        return np.array(a.view(_MX_UINT_OF_SIZE[a.itemsize]))
    a = np.asarray(a)
    return a.view(_UINT_OF_SIZE[a.itemsize])


def assert_bitwise_equal(a: mx.array | np.ndarray, b: mx.array | np.ndarray, what: str) -> None:
    """Same dtype, same shape, same bits; on failure say where and by how much."""
    assert str(a.dtype) == str(b.dtype), f"{what}: dtype {a.dtype} != {b.dtype}"
    assert tuple(a.shape) == tuple(b.shape), f"{what}: shape {a.shape} != {b.shape}"
    ba, bb = bits(a), bits(b)
    if np.array_equal(ba, bb):
        return
    diff = np.flatnonzero(ba.reshape(-1) != bb.reshape(-1))
    i = int(diff[0])
    va = np.asarray(a.astype(mx.float32) if isinstance(a, mx.array) else a).reshape(-1)[i]
    vb = np.asarray(b.astype(mx.float32) if isinstance(b, mx.array) else b).reshape(-1)[i]
    raise AssertionError(
        f"{what}: {diff.size} of {ba.size} elements differ; first at flat index {i}: "
        f"{va!r} vs {vb!r}"
    )


# ---------------------------------------------------------------------------------------------
# Models and tokenizers


@dataclass
class Pair:
    """One model folder loaded twice: by mlx_lm.load (ref) and by mlxd.load (got)."""

    arch: str
    folder: Path
    ref_model: Any
    ref_tok: Any
    ref_config: dict
    got_model: Any
    got_tok: Any
    got_config: dict


def load_pair(arch: str, folder: Path) -> Pair:
    import mlx_lm

    import mlxd

    ref = mlx_lm.load(str(folder), return_config=True)
    got = mlxd.load(str(folder), return_config=True)
    return Pair(arch, folder, *ref, *got)


def assert_same_parameters(ref, got) -> None:
    """Two loaded models hold the same parameter names, dtypes, shapes and bits."""
    pa, pb = dict(tree_flatten(ref.parameters())), dict(tree_flatten(got.parameters()))
    assert sorted(pa) == sorted(pb), (
        f"parameter names differ: only in ref {sorted(set(pa) - set(pb))[:5]}, "
        f"only in got {sorted(set(pb) - set(pa))[:5]}"
    )
    for name in sorted(pa):
        assert_bitwise_equal(pa[name], pb[name], f"parameter {name}")


# ---------------------------------------------------------------------------------------------
# stream_generate


@dataclass
class StreamRun:
    """Everything a stream_generate call produced, detached from the arrays it returned."""

    fields: list[dict[str, Any]] = field(default_factory=list)
    logprobs: list[np.ndarray] = field(default_factory=list)
    logprob_dtype: list[str] = field(default_factory=list)
    error: tuple[type, str] | None = None
    rng_after: np.ndarray | None = None  # the caller's PRNG key once the stream is consumed

    @property
    def tokens(self) -> list[int]:
        return [f["token"] for f in self.fields]

    @property
    def text(self) -> str:
        return "".join(f["text"] for f in self.fields)

    @property
    def finish_reason(self) -> str | None:
        return self.fields[-1]["finish_reason"] if self.fields else None


def run_stream(
    stream_generate: Callable[..., Iterable[Any]],
    model,
    tokenizer,
    prompt,
    *,
    seed: int | None,
    **kwargs: Any,
) -> StreamRun:
    """Consume a whole stream_generate call, recording each response and any exception.

    The global MLX PRNG is re-seeded right before the call (when `seed` is given) so both sides
    start sampling from the same state; its state afterwards is recorded too, since a caller's
    next call continues from it.
    """
    run = StreamRun()
    if seed is not None:
        mx.random.seed(seed)
    try:
        for r in stream_generate(model, tokenizer, prompt, **kwargs):
            run.fields.append({k: getattr(r, k) for k in EXACT_FIELDS})
            run.logprobs.append(bits(r.logprobs))
            run.logprob_dtype.append(str(r.logprobs.dtype))
    except Exception as e:  # noqa: BLE001 - the exception itself is what gets compared
        run.error = (type(e), str(e))
    run.rng_after = bits(mx.random.state[0])
    return run


def assert_same_run(ref: StreamRun, got: StreamRun, label: str = "") -> None:
    """Token ids, full logprob arrays, texts, counters, finish reason and any error: identical."""
    p = f"{label}: " if label else ""
    assert got.error == ref.error, f"{p}error {got.error!r} != reference {ref.error!r}"
    assert got.tokens == ref.tokens, f"{p}tokens {got.tokens} != reference {ref.tokens}"
    assert len(got.fields) == len(ref.fields)
    for i, (fa, fb) in enumerate(zip(ref.fields, got.fields, strict=True)):
        for k in EXACT_FIELDS:
            assert fb[k] == fa[k], f"{p}response {i} {k}: {fb[k]!r} != reference {fa[k]!r}"
    assert got.logprob_dtype == ref.logprob_dtype, f"{p}logprob dtypes differ"
    for i, (la, lb) in enumerate(zip(ref.logprobs, got.logprobs, strict=True)):
        assert_bitwise_equal(la, lb, f"{p}logprobs of response {i}")
    if ref.rng_after is not None or got.rng_after is not None:
        assert ref.rng_after is not None and got.rng_after is not None
        assert_bitwise_equal(ref.rng_after, got.rng_after, f"{p}PRNG key after the call")


# ---------------------------------------------------------------------------------------------
# batch_generate


@dataclass
class BatchRun:
    """A batch_generate call's BatchResponse (or exception) and the caller's PRNG key after."""

    response: Any = None
    error: tuple[type, str] | None = None
    rng_after: np.ndarray | None = None


def run_batch(
    batch_generate: Callable[..., Any],
    model,
    tokenizer,
    prompts: list[list[int]],
    *,
    seed: int | None,
    **kwargs: Any,
) -> BatchRun:
    run = BatchRun()
    if seed is not None:
        mx.random.seed(seed)
    try:
        run.response = batch_generate(model, tokenizer, [list(p) for p in prompts], **kwargs)
    except Exception as e:  # noqa: BLE001 - the exception itself is what gets compared
        run.error = (type(e), str(e))
    run.rng_after = bits(mx.random.state[0])
    return run


def assert_same_batch(ref_run: BatchRun, got_run: BatchRun, label: str = "") -> None:
    """Same error (if any), texts, token ids, (bitwise) per-token logprobs, token counts and
    PRNG key afterwards."""
    p = f"{label}: " if label else ""
    assert got_run.error == ref_run.error, f"{p}error {got_run.error!r} != {ref_run.error!r}"
    assert_bitwise_equal(ref_run.rng_after, got_run.rng_after, f"{p}PRNG key after the call")
    ref, got = ref_run.response, got_run.response
    if ref is None:
        return
    assert got.texts == ref.texts, f"{p}texts differ"
    assert got.token_ids == ref.token_ids, f"{p}token ids {got.token_ids} != {ref.token_ids}"
    assert (got.logprobs is None) == (ref.logprobs is None), f"{p}logprobs presence differs"
    if ref.logprobs is not None:
        assert len(got.logprobs) == len(ref.logprobs)
        for i, (la, lb) in enumerate(zip(ref.logprobs, got.logprobs, strict=True)):
            assert_bitwise_equal(
                np.asarray(la, dtype=np.float64),
                np.asarray(lb, dtype=np.float64),
                f"{p}logprobs of sequence {i}",
            )
    for k in ("prompt_tokens", "generation_tokens"):
        assert getattr(got.stats, k) == getattr(ref.stats, k), f"{p}stats.{k} differ"


# ---------------------------------------------------------------------------------------------
# Printed reports (verbose=True): the same text once timings are masked.

_FLOAT = re.compile(r"\d+\.\d+")


def mask_timings(report: str) -> str:
    """Replace every decimal number (tokens-per-sec, GB) so two reports can be compared."""
    return _FLOAT.sub("<num>", report)
