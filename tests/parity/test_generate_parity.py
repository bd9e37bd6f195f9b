"""mlxd.load / stream_generate / generate against mlx-lm's, on six tiny real architectures.

For each architecture the same folder is loaded by `mlx_lm.load` and by `mlxd.load`; each side
then generates with its own model and tokenizer, fresh caches, fresh sampler / processor
objects, and the MLX PRNG re-seeded right before it. Token ids, every full per-token logprob
array, texts, counters, finish reasons and exceptions must be identical (bit patterns, no
tolerance). Combinations mlx-lm refuses are not skipped: mlx-lm must raise, and mlxd must raise
the same exception with the same message after yielding exactly the same responses.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from fixtures.tiny_models import ARCHS, EOS_ID
from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from parity.helpers import (
    PROMPT_TEXT,
    Pair,
    StreamRun,
    assert_bitwise_equal,
    assert_same_parameters,
    assert_same_run,
    mask_timings,
    run_stream,
)

import mlxd

NEWLINE_ID = 198  # "\n" in the Qwen3 vocabulary (checked in test_load_parity)
XTC_SPECIAL = [EOS_ID, NEWLINE_ID]  # what mlx-lm's server passes as xtc_special_tokens

SHORT, LONG = 5, 40  # prompt lengths in tokens; prefill steps of 8 / 16 split LONG, not SHORT

CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What's the weather in Lisbon tomorrow?"},
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "day": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


# ---------------------------------------------------------------------------------------------
# Prompts


def prompt_of(pair: Pair, kind: str) -> list[int] | str:
    """The "short" (5) or "long" (40) token prompt, or the rendered "chat" template string."""
    if kind == "chat":
        return chat_prompt(pair.ref_tok)
    ids = pair.ref_tok.encode(PROMPT_TEXT)
    assert len(ids) >= LONG
    return list(ids[: {"short": SHORT, "long": LONG}[kind]])


def chat_prompt(tokenizer, enable_thinking: bool = True) -> str:
    return tokenizer.apply_chat_template(
        CHAT_MESSAGES,
        tools=CHAT_TOOLS,
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=enable_thinking,
    )


# ---------------------------------------------------------------------------------------------
# Load


@pytest.mark.parametrize("arch", ARCHS)
def test_load_parity(loaded_pair, arch: str) -> None:
    pair = loaded_pair(arch)
    assert_same_parameters(pair.ref_model, pair.got_model)
    assert pair.got_config == pair.ref_config
    rt, gt = pair.ref_tok, pair.got_tok
    assert gt.eos_token_ids == rt.eos_token_ids
    assert gt.bos_token == rt.bos_token
    assert len(gt._tokenizer) == len(rt._tokenizer) == 151_669
    assert rt.encode("\n") == [NEWLINE_ID]
    ids = rt.encode(PROMPT_TEXT)
    assert gt.encode(PROMPT_TEXT) == ids
    assert gt.decode(ids) == rt.decode(ids) == PROMPT_TEXT
    for thinking in (True, False):
        assert chat_prompt(gt, thinking) == chat_prompt(rt, thinking)


# ---------------------------------------------------------------------------------------------
# stream_generate


@dataclass(frozen=True)
class Case:
    id: str
    prompt: str  # "short" | "long" | "chat"
    max_tokens: int = 16
    seed: int | None = None
    sampler: dict[str, Any] | None = None  # make_sampler(**sampler)
    processors: dict[str, Any] | None = None  # make_logits_processors(**processors)
    gen: dict[str, Any] = field(default_factory=dict)  # the other stream_generate kwargs
    archs: tuple[str, ...] = ARCHS  # where to run it

    def kwargs(self) -> dict[str, Any]:
        """Fresh kwargs for one side: new sampler / processor objects, copied dicts."""
        kw: dict[str, Any] = copy.deepcopy(self.gen)
        kw["max_tokens"] = self.max_tokens
        if self.sampler is not None:
            kw["sampler"] = make_sampler(**copy.deepcopy(self.sampler))
        if self.processors is not None:
            kw["logits_processors"] = make_logits_processors(**copy.deepcopy(self.processors))
        return kw


# The sampler and processor options are model-independent: each is tested on its own on two
# architectures, and combined on all six.
DETAIL = ("qwen3", "lfm2")
BIAS = {EOS_ID: -100.0, 1000: 6.0, 2000: 6.0, 3000: -6.0, 151_644: -100.0}

CASES = [
    # Prompt processing: shorter than the prefill step, split in 8s and 16s, one chunk; chat.
    Case("greedy_short_prefill8", "short", max_tokens=24, gen=dict(prefill_step_size=8)),
    Case("greedy_long_prefill8", "long", gen=dict(prefill_step_size=8)),
    Case("greedy_long_prefill16", "long", gen=dict(prefill_step_size=16), archs=DETAIL),
    Case("greedy_long_one_chunk", "long", archs=DETAIL),
    Case("chat_template_str_prompt", "chat", max_tokens=12, gen=dict(prefill_step_size=64)),
    # Seeded sampling.
    Case("sample_temp", "short", seed=11, sampler=dict(temp=0.8), archs=DETAIL),
    Case(
        "sample_top_p_top_k",
        "long",
        seed=12,
        sampler=dict(temp=1.0, top_p=0.8, top_k=40),
        gen=dict(prefill_step_size=16),
        archs=DETAIL,
    ),
    Case(
        "sample_min_p",
        "short",
        seed=13,
        sampler=dict(temp=1.2, min_p=0.05, min_tokens_to_keep=3),
        archs=DETAIL,
    ),
    Case(
        "sample_xtc",
        "short",
        seed=14,
        sampler=dict(
            temp=1.0, xtc_probability=0.7, xtc_threshold=0.01, xtc_special_tokens=XTC_SPECIAL
        ),
        archs=DETAIL,
    ),
    Case(
        "sample_all_filters",
        "long",
        seed=15,
        sampler=dict(
            temp=0.9,
            top_p=0.95,
            top_k=100,
            min_p=0.02,
            xtc_probability=0.5,
            xtc_threshold=0.02,
            xtc_special_tokens=XTC_SPECIAL,
        ),
        gen=dict(prefill_step_size=8),
    ),
    # Logits processors.
    Case(
        "repetition_penalty",
        "long",
        processors=dict(repetition_penalty=1.5, repetition_context_size=16),
        gen=dict(prefill_step_size=8),
        archs=DETAIL,
    ),
    Case(
        "presence_frequency_penalty",
        "short",
        max_tokens=24,
        processors=dict(
            presence_penalty=0.8,
            presence_context_size=12,
            frequency_penalty=0.6,
            frequency_context_size=24,
        ),
        archs=DETAIL,
    ),
    Case("logit_bias", "short", processors=dict(logit_bias=BIAS), archs=DETAIL),
    Case(
        "processors_and_sampling",
        "long",
        seed=16,
        sampler=dict(temp=0.7, top_k=50),
        processors=dict(
            logit_bias=BIAS, repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2
        ),
        gen=dict(prefill_step_size=16),
    ),
    # Quantized KV cache: from the start, crossed mid-generation, crossed mid-prefill.
    Case(
        "kv4_from0",
        "short",
        max_tokens=24,
        gen=dict(kv_bits=4, kv_group_size=32, quantized_kv_start=0),
    ),
    Case(
        "kv8_from20",
        "short",
        max_tokens=24,
        gen=dict(kv_bits=8, kv_group_size=64, quantized_kv_start=20),
    ),
    Case(
        "kv4_from16_long_prefill8",
        "long",
        seed=17,
        sampler=dict(temp=1.0, top_p=0.9),
        gen=dict(prefill_step_size=8, kv_bits=4, kv_group_size=64, quantized_kv_start=16),
    ),
    # Rotating cache smaller than prompt + generation (models with their own make_cache ignore
    # max_kv_size, in mlx-lm and hence here too).
    Case("max_kv_24_short", "short", max_tokens=24, gen=dict(max_kv_size=24)),
    Case(
        "max_kv_24_long_prefill8",
        "long",
        max_tokens=24,
        gen=dict(max_kv_size=24, prefill_step_size=8),
    ),
    Case(
        "max_kv_24_kv8",
        "long",
        gen=dict(max_kv_size=24, prefill_step_size=8, kv_bits=8, quantized_kv_start=0),
    ),
]


def refuses(model, case: Case) -> bool:
    """mlx-lm cannot quantize a RotatingKVCache (NotImplementedError "... Quantization NYI").

    Rotating caches come from max_kv_size (models without make_cache) or from the model's own
    sliding-window layers (gemma3). Every kv case here reaches quantized_kv_start.
    """
    if case.gen.get("kv_bits") is None:
        return False
    cache = make_prompt_cache(model, max_kv_size=case.gen.get("max_kv_size"))
    return any(isinstance(c, RotatingKVCache) for c in cache)


def run_both(pair: Pair, prompt, seed: int | None, make_kwargs) -> tuple[StreamRun, StreamRun]:
    ref = run_stream(
        mlx_lm.stream_generate,
        pair.ref_model,
        pair.ref_tok,
        copy.copy(prompt),
        seed=seed,
        **make_kwargs(),
    )
    got = run_stream(
        mlxd.stream_generate,
        pair.got_model,
        pair.got_tok,
        copy.copy(prompt),
        seed=seed,
        **make_kwargs(),
    )
    return ref, got


STREAM_PARAMS = [
    pytest.param(arch, case, id=f"{arch}-{case.id}")
    for arch in ARCHS
    for case in CASES
    if arch in case.archs
]


@pytest.mark.parametrize("arch,case", STREAM_PARAMS)
def test_stream_generate_parity(loaded_pair, arch: str, case: Case) -> None:
    pair = loaded_pair(arch)
    ref, got = run_both(pair, prompt_of(pair, case.prompt), case.seed, case.kwargs)
    if refuses(pair.ref_model, case):
        assert ref.error is not None and ref.error[0] is NotImplementedError, (
            f"mlx-lm was expected to refuse {case.id} on {pair.arch}, got {ref.error!r}"
        )
    else:
        assert ref.error is None, f"mlx-lm failed: {ref.error!r}"
        assert ref.finish_reason == "length" and len(ref.tokens) == case.max_tokens
        assert len(set(ref.tokens)) > 1, "degenerate reference: one token repeated"
    assert_same_run(ref, got, f"{pair.arch}/{case.id}")


@pytest.mark.parametrize("arch", ["gemma3", "lfm2"])
def test_eos_stops_mid_stream(loaded_pair, arch: str) -> None:
    """finish_reason "stop": make a token the model emits mid-stream an EOS (via model_config,
    which both loads pass to the tokenizer) and compare the truncated streams."""
    pair = loaded_pair(arch)
    ref0 = run_stream(
        mlx_lm.stream_generate,
        pair.ref_model,
        pair.ref_tok,
        prompt_of(pair, "short"),
        seed=None,
        max_tokens=16,
    )
    # The first token, from position 2 on, that has not appeared before it.
    stop_at, stop_id = next(
        (i, t) for i, t in enumerate(ref0.tokens) if i >= 2 and t not in ref0.tokens[:i]
    )
    model_config = {"eos_token_id": [EOS_ID, stop_id]}
    ref_model, ref_tok = mlx_lm.load(str(pair.folder), model_config=model_config)
    got_model, got_tok = mlxd.load(str(pair.folder), model_config=model_config)
    assert got_tok.eos_token_ids == ref_tok.eos_token_ids == {EOS_ID, stop_id}
    ref = run_stream(
        mlx_lm.stream_generate,
        ref_model,
        ref_tok,
        prompt_of(pair, "short"),
        seed=None,
        max_tokens=16,
    )
    got = run_stream(
        mlxd.stream_generate, got_model, got_tok, prompt_of(pair, "short"), seed=None, max_tokens=16
    )
    assert ref.finish_reason == "stop" and ref.tokens[-1] == stop_id
    assert ref.tokens[:-1] == ref0.tokens[:stop_at]
    assert_same_run(ref, got, f"{pair.arch}/eos")


@pytest.mark.parametrize("arch", ARCHS)
def test_stream_generate_accepts_mlx_lm_loaded_model(loaded_pair, arch: str) -> None:
    """Drop-in: mlxd.stream_generate on the model and tokenizer that mlx-lm loaded."""
    pair = loaded_pair(arch)

    def run(stream_generate):
        return run_stream(
            stream_generate,
            pair.ref_model,
            pair.ref_tok,
            prompt_of(pair, "long"),
            seed=21,
            max_tokens=12,
            prefill_step_size=16,
            sampler=make_sampler(temp=0.9),
        )

    assert_same_run(run(mlx_lm.stream_generate), run(mlxd.stream_generate), f"{pair.arch}/cross")


# ---------------------------------------------------------------------------------------------
# generate


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_text_parity(loaded_pair, arch: str, capsys: pytest.CaptureFixture[str]) -> None:
    pair = loaded_pair(arch)
    prompt = "Tell me a story about a lighthouse."
    for seed, sampler in ((None, None), (31, dict(temp=1.0, top_p=0.9, min_p=0.01))):

        def kwargs(sampler=sampler):
            kw: dict[str, Any] = dict(max_tokens=16)
            if sampler is not None:
                kw["sampler"] = make_sampler(**sampler)
            return kw

        if seed is not None:
            mx.random.seed(seed)
        ref = mlx_lm.generate(pair.ref_model, pair.ref_tok, prompt, **kwargs())
        if seed is not None:
            mx.random.seed(seed)
        got = mlxd.generate(pair.got_model, pair.got_tok, prompt, **kwargs())
        assert isinstance(ref, str) and ref
        assert got == ref

    # verbose=True: the same text and report, up to the timing / memory numbers.
    capsys.readouterr()
    ref = mlx_lm.generate(pair.ref_model, pair.ref_tok, prompt, verbose=True, max_tokens=8)
    ref_out = capsys.readouterr().out
    got = mlxd.generate(pair.got_model, pair.got_tok, prompt, verbose=True, max_tokens=8)
    got_out = capsys.readouterr().out
    assert got == ref
    assert "tokens-per-sec" in ref_out
    assert mask_timings(got_out) == mask_timings(ref_out)


# ---------------------------------------------------------------------------------------------
# The comparison must be able to fail.


@pytest.fixture
def qwen3_ref(loaded_pair):
    pair = loaded_pair("qwen3")
    return pair.ref_model, pair.ref_tok  # only read here


def test_sanity_different_seeds_are_caught(qwen3_ref) -> None:
    model, tok = qwen3_ref
    prompt = tok.encode(PROMPT_TEXT)[:SHORT]

    def run(seed):
        return run_stream(
            mlx_lm.stream_generate,
            model,
            tok,
            prompt,
            seed=seed,
            max_tokens=12,
            sampler=make_sampler(temp=1.0),
        )

    a, a2, b = run(1), run(1), run(2)
    assert_same_run(a, a2)  # same seed: reproducible, so equality is meaningful
    assert a.tokens != b.tokens
    with pytest.raises(AssertionError, match="tokens"):
        assert_same_run(a, b)


def test_sanity_one_ulp_logprob_is_caught(qwen3_ref) -> None:
    model, tok = qwen3_ref
    run = run_stream(
        mlx_lm.stream_generate, model, tok, tok.encode(PROMPT_TEXT)[:SHORT], seed=None, max_tokens=4
    )
    lp = run.logprobs[2].view(np.float32)
    bumped = lp.copy()
    bumped[12345] = np.nextafter(bumped[12345], np.float32(np.inf))
    assert bumped[12345] != lp[12345]
    assert np.allclose(bumped, lp)  # what a tolerance-based check would wrongly accept
    with pytest.raises(AssertionError, match="1 of 151936 elements differ"):
        assert_bitwise_equal(lp, bumped, "logprobs")
    # The run-level check sees it too, and sign of zero counts as well.
    other = copy.deepcopy(run)
    other.logprobs[2] = bumped.view(np.uint32)
    with pytest.raises(AssertionError, match="logprobs of response 2"):
        assert_same_run(run, other)
    with pytest.raises(AssertionError):
        assert_bitwise_equal(np.float32([0.0]), np.float32([-0.0]), "zero")


def test_sanity_parameter_and_error_differences_are_caught(qwen3_ref, tiny_model) -> None:
    model, _ = qwen3_ref
    other, _ = mlx_lm.load(str(tiny_model("qwen3")))
    assert_same_parameters(model, other)
    w = other.model.layers[1].mlp.down_proj.weight
    flat = np.array(w).reshape(-1)
    flat[7] = np.nextafter(flat[7], np.float32(-np.inf))
    other.model.layers[1].mlp.down_proj.weight = mx.array(flat.reshape(w.shape))
    with pytest.raises(AssertionError, match="down_proj"):
        assert_same_parameters(model, other)

    ok = StreamRun()
    failed = StreamRun(error=(NotImplementedError, "RotatingKVCache Quantization NYI"))
    with pytest.raises(AssertionError, match="error"):
        assert_same_run(failed, ok)
    with pytest.raises(AssertionError, match="error"):
        assert_same_run(failed, StreamRun(error=(ValueError, "RotatingKVCache Quantization NYI")))


# ---------------------------------------------------------------------------------------------
# Order independence: in a fresh interpreter, mlxd generates before mlx-lm ever has (the other
# tests always run mlx-lm first, which could hide state that mlxd relies on).

FRESH_ARCHS = ("llama", "gemma3", "lfm2")

_FRESH_SCRIPT = """
import sys
sys.path.insert(0, {tests_dir!r})
import mlx_lm
from mlx_lm.sample_utils import make_sampler
import mlxd
from parity.helpers import PROMPT_TEXT, assert_same_run, run_stream

