"""A row's failure is the row's: when running one row of a batch raises, that row ends with the
error and the others go on with the bits they get when it is not there at all.

The model here raises whenever one token id is in its input (a hostile prompt, or a token a
row was made to sample): the batch's forward raises for every row, the engine finds the row
whose own input does (engine/generator.py) and runs the step again without it. A caller's
processor, sampler or detokenizer that raises is caught at that row (engine/culprits.py)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from mlxd.engine.engine import Engine
from mlxd.engine.request import GenerationRequest
from mlxd.engine.sampling import SamplingParams

BAD = 4242  # the poisoned token id: no clean request below feeds it
N = 8
CLEAN = [[1, 2, 3, 4, 5], [10, 20, 30, 40, 50], [7, 8, 9, 10, 11]]

Result = tuple[list[int], list[np.ndarray], str, BaseException | None]


@pytest.fixture(scope="module")
def model(tiny_model: Callable[..., Path]):
    from mlx_lm import load

    return load(str(tiny_model("qwen3")))[0]  # its own copy: the embedding is swapped below


@contextmanager
def poisoned(model: Any, batches_fail: bool = False, late: bool = False) -> Iterator[None]:
    """The model's forward raises when BAD is in its input (`batches_fail`: also on any input
    of more than one row, which no row alone reproduces, as running out of memory would;
    `late`: at its final norm, after every layer's cache took the step)."""
    inner = model.model
    emb = inner.embed_tokens
    norm = inner.norm if hasattr(inner, "norm") else inner.embedding_norm  # lfm2's final norm
    clean, clean_norm = type(emb), type(norm)
    fed = [False]  # BAD is in the input of the forward running now

    class Poisoned(clean):  # type: ignore[misc, valid-type]
        def __call__(self, x: mx.array) -> mx.array:
            fed[0] = BAD in x.flatten().tolist()
            if fed[0] and not late:
                raise RuntimeError("a poisoned input")
            if batches_fail and x.shape[0] > 1:
                raise RuntimeError("the batch as such")
            return super().__call__(x)

    class PoisonedNorm(clean_norm):  # type: ignore[misc, valid-type]
        def __call__(self, x: mx.array) -> mx.array:
            if fed[0]:
                raise RuntimeError("a poisoned input")
            return super().__call__(x)

    emb.__class__ = Poisoned
    if late:
        norm.__class__ = PoisonedNorm
    try:
        yield
    finally:
        emb.__class__, norm.__class__ = clean, clean_norm


def _run(model: Any, reqs: list[GenerationRequest]) -> list[Result]:
    """Every request submitted at once (one batch); the engine serves a request after them."""
    engine = Engine(model, batch=4)
    try:
        out = []
        for handle in engine.submit_many(reqs):
            tokens, logprobs = [], []
            try:
                for event in handle:
                    tokens.append(event.token)
                    logprobs.append(np.array(event.logprobs.astype(mx.float32)))
            except RuntimeError:
                pass  # the error also ends the handle's DoneEvent
            out.append((tokens, logprobs, handle.done.reason, handle.done.error))
        after = engine.submit(GenerationRequest(prompt=mx.array([3, 1, 4]), max_tokens=2))
        assert len(list(after)) == 2 and engine.alive
        assert engine.stats()["active"] == 0
        return out
    finally:
        engine.close()


def _clean(n: int = N, prompts: list[list[int]] = CLEAN) -> list[GenerationRequest]:
    return [GenerationRequest(prompt=mx.array(p), max_tokens=n) for p in prompts]


def _survivors_equal_the_run_without(model: Any, got: list[Result]) -> None:
    _survivors_equal(got, _run(model, _clean()))


def _survivors_equal(got: list[Result], want: list[Result], n: int = N) -> None:
    assert all(BAD not in tokens for tokens, *_ in want)  # BAD poisons the bad row only
    for (tokens, logprobs, reason, _), (w_tokens, w_logprobs, w_reason, _) in zip(
        got, want, strict=True
    ):
        assert (reason, tokens) == (w_reason, w_tokens) == ("length", w_tokens)
        assert len(w_tokens) == n
        assert all(np.array_equal(a, b) for a, b in zip(logprobs, w_logprobs, strict=True))


def _forced_from_call(n: int) -> Callable[[mx.array, mx.array], mx.array]:
    """A caller's processor that makes its row sample BAD from its n-th call on."""
    calls = [0]

    def force(_tokens: mx.array, logits: mx.array) -> mx.array:
        calls[0] += 1
        return logits.at[:, BAD].add(1e4) if calls[0] >= n else logits

    return force


def _bad_request(where: str, n: int = N, later: int = 3) -> GenerationRequest:
    prompt = {"in its prompt": [5, 6, BAD, 8, 9], "its last prompt token": [5, 6, 7, 8, BAD]}
    if where in prompt:
        return GenerationRequest(prompt=mx.array(prompt[where]), max_tokens=n)
    if where == "sampled first":  # the request's logit bias: fed at its first decode step
        bias = SamplingParams(logit_bias={BAD: 1e4})
        return GenerationRequest(prompt=mx.array([5, 6, 7, 8, 9]), max_tokens=n, sampling=bias)
    return GenerationRequest(  # after it streamed tokens, in mlx-lm's step (a caller's processor)
        prompt=mx.array([5, 6, 7, 8, 9]),
        max_tokens=n,
        logits_processors=[_forced_from_call(later)],
    )


