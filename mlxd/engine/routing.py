"""Where admitted rows go, called on the engine thread: `n` > 1 and quantized-KV prefills to
prefill jobs, a lone row to serial caches, the rest into the batch of their KV format (one
BatchedRows per format; a serial row joins them first or, mid quantized prefill, becomes a job).
"""

from typing import Any

from mlx_lm.generate import generation_stream

from ..kv.batch_quantized import batch_format, is_quantized
from ..model.folded_attention import is_folded
from .batch import BatchedRows
from .batch_row import BatchedRow, batchable
from .crossing import needs_own_prefill, quantizes
from .fork import ForkJob
from .moves import serial_into_batch
from .output import RowOutput
from .rng import set_key
from .serial import SerialRow


class Routing:
    """Mixed into Engine (state lives on the Engine)."""

    _serial: Any
    _batches: dict[Any, BatchedRows]
    _forks: list[ForkJob]
    _groups: dict[int, list[Any]]
    _driver: Any
    _plain_rows: Any
    config: Any
    model: Any

    def step_model(self) -> Any:
        """The model a serial row and an mlx-mode batch step: its plain-rows twin
        (model/plain_rows.py) unless that is off. Folded batches fold the model itself."""
        if not self.config.decode_rows:
            return self.model
        return self._plain_rows.of(self.model, self.config.decode_fused)  # rows+fused

    def _start(self, joiners: list) -> None:
        """Turn this round's joiners into rows: forks, a serial row, or batch joiners."""
        for req, handle in [j for j in joiners if j[0].n > 1]:
            handles = [handle, *self._groups.pop(id(handle), [])]
            plan = self._plan(req)
            for h in handles:
                h.cached_tokens = req.cached_tokens
            job = ForkJob(self.model, req, handles, generation_stream, self.tokenizer, plan,
                          self._snapshot(req, plan))  # fmt: skip
            job.row.clears = self.config.clear_cache
            self._forks.append(job)
            self.paths["forked"] += req.n
        joiners, plans = self._share([j for j in joiners if j[0].n == 1])
        if not joiners:
            return
        outs = [RowOutput(req, self.tokenizer, h.submitted) for req, h in joiners]
        solo = len(joiners) == 1 and batchable(joiners[0][0], self.config) is not None
        if not self._active() and len(joiners) == 1 and (self.serial_fast_path or solo):
            (req, handle), out, plan = joiners[0], outs[0], plans[0]
            self._alone = solo
            self.paths["alone" if self._alone else "serial"] += 1
            try:
                row = SerialRow(self.step_model(), req, generation_stream, plan,
                                self._snapshot(req, plan))  # fmt: skip
                row.clears = self.config.clear_cache
                row.keeps_key = handle is self._driver  # its drawn key, at hand for a hand-over
                self._serial = (row, handle, out)
            except Exception as e:  # noqa: BLE001 - the caller re-raises it
                self._alone = False
                handle.put(out.done("error", e))
            return
        rows, prompts, caches, histories = [], [], [], []
        for (req, handle), out, plan in zip(joiners, outs, plans, strict=True):
            if needs_own_prefill(req, plan):  # it joins once prefilled (crossing.py)
                job = ForkJob(self.model, req, [handle], generation_stream, self.tokenizer, plan,
                              self._snapshot(req, plan), outs=[out])  # fmt: skip
                job.row.clears = self.config.clear_cache
                self._forks.append(job)
                self.paths["quantized prefill"] += 1
                continue
            self.paths["batched"] += 1
            start = plan.start if plan is not None else 0
            cuts = [c for c, _ in plan.cuts] if plan is not None else []
            rows.append(BatchedRow(req, handle, out, key=req.random_key, plan=plan, cuts=cuts))
            prompt = req.prompt.tolist()
            prompts.append(prompt[start:])
            caches.append(plan.cache if plan is not None and plan.cache else req.prompt_cache)
            histories.append(prompt[:start])
        if rows:
            self._into_batch(rows, prompts, caches, histories)

    def _into_batch(self, rows, prompts, caches, histories) -> None:
        """Insert joiners into the batch of their KV format (created on demand); a serial row
        joins them first."""
        if not self._batches and self._serial is None:
            first = rows[0].req
            if first.random_key is not None and first.draws is None:
                set_key(first.random_key)  # a user sampler draws from the thread's key
        if self._serial is not None and not self._serial_to_prefill_job():
            self.paths["serial->batched"] += 1
            moved = serial_into_batch(self._serial, self._keys)
            self._serial = None
            if moved is not None:
                rows.insert(0, moved[0])
                prompts.insert(0, moved[1])
                caches.insert(0, moved[2])
                histories.insert(0, moved[3])
        by_format: dict[Any, list[int]] = {}
        for i, cache in enumerate(caches):
            by_format.setdefault(batch_format(cache), []).append(i)
        for fmt, idx in by_format.items():
            if fmt not in self._batches:
                model = self.model if is_folded(self.config.attention) else self.step_model()
                self._batches[fmt] = BatchedRows(model, self.config, self.sharing, fmt)
            parts = [[xs[i] for i in idx] for xs in (rows, prompts, caches, histories)]
            self._batches[fmt].insert(*parts)

    def _serial_to_prefill_job(self) -> bool:
        """A quantized-KV serial row mid-prefill goes on prefilling alone, beside the batch
        (its conversion must land after mlx-lm's chunk): it becomes a prefill job."""
        row, handle, out = self._serial
        if not row.prefilling or not quantizes(row.req):
            return False
        if row.total - row.processed <= 1:
            return False
        if not is_quantized(row.cache) and row.total - 1 < row.req.quantized_kv_start:
            return False
        self._keys.leave(row)
        job = ForkJob(self.model, row.req, [handle], generation_stream, self.tokenizer,
                      row.plan, outs=[out], row=row)  # fmt: skip
        self._forks.append(job)
        self._serial = None
        self.paths["serial->quantized prefill"] += 1
        return True