failures = []
for arch, folder in {folders!r}:
    got_model, got_tok = mlxd.load(folder)
    prompt = got_tok.encode(PROMPT_TEXT)[:5]
    runs = []
    for sampler in (None, dict(temp=1.0)):
        kw = dict(max_tokens=8, prefill_step_size=8)
        if sampler:
            kw["sampler"] = make_sampler(**sampler)
        got = run_stream(mlxd.stream_generate, got_model, got_tok, prompt, seed=3, **kw)
        runs.append((kw, got))
    ref_model, ref_tok = mlx_lm.load(folder)
    for kw, got in runs:
        if "sampler" in kw:
            kw["sampler"] = make_sampler(temp=1.0)
        ref = run_stream(mlx_lm.stream_generate, ref_model, ref_tok, prompt, seed=3, **kw)
        assert ref.error is None, ref.error
        try:
            assert_same_run(ref, got, arch + (" sampled" if "sampler" in kw else " greedy"))
        except AssertionError as e:
            failures.append(str(e))
print("\\n".join(failures) if failures else "PARITY-OK")
"""


def test_fresh_process_mlxd_generates_first(tiny_model) -> None:
    import subprocess
    import sys
    from pathlib import Path

    folders = [(arch, str(tiny_model(arch))) for arch in FRESH_ARCHS]
    script = _FRESH_SCRIPT.format(
        tests_dir=str(Path(__file__).resolve().parents[1]), folders=folders
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0 or proc.stdout.strip() != "PARITY-OK":
        pytest.fail(proc.stdout + proc.stderr[-3000:], pytrace=False)
