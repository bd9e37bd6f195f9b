"""The engine's per-row adapters: named LoRA / DoRA adapters resident over its model
(model/lora/), how many live or queued rows use each (one in use is never unloaded), and the
slot ids every model call of rows sets first, in the call's row order, cleared once the call
has built its graph: a path that sets none (a draft model's row, ...) computes the base.

Requests whose path sets no slots are refused at submit; with no adapter loaded nothing here
runs and the model is untouched."""

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from ..model.fingerprint import fingerprint
from ..model.lora import AdapterSlots
from ..model.lora.adapter import read_config
from ..model.lora.targets import lora_targets
from ..model.peft import mlx_adapter
from .request import GenerationRequest, RequestHandle

NOOP = nullcontext()


def refusal(req: GenerationRequest) -> str | None:
    """Why a request naming an adapter cannot run with it (its path sets no slots), or None."""
    spec = req.speculation
    if spec is not None and spec.mode in ("draft", "model") and spec.max_draft > 0:
        return "draft-model speculation"
    if req.kv_bits is not None or req.kv_config is not None:
        return "quantized KV (kv_bits, kv_config)"
    return None


class _Clear:
    """Clears the rows' slots after the call built its graph (MLX kept the arrays it read)."""

    def __init__(self, slots: AdapterSlots) -> None:
        self.slots = slots

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.slots.rows.clear()


class EngineAdapters:
    """One engine's adapters. Loads and unloads run under the engine's turn lock (between
    model calls); refcounts change from any thread, under `_lock`."""

    def __init__(self, model: Callable[[], Any]) -> None:
        self._model = model
        self.slots: AdapterSlots | None = None  # made on the first load
        self._hashes: dict[str, str] = {}  # name -> content hash of its folder (prefix keys)
        self._refs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._clear: _Clear | None = None

    @property
    def active(self) -> bool:
        return bool(self._hashes)

    def load(self, name: str, path: str, busy: bool = False) -> None:
        """The mlx-lm or PEFT adapter folder `path` as `name` (PEFT converted once, peft.py).
        `busy`: rows are running; their steps hold the model's modules (a plain-rows twin holds
        its linears), so an adapter that would wrap a linear not wrapped yet is refused."""
        if name in self._hashes:
            raise ValueError(f"an adapter named {name!r} is already loaded")
        folder = mlx_adapter(path, None)  # ModelLoadError naming the file at fault
        if busy:
            targets = lora_targets(self._model(), read_config(Path(folder)))
            if new := sorted(set(targets) - set(self.slots.stacks if self.slots else ())):
                raise ValueError(
                    f"adapter {name!r} adapts {new[0]}, which no loaded adapter does: "
                    "load it while no rows run"
                )
        if self.slots is None:
            self.slots = AdapterSlots(self._model())
            self._clear = _Clear(self.slots)
        self.slots.add(name, folder)  # AdapterError naming the module at fault
        with self._lock:
            self._hashes[name] = fingerprint(None, folder)
            self._refs[name] = 0

    def unload(self, name: str) -> None:
        with self._lock:
            if name not in self._hashes:
                raise KeyError(f"no adapter named {name!r} is loaded")
            if self._refs[name]:
                raise ValueError(f"adapter {name!r} is in use by {self._refs[name]} row(s)")
            del self._hashes[name], self._refs[name]
        assert self.slots is not None
        self.slots.remove(name)

    def names(self) -> list[str]:
        return list(self._hashes)

    def nbytes(self, name: str) -> int:
        if name not in self._hashes or self.slots is None:
            raise KeyError(f"no adapter named {name!r} is loaded")
        return self.slots.nbytes(name)

    def key(self, name: str) -> str:
        """What the prefix store's namespace adds for rows with this adapter."""
        return f"{name}:{self._hashes[name]}"

    def check(self, req: GenerationRequest) -> None:
        """Submit's refusals: an adapter not loaded, or a path that would run without it."""
        if req.adapter is None:
            return
        if req.adapter not in self._hashes:
            raise ValueError(f"unknown adapter {req.adapter!r} (loaded: {self.names()})")
        if (why := refusal(req)) is not None:
            raise ValueError(f"{why} is not supported with adapters (adapter {req.adapter!r})")

    def acquire(self, reqs: Sequence[GenerationRequest], handles: Sequence[RequestHandle]) -> None:
        """Count each row using an adapter until its DoneEvent is put; every request is given
        this registry, so each model call of its row sets the slots."""
        with self._lock:
            for req in reqs:
                if req.adapter is not None and req.adapter not in self._hashes:
                    raise ValueError(f"unknown adapter {req.adapter!r} (unloaded meanwhile)")
            for req, handle in zip(reqs, handles, strict=True):
                req.adapter_slots = self
                if req.adapter is not None:
                    self._refs[req.adapter] += 1
                    handle.on_done = self._releaser(req.adapter)

    def acquire_siblings(self, req: GenerationRequest, handles: Sequence[RequestHandle]) -> None:
        """An `n` > 1 request's other rows, each counted until its own DoneEvent."""
        if req.adapter is None:
            return
        with self._lock:
            for handle in handles:
                self._refs[req.adapter] = self._refs.get(req.adapter, 0) + 1
                handle.on_done = self._releaser(req.adapter)

    def _releaser(self, name: str) -> Callable[[], None]:
        def release() -> None:
            with self._lock:
                if name in self._refs:
                    self._refs[name] -= 1

        return release

    def rows(self, names: Callable[[], Sequence[str | None]]) -> AbstractContextManager:
        """Set each row's slot for the next model call (`names()`: row order); a `with` around
        the call clears them after it. A no-op when no adapter is loaded."""
        if not self._hashes or self.slots is None or self._clear is None:
            return NOOP
        self.slots.set_rows(names())
        return self._clear


def row_slots(
    reg: EngineAdapters | None, names: Callable[[], Sequence[str | None]]
) -> AbstractContextManager:
    """`reg.rows(names)`, or nothing for a request from before the engine had a registry."""
    return NOOP if reg is None else reg.rows(names)


def uid_slots(
    reg: EngineAdapters | None, rows: Mapping[int, Any]
) -> Callable[[Sequence[int]], AbstractContextManager]:
    """The batched calls' setter: row order by uid, each uid's adapter from its BatchedRow (a
    closure over the rows only, as batch_row.wants_of)."""

    def around(uids: Sequence[int]) -> AbstractContextManager:
        def names() -> list[str | None]:
            return [r.req.adapter if (r := rows.get(u)) is not None else None for u in uids]

        return row_slots(reg, names)

    return around


def no_slots(_uids: Sequence[int]) -> AbstractContextManager:
    return NOOP
