"""The engine's rows and the prefix store: each admitted row's plan (a stored prefix and its
snapshot points), joiners that wait for a prefix another joiner is about to compute, the
store's byte cap with running rows counted, and a serial row's cache kept when it ends."""

from typing import Any

from ..store.layers import clone
from .prefix import Plan, PrefixSharing, cuts_for
from .request import DoneEvent, GenerationRequest
from .serial import SerialRow


class PrefixRows:
    """Mixed into Engine (engine thread only)."""

    sharing: PrefixSharing | None
    admission: Any
    paths: Any
    _serial: Any
    _batches: dict[Any, Any]

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

    def _share(self, joiners: list) -> tuple[list, list[Plan | None]]:
        """Plans for this round's joiners. One that shares a prefix the store lacks with an
        earlier joiner goes back to wait for that joiner's snapshot of it (one prefill)."""
        if self.sharing is None:
            return joiners, [None] * len(joiners)
        kept: list = []
        plans: list[Plan | None] = []
        back = []
        for req, handle in joiners:
            donor = None
            if self.sharing.eligible(req):
                donor = self.sharing.donor(
                    req, [(o, p) for (o, _), p in zip(kept, plans, strict=True)]
                )
            if donor is not None:
                self.sharing.add_cut(*donor)
                back.append((req, handle))
                continue
            kept.append((req, handle))
            plans.append(self._plan(req))
            handle.cached_tokens = req.cached_tokens
        if back:
            self.paths["waited for a shared prefix"] += len(back)
            self.admission.push_front(back)
        if any(p is not None for p in plans):
            self._trim_store()
        return kept, plans

    def _trim_store(self) -> None:
        """mlx_lm.server's --prompt-cache-bytes bounds stored and running caches together."""
        cap = self.sharing.store.ram.max_bytes
        active = 0
        if self._serial is not None:
            active += sum(c.nbytes for c in self._serial[0].cache)
        for batch in self._batches.values():
            active += batch.gen.prompt_cache_nbytes
        if active:
            self.sharing.trim(cap - active)

    def _keep(self, row: SerialRow, done: DoneEvent) -> None:
        """A serial row's cache goes to the prefix store when it ends (not after an error)."""
        if self.sharing is None or row.plan is None or not row.plan.namespace:
            return
        if done.reason == "error" or row.fed == 0:
            self.sharing.forget(row.req)
            return
        tokens = (row.req.prompt.tolist() + row.emitted)[: row.fed]
        cache = clone(row.cache) if row.req.return_prompt_cache else row.cache
        self.sharing.finish(row.req, row.plan, tokens, cache, solo=True)
