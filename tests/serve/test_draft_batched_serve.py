"""`mlxd serve --draft-model M --speculative draft`: draft-model requests run in the batched
step together (not one at a time), greedy answers token for token the answers without
drafting, usage and /metrics report the drafts; a request's `speculative: "draft"` asks for it
on a server started without the flag; and what is refused (at start-up and per request)."""

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve.conftest import LiveServer, start_server
from serve.test_metrics import delta, scrape

from mlxd.model import ModelLoadError

PROMPTS = ["Once upon a time", "The capital of France is", "Count: one two three"]


@pytest.fixture(scope="module")
def batched(
    qwen3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """The draft is the target itself: every greedy draft is kept."""
    live = start_server(model=str(qwen3_model_dir), draft_model=str(qwen3_model_dir),
                        speculative="draft", num_speculative_tokens=4,
                        data_dir=str(tmp_path_factory.mktemp("d")))  # fmt: skip
    yield live
    live.stop()


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + "/v1/completions", json={"max_tokens": 16, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _text(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["text"]


def test_concurrent_draft_requests_batch_and_keep_their_answers(batched) -> None:
    url, engine = batched.url, batched.state.provider.default.engine
    plain = [_text(_post(url, {"prompt": p, "speculative": "off"})) for p in PROMPTS]
    before = scrape(url)
    lone = engine.paths["draft model"]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        replies = list(pool.map(lambda p: _post(url, {"prompt": p}), PROMPTS))
    after = scrape(url)
    assert [_text(r) for r in replies] == plain
    assert engine.paths["draft model"] == lone  # none ran on the lone draft path
    for r in replies:
        details = r["usage"]["completion_tokens_details"]
        assert details["accepted_prediction_tokens"] > 0, r["usage"]
        assert details["rejected_prediction_tokens"] == 0, r["usage"]
    drafted = delta(before, after, "mlxd_spec_draft_tokens_total", endpoint="completions")
    accepted = delta(before, after, "mlxd_spec_accepted_tokens_total", endpoint="completions")
    assert drafted == accepted > 0


def test_num_draft_tokens_zero_turns_it_off(batched) -> None:
    reply = _post(batched.url, {"prompt": PROMPTS[0], "num_draft_tokens": 0})
    assert "completion_tokens_details" not in reply["usage"]


@pytest.fixture(scope="module")
def lone(
    qwen3_model_dir: Path, tiny_model: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """A draft of another seed, --speculative left off: mlx_lm.server's one-at-a-time path."""
    live = start_server(model=str(qwen3_model_dir), draft_model=str(tiny_model("qwen3", seed=1)),
                        data_dir=str(tmp_path_factory.mktemp("d")))  # fmt: skip
    yield live
    live.stop()


def test_a_request_asks_for_batched_drafting(lone) -> None:
    engine = lone.state.provider.default.engine
    plain = _text(_post(lone.url, {"prompt": PROMPTS[1], "draft_model": None}))
    paths = dict(engine.paths)
    reply = _post(lone.url, {"prompt": PROMPTS[1], "speculative": "draft"})
    assert _text(reply) == plain
    assert engine.paths["draft model"] == paths.get("draft model", 0)
    details = reply["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"] > 0


def test_draft_without_a_draft_model_is_a_400(lone, qwen3_server) -> None:
    for url, body in (
        (lone.url, {"prompt": "hi", "speculative": "draft", "draft_model": None}),
        (qwen3_server.url, {"prompt": "hi", "speculative": "draft"}),
    ):
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "speculative"


def test_start_up_refuses_what_cannot_draft_batched(
    qwen3_model_dir: Path, tiny_model: Callable[..., Path]
) -> None:
    with pytest.raises(ModelLoadError, match="no draft model"):
        start_server(model=str(qwen3_model_dir), speculative="draft")
    with pytest.raises(ModelLoadError, match="RotatingKVCache"):
        start_server(model=str(qwen3_model_dir), draft_model=str(tiny_model("gemma3")),
                     speculative="draft")  # fmt: skip
