"""`mlxd serve --draft-model`: the same answers as `mlx_lm.server --draft-model` (tokens,
logprobs, text, usage), mlx_lm.server's `draft_model` / `num_draft_tokens` fields, and the 400s
for values it does not serve. The draft is the tiny qwen3 model itself (every greedy draft is
kept) or one of another seed (most are rejected)."""

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from serve.conftest import LiveServer, start_server
from test_mlx_lm_server_parity import _comparable, _post, run_mlx_lm_server

CHAT = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12}


@pytest.fixture(scope="module")
def draft_dir(tiny_model: Callable[..., Path]) -> Path:
    return tiny_model("qwen3", seed=1)


@pytest.fixture(scope="module")
def theirs(qwen3_model_dir: Path, draft_dir: Path) -> Iterator[str]:
    # No prompt cache: a hit would start the draft's cache off the target's (mlx-lm trims
    # both by one count), while mlxd's draft rows always start cold.
    yield from run_mlx_lm_server(
        qwen3_model_dir, "--draft-model", str(draft_dir), "--prompt-cache-size", "0"
    )


@pytest.fixture(scope="module")
def ours(
    qwen3_model_dir: Path, draft_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    live = start_server(model=str(qwen3_model_dir), draft_model=str(draft_dir),
                        data_dir=str(tmp_path_factory.mktemp("d")))  # fmt: skip
    yield live
    live.stop()


def _drafted(live: LiveServer) -> int:
    return live.state.provider.default.engine.paths["draft model"]


@pytest.mark.parametrize(
    "extra",
    [
        {"logprobs": True},
        {"temperature": 1.0, "seed": 5, "logprobs": True, "num_draft_tokens": 2},
        {"repetition_penalty": 1.3, "num_draft_tokens": 0},
    ],
)
def test_chat_equals_mlx_lm_server_with_a_draft_model(ours, theirs: str, extra: dict) -> None:
    body = {**CHAT, **extra}
    before = _drafted(ours)
    got = _post(ours.url, "/v1/chat/completions", body)
    assert _drafted(ours) == before + 1  # it ran as a draft row
    got, want = _comparable(got), _comparable(_post(theirs, "/v1/chat/completions", body))
    usage, want_usage = got.pop("usage"), want.pop("usage")
    assert got == want
    assert {k: usage[k] for k in want_usage} == want_usage  # and how many drafts were kept


def test_draft_model_null_turns_drafting_off(ours, theirs: str) -> None:
    body = {**CHAT, "logprobs": True}
    before = _drafted(ours)
    off = _post(ours.url, "/v1/chat/completions", {**body, "draft_model": None})
    assert _drafted(ours) == before
    on = _post(ours.url, "/v1/chat/completions", body)
    assert _drafted(ours) == before + 1
    # drafting keeps the output: the same tokens and logprobs either way (greedy)
    assert _comparable(off)["choices"] == _comparable(on)["choices"]


def test_the_served_drafts_names_draft(ours, draft_dir: Path) -> None:
    for name in ("default_model", str(draft_dir)):
        before = _drafted(ours)
        _post(ours.url, "/v1/chat/completions", {**CHAT, "draft_model": name})
        assert _drafted(ours) == before + 1


@pytest.mark.parametrize(
    "field,value",
    [
        ("draft_model", "some/other-draft"),
        ("draft_model", 3),
        ("num_draft_tokens", -1),
        ("num_draft_tokens", "2"),
        ("num_draft_tokens", 1.5),
    ],
)
def test_bad_draft_fields_are_400s_naming_the_field(ours, field: str, value: object) -> None:
    r = httpx.post(ours.url + "/v1/chat/completions", json={**CHAT, field: value}, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.text


def test_concurrent_draft_requests_run_one_at_a_time(ours) -> None:
    """As mlx_lm.server serves a draft model: each request alone, each the answer it gets
    alone."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = ["Once upon a time", "The capital of France is", "Count: one two"]
    bodies = [{"prompt": p, "max_tokens": 8, "logprobs": 1} for p in prompts]
    alone = [_comparable(_post(ours.url, "/v1/completions", b)) for b in bodies]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda b: _post(ours.url, "/v1/completions", b), bodies))
    assert [_comparable(r) for r in together] == alone
