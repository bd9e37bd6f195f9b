"""`/v1/completions` as OpenAI defines it, with the openai SDK: `prompt` as a list of strings or
of token-id lists (one choice per prompt, choice i * n + j for prompt i's row j, queued
together), and `logprobs` as an integer (the legacy shape: tokens, token_logprobs,
top_logprobs, text_offset). Numbers are checked against the model run directly."""

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):"]


@pytest.fixture(scope="module")
def client(qwen3_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")


@pytest.fixture(scope="module")
def lm(qwen3_model_dir):
    return load(str(qwen3_model_dir))


def _logprobs(model, ids: list[int]) -> mx.array:
    """Log-probabilities of the next token at every position of `ids` (one full forward)."""
    logits = model(mx.array([ids]))[0].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def test_a_list_of_strings_is_one_choice_per_prompt(client) -> None:
    alone = [client.completions.create(model="m", prompt=p, max_tokens=6) for p in PROMPTS]
    together = client.completions.create(model="m", prompt=PROMPTS, max_tokens=6)
    assert [c.index for c in together.choices] == [0, 1, 2]
    assert [c.text for c in together.choices] == [a.choices[0].text for a in alone]
    assert together.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert together.usage.completion_tokens == 18


def test_token_id_lists_and_n_rows_index_as_i_times_n_plus_j(client, lm) -> None:
    ids = [lm[1].encode(p) for p in PROMPTS[:2]]
    args = {"model": "m", "max_tokens": 5, "n": 2, "temperature": 1.0, "seed": 11}
    together = client.completions.create(prompt=ids, **args)
    assert [c.index for c in together.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(ids):
        alone = client.completions.create(prompt=prompt, **args)
        got = [c.text for c in together.choices if c.index // 2 == i]
        assert got == [c.text for c in alone.choices], i


def test_integer_logprobs_in_openais_shape_with_the_models_numbers(client, lm) -> None:
    model, tok = lm
    out = client.completions.create(model="m", prompt=PROMPTS[0], max_tokens=5, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(5)]
    prompt = tok.encode(PROMPTS[0])
    generated = [tok.encode(t, add_special_tokens=False) for t in lp.tokens]
    ids = prompt + [g[0] for g in generated]
    direct = _logprobs(model, ids)
    for k, token_id in enumerate(ids[len(prompt) :]):
        row = direct[len(prompt) - 1 + k]
        assert lp.token_logprobs[k] == pytest.approx(row[token_id].item(), abs=2e-3)
        top3 = mx.argsort(-row)[:3].tolist()
        want = {tok.decode([t]): row[t].item() for t in top3}
        assert set(want) <= set(lp.top_logprobs[k]) and len(lp.top_logprobs[k]) <= 4
        for text, value in want.items():
            assert lp.top_logprobs[k][text] == pytest.approx(value, abs=2e-3)


def test_batched_logprobs_equal_single_prompt_requests(client) -> None:
    alone = [
        client.completions.create(model="m", prompt=p, max_tokens=4, logprobs=2).choices[0]
        for p in PROMPTS
    ]
    together = client.completions.create(model="m", prompt=PROMPTS, max_tokens=4, logprobs=2)
    for a, b in zip(alone, together.choices, strict=True):
        assert b.logprobs.tokens == a.logprobs.tokens
        assert b.logprobs.token_logprobs == a.logprobs.token_logprobs
        assert b.logprobs.top_logprobs == a.logprobs.top_logprobs


def test_logprobs_zero_lists_only_the_sampled_token(client) -> None:
    out = client.completions.create(model="m", prompt=PROMPTS[1], max_tokens=3, logprobs=0)
    lp = out.choices[0].logprobs
    assert [list(top) for top in lp.top_logprobs] == [[t] for t in lp.tokens]


def test_streamed_prompts_and_logprobs_join_to_the_whole_answer(client) -> None:
    whole = client.completions.create(model="m", prompt=PROMPTS, max_tokens=6, logprobs=1)
    stream = client.completions.create(
        model="m", prompt=PROMPTS, max_tokens=6, logprobs=1, stream=True
    )
    text, tokens, offsets = ["", "", ""], [[], [], []], [[], [], []]
    for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.text
            if c.logprobs is not None:
                tokens[c.index] += c.logprobs.tokens
                offsets[c.index] += c.logprobs.text_offset
    assert text == [c.text for c in whole.choices]
    assert tokens == [c.logprobs.tokens for c in whole.choices]
    assert offsets == [c.logprobs.text_offset for c in whole.choices]


def test_boolean_logprobs_keep_mlx_lm_servers_shape(qwen3_server) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "logprobs": True, "top_logprobs": 2}
    r = httpx.post(qwen3_server.v1 + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert "content" in r.json()["choices"][0]["logprobs"]


@pytest.mark.parametrize(
    "fields",
    [
        {"prompt": []},
        {"prompt": ["a", [1, 2]]},
        {"prompt": [[1], []]},
        {"prompt": ["x"] * 129},
        {"prompt": ["a", "b"], "n": 65},
        {"prompt": "hi", "logprobs": 12},
        {"prompt": "hi", "logprobs": -1},
        {"prompt": "hi", "logprobs": 2, "top_logprobs": 2},
    ],
    ids=[
        "empty",
        "mixed",
        "empty-ids",
        "too-many",
        "too-many-rows",
        "logprobs-big",
        "logprobs-neg",
        "both",
    ],
)
def test_refusals_name_the_field(qwen3_server, fields) -> None:
    r = httpx.post(qwen3_server.v1 + "/completions", json={"max_tokens": 2, **fields}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] in ("prompt", "logprobs")


def test_the_prompts_are_queued_in_one_engine_call(qwen3_server, client, monkeypatch) -> None:
    engine = qwen3_server.state.provider.default.engine
    calls: list[int] = []
    real = engine.submit_many

    def spy(reqs):
        calls.append(len(reqs))
        return real(reqs)

    monkeypatch.setattr(engine, "submit_many", spy)
    client.completions.create(model="m", prompt=PROMPTS, max_tokens=2)
    assert calls == [3]
