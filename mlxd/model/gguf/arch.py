"""Per-architecture knowledge: GGUF metadata → mlx-lm config.json, GGUF tensor names → the
weight names mlx-lm's llama / qwen2 / qwen3 / gemma3_text modules expect.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from .tensors import Transform


@dataclass(frozen=True)
class Arch:
    model_type: str  # mlx-lm module name
    gpu_dtype: str  # the checkpoint's native float type, used off-CPU
    permute_qk: bool = False  # llama.cpp permuted q/k rows for its rope layout
    norm_shift: float = 0.0  # llama.cpp stored Gemma's RMSNorm weight as 1 + w
    layer_names: dict[str, str] = field(default_factory=dict)  # overrides of LAYER_NAMES


LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GEMMA3_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",  # Gemma 3 has four norms per block
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
ARCHS = {
    "llama": Arch("llama", "float16", permute_qk=True),
    "mistral": Arch("llama", "float16", permute_qk=True),  # llama layout under another name
    "qwen2": Arch("qwen2", "float16"),
    "qwen3": Arch("qwen3", "float16"),
    "gemma3": Arch("gemma3_text", "bfloat16", norm_shift=1.0, layer_names=GEMMA3_NAMES),
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
SKIPPED = {"rope_freqs.weight"}  # llama 3 rope factors: recomputed from config by mlx-lm
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def get_arch(path: Path, metadata: dict[str, Any]) -> tuple[str, Arch]:
    name = metadata.get("general.architecture")
    if name not in ARCHS:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {name!r} "
            f"(supported: {', '.join(sorted(ARCHS))})"
        )
    return name, ARCHS[name]


def map_tensor(name: str, arch: Arch, config: dict[str, Any]) -> tuple[str, Transform] | None:
    """The MLX weight name and transform for a GGUF tensor; None to drop it; KeyError if unknown."""
    if name in SKIPPED:
        return None
    stem, _, kind = name.rpartition(".")
    if stem in TOP_NAMES:
        module, layer_key = TOP_NAMES[stem], stem
    elif m := _BLOCK.fullmatch(name):
        layer_key = m.group(2)
        local = arch.layer_names.get(layer_key) or LAYER_NAMES[layer_key]
        module = f"model.layers.{m.group(1)}.{local}"
    else:
        raise KeyError(name)
    heads = 0
    if arch.permute_qk and layer_key in ("attn_q", "attn_k"):
        heads = (
            config["num_attention_heads"]
            if layer_key == "attn_q"
            else config["num_key_value_heads"]
        )
    shift = arch.norm_shift if layer_key.endswith("norm") else 0.0
    return f"{module}.{kind}", Transform(unpermute_heads=heads, norm_shift=shift)


def _nice(x: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(x)))


def _rope_scaling(md: dict[str, Any], a: str) -> dict[str, Any] | None:
    kind = md.get(f"{a}.rope.scaling.type")
    factor = md.get(f"{a}.rope.scaling.factor")
    if kind in (None, "none") or not factor:
        return None
    scaling: dict[str, Any] = {"type": kind, "rope_type": kind, "factor": _nice(factor)}
    if (orig := md.get(f"{a}.rope.scaling.original_context_length")) is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    return scaling


def llama3_rope_scaling(freqs: np.ndarray, head_dim: int, theta: float, ctx: int) -> dict | None:
    """Recover Llama 3's rope_scaling from llama.cpp's `rope_freqs` tensor (it stores the
    per-frequency divisors, mlx-lm recomputes them from these four numbers)."""
    factor = float(freqs.max())
    for low, high, orig in ((1.0, 4.0, 8192), (1.0, 4.0, ctx)):
        wavelen = 2 * np.pi * theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
        lo_wl, hi_wl = orig / low, orig / high
        smooth = (orig / wavelen - low) / (high - low)
        mid = 1.0 / ((1 - smooth) / factor + smooth)
        want = np.where(wavelen < hi_wl, 1.0, np.where(wavelen > lo_wl, factor, mid))
        if want.shape == freqs.shape and np.allclose(want, freqs, rtol=1e-4):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": int(orig),
            }
    return None


def build_config(arch_name: str, arch: Arch, md: dict[str, Any], vocab_size: int) -> dict:
    """config.json for mlx-lm (without tie/eos/quantization, which need the tensors)."""
    a = arch_name

    def req(key: str) -> Any:
        if f"{a}.{key}" not in md:
            raise KeyError(f"{a}.{key}")
        return md[f"{a}.{key}"]

    hidden, heads = int(req("embedding_length")), int(req("attention.head_count"))
    ffn = req("feed_forward_length")
    cfg: dict[str, Any] = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(req("block_count")),
        "intermediate_size": int(ffn if not isinstance(ffn, list) else max(ffn)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(md.get(f"{a}.attention.head_count_kv", heads)),
        "head_dim": int(md.get(f"{a}.attention.key_length", hidden // heads)),
        "rms_norm_eps": _nice(req("attention.layer_norm_rms_epsilon")),
        "vocab_size": vocab_size,
        "max_position_embeddings": int(md.get(f"{a}.context_length", 4096)),
    }
    if (theta := md.get(f"{a}.rope.freq_base")) is not None:
        cfg["rope_theta"] = _nice(theta)
    if scaling := _rope_scaling(md, a):
        cfg["rope_scaling"] = scaling
    if arch.model_type == "gemma3_text":
        cfg.update(_gemma3_extras(md, a, cfg))
    elif (window := md.get(f"{a}.attention.sliding_window")) is not None:
        cfg["sliding_window"] = int(window)
    return cfg


def _gemma3_extras(md: dict[str, Any], a: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """What llama.cpp hard-codes for Gemma 3 rather than storing (see its llama-model.cpp)."""
    pattern = md.get(f"{a}.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per-layer "is sliding" flags: the period is the first global
        pattern = next((i + 1 for i, sliding in enumerate(pattern) if not sliding), len(pattern))
    # Gemma 3 27B scales queries by hidden/heads, the other sizes by head_dim.
    is_27b = cfg["num_hidden_layers"] == 62
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if is_27b else cfg["head_dim"]
    return {
        "sliding_window": int(md.get(f"{a}.attention.sliding_window", 512)),
        "sliding_window_pattern": int(pattern),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": scalar,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": cfg.get("rope_theta", 1_000_000.0),
    }
