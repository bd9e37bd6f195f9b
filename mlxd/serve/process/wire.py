"""The messages between the server and an engine process, as msgspec structs (msgpack on a
ZeroMQ socket). A request crosses once; its tokens come back in one message per drain of the
engine's outbox (a step's worth), never one message per token per row."""

from dataclasses import asdict, fields
from typing import Any

import msgspec

from ...constrain.spec import Constraint
from ...engine.request import GenerationRequest, Speculation
from ...engine.sampling import SamplingParams


class RowSpec(msgspec.Struct, array_like=True):
    """What a server request sets on a GenerationRequest, in plain values (the grammar as its
    Constraint, rebuilt into a processor on the engine's side)."""

    prompt: list[int]
    max_tokens: int
    prefill_step_size: int
    kv_bits: int | None
    kv_group_size: int
    quantized_kv_start: int
    quantize_windows: bool
    max_kv_size: int | None
    stop_token_ids: list[int]
    stop_sequences: list[list[int]]
    sampling: SamplingParams | None
    seed: int | None
    logprob: bool
    top_logprobs: int
    use_prefix_store: bool
    snapshot_at: list[tuple[int, str]]
    adapter: str | None
    speculation: Speculation | None
    constraint: Constraint | None
    progress: bool  # report prefill progress (the request log's lines)


# server -> engine process
class Submit(msgspec.Struct, tag=True, array_like=True):
    call: int
    rids: list[int]  # one per row (n rows of one spec, or one per spec)
    specs: list[RowSpec]
    n: int = 1


class Cancel(msgspec.Struct, tag=True, array_like=True):
    rid: int


class Arrive(msgspec.Struct, tag=True, array_like=True):
    kind: str  # came / released / replied: the server's Arrivals, mirrored (arrivals.py)


class Call(msgspec.Struct, tag=True, array_like=True):
    call: int
    method: str  # one of child.CALLS
    args: list[Any]


ToChild = Submit | Cancel | Arrive | Call


# engine process -> server
class Ready(msgspec.Struct, tag=True, array_like=True):
    facts: dict[str, Any]  # loading.ModelFacts' fields
    batch: int
    pid: int
    store: bool  # it has a prefix store (stats come with the engine's)


class Failed(msgspec.Struct, tag=True, array_like=True):
    kind: str  # the exception's type name
    message: str


class Reply(msgspec.Struct, tag=True, array_like=True):
    call: int
    value: Any = None
    kind: str | None = None  # an exception's type name, raised again on the server's side
    message: str = ""


class Tok(msgspec.Struct, tag=True, array_like=True):
    rid: int
    token: int
    text: str
    finish: str | None
    logprob: float | None
    top: list[tuple[int, float]] | None
    from_draft: bool


class Done(msgspec.Struct, tag=True, array_like=True):
    rid: int
    reason: str
    kind: str | None  # the row's error, if it ended with one
    message: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    text: str
    timings: dict[str, float]
    drafted: int
    accepted: int


class Admit(msgspec.Struct, tag=True, array_like=True):
    rid: int
    cached: int


class Progress(msgspec.Struct, tag=True, array_like=True):
    rid: int
    done: int
    total: int


ToParent = Ready | Failed | Reply | Tok | Done | Admit | Progress

encode = msgspec.msgpack.Encoder().encode
to_child = msgspec.msgpack.Decoder(ToChild).decode
to_parent = msgspec.msgpack.Decoder(list[ToParent]).decode

_SPEC = {f for f in RowSpec.__struct_fields__ if f not in ("progress", "prompt")}


def row_spec(req: GenerationRequest) -> RowSpec:
    """`req` as a server built it (mlxd/serve/row_request.py); ValueError for what cannot cross."""
    if req.input_embeddings is not None or req.prompt_cache is not None or req.sampler is not None:
        raise ValueError("an engine process takes token prompts with mlx-lm's samplers only")
    values = {name: getattr(req, name) for name in _SPEC}
    values["stop_token_ids"] = sorted(req.stop_token_ids)
    values["snapshot_at"] = list(req.snapshot_at)
    prompt = req.prompt.tolist() if hasattr(req.prompt, "tolist") else list(req.prompt)
    return RowSpec(prompt=prompt, progress=req.prompt_progress_callback is not None, **values)


def request_of(spec: RowSpec) -> GenerationRequest:
    """The engine's side: the request the spec was made from, less its callables."""
    import mlx.core as mx

    values = {name: getattr(spec, name) for name in _SPEC}
    values["stop_token_ids"] = frozenset(spec.stop_token_ids)
    values["snapshot_at"] = tuple(tuple(c) for c in spec.snapshot_at)
    return GenerationRequest(prompt=mx.array(spec.prompt), **values)


def facts_dict(facts: Any) -> dict[str, Any]:
    return asdict(facts)


def facts_of(cls: type, values: dict[str, Any]) -> Any:
    return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
