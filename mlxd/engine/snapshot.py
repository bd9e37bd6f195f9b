"""What each row of an engine is doing right now, for the server's dashboard: the running rows
(prefilling or decoding) and the waiting requests, as plain values (the snapshot crosses from an
engine process to the server). Read under the admission lock, as Engine.stats reads its rows."""

import time
from collections.abc import Iterator
from typing import Any

from .output import RowOutput
from .request import GenerationRequest, RequestHandle

Running = tuple[GenerationRequest, RequestHandle, RowOutput, Any]  # Any: the row's prefill state


def _prompt_tokens(req: GenerationRequest) -> int:
    if req.input_embeddings is not None:
        return int(req.input_embeddings.shape[-2])
    return int(req.prompt.size)


def _running(rows: Any) -> Iterator[Running]:
    """Every running row as (request, handle, output, the object that knows its prefill)."""
    if (serial := rows.serial) is not None:  # read once: the engine thread may clear it
        row, handle, out = serial
        yield row.req, handle, out, row
    for job in list(rows.forks):
        for handle, out in zip(job.handles, job.outs, strict=False):
            yield job.req, handle, out, job.row
    for batch in list(rows.batches.values()):
        for brow in list(batch.rows.values()):
            yield brow.req, brow.handle, brow.out, None


def _entry(state: str, req: GenerationRequest, handle: RequestHandle, now: float) -> dict[str, Any]:
    return {
        "id": int(getattr(handle, "rid", id(handle))),  # stable while the row lives
        "state": state,
        "prompt_tokens": _prompt_tokens(req),
        "cached_tokens": int(handle.cached_tokens),
        "prefilled_tokens": 0,
        "generated_tokens": 0,
        "max_tokens": int(req.max_tokens),
        "tokens_per_s": 0.0,
        "age_s": round(now - handle.submitted, 3),
        "ttft_s": None,
        "adapter": req.adapter,
        "speculative": req.speculation is not None,
        "speculation": req.speculation.mode if req.speculation is not None else None,
    }


def _row(req: GenerationRequest, handle: RequestHandle, out: RowOutput, prefill: Any,
         now: float) -> dict[str, Any]:  # fmt: skip
    count = out.count
    entry = _entry("decode" if count else "prefill", req, handle, now)
    entry["generated_tokens"] = count
    processed = getattr(prefill, "processed", None)
    entry["prefilled_tokens"] = int(processed) if processed is not None else (
        entry["prompt_tokens"] if count else 0)  # fmt: skip
    first = out.times.get("first_token")
    if first is not None:
        entry["ttft_s"] = round(first - out.times["submitted"], 4)
        # The tokens after the first over the time since it: the decode rate, prefill excluded.
        if count > 1 and now > first:
            entry["tokens_per_s"] = round((count - 1) / (now - first), 2)
    return entry


def rows_snapshot(engine: Any) -> list[dict[str, Any]]:
    """The engine's running rows, then its waiting requests (oldest first), one dict each:
    id, state (waiting / prefill / decode), prompt, cached, prefilled and generated tokens,
    max_tokens, tokens_per_s since its first token, age_s since submit, ttft_s, adapter, and
    whether (and how) it speculates."""
    for _ in range(3):  # the engine thread may reshape a batch mid-read: read again
        try:
            with engine.admission.wake:
                now = time.perf_counter()
                out = [_row(*running, now) for running in _running(engine.rows)]
                for req, handle in list(engine.admission.waiting):
                    out.append(_entry("waiting", req, handle, now))
                return out
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return []
