"""The served model and its engine; other models named by requests, loaded on demand.

mlx_lm.server swaps its one model for whatever a request names. Agents sharing a server must
not evict each other, so the served model stays and a requested other model is loaded beside
it (at most `max_others`, least recently used evicted); a name that cannot load is a 404.
"""

import collections
import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..engine import Engine, step_order
from ..engine.arrivals import Arrivals
from ..engine.batch import BatchConfig
from ..engine.batch_prompt import clears_cache
from ..engine.gil import step_phases
from ..engine.prompt_waves import wave_budget
from ..kv import additive_mask, mixed
from ..kv.schemes import unsupported
from ..model import ModelLoadError, load
from ..model.default import DEFAULT_MODEL_NAME
from ..model.folded_attention import is_folded, is_fused
from ..model.folded_attention import unsupported as unfoldable
from ..model.fused_projections import stack_in_place
from ..model.resolve import resolve_model
from .budget import hold_to_budget, kv_budget_from
from .store import make_store

log = logging.getLogger("mlxd.serve")

# Names that always mean the served model: mlx-lm's default and Anthropic-shaped ids.
SERVED_ALIASES = ("default_model", "")


@dataclass
class Served:
    """A loaded model as the server uses it."""

    name: str  # the id /v1/models lists
    model: Any
    tokenizer: TokenizerWrapper
    engine: Engine
    context_length: int | None  # max_position_embeddings, when the config says
    weight_bytes: int


def _context_length(folder: Path) -> int | None:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config", config)
    value = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


class ModelProvider:
    def __init__(self, args: Any, max_others: int = 1) -> None:
        self.args = args
        self.max_others = max_others
        self._lock = threading.Lock()
        # Requests on their way to any engine here (engine/arrivals.py: the join window).
        # MLXD_JOIN_EXPECT=0: replies that ended do not hold a wave; MLXD_JOIN_LEAD=0: a long
        # prompt the store lacks is held with the rest (each the A/B's other side).
        expect = os.environ.get("MLXD_JOIN_EXPECT", "1") != "0"
        lead = os.environ.get("MLXD_JOIN_LEAD", "1") != "0"
        self.arrivals = Arrivals(getattr(args, "join_window", 0.0), expect, lead)
        self.default = self._load(args.model, args.adapter_path)
        self._limit_before = hold_to_budget(args)  # once the budget is known to hold the weights
        self._others: collections.OrderedDict[tuple, Served] = collections.OrderedDict()

    def _tokenizer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"trust_remote_code": True} if self.args.trust_remote_code else {}
        if self.args.chat_template:
            config["chat_template"] = self.args.chat_template
        return config

    def _load(self, ref: str | None, adapter: str | None) -> Served:
        folder = resolve_model(ref)
        model, tokenizer = load(
            str(folder),
            tokenizer_config=self._tokenizer_config(),
            adapter_path=adapter,
            trust_remote_code=self.args.trust_remote_code,
        )[:2]
        if self.args.use_default_chat_template and tokenizer.chat_template is None:
            tokenizer.chat_template = tokenizer.default_chat_template
        a = self.args
        window = getattr(a, "max_kv_size", None)
        if (kv_config := getattr(a, "kv_config", None)) is not None:
            try:
                mixed.check(model, kv_config, window)
            except ValueError as e:
                raise ModelLoadError(f"{folder}: --kv-config: {e}") from e
        # Sliding-window layers are quantized too (quantize_windows): only a kv_config naming
        # a layer that holds no keys and values is refused.
        if (why := unsupported(model, kv_config, window)) is not None:
            raise ModelLoadError(f"{folder}: {why}")
        if is_folded(a.batched_attention) and (why := unfoldable(model, a.batched_attention)):
            raise ModelLoadError(f"{folder}: {why}")
        weights = 0
        if is_fused(a.batched_attention) or a.decode_step == "rows+fused":
            weights += stack_in_place(model)  # before any engine holds those weights; copies
            # only where a layer's slice of a stack would start off MLX's alignment
        weights += sum(v.nbytes for _, v in tree_flatten(model.parameters()))
        kv_budget = kv_budget_from(a, weights)
        store, namespace = make_store(a, folder, adapter, kv_budget)
        engine = Engine(
            model,
            batch=a.batch,
            max_queue=a.max_queue,
            prefill_step_size=a.prefill_step_size,
            tokenizer=tokenizer,
            kv_budget=kv_budget,
            batch_config=BatchConfig(
                a.batch,
                min(a.batch, a.prompt_concurrency),
                a.prefill_step_size,
                attention=a.batched_attention,
                clear_cache=clears_cache(a.prefill_clear_cache),
                decode_rows=a.decode_step != "mlx",
                decode_fused=a.decode_step == "rows+fused",
                batch_sampling={"on": True, "off": False}.get(a.batched_sampling),
                prefill_tokens=wave_budget(
                    a.prefill_batch_tokens, min(a.batch, a.prompt_concurrency), a.prefill_step_size
                ),
                phases=step_phases(getattr(a, "switch_interval", None)),
                step_order=step_order.resolved(getattr(a, "step_order", None)),
                split_fraction=step_order.split_fraction(),
                thread_rows=step_order.thread_rows(),
                additive_mask=additive_mask.enabled(),
            ),
            prefix_store=store,
            namespace=namespace,
            arrivals=self.arrivals,
        )
        if a.kv_bits is not None:
            engine.announce_scheme(a.kv_bits, a.kv_group_size)
        name = ref if ref is not None else DEFAULT_MODEL_NAME
        ctx = _context_length(folder)
        return Served(name, model, tokenizer, engine, ctx, weights)

    def get(self, name: str | None, adapter: str | None = None, fallback: bool = False) -> Served:
        """The model a request names; raises ModelLoadError when it cannot be loaded, unless
        `fallback` (Anthropic clients send their own model ids): then the served model."""
        d = self.default
        adapter = None if adapter == self.args.adapter_path else adapter
        if adapter is None and (name is None or name in SERVED_ALIASES or name == d.name):
            return d
        try:
            return self._other(name, adapter)
        except ModelLoadError:
            if fallback and adapter is None:
                return d
            raise

    def _other(self, name: str | None, adapter: str | None) -> Served:
        key = (name, adapter)
        with self._lock:
            if key in self._others:
                self._others.move_to_end(key)
                return self._others[key]
            served = self._load(None if name in SERVED_ALIASES else name, adapter)
            self._others[key] = served
            while len(self._others) > self.max_others:
                _, old = self._others.popitem(last=False)
                old.engine.close()
                if old.engine.sharing is not None:
                    old.engine.sharing.store.close()
            return served

    def loaded(self) -> list[Served]:
        return [self.default, *self._others.values()]

    def close(self) -> None:
        """Stop the engines, flush the disk tiers' queues and give MLX back its memory limit
        (idempotent)."""
        for served in self.loaded():
            served.engine.close()
            if (sharing := served.engine.sharing) is not None and not sharing.store.closed:
                sharing.store.close()
                log.info("%s: prefix store closed, %s", served.name, sharing.store.stats())
        if self._limit_before is not None:
            mx.set_memory_limit(self._limit_before)
            self._limit_before = None


__all__ = ["ModelLoadError", "ModelProvider", "Served"]