@pytest.mark.parametrize(
    "where", ["in its prompt", "its last prompt token", "sampled first", "sampled later"]
)
def test_a_row_whose_input_raises_ends_alone(model, where: str) -> None:
    """The poisoned row ends with the forward's error; the three others finish with the tokens
    and logprobs of the same three requests run without it."""
    with poisoned(model):
        got = _run(model, [*_clean(), _bad_request(where)])
    *survivors, (tokens, _, reason, error) = got
    assert reason == "error" and "a poisoned input" in str(error)
    assert BAD not in tokens and len(tokens) == (2 if where == "sampled later" else 0)
    _survivors_equal_the_run_without(model, survivors)


# Prompts of 3, 7 and 5 tokens: the short row's ring holds 4 slots of left padding. The later
# row fails at the 18th column, past the tiny models' 16-token window: gemma3's rings have
# rotated and are still overwriting that padding (its count moving at each step).
RING_CLEAN = [[1, 2, 3], [10, 20, 30, 40, 50, 60, 70], [7, 8, 9, 10, 11]]
RING_N, RING_LATER = 20, 11
# gemma3's rings bf16 and 8-bit (quantized from the first token), lfm2's conv state
STATEFUL = {"gemma3": {}, "gemma3 kv8": {"kv_bits": 8, "kv_group_size": 32}, "lfm2": {}}


@pytest.fixture(scope="module", params=list(STATEFUL))
def stateful(request: pytest.FixtureRequest, tiny_model: Callable[..., Path]):
    """(a model whose layers a decode step changes in place, its requests' KV fields)."""
    from mlx_lm import load

    kv = STATEFUL[request.param]
    if kv:
        kv = {**kv, "quantized_kv_start": 0, "quantize_windows": True}
    return load(str(tiny_model(request.param.split()[0])))[0], kv


def _with_kv(reqs: list[GenerationRequest], kv: dict[str, Any]) -> list[GenerationRequest]:
    for r in reqs:
        for k, v in kv.items():
            setattr(r, k, v)
    return reqs


@pytest.mark.parametrize("where", ["sampled first", "sampled later"])
def test_a_row_failing_in_a_decode_step_of_rings_or_state_ends_alone(stateful, where: str) -> None:
    """The failed step is undone after every layer took it (a ring's slot written and its
    padding moved, a recurrent state replaced): the other rows finish with the bits of the
    run without the bad row."""
    model, kv = stateful
    bad = _bad_request(where, RING_N, RING_LATER)
    with poisoned(model, late=True):
        got = _run(model, _with_kv([*_clean(RING_N, RING_CLEAN), bad], kv))
    *survivors, (tokens, _, reason, error) = got
    assert reason == "error" and "a poisoned input" in str(error)
    assert len(tokens) == (RING_LATER - 1 if where == "sampled later" else 0)
    want = _run(model, _with_kv(_clean(RING_N, RING_CLEAN), kv))
    _survivors_equal(survivors, want, RING_N)


class _Detokenizer:
    """Raises at its row's third token (a streaming detokenizer that breaks)."""

    def __init__(self) -> None:
        self.n, self.last_segment = 0, ""

    def add_token(self, _token: int) -> None:
        self.n += 1
        if self.n == 3:
            raise RuntimeError("the row's own detokenizer broke")

    def finalize(self) -> None:
        pass


class _Tokenizer:
    @property
    def detokenizer(self) -> _Detokenizer:
        return _Detokenizer()


def _raising_from_call(n: int, inner: Callable[..., mx.array]) -> Callable[..., mx.array]:
    calls = [0]

    def call(*args: mx.array) -> mx.array:
        calls[0] += 1
        if calls[0] >= n:
            raise RuntimeError("the row's own callable broke")
        return inner(*args)

    return call


@pytest.mark.parametrize("what", ["processor", "sampler", "detokenizer"])
def test_a_row_whose_own_callable_raises_ends_alone(model, what: str) -> None:
    """A caller's logits processor, sampler or detokenizer raising in one row's third token
    ends that row; the others finish with the bits of the run without it."""
    bad = GenerationRequest(prompt=mx.array([5, 6, 7, 8, 9]), max_tokens=N)
    if what == "processor":
        bad.logits_processors = [_raising_from_call(3, lambda _t, logits: logits)]
    elif what == "sampler":
        bad.sampler = _raising_from_call(3, lambda lp: mx.argmax(lp, axis=-1))
    else:
        bad.tokenizer = _Tokenizer()
    *survivors, (tokens, _, reason, error) = _run(model, [*_clean(), bad])
    assert reason == "error" and "the row's own" in str(error)
    # the callable's third call builds the third token as the second goes out: the second
    # is not handed over (nor is a serial row's); the detokenizer breaks on the third itself
    assert len(tokens) == 2 if what == "detokenizer" else len(tokens) == 1
    _survivors_equal_the_run_without(model, survivors)


def test_a_failure_no_row_reproduces_alone_ends_the_rest(model) -> None:
    """The poisoned row ends with its own error; the batch of the others still fails, as no
    row alone reproduces (as out of memory would): those rows end with that error, and the
    engine serves on."""
    with poisoned(model, batches_fail=True):
        got = _run(model, [*_clean(), _bad_request("in its prompt")])
    ends = [(reason, str(error)) for _, _, reason, error in got]
    assert ends == [("error", "the batch as such")] * 3 + [("error", "a poisoned input")]
