"""OpenAI's `/v1/embeddings` for a served model: one vector per input, in OpenAI's request and
response shapes (text or token ids in, float lists or base64 little-endian float32 out,
`dimensions`, usage). The vectors come from engine/embed.py, under the engine's turn lock."""

import base64
import functools
import struct
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse

from ..engine.embed import TooManyDimensions, embed
from ..model.pooling import Pooling, pooling_of
from .errors import APIError, bad_request, read_json
from .metrics import note_model
from .openapi import responses
from .params import load_model, model_ref
from .provider import Served
from .streaming import offload

PATH = "/v1/embeddings"
MAX_INPUTS = 2048  # OpenAI's limit on the inputs of one request
FORMATS = ("float", "base64")


@dataclass
class EmbeddingRequest:
    inputs: list[str] | list[list[int]]  # texts, or token id lists
    encoding_format: str
    dimensions: int | None


def parse(body: dict[str, Any]) -> EmbeddingRequest:
    """The request's inputs and options; a 400 naming the field for anything OpenAI refuses."""
    value = body.get("input")
    if isinstance(value, str):
        inputs: Any = [value]
    elif isinstance(value, list) and value and all(_is_id(v) for v in value):
        inputs = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = value
    elif isinstance(value, list) and value and all(_is_ids(v) for v in value):
        inputs = value
    elif value is None or value == []:
        raise bad_request("input must not be empty", "input")
    else:
        raise bad_request(
            "input must be a string, a list of strings, a list of token ids or a list of "
            "token id lists",
            "input",
        )
    if len(inputs) > MAX_INPUTS:
        raise bad_request(f"input holds {len(inputs)} items; at most {MAX_INPUTS}", "input")
    if any(len(item) == 0 for item in inputs):
        raise bad_request("input must not hold an empty string or token list", "input")
    fmt = body.get("encoding_format", "float")
    fmt = "float" if fmt is None else fmt
    if fmt not in FORMATS:
        raise bad_request(f"encoding_format must be one of {list(FORMATS)}", "encoding_format")
    dims = body.get("dimensions")
    if dims is not None and (not _is_id(dims) or dims < 1):
        raise bad_request("dimensions must be a positive integer", "dimensions")
    return EmbeddingRequest(inputs, fmt, dims)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_ids(v: Any) -> bool:
    return isinstance(v, list) and all(_is_id(t) for t in v)


def token_lists(served: Served, req: EmbeddingRequest) -> list[list[int]]:
    """Each input's token ids, checked against the model's vocabulary and context."""
    if req.inputs and isinstance(req.inputs[0], str):
        ids = [served.tokenizer.encode(text) for text in req.inputs]  # type: ignore[arg-type]
    else:
        ids = [list(item) for item in req.inputs]  # type: ignore[arg-type]
        vocab = served.facts.embed_vocab
        for i, item in enumerate(ids):
            if bad := [t for t in item if not 0 <= t < vocab]:
                raise bad_request(
                    f"input[{i}] holds token id {bad[0]}, outside the vocabulary (0..{vocab - 1})",
                    "input",
                )
    limit = served.context_length
    for i, item in enumerate(ids):
        if len(item) == 0:
            raise bad_request(f"input[{i}] has no tokens", "input")
        if limit is not None and len(item) > limit:
            raise APIError(
                400,
                f"input[{i}] is {len(item)} tokens; this model's maximum context length is "
                f"{limit} tokens",
                param="input",
                code="context_length_exceeded",
            )
    return ids


def encoded(vector: list[float], fmt: str) -> list[float] | str:
    """OpenAI's base64: the float32 values' little-endian bytes."""
    if fmt == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


_pooling_of = functools.lru_cache(maxsize=16)(pooling_of)  # a folder's config is read once


def pooling(served: Served) -> Pooling:
    """The served model's pooling: its tokenizer was loaded from the model's folder."""
    folder = getattr(served.tokenizer, "name_or_path", None)
    return _pooling_of(folder if isinstance(folder, str) else None)


async def embeddings(request: Request) -> JSONResponse:
    body = await read_json(request)
    req = parse(body)
    state = request.app.state.mlxd
    served = await load_model(state, model_ref(body))
    note_model(served)  # no Generation runs here to tell /metrics the request's model
    if served.adapter is not None:  # its forward here would be the base model's, unmarked
        raise bad_request(f"embeddings do not run with LoRA adapter {served.adapter!r}; name the "
                          "base model", "model")  # fmt: skip

    def run() -> tuple[list[list[float]], int]:
        ids = token_lists(served, req)
        try:
            if served.model is None:  # the engine's process runs the forward
                vectors = served.engine.embed(ids, pooling(served), req.dimensions)
            else:  # no engine turn runs MLX work beside this forward (its turn lock)
                vectors = embed(served.model, ids, pooling(served), req.dimensions,
                                served.engine.driver.lock)  # fmt: skip
        except TooManyDimensions as e:
            raise bad_request(str(e), "dimensions") from e
        except ValueError as e:
            raise bad_request(str(e)) from e
        return vectors, sum(len(item) for item in ids)

    vectors, tokens = await offload(run)
    data = [
        {"object": "embedding", "index": i, "embedding": encoded(v, req.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return JSONResponse({"object": "list", "data": data, "model": served.name, "usage": usage})


_OK = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array"}},
}
_BODY = {
    "type": "object",
    "required": ["input"],
    "properties": {
        "input": {"anyOf": [{"type": "string"}, {"type": "array"}]},
        "model": {"type": "string"},
        "encoding_format": {"enum": list(FORMATS)},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": {"type": "string"},
    },
}


def add_routes(app: FastAPI) -> None:
    answers = responses(PATH, "models")
    answers["200"]["content"]["application/json"]["schema"] = _OK
    extra = {
        "responses": answers,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _BODY}}},
    }
    app.add_api_route(PATH, embeddings, methods=["POST"], openapi_extra=extra)
