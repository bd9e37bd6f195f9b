"""`/v1/chat/completions`, `/chat/completions` and `/v1/completions`: mlx_lm.server's request
fields and response shapes, with `reasoning_content` beside `reasoning`, `n` as rows, and
`tool_choice` / `response_format` honoured or refused (never silently ignored). Tool calls and
logprobs carry mlx_lm.server's fields plus the OpenAI ones, so both kinds of client parse them.
Completions also take OpenAI's list of prompts (batched, prompt_batch.py) and integer
`logprobs` (its legacy shape, legacy_logprobs.py)."""

import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .app import ServerState
from .errors import APIError, openai_body, read_json
from .generation import Chunk, Generation, TokenInfo
from .legacy_logprobs import finite, legacy_logprobs_json, sampled_logprob
from .limits import check_fits, message_text_bytes
from .openai_request import parse_openai
from .params import GenParams, load_model
from .prompt import Prompt, chat_prompt, text_prompt
from .prompt_batch import Generations
from .provider import Served
from .speculation import prediction_details
from .streaming import offload, sse_data, sse_stream, until_done_or_disconnect
from .text import Delta, ToolCall
from .tools_warning import tools_warning

log = logging.getLogger("mlxd.serve")


class Completion:
    """One chat or text completion request, from its typed fields to the response."""

    def __init__(
        self, state: ServerState, body: dict[str, Any], chat: bool, arrival: Any = None
    ) -> None:
        self.state, self.chat, self.arrival = state, chat, arrival
        self.req = parse_openai(body, state.config, chat)
        self.stream, self.params, self.tools = self.req.stream, self.req.params, self.req.tools
        self.include_usage = self.req.include_usage
        self.choices = max(self.params.n, 1)  # every prompt's n rows (set once prompts are read)
        self.offsets: list[int] = []  # legacy logprobs: each choice's text offset so far
        self.model_name = body.get("model", "default_model")  # echoed as sent (mlx_lm.server)
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4()}"
        self.created = int(time.time())
        self.object = ("chat.completion" if chat else "text_completion") + (
            ".chunk" if self.stream and chat else ""
        )

    async def prompts(self, served: Served) -> list[Prompt]:
        """Checked against the context by its size first: templating and tokenizing a text
        that cannot fit would cost far more than refusing it (limits.py)."""
        tok, req = served.tokenizer, self.req
        if not self.chat:
            for prompt in req.prompts or []:
                if isinstance(prompt, str):
                    check_fits(served, len(prompt.encode("utf-8")), "prompt")
            return await offload(lambda: [text_prompt(tok, p) for p in req.prompts or []])
        messages = req.messages or []
        check_fits(served, message_text_bytes(messages))
        args, mapping = req.template_args or {}, req.role_mapping
        return [await offload(lambda: chat_prompt(tok, messages, self.tools, args, mapping))]

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "system_fingerprint": self.state.fingerprint,
            "object": self.object,
            "model": self.model_name,
            "created": self.created,
        }

    def _choice(self, index: int, delta: Delta, finish: str | None, calls_from: int) -> dict:
        choice: dict[str, Any] = {"index": index, "finish_reason": finish}
        if not self.chat:
            choice["text"] = delta.content
            return choice
        msg: dict[str, Any] = {"role": "assistant"}
        if not self.stream:
            msg["content"] = delta.content or None
        elif delta.content:
            msg["content"] = delta.content
        if delta.reasoning:
            msg["reasoning"] = msg["reasoning_content"] = delta.reasoning
        if delta.tool_calls:
            first = calls_from if self.stream else None
            msg["tool_calls"] = [
                tool_call_json(c, None if first is None else first + i)
                for i, c in enumerate(delta.tool_calls)
            ]
        choice["delta" if self.stream else "message"] = msg
        return choice

    def usage_json(self, gen: Generation | Generations) -> dict[str, Any]:
        u = gen.usage
        out: dict[str, Any] = {
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        }
        if u.drafted_tokens or self.params.prediction is not None:  # zeros for a prediction
            details = prediction_details(u.drafted_tokens, u.accepted_tokens)
            out["completion_tokens_details"] = details
        return out

    async def respond(self, request: Request) -> Response:
        served = await load_model(self.state, self.req.model)
        prompts = await self.prompts(served)
        endpoint = "chat" if self.chat else "completions"
        metrics, arrival = self.state.metrics, self.arrival
        gen: Generation | Generations
        if len(prompts) == 1:
            gen = Generation(
                served, prompts[0], self.params, self.tools, metrics, endpoint, arrival
            )
        else:
            rows = [Generation(served, p, self.params, None, metrics, endpoint) for p in prompts]
            gen = Generations(rows, arrival)
        self.choices = len(prompts) * max(self.params.n, 1)
        await gen.start(self.state)
        headers = tools_warning(served, self.tools, self.req.template_args)
        if self.stream:
            response = sse_stream(self._frames(gen, served), gen.behind)
        else:
            response = await until_done_or_disconnect(request, self._whole(gen, served), gen)
        response.headers.update(headers)
        return response

    def _logprobs(self, tokens: list[TokenInfo], served: Served, i: int) -> dict | None:
        """Choice `i`'s logprobs for `tokens`, in the shape the request asked for."""
        if self.req.legacy_logprobs is None:
            return logprobs_json(tokens, served.tokenizer, self.params)
        out, self.offsets[i] = legacy_logprobs_json(tokens, served.tokenizer, self.offsets[i])
        return out

    async def _whole(self, gen: Generation | Generations, served: Served) -> Response:
        n = self.choices
        self.offsets = [0] * n
        deltas = [Delta() for _ in range(n)]
        tokens: list[list[TokenInfo]] = [[] for _ in range(n)]
        finish = ["stop"] * n
        async for chunk in gen.chunks():
            d = deltas[chunk.index]
            d.content += chunk.delta.content
            d.reasoning += chunk.delta.reasoning
            d.tool_calls += chunk.delta.tool_calls
            tokens[chunk.index] += chunk.tokens
            if chunk.finish is not None:
                finish[chunk.index] = chunk.finish
        choices = []
        for i in range(n):
            choice = self._choice(i, deltas[i], finish[i], 0)
            if (lp := self._logprobs(tokens[i], served, i)) is not None:
                choice["logprobs"] = lp
            choices.append(choice)
        body = {**self._head(), "choices": choices, "usage": self.usage_json(gen)}
        return JSONResponse(body)

    async def _frames(self, gen: Generation | Generations, served: Served) -> AsyncIterator[str]:
        """The stream's frames. A failure once the status line is out becomes an error frame in
        OpenAI's shape (the openai SDK raises it as APIError, as vLLM's), then [DONE], instead
        of a connection cut mid-body."""
        frames = self._token_frames(gen, served)
        async with aclosing(frames):
            try:
                async for frame in frames:
                    yield frame
            except APIError as e:  # a refusal once the status line is out (--request-timeout)
                log.warning("a stream ended with %d: %s", e.status, e)
                yield sse_data(openai_body(e))
                yield "data: [DONE]\n\n"
            except Exception as e:  # noqa: BLE001 - the status line is gone: an error frame
                log.exception("a stream failed after its status line: error frame sent")
                yield sse_data(openai_body(APIError(500, f"{e}")))
                yield "data: [DONE]\n\n"

    async def _token_frames(
        self, gen: Generation | Generations, served: Served
    ) -> AsyncIterator[str]:
        n = self.choices
        self.offsets = [0] * n
        pending = [Delta() for _ in range(n)]
        held: list[list[TokenInfo]] = [[] for _ in range(n)]
        calls_sent = [0] * n
        async for chunk in gen.chunks():
            i = chunk.index
            self._merge(pending[i], chunk)
            held[i] += chunk.tokens
            if chunk.in_tool or not pending[i]:
                if chunk.finish is None:
                    continue  # mlx_lm.server sends only text, and nothing inside a tool block
            else:
                yield sse_data(self._frame(i, pending[i], None, calls_sent, held, served))
                calls_sent[i] += len(pending[i].tool_calls)
                pending[i], held[i] = Delta(), []
            if chunk.finish is not None:  # its own last frame, as mlx_lm.server sends it
                yield sse_data(self._frame(i, pending[i], chunk.finish, calls_sent, held, served))
                pending[i], held[i] = Delta(), []
        if self.include_usage:
            usage = {**self._head(), "choices": [], "usage": self.usage_json(gen)}
            usage["object"] = "chat.completion"  # mlx_lm.server's, for both endpoints
            yield sse_data(usage)
        yield "data: [DONE]\n\n"

    @staticmethod
    def _merge(into: Delta, chunk: Chunk) -> None:
        into.content += chunk.delta.content
        into.reasoning += chunk.delta.reasoning
        into.tool_calls += chunk.delta.tool_calls

    def _frame(self, i, delta, finish, calls_sent, held, served) -> dict[str, Any]:
        choice = self._choice(i, delta, finish, calls_sent[i])
        if held[i] and (lp := self._logprobs(held[i], served, i)):
            choice["logprobs"] = lp
        return {**self._head(), "choices": [choice]}


