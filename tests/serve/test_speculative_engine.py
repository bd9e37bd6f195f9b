"""Speculation end to end on the embedded SmolLM2 (real text): a greedy answer drafted from a
prediction or from n-gram lookup is token for token the answer without drafting, and the
usage and /metrics report the drafts the engine verified and kept. These need the engine's
drafting (engine/speculate/): without it nothing is drafted and the counts stay zero."""

import json
from typing import Any

import httpx
import pytest
from serve.test_metrics import delta, scrape

CHAT = "/v1/chat/completions"
COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
# A prompt whose answer repeats its own text: what n-gram lookup drafts from.
REPEAT = [{"role": "user", "content": "Repeat this line three times: the cat sat on the mat."}]


MAX_TOKENS = 24  # "1, 2, ..." to about 12: long enough for several verify steps


def _chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"max_tokens": MAX_TOKENS, "temperature": 0, **body}
    r = httpx.post(url + CHAT, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _content(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def plain(smollm2_server) -> dict[str, Any]:
    """The greedy COUNT reply without drafting, the answer the drafted ones must repeat."""
    return _chat(smollm2_server.url, {"messages": COUNT})


def test_a_right_prediction_is_accepted_and_changes_nothing(smollm2_server, plain) -> None:
    url = smollm2_server.url
    answer = _content(plain)
    assert answer and "completion_tokens_details" not in plain["usage"]
    prediction = {"type": "content", "content": answer}
    predicted = _chat(url, {"messages": COUNT, "prediction": prediction})
    assert _content(predicted) == answer
    assert predicted["choices"][0]["finish_reason"] == plain["choices"][0]["finish_reason"]
    usage = predicted["usage"]
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"]
    details = usage["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 0, usage
    assert details["rejected_prediction_tokens"] >= 0, usage
    # the kept drafts are tokens of the answer
    assert details["accepted_prediction_tokens"] <= usage["completion_tokens"]


def test_a_wrong_prediction_changes_nothing(smollm2_server, plain) -> None:
    url = smollm2_server.url
    answer = _content(plain)
    wrong = {"type": "content", "content": "Zebras dance quietly under purple moons. " * 4}
    reply = _chat(url, {"messages": COUNT, "prediction": wrong})
    assert _content(reply) == answer
    details = reply["usage"]["completion_tokens_details"]
    assert details["rejected_prediction_tokens"] > 0, reply["usage"]


def test_ngram_drafting_is_lossless_and_counted(smollm2_server) -> None:
    url = smollm2_server.url
    answer = _content(_chat(url, {"messages": REPEAT}))
    before = scrape(url)
    reply = _chat(url, {"messages": REPEAT, "speculative": "ngram"})
    after = scrape(url)
    assert _content(reply) == answer
    drafted = delta(before, after, "mlxd_spec_draft_tokens_total", endpoint="chat")
    accepted = delta(before, after, "mlxd_spec_accepted_tokens_total", endpoint="chat")
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    details = reply["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": accepted,
                       "rejected_prediction_tokens": drafted - accepted}  # fmt: skip


def test_a_streamed_prediction_reports_usage(smollm2_server, plain) -> None:
    url = smollm2_server.url
    answer = _content(plain)
    body = {"messages": COUNT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "prediction": {"type": "content", "content": answer}}  # fmt: skip
    text, usage = "", None
    with httpx.stream("POST", url + CHAT, json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            frame = json.loads(line[6:])
            usage = frame.get("usage") or usage
            for choice in frame["choices"]:
                text += choice["delta"].get("content") or ""
    assert text == answer
    assert usage is not None
    assert usage["completion_tokens_details"]["accepted_prediction_tokens"] > 0, usage


def test_rows_with_penalties_draft_and_change_nothing(smollm2_server) -> None:
    """A penalty reads each position's history: the drafted row's answer is the one without a
    prediction, and its drafts are accepted."""
    url = smollm2_server.url
    answer = _content(_chat(url, {"messages": COUNT, "repetition_penalty": 1.1}))
    body = {"messages": COUNT, "repetition_penalty": 1.1,
            "prediction": {"type": "content", "content": answer}}  # fmt: skip
    reply = _chat(url, body)
    assert _content(reply) == answer
    assert reply["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
