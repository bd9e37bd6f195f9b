"""Who runs next, and where: the waiting queue (admission.py: row cap, KV budget), the join
window (arrivals.py: a wave waits for turns on their way), the prefix store's plans (a stored
prefix, snapshot points, joiners that wait for a prefix another joiner computes) and the
routing of joiners: n > 1 and quantized-KV prefills to prefill jobs, a lone row to serial
caches, the rest into the batch of their KV format. Engine thread only."""

from collections.abc import Callable
from typing import Any

from mlx_lm.generate import generation_stream

from ..config import EngineConfig
from .admission import Admission, Waiting
from .arrivals import Arrivals
from .batch_row import BatchedRow, batchable
from .draft_row import DraftRow, drafts
from .moves import ForkJob, needs_own_prefill
from .output import RowOutput
from .prefix import Plan, PrefixSharing, cuts_for
from .request import DoneEvent, GenerationRequest, RequestHandle
from .rows import Rows
from .serial import SerialRow
from .speculate.drafting import drafts_in_batch


class Scheduler:
    def __init__(
        self,
        model: Callable[[], Any],
        config: EngineConfig,
        queue: Admission,
        arrivals: Arrivals,
        rows: Rows,
        sharing: PrefixSharing | None,
        tokenizer: Any,
    ) -> None:
        self._model, self.config, self.queue, self.arrivals = model, config, queue, arrivals
        self.rows, self.sharing, self.tokenizer = rows, sharing, tokenizer
        queue.running = rows.active  # free rows are not queue places (Admission.push)
        self._held_for: float | None = None  # the oldest waiting request of the last hold
        self._lead_seen: tuple[float, int, bool] = (0.0, -1, False)  # _leads' last answer
        self.draft_model: Any = None  # what draft requests draft with (Engine.use_draft)

    # the join window
    def hold(self) -> float:
        """Seconds the next wave still waits for requests on their way (0: admit now)."""
        queue = self.queue
        if not queue.waiting or not self.arrivals.maybe():
            return 0.0  # the per-turn fast path: no lock
        with queue.wake:
            first = queue.waiting[0] if queue.waiting else None
        oldest = first[1].submitted if first is not None else None
        wait = self.arrivals.hold(oldest)
        if wait > 0 and first is not None and self._leads(first[0], oldest):
            if oldest != self._held_for:
                self._held_for = oldest
                self.rows.paths["started ahead of its wave"] += 1
            return 0.0
        if wait > 0 and oldest != self._held_for:  # a new wave held: counted once
            self._held_for = oldest
            self.rows.paths["wave held for arrivals"] += 1
        return wait

    def _leads(self, req: GenerationRequest, submitted: float) -> bool:
        """Nothing runs and the oldest request has a prefill step or more the store lacks, up
        to a boundary it snapshots (a fleet's new system prompt, `PrefixSharing.leads`): it
        starts now, alone, while its wave's other turns are still on their way. Those that
        share its prompt wait for its snapshot anyway, and its prefill would otherwise start
        only after the last of them was tokenized."""
        if self.rows.busy() or self.sharing is None or req.n != 1:
            return False
        key = (submitted, self.sharing.store.version)  # a held wave asks at every arrival
        if self._lead_seen[:2] != key:
            self._lead_seen = (*key, self.sharing.leads(req))
        return self._lead_seen[2]

    # admission
    def take(self, only: RequestHandle | None) -> list[Waiting]:
        """This turn's joiners (`only`: just that one, for a driver)."""
        if only is None and self.hold() > 0:
            return []  # requests on their way will join this wave (arrivals.py)
        defer = None
        if self.sharing is not None and self.rows.busy() and self.queue.waiting:
            self.sharing.prune({id(r) for r in self.rows.requests()})
            defer = self.sharing.defer
        return self.queue.take(self.rows.active, self.rows.alone, defer, only)

    def start(self, joiners: list[Waiting], driver: RequestHandle | None) -> None:
        """Turn this round's joiners into rows: prefill jobs, a serial row, or batch joiners.
        On an error, the joiners that did not become rows end with it."""
        rows = self.rows
        taken = [h for _, handle in joiners for h in [handle, *rows.groups.get(id(handle), [])]]
        try:
            self._start(joiners, driver)
        except Exception as e:
            # Taken but not yet rows: nobody else would ever end them (the engine's turn
            # ends the running rows). Ones sent back to wait are still queued.
            live = {id(h) for h in rows.active()}
            with self.queue.wake:
                live |= {id(h) for _, h in self.queue.waiting}
            for h in taken:
                if id(h) not in live and h.done is None:
                    h.put(DoneEvent("error", e))
            raise

    def _start(self, joiners: list[Waiting], driver: RequestHandle | None) -> None:
        rows, config = self.rows, self.config
        for req, handle in [j for j in joiners if j[0].n > 1]:
            handles = [handle, *rows.groups.pop(id(handle), [])]
            plan = self._plan(req)
            for h in handles:
                h.admit(req.cached_tokens)
            job = ForkJob(self._model(), req, handles, generation_stream, self.tokenizer, plan,
                          self._snapshot(req, plan))  # fmt: skip
            rows.add_fork(job, "forked", req.n)
        joiners = [j for j in joiners if j[0].n == 1]
        if any(drafts(req) for req, _ in joiners):
            joiners = self._drafts(joiners, driver)  # it runs alone, or waits to
        joiners, plans = self._share(joiners)
        if not joiners:
            return
        outs = [RowOutput(req, self.tokenizer, h.submitted) for req, h in joiners]
        solo = len(joiners) == 1 and batchable(joiners[0][0], config) is not None
        serial = (config.serial_fast_path and not drafts_in_batch(joiners[0][0])) or solo
        if not rows.active() and len(joiners) == 1 and serial:
            (req, handle), out, plan = joiners[0], outs[0], plans[0]
            rows.paths["alone" if solo else "serial"] += 1
            self._serial(
                lambda: SerialRow(rows.step_model(), req, generation_stream, plan,
                                  self._snapshot(req, plan)),
                handle, out, solo, driver,
            )  # fmt: skip
            return
        batched, prompts, caches, histories = [], [], [], []
        for (req, handle), out, plan in zip(joiners, outs, plans, strict=True):
            if needs_own_prefill(req, plan):  # it joins once prefilled (moves.py)
                job = ForkJob(self._model(), req, [handle], generation_stream, self.tokenizer,
                              plan, self._snapshot(req, plan), outs=[out])  # fmt: skip
                rows.add_fork(job, "embeddings prefill" if job.embeds else "quantized prefill")
                continue
            rows.paths["batched"] += 1
            start = plan.start if plan is not None else 0
            cuts = [c for c, _ in plan.cuts] if plan is not None else []
            batched.append(BatchedRow(req, handle, out, key=req.random_key, plan=plan, cuts=cuts))
            prompt = req.prompt.tolist()
            prompts.append(prompt[start:])
            caches.append(plan.cache if plan is not None and plan.cache else req.prompt_cache)
            histories.append(prompt[:start])
        if batched:
            rows.into_batch(batched, prompts, caches, histories)

    def _serial(
        self,
        make: Callable[[], Any],
        handle: RequestHandle,
        out: RowOutput,
        alone: bool,
        driver: RequestHandle | None,
    ) -> None:
        """The one row on serial caches (`alone`: no row may join it); a row that cannot be
        built ends with its error (its reader re-raises it)."""
        rows = self.rows
        rows.alone = alone
        try:
            row = make()
            row.clears = self.config.clear_cache
            row.keeps_key = handle is driver  # its drawn key, at hand for a hand-over
            rows.serial = (row, handle, out)
        except Exception as e:  # noqa: BLE001 - the reader re-raises it
            rows.alone = False
            handle.put(out.done("error", e))

    def _drafts(self, joiners: list[Waiting], driver: RequestHandle | None) -> list[Waiting]:
        """A draft-model request runs alone (mlx_lm.server serves a draft model one request at
        a time): first in line with nothing running, it starts; else it waits again. The
        others it returns. No prefix store: it starts from its own caches."""
        rows = self.rows
        if not rows.active() and drafts(joiners[0][0]):
            (req, handle), back = joiners[0], joiners[1:]
            out = RowOutput(req, self.tokenizer, handle.submitted)
            handle.admit(req.cached_tokens)
            rows.paths["draft model"] += 1
            self._serial(
                lambda: DraftRow(self._model(), self.draft_model, req, generation_stream),
                handle, out, True, driver,
            )  # fmt: skip
            keep: list[Waiting] = []
        else:
            back = [j for j in joiners if drafts(j[0])]
            keep = [j for j in joiners if not drafts(j[0])]
        if back:
            self.queue.push_front(back)
        return keep

    # the prefix store's plans
    def _plan(self, req: GenerationRequest) -> Plan | None:
        """The store's plan; without the store, the request's prefill cuts still apply (they
        decide the chunks, so the bits: mlx_lm.server cuts at them either way)."""
        if self.sharing is None or not self.sharing.eligible(req):
            return Plan("", cuts=cuts_for(req)) if req.snapshot_at else None
        return self.sharing.plan(req)

    def _snapshot(self, req: GenerationRequest, plan: Plan | None) -> Any:
        if plan is None or self.sharing is None or not plan.namespace:
            return None
        sharing = self.sharing
        return lambda at, cache: sharing.snapshot(req, plan, at, cache)

    def _share(self, joiners: list[Waiting]) -> tuple[list[Waiting], list[Plan | None]]:
        """Plans for this round's joiners. One that shares a prefix the store lacks with an
        earlier joiner goes back to wait for that joiner's snapshot of it (one prefill)."""
        sharing = self.sharing
        if sharing is None:
            for req, handle in joiners:
                handle.admit(req.cached_tokens)
            return joiners, [None] * len(joiners)
        kept: list[Waiting] = []
        plans: list[Plan | None] = []
        back = []
        for req, handle in joiners:
            donor = None
            if sharing.eligible(req):
                donor = sharing.donor(req, [(o, p) for (o, _), p in zip(kept, plans, strict=True)])
            if donor is not None:
                sharing.add_cut(*donor)
                back.append((req, handle))
                continue
            kept.append((req, handle))
            plans.append(self._plan(req))
            handle.admit(req.cached_tokens)
        if back:
            self.rows.paths["waited for a shared prefix"] += len(back)
            self.queue.push_front(back)
        if any(p is not None for p in plans) and (active := self.rows.cache_bytes()):
            # mlx_lm.server's --prompt-cache-bytes bounds stored and running caches together
            sharing.trim(sharing.store.ram.max_bytes - active)
        return kept, plans
