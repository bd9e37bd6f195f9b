"""The prompt searches in serve/prompt.py (`rfind`, `mismatch`) against what it replaces: mlx-lm's
own reverse search (`TokenizerWrapper._find`) and the per-token loop that found where the system
prompt's tokens leave the prompt's, on random token lists built to hold the sequence at the
edges, overlapping and not at all."""

import random

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper

from mlxd.serve.prompt import mismatch, rfind


def _loop_mismatch(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), 0)


def _lists(rng: random.Random, sequence: list[int]) -> list[list[int]]:
    """Tokens over a small alphabet (so partial matches are common), with the sequence planted
    at the start, the end, twice overlapping, or absent."""
    out = [[], sequence[:-1], list(sequence)]
    for _ in range(300):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        where = rng.choice(["start", "end", "twice", "none", "middle"])
        if where == "start":
            tokens = sequence + tokens
        elif where == "end":
            tokens = tokens + sequence
        elif where == "twice":
            tokens = tokens + sequence + sequence[1:] + sequence
        elif where == "middle" and tokens:
            at = rng.randrange(len(tokens))
            tokens = tokens[:at] + sequence + tokens[at:]
        out.append(tokens)
    return out


@pytest.mark.parametrize("sequence", [[2], [1, 2], [2, 2, 3], [0, 1, 0, 1]])
def test_rfind_is_mlx_lms_reverse_search(sequence: list[int]) -> None:
    rng = random.Random(len(sequence))
    for tokens in _lists(rng, sequence):
        expected = TokenizerWrapper._find(tokens, sequence, reverse=True)
        assert rfind(tokens, sequence) == expected, tokens
        assert rfind(tuple(tokens), tuple(sequence)) == expected  # tuples as well


def test_mismatch_is_the_per_token_loop() -> None:
    rng = random.Random(0)
    cases = [([], []), ([1], []), ([1, 2], [1, 2]), ([1, 2], [1, 2, 3]), ([1, 2, 3], [1, 2])]
    for _ in range(500):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 60))]
        b = list(a)
        if b and rng.random() < 0.8:
            b[rng.randrange(len(b))] = 7  # one difference, anywhere
        if rng.random() < 0.5:
            b += [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        cases.append((a, b))
    for a, b in cases:
        assert mismatch(a, b) == _loop_mismatch(a, b), (a, b)
        assert mismatch(tuple(a), b) == _loop_mismatch(a, b)  # mixed sequence types


def test_the_prompts_state_is_what_mlx_lms_think_searches_say(qwen3_tokenizer_dir) -> None:
    """`initial_state` over the real Qwen3 tokenizer: reasoning exactly where mlx-lm's wrapper
    finds the last think start after the last think end (a template that opens the block)."""
    from mlx_lm.tokenizer_utils import load

    from mlxd.serve.prompt import initial_state

    tok = load(qwen3_tokenizer_dir)
    assert tok.has_thinking
    texts = [
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok</think>\n\n",
        "<think>a</think> and <think>b",
        "plain text, no tags",
    ]
    states = []
    for text in texts:
        tokens = tok.encode(text, add_special_tokens=False)
        open_ = tok.rfind_think_start(tokens) > tok.rfind_think_end(tokens)
        expected = tok.response_initial_state or ("reasoning" if open_ else "normal")
        assert initial_state(tok, tokens) == expected
        states.append(expected)
    assert "reasoning" in states and "normal" in states  # both sides exercised
