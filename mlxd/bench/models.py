"""What the bench runs on: random-weight models from real architectures' configs (no files,
no tokenizer) or a real model reference, plus fixed-seed random token prompts."""

import random
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import _get_classes

_QWEN3 = dict(
    model_type="qwen3",
    vocab_size=151936,
    head_dim=128,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    bos_token_id=151643,  # the Qwen3 tokenizer's, for bench/probes/random_model.py's folders
    eos_token_id=151645,
)
_LLAMA3 = dict(
    model_type="llama",
    vocab_size=128256,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    max_position_embeddings=131072,
)
_LLAMA3_ROPE = dict(
    rope_type="llama3",
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)

# The published config.json values that set the work per token (same as the anchors script).
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        _QWEN3,
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        intermediate_size=3072,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        _QWEN3,
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=12288,
        tie_word_embeddings=False,
    ),
    "llama-1b": dict(
        _LLAMA3,
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        tie_word_embeddings=True,
        rope_scaling=dict(_LLAMA3_ROPE, factor=32.0),
    ),
    "llama-8b": dict(
        _LLAMA3,
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=14336,
        tie_word_embeddings=False,
        rope_scaling=dict(_LLAMA3_ROPE, factor=8.0),
    ),
    # Qwen3-0.6B's graph (28 layers, same ops) at tiny widths: the host's per-step work
    # dominates, as it does for 0.6B on a GPU. For profiling the host side on a CPU machine.
    "qwen3-host": dict(
        _QWEN3,
        vocab_size=1024,
        hidden_size=64,
        head_dim=16,
        num_hidden_layers=28,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    ),
    # Small enough for a 2-core CI box.
    "tiny": dict(
        _LLAMA3,
        vocab_size=32000,
        hidden_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        intermediate_size=1536,
        tie_word_embeddings=True,
    ),
}
# Gemma 3 1B and Phi-4-mini (phi3 blocks: fused q/k/v and gate/up, 3/4 of each head rotated,
# longrope; the factors' values do not change the work), for the other rows-step families.
SHAPES["gemma3-1b"] = dict(
    model_type="gemma3_text",
    vocab_size=262144,
    hidden_size=1152,
    num_hidden_layers=26,
    intermediate_size=6912,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    rope_local_base_freq=10000.0,
    sliding_window=512,
    sliding_window_pattern=6,
    max_position_embeddings=32768,
)
SHAPES["phi4-mini"] = dict(
    model_type="phi3",
    vocab_size=200064,
    hidden_size=3072,
    num_hidden_layers=32,
    intermediate_size=8192,
    num_attention_heads=24,
    num_key_value_heads=8,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    partial_rotary_factor=0.75,
    max_position_embeddings=131072,
    original_max_position_embeddings=4096,
    rope_scaling=dict(type="longrope", short_factor=[1.0] * 48, long_factor=[1.0] * 48),
    tie_word_embeddings=True,
)
# Their graphs at tiny widths, host-bound on a CPU (as qwen3-host is for Qwen3-0.6B).
_HOST = dict(vocab_size=1024, hidden_size=64, num_attention_heads=4, intermediate_size=128)
SHAPES["gemma3-host"] = dict(
    SHAPES["gemma3-1b"], **_HOST, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16
)
SHAPES["phi4-host"] = dict(
    SHAPES["phi4-mini"],
    **_HOST,
    num_key_value_heads=2,
    rope_scaling=dict(type="longrope", short_factor=[1.0] * 6, long_factor=[1.0] * 6),
)
# Qwen3-0.6B without grouped-query attention (16 KV heads), to tell a GQA-specific kernel gap
# from a general one (docs/benchmarks.md, KV schemes on the H200).
SHAPES["qwen3-0.6b-mha"] = dict(SHAPES["qwen3-0.6b"], num_key_value_heads=16)

# Default init + tied head makes greedy decoding repeat one id forever; a gain on the residual
# branches' outputs varies the tokens (so the identical-tokens check compares real work).
_RESIDUAL_OUT = ("o_proj.weight", "down_proj.weight")
_RESIDUAL_GAIN = 4.0


@dataclass
class BenchModel:
    name: str
    model: nn.Module
    tokenizer: TokenizerWrapper
    vocab_size: int
    dtype: str
    param_bytes: int


class _NullDetokenizer:
    """Random shapes have no tokenizer: a detokenizer that does nothing, the same on both sides."""

    last_segment = ""
    text = ""

    def reset(self) -> None:
        self.tokens: list[int] = []

    def add_token(self, token: int) -> None:
        pass

    def finalize(self) -> None:
        pass


class NullTokenizer(TokenizerWrapper):
    """Enough of TokenizerWrapper for stream_generate over token prompts: no EOS, no text."""

    def __init__(self) -> None:
        self._tokenizer = None
        self._detokenizer = _NullDetokenizer()
        self._eos_token_ids: set[int] = set()

    @property
    def bos_token(self) -> None:
        return None


def build_random(shape: str, dtype: str, seed: int = 0) -> BenchModel:
    config = dict(SHAPES[shape])
    model_cls, args_cls = _get_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))

    def gain(path: str, x: mx.array) -> mx.array:
        return x * _RESIDUAL_GAIN if path.endswith(_RESIDUAL_OUT) else x

    model.update(tree_map_with_path(gain, model.parameters()))
    # Lazy: the float32 init, the gain and the cast fuse at eval (no full fp32 copy in memory).
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return BenchModel(
        shape, model, NullTokenizer(), config["vocab_size"], dtype, _param_bytes(model)
    )


def load_ref(ref: str, dtype: str | None) -> BenchModel:
    """A real model (anything `mlxd.load` takes); EOS is ignored so every run makes M tokens."""
    from ..model import load

    model, tokenizer = load(ref)
    if dtype is not None:
        model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    tokenizer.eos_token_ids = []
    vocab = min(len(tokenizer), model.args.vocab_size)
    name_dtype = dtype or str(next(v for _, v in tree_flatten(model.parameters())).dtype)
    return BenchModel(ref, model, tokenizer, vocab, name_dtype, _param_bytes(model))


def _param_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def random_prompts(vocab_size: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """`n` prompts of `length` uniform token ids, the same for a given seed on every machine."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(length)] for _ in range(n)]
