"""A prompt prefilled alone, a chunk per engine turn, beside the batch: `n` > 1 (several rows
from one prompt, prefilled once) and quantized-KV rows whose prefill converts their caches.

The prompt (all but its last token) is prefilled on one serial cache, as generate_step does;
then the cache is copied for each sibling and all of them join the batch, each feeding the
last prompt token with its own sampler stream."""

import copy
from typing import Any

from .batch_row import BatchedRow
from .handle import RequestHandle
from .output import RowOutput
from .prefix import Plan
from .request import GenerationRequest
from .sampling import seed_key
from .serial import SerialRow


class ForkJob:
    def __init__(
        self, model: Any, req: GenerationRequest, handles: list[RequestHandle], stream: Any,
        tokenizer: Any | None, plan: Plan | None = None, snapshot: Any = None,
        outs: list[RowOutput] | None = None, row: SerialRow | None = None,
    ) -> None:  # fmt: skip
        """`row`: continue a serial row's prefill (it is still prefilling) instead of a new one."""
        self.req, self.handles, self.plan = req, handles, plan
        self.row = row if row is not None else SerialRow(model, req, stream, plan, snapshot)
        self.outs = outs or [RowOutput(req, tokenizer, h.submitted) for h in handles]

    @property
    def ready(self) -> bool:
        """True once only the last prompt token is left (the point where rows diverge)."""
        return self.row.total - self.row.processed <= 1

    def step(self) -> None:
        self.row.prefill_chunk()

    def rows(self) -> tuple[list[BatchedRow], list[list[int]], list[list[Any]], list[list[int]]]:
        """The siblings as batch joiners: rows, tokens to feed, caches, tokens in cache."""
        prompt = self.req.prompt.tolist()
        live = list(zip(self.handles, self.outs, strict=True))
        rows, caches = [], []
        for i, (handle, out) in enumerate(live):
            key = self.req.random_key
            if self.req.seed is not None:
                key = seed_key(self.req.seed + i)  # choice i: the stream of seed + i
            row = BatchedRow(self.req, handle, out, key=key, plan=self.plan)
            if i > 0:  # a processor that holds state (a grammar) gets a twin per sibling
                procs = self.req.logits_processors or []
                row.processors = [p.fork() if hasattr(p, "fork") else p for p in procs]
            rows.append(row)
            caches.append(self.row.cache if i == 0 else copy.deepcopy(self.row.cache))
        n = len(rows)
        return rows, [prompt[-1:]] * n, caches, [prompt[:-1] for _ in range(n)]

    def drop_cancelled(self) -> list[tuple[RequestHandle, RowOutput]]:
        """Siblings cancelled while the prompt was prefilling (removed from the job)."""
        pairs = list(zip(self.handles, self.outs, strict=True))
        self.handles = [h for h, _ in pairs if not h.cancelled]
        self.outs = [o for h, o in pairs if not h.cancelled]
        return [(h, o) for h, o in pairs if h.cancelled]
