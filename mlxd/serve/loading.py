"""Load a model, its tokenizer and its engine as the server serves them (`Served`): in the
server's process (`--isolation off`), or in an engine process (process/child.py)."""

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlx.utils import tree_flatten
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..config import DEFAULT_MODEL_NAME, ServeConfig
from ..engine import Engine
from ..engine.arrivals import Arrivals
from ..engine.embed import vocab_size
from ..engine.speculate.draft_model import draft_refusal
from ..kv import mixed
from ..kv.schemes import unsupported
from ..model import ModelLoadError, load
from ..model.folded_attention import is_folded, is_fused
from ..model.folded_attention import unsupported as unfoldable
from ..model.fused_projections import stack_in_place
from ..model.resolve import resolve_model
from ..model.vision.api import tokenizer_of
from ..model.vision.model import VisionModel
from .budget import kv_budget_from, make_store
from .speculation import model_refusal

log = logging.getLogger("mlxd.serve")


@dataclass
class ModelFacts:
    """What the server checks requests against without touching the model (it may live in
    another process): plain values, sent once when an engine process is ready."""

    weight_bytes: int
    vocab: int | None = None  # the config's vocab_size (token ids a request may name)
    embed_vocab: int = 0  # rows of the embedding table (the embeddings endpoint's ids)
    spec_refusal: str | None = None  # why no row may draft on this model (None: rows may)
    draft_refusal: str | None = None  # why its draft model cannot draft in the batched step
    takes_images: bool = False  # a vision-language model: requests may carry images


def tokenizer_config(config: ServeConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"trust_remote_code": True} if config.trust_remote_code else {}
    if config.chat_template:
        out["chat_template"] = config.chat_template
    return out


def load_model(config: ServeConfig, folder: Path, adapter: str | None) -> tuple[Any, Any]:
    """The model and tokenizer, checked against the server's KV and attention settings."""
    c = config
    model, tokenizer = load(
        str(folder),
        tokenizer_config=tokenizer_config(c),
        adapter_path=adapter,
        trust_remote_code=c.trust_remote_code,
    )[:2]
    if isinstance(model, VisionModel):  # (model, mlx-vlm's processor): the server's tokenizer
        model.processor, tokenizer = tokenizer, tokenizer_of(tokenizer)  # is mlx-lm's wrapper
    if c.use_default_chat_template and tokenizer.chat_template is None:
        tokenizer.chat_template = tokenizer.default_chat_template
    kv_config = kv_config_of(c)
    if kv_config is not None:
        try:
            mixed.check(model, kv_config, c.engine.max_kv_size)
        except ValueError as e:
            raise ModelLoadError(f"{folder}: --kv-config: {e}") from e
    # Sliding-window layers are quantized too (quantize_windows): only a kv_config naming
    # a layer that holds no keys and values is refused.
    if (why := unsupported(model, kv_config, c.engine.max_kv_size)) is not None:
        raise ModelLoadError(f"{folder}: {why}")
    if is_folded(c.engine.attention) and (why := unfoldable(model, c.engine.attention)):
        raise ModelLoadError(f"{folder}: {why}")
    return model, tokenizer


def kv_config_of(config: ServeConfig) -> Any:
    """--kv-config: every row's per-layer KV scheme (kv.mixed.MixedKV), or None."""
    try:
        return mixed.from_flags(config.kv_config, config.kv_bits)
    except ValueError as e:
        raise ModelLoadError(str(e)) from e


def build_engine(
    config: ServeConfig,
    model: Any,
    tokenizer: TokenizerWrapper,
    folder: Path,
    adapter: str | None,
    held: int,
    arrivals: Arrivals,
) -> tuple[Engine, ModelFacts]:
    """The model's engine, its KV budget what every loaded model's weights (`held`: the
    others') leave of --memory-budget, and the facts the server checks requests with."""
    c = config
    weights = 0
    if is_fused(c.engine.attention) or c.engine.decode_fused:
        weights += stack_in_place(model)  # before any engine holds those weights; copies
        # only where a layer's slice of a stack would start off MLX's alignment
    weights += sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    kv_budget = kv_budget_from(c, weights + held)
    store, namespace = make_store(c, folder, adapter, kv_budget)
    engine = Engine(
        model,
        config=replace(c.engine, kv_budget=kv_budget),
        tokenizer=tokenizer,
        prefix_store=store,
        namespace=namespace,
        arrivals=arrivals,
    )
    if c.kv_bits is not None:
        engine.announce_scheme(c.kv_bits, c.kv_group_size)
    args = getattr(model, "args", None)
    facts = ModelFacts(
        weight_bytes=weights,
        vocab=args.vocab_size if args is not None and hasattr(args, "vocab_size") else None,
        embed_vocab=vocab_size(model, tokenizer),
        spec_refusal="speculative decoding does not run on vision models"
        if isinstance(model, VisionModel)
        else model_refusal(model),
        takes_images=isinstance(model, VisionModel),
    )
    return engine, facts


def load_draft(config: ServeConfig, engine: Engine, model: Any, tokenizer: Any, ref: str) -> Any:
    """--draft-model, loaded as the model is (same errors), given to `engine`; mlx_lm.server's
    warning when the vocabularies differ. Returns the draft model."""
    folder = resolve_model(ref)
    draft, draft_tok = load(str(folder), tokenizer_config=tokenizer_config(config),
                            trust_remote_code=config.trust_remote_code)[:2]  # fmt: skip
    if draft_tok.vocab_size != tokenizer.vocab_size:
        log.warning("Draft model tokenizer does not match model tokenizer. "
                    "Speculative decoding may not work as expected.")  # fmt: skip
    engine.use_draft(draft)
    return draft


def draft_facts(facts: ModelFacts, draft: Any, model: Any) -> None:
    facts.draft_refusal = draft_refusal(draft, model)


def draft_names(ref: str) -> tuple[str, ...]:
    """The names a request's `draft_model` may give the served draft."""
    return tuple(dict.fromkeys([ref, str(resolve_model(ref))]))


def load_tokenizer_only(config: ServeConfig, folder: Path) -> TokenizerWrapper:
    """The tokenizer `load` gives for `folder`, without the weights (an engine process holds
    those): mlx-lm's load_tokenizer with the config's eos ids."""
    from mlx_lm.utils import load_tokenizer

    model_config = json.loads((folder / "config.json").read_text())
    tokenizer = load_tokenizer(folder, tokenizer_config(config),
                               eos_token_ids=model_config.get("eos_token_id"))  # fmt: skip
    if config.use_default_chat_template and tokenizer.chat_template is None:
        tokenizer.chat_template = tokenizer.default_chat_template
    return tokenizer


def loaded_as(ref: str | None) -> str:
    return ref if ref is not None else DEFAULT_MODEL_NAME
