"""Rows running together: mlx-lm's BatchGenerator as the batched step (its PromptProcessingBatch
and GenerationBatch, merge / extend / filter / extract caches), driven by the engine's loop.

Rows admitted together get exactly BatchGenerator's tokens at that composition; the engine
decides who joins and when, and maps its responses back to the rows' handles.
"""

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from .handle import RequestHandle
from .request import DoneEvent, GenerationRequest, TokenEvent


@dataclass
class BatchedRow:
    req: GenerationRequest
    handle: RequestHandle
    uid: int = -1
    generated: list[int] = field(default_factory=list)


def batchable(req: GenerationRequest) -> str | None:
    """None when the request can share the batched step, else the reason it runs alone."""
    if req.kv_bits is not None:
        return "quantized KV (kv_bits) runs one row at a time until batched KV schemes land"
    if req.max_kv_size is not None:
        return "a per-request max_kv_size runs one row at a time"
    if req.input_embeddings is not None:
        return "input embeddings run one row at a time"
    if req.prompt_cache is not None:
        return "a caller-supplied prompt_cache runs one row at a time"
    return None


class BatchedRows:
    """The batched rows of one engine (created when a second row joins)."""

    def __init__(self, model: Any, capacity: int, prefill_step_size: int, stream: Any) -> None:
        self.gen = BatchGenerator(
            model,
            completion_batch_size=capacity,
            prefill_batch_size=min(capacity, 8),
            prefill_step_size=prefill_step_size,
            stream=stream,
        )
        self.rows: dict[int, BatchedRow] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def insert(
        self,
        rows: list[BatchedRow],
        prompts: list[list[int]],
        caches: list[list[Any] | None] | None = None,
        histories: list[list[int]] | None = None,
    ) -> None:
        """Queue rows for batched prefill; a row with a cache continues from it."""
        reqs = [r.req for r in rows]
        uids = self.gen.insert(
            prompts,
            max_tokens=[r.req.max_tokens - len(r.generated) for r in rows],
            caches=caches if caches and any(c is not None for c in caches) else None,
            all_tokens=histories,
            samplers=[q.sampler for q in reqs],
            logits_processors=[q.logits_processors or [] for q in reqs],
            stop_sequences=[StopSequences([[t] for t in sorted(q.stop_token_ids)]) for q in reqs],
        )
        for uid, row in zip(uids, rows, strict=True):
            row.uid = uid
            self.rows[uid] = row

    def remove(self, row: BatchedRow) -> None:
        self.gen.remove([row.uid])
        self.rows.pop(row.uid, None)

    def step(self) -> list[tuple[RequestHandle, TokenEvent | DoneEvent]]:
        """One BatchGenerator turn: a decode step for running rows, a prefill chunk for joiners."""
        _, responses = self.gen.next()
        events: list[tuple[RequestHandle, TokenEvent | DoneEvent]] = []
        for r in responses:
            row = self.rows[r.uid]
            row.generated.append(r.token)
            events.append((row.handle, TokenEvent(r.token, r.logprobs)))
            if r.finish_reason is not None:
                events.append((row.handle, DoneEvent(r.finish_reason)))
                del self.rows[r.uid]
        return events

    def close(self) -> None:
        self.gen.close()
        mx.clear_cache()
