"""Rebuild tokenizer.json / tokenizer_config.json from a GGUF's `tokenizer.*` metadata.

The vocabulary builders are transformers' own (torch-free); we only assemble their input, patch
the pre-tokenizers they do not know, and write the special-token settings mlx-lm reads.
"""

from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, pre_tokenizers, processors

from ..errors import ModelLoadError

CONTROL = 3  # llama.cpp token type of special tokens
# Texts llama.cpp treats as end-of-generation when they are control tokens (llama-vocab.cpp).
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
    "<EOT>", "<|end_of_text|>", "<|return|>", "<|call|>",
}  # fmt: skip


def _smollm_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """SmolLM's tokenizer.json: digits one by one, then GPT-2 byte-level splitting."""
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )


SPECIAL_TOKENS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}
PRE_TOKENIZERS = {"smollm": _smollm_pre_tokenizer}


def _id(md: dict[str, Any], key: str) -> int | None:
    idx = md.get(f"tokenizer.ggml.{key}")
    return idx if isinstance(idx, int) and 0 <= idx < len(md["tokenizer.ggml.tokens"]) else None


def _token(md: dict[str, Any], key: str) -> str | None:
    idx = _id(md, key)
    return None if idx is None else md["tokenizer.ggml.tokens"][idx]


def add_bos(md: dict[str, Any]) -> bool:
    # llama.cpp adds BOS to sentencepiece vocabularies unless the file says otherwise.
    default = md.get("tokenizer.ggml.model") == "llama"
    return bool(md.get("tokenizer.ggml.add_bos_token", default))


def eos_token_ids(md: dict[str, Any]) -> list[int]:
    """EOS first, then every other token llama.cpp would stop on (e.g. `<end_of_turn>`)."""
    keys = [f"tokenizer.ggml.{k}" for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    ids = [md[k] for k in keys if isinstance(md.get(k), int)]
    types = md.get("tokenizer.ggml.token_type") or []
    for i, (text, kind) in enumerate(zip(md["tokenizer.ggml.tokens"], types, strict=False)):
        if kind == CONTROL and text in EOG_TEXTS:
            ids.append(i)
    return list(dict.fromkeys(ids))


def _post_processor(md: dict[str, Any]) -> processors.TemplateProcessing:
    """BOS/EOS insertion as the file asks, like transformers' own `update_post_processor`."""
    tokens = md["tokenizer.ggml.tokens"]
    bos = _id(md, "bos_token_id") if add_bos(md) else None
    eos = _id(md, "eos_token_id") if md.get("tokenizer.ggml.add_eos_token") else None

    def seq(x: str, type_id: int) -> str:
        parts = [tokens[bos]] if bos is not None else []
        parts.append(x)
        parts += [tokens[eos]] if eos is not None else []
        return " ".join(f"{p}:{type_id}" for p in parts)

    special = [(tokens[i], i) for i in dict.fromkeys((bos, eos)) if i is not None]
    return processors.TemplateProcessing(
        single=seq("$A", 0), pair=f"{seq('$A', 0)} {seq('$B', 1)}", special_tokens=special
    )


def build_tokenizer(path: Path, arch_name: str, md: dict[str, Any]) -> Tokenizer:
    # Imported here: transformers is heavy, and only conversion needs it.
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    if "tokenizer.ggml.tokens" not in md:
        raise ModelLoadError(f"{path}: GGUF has no tokenizer (tokenizer.ggml.tokens missing)")
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    spec = {new: md[f"tokenizer.{old}"] for old, new in renames.items() if f"tokenizer.{old}" in md}
    try:
        tokenizer, _ = convert_gguf_tokenizer(arch_name, spec)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path}: cannot rebuild the tokenizer ({e})") from e
    if (pre := PRE_TOKENIZERS.get(md.get("tokenizer.ggml.pre", ""))) is not None:
        tokenizer.pre_tokenizer = pre()
    tokenizer.post_processor = _post_processor(md)
    return tokenizer


def tokenizer_config(md: dict[str, Any], max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: special tokens, BOS/EOS policy and the chat template."""
    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos(md),
        "add_eos_token": bool(md.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for name, key in SPECIAL_TOKENS.items():
        if (text := _token(md, key)) is not None:
            cfg[name] = text
    if template := md.get("tokenizer.chat_template"):
        cfg["chat_template"] = template
    return cfg
