"""Speculative decoding on the HTTP side: `--speculative` / `--num-speculative-tokens`, each
API's `speculative` field and chat's `prediction` (OpenAI's Predicted Outputs) validated with
a 400 naming the field, the row's `Speculation` built from them, and the usage fields and
/metrics counters made from the rows' draft counts (faked here on the DoneEvents)."""

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from serve.conftest import server_args
from serve.test_metrics import delta, scrape, stream_usage

from mlxd.config import ConfigError
from mlxd.engine.request import RequestHandle

USER = [{"role": "user", "content": "Say hello."}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGES, RESPONSES = "/v1/messages", "/v1/responses"
PREDICTION = {"type": "content", "content": "Hello there, how are you today?"}


# ---- flags -------------------------------------------------------------------------------


def test_flags_default_off_and_8() -> None:
    config = server_args()
    assert (config.speculative, config.num_speculative_tokens) == ("off", 8)


def test_flags_parse() -> None:
    from mlxd.cli.serve import parse_config

    config = parse_config(["--speculative", "ngram", "--num-speculative-tokens", "3"])
    assert (config.speculative, config.num_speculative_tokens) == ("ngram", 3)


def test_flags_refuse_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    from mlxd.cli.serve import parse_config

    with pytest.raises(SystemExit):
        parse_config(["--speculative", "eagle"])
    assert "--speculative" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--num-speculative-tokens"):
        parse_config(["--num-speculative-tokens", "0"])


# ---- 400s, in each API's shape -------------------------------------------------------------


def _openai_400(url: str, path: str, body: dict[str, Any], param: str) -> str:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    return error["message"]


BAD_SPECULATIVE = ("fast", True, 1, ["ngram"], {"mode": "ngram"})


@pytest.mark.parametrize("value", BAD_SPECULATIVE)
def test_speculative_is_checked_on_every_api(qwen3_server, value: Any) -> None:
    url = qwen3_server.url
    for path, body in (
        (CHAT, {"messages": USER}),
        (COMPLETIONS, {"prompt": "hi"}),
        (RESPONSES, {"input": "hi"}),
    ):
        message = _openai_400(url, path, {**body, "max_tokens": 2, "speculative": value},
                              "speculative")  # fmt: skip
        assert "speculative" in message
    body = {"model": "m", "max_tokens": 2, "messages": USER, "speculative": value}
    r = httpx.post(url + MESSAGES, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and "speculative" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    "prediction",
    [
        "just text",
        ["content"],
        {"content": "x"},  # type is required
        {"type": "text", "content": "x"},
        {"type": "content"},  # content is required
        {"type": "content", "content": 5},
        {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        {"type": "content", "content": [{"type": "text"}]},
        {"type": "content", "content": [{"type": "text", "text": 3}]},
        {"type": "content", "content": ["hi"]},
    ],
)
def test_a_bad_prediction_is_a_400(qwen3_server, prediction: Any) -> None:
    body = {"messages": USER, "max_tokens": 2, "prediction": prediction}
    assert "prediction" in _openai_400(qwen3_server.url, CHAT, body, "prediction")


TOOL = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"tools": [TOOL]}, "tools"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_prediction_refuses_what_openai_refuses_with_it(qwen3_server, extra, param) -> None:
    body = {"messages": USER, "max_tokens": 2, "prediction": PREDICTION, **extra}
    message = _openai_400(qwen3_server.url, CHAT, body, param)
    assert "prediction" in message


def test_prediction_takes_what_openai_allows_with_it(qwen3_server) -> None:
    body = {"messages": USER, "prediction": PREDICTION, "presence_penalty": -0.5, "n": 1,
            "logprobs": False, "modalities": ["text"], "max_completion_tokens": 2}  # fmt: skip
    r = httpx.post(qwen3_server.url + CHAT, json=body, timeout=60)
    assert r.status_code == 200, r.text


def test_prediction_is_a_chat_field(qwen3_server) -> None:
    url = qwen3_server.url
    body = {"prompt": "hi", "max_tokens": 2, "prediction": PREDICTION}
    _openai_400(url, COMPLETIONS, body, "prediction")
    _openai_400(url, RESPONSES, {"input": "hi", "prediction": PREDICTION}, "prediction")


# ---- the row's Speculation -----------------------------------------------------------------


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The GenerationRequests the servers build from now on, in order."""
    from mlxd.serve import generation, prompt_batch

    seen: list[Any] = []

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def build(*args: Any) -> Any:
            req = real(*args)
            seen.append(req)
            return req

        return build

    monkeypatch.setattr(generation, "build_request", wrap(generation.build_request))
    monkeypatch.setattr(prompt_batch, "build_request", wrap(prompt_batch.build_request))
    return seen


def _spec(live: Any, path: str, body: dict[str, Any], built: list[Any]) -> Any:
    cap = {"max_output_tokens": 3} if path == RESPONSES else {"max_tokens": 3}
    r = httpx.post(live.url + path, json={**cap, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return built[-1].speculation


def _ids(live: Any, text: str) -> list[int]:
    """The prediction's tokens as the Hugging Face tokenizer makes them (no special tokens)."""
    hf = live.state.provider.default.tokenizer._tokenizer
    return hf.encode(text, add_special_tokens=False)


def test_the_server_default_off_drafts_only_when_asked(qwen3_server, built) -> None:
    live, chat = qwen3_server, {"messages": USER}
    assert _spec(live, CHAT, chat, built) is None
    assert _spec(live, CHAT, {**chat, "speculative": None}, built) is None
    s = _spec(live, CHAT, {**chat, "speculative": "ngram"}, built)
    assert (s.mode, s.max_draft, s.prediction) == ("ngram", 8, None)
    long = {**chat, "max_tokens": 16}  # more than the prediction's tokens
    s = _spec(live, CHAT, {**long, "prediction": PREDICTION}, built)  # drafts though off
    assert (s.mode, s.max_draft) == ("prediction", 8)
    assert s.prediction == _ids(live, PREDICTION["content"])
    texts = ("Hello there, ", "how are you today?")
    parts = {"type": "content", "content": [{"type": "text", "text": t} for t in texts]}
    assert _spec(live, CHAT, {**long, "prediction": parts}, built).prediction == s.prediction
    off = {**chat, "prediction": PREDICTION, "speculative": "off"}
    assert _spec(live, CHAT, off, built) is None
    assert _spec(live, COMPLETIONS, {"prompt": "hi", "speculative": "ngram"}, built).mode == "ngram"
    assert _spec(live, RESPONSES, {"input": "hi", "speculative": "ngram"}, built).mode == "ngram"
    anthropic = {"model": "m", "messages": USER, "speculative": "ngram"}
    assert _spec(live, MESSAGES, anthropic, built).mode == "ngram"


def test_a_prediction_past_max_tokens_is_cut(qwen3_server, built) -> None:
    body = {"messages": USER, "prediction": PREDICTION, "max_tokens": 2}
    s = _spec(qwen3_server, CHAT, body, built)
    assert s.prediction == _ids(qwen3_server, PREDICTION["content"])[:2]


def test_the_server_default_ngram_and_its_ceiling(make_server, built) -> None:
    live = make_server(speculative="ngram", num_speculative_tokens=3)
    s = _spec(live, CHAT, {"messages": USER}, built)
    assert (s.mode, s.max_draft) == ("ngram", 3)
    assert _spec(live, CHAT, {"messages": USER, "speculative": "off"}, built) is None
    s = _spec(live, CHAT, {"messages": USER, "prediction": PREDICTION}, built)
    assert (s.mode, s.max_draft) == ("prediction", 3)
    s = _spec(live, MESSAGES, {"model": "m", "messages": USER}, built)
    assert (s.mode, s.max_draft) == ("ngram", 3)
    assert _spec(live, MESSAGES, {"model": "m", "messages": USER, "speculative": "off"},
                 built) is None  # fmt: skip


# ---- usage and /metrics from the rows' draft counts -----------------------------------------

DRAFTED, ACCEPTED = 7, 4  # each row's, faked on its DoneEvent


@pytest.fixture
def drafts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every row that ends from now on reports DRAFTED draft tokens verified, ACCEPTED kept."""
    real = RequestHandle._finish

    def finish(self: RequestHandle, event: Any) -> None:
        event.drafted_tokens, event.accepted_tokens = DRAFTED, ACCEPTED
        real(self, event)

    monkeypatch.setattr(RequestHandle, "_finish", finish)
    yield


def _details(rows: int) -> dict[str, int]:
    return {"accepted_prediction_tokens": rows * ACCEPTED,
            "rejected_prediction_tokens": rows * (DRAFTED - ACCEPTED)}  # fmt: skip


def _usage(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(url + path, json={"max_tokens": 3, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_chat_usage_reports_drafts(qwen3_server, drafts) -> None:
    url, chat = qwen3_server.url, {"messages": USER}
    usage = _usage(url, CHAT, {**chat, "prediction": PREDICTION})
    assert usage["completion_tokens_details"] == _details(1)
    usage = _usage(url, CHAT, {**chat, "speculative": "ngram", "n": 2})  # n sums the choices
    assert usage["completion_tokens_details"] == _details(2)
    streamed, _ = stream_usage(url + CHAT, {**chat, "max_tokens": 3, "prediction": PREDICTION})
    assert streamed["completion_tokens_details"] == _details(1)
    assert streamed["total_tokens"] == streamed["prompt_tokens"] + streamed["completion_tokens"]


def test_completions_usage_sums_prompts_and_choices(qwen3_server, drafts) -> None:
    url = qwen3_server.url
    usage = _usage(url, COMPLETIONS, {"prompt": ["hi", "so"], "n": 2, "speculative": "ngram"})
    assert usage["completion_tokens_details"] == _details(4)
    body = {"prompt": "hi", "max_tokens": 3, "speculative": "ngram"}
    streamed, _ = stream_usage(url + COMPLETIONS, body)
    assert streamed["completion_tokens_details"] == _details(1)


def test_a_prediction_that_drafted_nothing_reports_zeros(qwen3_server) -> None:
    body = {"messages": USER, "prediction": PREDICTION, "speculative": "off"}
    usage = _usage(qwen3_server.url, CHAT, body)
    assert usage["completion_tokens_details"] == _details(0)


def test_no_speculation_no_details(qwen3_server) -> None:
    assert "completion_tokens_details" not in _usage(qwen3_server.url, CHAT, {"messages": USER})
    assert "completion_tokens_details" not in _usage(qwen3_server.url, COMPLETIONS,
                                                     {"prompt": "hi"})  # fmt: skip


def test_responses_usage_reports_drafts(qwen3_server, drafts) -> None:
    body = {"input": "hi", "max_output_tokens": 3, "speculative": "ngram"}
    r = httpx.post(qwen3_server.url + RESPONSES, json=body, timeout=60)
    assert r.status_code == 200, r.text
    details = r.json()["usage"]["output_tokens_details"]
    assert details == {"reasoning_tokens": details["reasoning_tokens"], **_details(1)}


def test_anthropic_usage_keeps_its_fields(qwen3_server, drafts) -> None:
    body = {"model": "m", "max_tokens": 3, "messages": USER, "speculative": "ngram"}
    r = httpx.post(qwen3_server.url + MESSAGES, json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert set(r.json()["usage"]) == {"input_tokens", "cache_creation_input_tokens",
                                      "cache_read_input_tokens", "output_tokens"}  # fmt: skip


def test_metrics_count_drafts(qwen3_server, drafts) -> None:
    url = qwen3_server.url
    before = scrape(url)
    _usage(url, CHAT, {"messages": USER, "speculative": "ngram", "n": 2})
    _usage(url, MESSAGES, {"model": "m", "messages": USER, "speculative": "ngram"})
    after = scrape(url)
    for endpoint, rows in (("chat", 2), ("messages", 1)):
        drafted = delta(before, after, "mlxd_spec_draft_tokens_total", endpoint=endpoint)
        accepted = delta(before, after, "mlxd_spec_accepted_tokens_total", endpoint=endpoint)
        assert (drafted, accepted) == (rows * DRAFTED, rows * ACCEPTED), endpoint


def test_a_model_that_cannot_draft(make_server, tiny_model, built) -> None:
    """Recurrent state cannot be cut back: asking to draft is a 400 naming the field that
    asked (each API's shape); the server's --speculative ngram is refused at start-up."""
    from mlxd.cli.serve import parse_config
    from mlxd.model import ModelLoadError
    from mlxd.serve.main import make_state

    path = str(tiny_model("lfm2"))
    with pytest.raises(ModelLoadError, match="--speculative ngram: .*recurrent"):
        make_state(parse_config(["--model", path, "--speculative", "ngram"]))
    live = make_server(model=path)
    chat = {"messages": USER, "max_tokens": 3}
    assert _spec(live, CHAT, chat, built) is None
    assert "recurrent" in _openai_400(live.url, CHAT, {**chat, "speculative": "ngram"},
                                           "speculative")  # fmt: skip
    _openai_400(live.url, CHAT, {**chat, "prediction": PREDICTION}, "prediction")
    body = {"model": "m", "max_tokens": 3, "messages": USER, "speculative": "ngram"}
    r = httpx.post(live.url + MESSAGES, json=body, timeout=60)
    assert r.status_code == 400 and "recurrent" in r.json()["error"]["message"], r.text