async def chat_completions(request: Request) -> Response:
    return await _complete(request, chat=True)


async def completions(request: Request) -> Response:
    return await _complete(request, chat=False)


async def _complete(request: Request, chat: bool) -> Response:
    state: ServerState = request.app.state.mlxd
    with state.provider.arrivals.coming() as arrival:  # a new wave may wait for this one
        body = await read_json(request)
        return await Completion(state, body, chat, arrival).respond(request)


def tool_call_json(call: ToolCall, index: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "function": {"name": call.name, "arguments": call.arguments},
        "type": "function",
        "id": call.id,
    }
    if index is not None:
        out["index"] = index
    return out


def logprobs_json(tokens: list[TokenInfo], tokenizer: Any, params: GenParams) -> dict | None:
    """mlx_lm.server's shape ({id, logprob}, top entries {id, token, logprob}), with the OpenAI
    fields `token` and `top_logprobs` on every entry so OpenAI clients parse it too."""
    if not params.logprobs and params.top_logprobs <= 0:
        return None
    content = []
    for t in tokens:
        entry: dict[str, Any] = {"id": t.id, "token": tokenizer.convert_ids_to_tokens(t.id)}
        entry["logprob"] = finite(sampled_logprob(t))
        tops = t.top or []
        names = tokenizer.convert_ids_to_tokens([i for i, _ in tops]) if tops else []
        entry["top_logprobs"] = [
            {"id": i, "token": s, "logprob": finite(lp)}
            for (i, lp), s in zip(tops, names, strict=True)
        ]
        content.append(entry)
    return {"content": content}
