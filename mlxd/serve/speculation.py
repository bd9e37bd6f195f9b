"""Speculative decoding as the HTTP APIs ask for it: a body's `speculative` ("ngram" | "draft" |
"off", null for the server's `--speculative`), OpenAI's Predicted Outputs (`prediction` on chat
completions, refused with what OpenAI refuses it with), the row's engine `Speculation`, and
the usage fields that report how much of the draft the model kept."""

from typing import Any

import mlx.core as mx

from ..engine.request import GenerationRequest, Speculation
from ..engine.speculate.drafting import refusal
from .errors import bad_request

MODES = ("ngram", "draft", "off")


def speculative(body: dict[str, Any]) -> str | None:
    """The body's `speculative`: "ngram", "draft", "off", or None (absent or null: the
    server's)."""
    value = body.get("speculative")
    if value is None or value in MODES:
        return value
    raise bad_request("speculative must be 'ngram', 'draft', 'off' or null", "speculative")


def prediction(body: dict[str, Any]) -> str | None:
    """OpenAI's `prediction`: {"type": "content", "content": a string or text parts}, as text
    (the parts joined, as OpenAI joins a message's text parts); None when absent or null."""
    value = body.get("prediction")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_request("prediction must be an object", "prediction")
    if value.get("type") != "content":
        raise bad_request("prediction.type must be 'content'", "prediction")
    content = value.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(f"prediction.content[{j}] must be a text part", "prediction")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"prediction.content[{j}].text must be a string", "prediction")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request("prediction.content must be a string or a list of text parts", "prediction")


def refuse_with_prediction(body: dict[str, Any], params: Any, tools: list[dict] | None) -> None:
    """What OpenAI's Predicted Outputs refuse beside a prediction: n > 1, logprobs, positive
    presence or frequency penalties, tools, audio. (OpenAI also refuses max_completion_tokens;
    here it is max_tokens' other name, so it stays.)"""
    conflicts = (
        ("n", params.n > 1, "n greater than 1"),
        ("logprobs", params.logprobs, "logprobs"),
        ("top_logprobs", params.top_logprobs > 0, "top_logprobs"),
        ("presence_penalty", params.presence_penalty > 0, "presence_penalty greater than 0"),
        ("frequency_penalty", params.frequency_penalty > 0, "frequency_penalty greater than 0"),
        ("tools", bool(tools), "tools"),
        ("audio", body.get("audio") is not None, "audio"),
        ("modalities", body.get("modalities") not in (None, ["text"]), "modalities but text"),
    )
    for name, bad, what in conflicts:
        if bad:
            raise bad_request(f"prediction cannot be used with {what}", name)


def row_speculation(served: Any, p: Any, config: Any, max_tokens: int) -> Speculation | None:
    """The row's drafting: none when the request says off; the prediction's tokens (its
    first `max_tokens`: no more can be kept) when it gave one; n-gram lookup when the request
    or the server's `--speculative` asks for it. `--num-speculative-tokens` caps a step's draft.
    A model whose caches cannot be cut back does not draft: a 400 naming the field that asked
    (the server's own `--speculative` is refused at start-up, serve/main.py)."""
    if p.speculative == "off":
        return None
    if p.speculative == "draft" and p.prediction is None:  # draft_speculation took it if it could
        why = "a draft model (--draft-model)" if not served.draft_names else "draft_model not null"
        raise bad_request(f"speculative 'draft' needs {why}", "speculative")
    k = config.num_speculative_tokens
    if p.prediction is not None:
        ids = served.tokenizer.encode(p.prediction, add_special_tokens=False)[:max_tokens]
        spec = Speculation(mode="prediction", max_draft=k, prediction=list(ids))
    elif (p.speculative or config.speculative) == "ngram":
        spec = Speculation(mode="ngram", max_draft=k)
    else:
        return None
    if (why := served.facts.spec_refusal) is None:
        return spec
    raise bad_request(why, "prediction" if p.prediction is not None else "speculative")


def model_refusal(model: Any) -> str | None:
    """Why no request can draft on `model` (recurrent state cannot be cut back), or None."""
    probe = GenerationRequest(prompt=mx.array([0]), speculation=Speculation("ngram", 1))
    return refusal(model, probe)


def prediction_details(drafted: int, accepted: int) -> dict[str, int]:
    """OpenAI's `completion_tokens_details` fields: draft tokens kept and thrown away."""
    return {
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": drafted - accepted,
    }
