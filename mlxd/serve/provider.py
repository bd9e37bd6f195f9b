"""The served model and its engine; other models named by requests, loaded on demand.

mlx_lm.server swaps its one model for whatever a request names. Agents sharing a server must
not evict each other, so the served model stays and a requested other model is loaded beside
it (at most `max_others`, least recently used evicted).

A request's model name, one rule for every API: the served model's names (--served-model-name,
the --model value, `default_model`) mean it; another name loads as above; a name that cannot
load is a 404, except that a bare name (no path or repo shape: `gpt-4o`, the label an agent
tool sends) means the served model unless --strict-model-names. Anthropic clients send only
their own ids, so /v1/messages maps any such name to the served model (same flag). A LoRA
adapter's name (--lora-modules, lora.py) means the served model with that adapter, first.

--draft-model: the served model's engine drafts with it: mlx-lm's speculative decoding, one
request at a time, or with `--speculative draft` in the batched step beside every other row; a
request's `draft_model` picks it or turns it off (`draft_speculation`).
"""

import collections
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..config import DEFAULT_MODEL_NAME, ServeConfig
from ..engine.arrivals import Arrivals
from ..engine.request import Speculation
from ..model import ModelLoadError
from ..model.resolve import cached_repo, resolve_model
from ..model.vision.load import is_vision_folder
from .budget import hold_to_budget
from .errors import APIError, bad_request
from .loading import (
    ModelFacts,
    build_engine,
    draft_facts,
    draft_names,
    kv_config_of,
    load_draft,
    load_model,
    loaded_as,
)
from .lora import Loras
from .pool import RETRY_S, Entry, Pool, busy
from .pool_specs import ModelSpec, specs_from
from .process import remote_served

log = logging.getLogger("mlxd.serve")

# Names that always mean the served model: mlx-lm's default and Anthropic-shaped ids.
SERVED_ALIASES = ("default_model", "")


@dataclass
class Served:
    """A loaded model as the server uses it."""

    name: str  # the id /v1/models lists
    model: Any  # None where the engine runs in its own process (process/)
    tokenizer: TokenizerWrapper
    engine: Any  # an Engine, or a process/RemoteEngine with the methods the server calls
    context_length: int | None  # max_position_embeddings, when the config says
    facts: ModelFacts
    draft_names: tuple[str, ...] = ()  # the names of its draft model (--draft-model), if any
    draft: Any = None  # that draft model (in this process)
    adapter: str | None = None  # the LoRA adapter its rows run with (lora.py), by name

    @property
    def weight_bytes(self) -> int:
        return self.facts.weight_bytes

    def draft_speculation(self, p: Any, config: Any) -> Speculation | None:
        """mlx_lm.server's `draft_model` field (`p.draft_model`, default "default_model"):
        "default_model" or the served draft's name drafts with it, null turns drafting off,
        another name is a 400. With `speculative` "draft" (the request's or the server's) the
        row drafts in the batched step, `num_draft_tokens` (else --num-speculative-tokens)
        its ceiling; else alone, as mlx_lm.server, `num_draft_tokens` (else
        --num-draft-tokens) a step. Rows the lone path does not run (n > 1, a grammar), a
        prediction (it drafts instead), `speculative` off or ngram go without it."""
        name = p.draft_model
        if name is None:
            return None
        if name != "default_model" and name not in self.draft_names:
            served = f"the served one is {shown(self.draft_names[0])}" if self.draft_names else (
                "none is served with this model")  # fmt: skip
            raise bad_request(f"draft_model {shown(name)} is not served here; {served}",
                              "draft_model")  # fmt: skip
        if not self.draft_names or p.prediction is not None or p.speculative in ("off", "ngram"):
            return None
        if (p.speculative or config.speculative) == "draft":
            k = config.num_speculative_tokens if p.num_draft_tokens is None else p.num_draft_tokens
            return Speculation(mode="model", max_draft=k) if k > 0 else None
        if p.n > 1 or p.constraint is not None:
            return None
        k = config.num_draft_tokens if p.num_draft_tokens is None else p.num_draft_tokens
        return Speculation(mode="draft", max_draft=k)


def context_length(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config", config)
    value = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def served_names(config: ServeConfig, loaded_as: str) -> list[str]:
    """The served model's names, the id /v1/models lists first: --served-model-name's, then
    the name it was loaded by (the --model value, or the embedded model's name)."""
    names = list(config.served_model_name)
    if any(not isinstance(n, str) or not n or "\x00" in n for n in names):
        raise ModelLoadError("--served-model-name: each name is non-empty text")
    return list(dict.fromkeys([*names, loaded_as]))


# A label an agent tool sends (gpt-4o, claude-sonnet-4-5, qwen2.5-coder:7b), not a reference:
# no path or repo shape (no `/` or `\\`, no leading `.` or `~`), at most 128 characters.
_BARE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")


def bare_name(name: str) -> bool:
    return _BARE.fullmatch(name) is not None


def shown(name: str | None, most: int = 100) -> str:
    """A request's name quoted for an error message, cut to `most` characters."""
    text = str(name)
    return repr(text if len(text) <= most else text[:most] + "...")


class ModelProvider:
    """The pool's models (pool.py) loaded as Served, by the name a request gives."""

    def __init__(
        self, config: ServeConfig, max_others: int = 1, scan: Callable[[], list[str]] | None = None
    ) -> None:
        self.config = config = config.resolved()
        self.max_others = max_others  # request-named adapters over a model (`adapters`)
        self._lock = threading.Lock()
        self.kv_config = kv_config_of(config)  # --kv-config: every row's per-layer KV scheme
        # Requests on their way to any engine here (engine/arrivals.py: the join window).
        self.arrivals = Arrivals(config.join_window)
        specs = specs_from(config, scan)
        first = specs[0]
        self.names = served_names(config, first.name or DEFAULT_MODEL_NAME)
        first.name, first.aliases = self.names[0], (*self.names[1:], *first.aliases)
        self.pool = Pool(config, specs, self._load_spec)
        self._default = self.pool.entries[first.name]
        self._fell_back: set[str | None] = set()
        self._others: collections.OrderedDict[tuple, Served] = collections.OrderedDict()
        # once the budget is known to hold the weights (an engine process sets its own)
        self._limit_before = hold_to_budget(config) if config.isolation != "process" else None
        try:
            self.pool.acquire(self._default)  # the default model loads at start-up
        except APIError as e:  # what a request would get: at start-up, the one-line error
            self.close()
            raise ModelLoadError(e.message) from None
        except BaseException:
            self.close()
            raise
        self.loras = Loras(self)  # --lora-modules and the runtime loads (lora.py)

    @property
    def default(self) -> Served:
        """The default model, loaded again if it was unloaded (it is not pinned)."""
        return self.pool.acquire(self._default)

    @default.setter
    def default(self, served: Served) -> None:
        """Put `served` in the default model's place (an embedder's own engine or model)."""
        self._default.served = served

    def _load_spec(self, spec: ModelSpec, held: int) -> Served:
        """Load a pool model (`held`: bytes of weights the other loaded models hold)."""
        default = spec is self._default.spec
        folder = Path(spec.path) if spec.requested and spec.path else None
        adapter = self.config.adapter_path if default else None
        draft = self.config.draft_model if default else None
        served = self._load(spec.path, adapter, folder, held, draft)
        served.name = spec.name
        return served

    def _load(
        self,
        ref: str | None,
        adapter: str | None,
        folder: Path | None = None,
        held: int = 0,
        draft: str | None = None,
    ) -> Served:
        """`draft`: --draft-model's reference, loaded beside it."""
        c = self.config
        folder = folder or resolve_model(ref)
        name = loaded_as(ref)
        if c.isolation == "process" and not is_vision_folder(folder):
            return remote_served(c, name, folder, adapter, held, draft, self.arrivals)
        # A vision model's rows carry arrays (embeddings, mrope state) the engine process's
        # wire does not: its engine runs in the server's process.
        model, tokenizer = load_model(c, folder, adapter)
        engine, facts = build_engine(c, model, tokenizer, folder, adapter, held, self.arrivals)
        served = Served(name, model, tokenizer, engine, context_length(folder), facts)
        if draft is not None:
            try:
                served.draft = load_draft(c, engine, model, tokenizer, draft)
            except BaseException:
                close_served(served)  # its thread and store go with the failed load
                raise
            draft_facts(facts, served.draft, model)
            served.draft_names = draft_names(draft)
        return served

    def serves(self, name: str | None) -> bool:
        """`name` is one of the default model's names or aliases."""
        return name is None or name in SERVED_ALIASES or name in self.names

    def falls_back(self, name: str | None, any_name: bool = False) -> bool:
        """A name nothing loads for still means the default model (the module's rule)."""
        if self.config.strict_model_names or name is None:
            return False
        return any_name or bare_name(name)

    def get(self, name: str | None, adapter: str | None = None, fallback: bool = False) -> Served:
        """The model a request names; raises ModelLoadError when it cannot be loaded and the
        name does not fall back (`fallback`: any name may, Anthropic's ids)."""
        adapter = None if adapter == self.config.adapter_path else adapter
        if adapter is None and self.serves(name):
            return self.default
        if adapter is None and (lora := self.loras.route(name)) is not None:
            return lora  # an adapter's name, before any model or the bare-name fallback
        if adapter is None and (entry := self.pool.find(name)) is not None:
            return self._acquire(entry)
        try:
            return self._other(name, adapter)
        except ModelLoadError:
            if adapter is None and self.falls_back(name, fallback):
                self._note_fallback(name)
                return self.default
            raise

    def _acquire(self, entry: Entry) -> Served:
        """A configured model's load failure is the server's (500), not a name's (404)."""
        try:
            return self.pool.acquire(entry)
        except ModelLoadError as e:
            if entry.spec.requested:
                raise
            raise APIError(500, f"model {shown(entry.name)} failed to load: {e}") from e

    def _note_fallback(self, name: str | None) -> None:
        """One log line per name (bounded): a client's label now means the served model."""
        if name in self._fell_back or len(self._fell_back) >= 256:
            return
        self._fell_back.add(name)
        log.info(
            "model %s is not served here: answering with %s (--strict-model-names refuses)",
            shown(name),
            self._default.name,
        )

    def _other(self, name: str | None, adapter: str | None) -> Served:
        """A model a request names by path or cached repo: it joins the pool, unpinned. With
        an adapter (`adapters`): kept beside the pool, at most `max_others`."""
        ref = None if name in SERVED_ALIASES else name
        folder = self._allowed(ref, adapter)
        if adapter is None and ref is not None:
            path = str(folder) if folder is not None else ref
            with self._lock:
                entry = self.pool.find(ref) or self.pool.add(ModelSpec(ref, path, requested=True))
            try:
                return self.pool.acquire(entry)
            except ModelLoadError:
                self.pool.remove(entry)
                raise
        key = (name, adapter)
        with self._lock:
            if key in self._others:
                self._others.move_to_end(key)
                return self._others[key]
            served = self._load(ref, adapter, folder, self.pool.held())
            self._others[key] = served
            while len(self._others) > self.max_others:
                close_served(self._others.popitem(last=False)[1])
            return served

    def _allowed(self, ref: str | None, adapter: str | None) -> Path | None:
        """Without --allow-model-paths a request may name only the served models, their
        aliases and repos in the local Hugging Face cache (their folder); every other name gets
        the same answer, whatever is on disk. With it: None, and `_load` resolves as mlx-lm does."""
        if self.config.allow_model_paths:
            return None
        if adapter is not None:
            raise ModelLoadError(f"adapter {shown(adapter)} is not served here")
        folder = None if ref is None else cached_repo(ref)
        if folder is None:
            raise ModelLoadError(
                f"model {shown(ref)} is not served here; GET /v1/models lists the models it serves"
            )
        return folder

    def load(self, name: str) -> Served:
        """POST /v1/models/load: a pool model (404 for any other name) loaded now."""
        if self.serves(name):
            return self.default
        if (entry := self.pool.find(name)) is None:
            raise APIError(404, f"model {shown(name)} is not in the pool", param="model",
                           code="model_not_found")  # fmt: skip
        return self._acquire(entry)

    def unload(self, name: str) -> None:
        """POST /v1/models/unload: 404 unknown, 400 pinned, 409 while it runs rows."""
        entry = self._default if self.serves(name) else self.pool.find(name)
        if entry is None:
            raise APIError(404, f"model {shown(name)} is not in the pool", param="model",
                           code="model_not_found")  # fmt: skip
        if entry.spec.pinned:
            raise bad_request(f"model {shown(entry.name)} is pinned: it is never unloaded", "model")
        with self.pool.lock_loads():
            if entry.served is not None and busy(entry.served):
                why = f"model {shown(entry.name)} is running rows; retry once they end"
                retry = {"Retry-After": str(RETRY_S)}
                raise APIError(409, why, param="model", headers=retry)
            self.pool.unload(entry, "request", why="POST /v1/models/unload")

    def loaded(self) -> list[Served]:
        return [e.served for e in self.pool.loaded()] + list(self._others.values())

    def close(self) -> None:
        """Stop the engines, flush the disk tiers' queues and give MLX back its memory limit
        (idempotent)."""
        self.pool.close()
        for served in self.loaded():
            close_served(served)
        if self._limit_before is not None:
            mx.set_memory_limit(self._limit_before)
            self._limit_before = None


def close_served(served: Served) -> None:
    served.engine.close()
    if (sharing := served.engine.sharing) is not None and not sharing.store.closed:
        sharing.store.close()
        log.info("%s: prefix store closed, %s", served.name, sharing.store.stats())


__all__ = ["ModelLoadError", "ModelProvider", "Served"]
