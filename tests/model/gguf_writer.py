"""Tiny random-weight models, saved both as an MLX folder and as a GGUF in llama.cpp's layout.

The GGUF side follows llama.cpp's convert_hf_to_gguf independently of mlxd: tensor names come
from gguf-py's own TensorNameMap, llama q/k rows get llama.cpp's `permute`, Gemma norms get + 1.
"""

import json
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"),
          ("Ġw", "or"), ("l", "d"), ("Ġwor", "ld")]  # fmt: skip
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"  # noqa: E501
)
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3"}
HPARAMS = {
    "add_block_count": "num_hidden_layers",
    "add_context_length": "max_position_embeddings",
    "add_embedding_length": "hidden_size",
    "add_feed_forward_length": "intermediate_size",
    "add_head_count": "num_attention_heads",
    "add_head_count_kv": "num_key_value_heads",
    "add_rope_freq_base": "rope_theta",
    "add_layer_norm_rms_eps": "rms_norm_eps",
    "add_key_length": "head_dim",
    "add_value_length": "head_dim",
}
_BASE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 256,  # one K-quant super-block (256) per ffn_down row
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 512,
}


def byte_level_vocab() -> list[str]:
    """3 specials, the 256 byte-level symbols, then one token per merge: a 268-token BPE."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return SPECIALS + list(bytes_to_unicode().values()) + ["".join(m) for m in MERGES]


def tiny_config(model_type: str) -> dict:
    cfg = dict(_BASE, model_type=model_type, vocab_size=len(byte_level_vocab()))
    cfg.update(rope_theta=10000.0, tie_word_embeddings=model_type != "qwen3", eos_token_id=2)
    if model_type == "gemma3_text":
        # llama.cpp hard-codes the pattern 6 and local base 10000; 6 layers so one is global.
        cfg.update(num_hidden_layers=6, rms_norm_eps=1e-6, rope_theta=1_000_000.0)
        cfg.update(sliding_window=8, sliding_window_pattern=6, query_pre_attn_scalar=16)
        cfg.update(rope_local_base_freq=10000.0)
    return cfg


def random_weights(config: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Every parameter of the mlx-lm model, float32. Norms are multiples of 2^-8 in [-0.5, 0.5]
    so Gemma's 1 + w (in the GGUF) minus 1 gives w back exactly."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in tree_flatten(model.parameters()):
        if name == "lm_head.weight" and config["tie_word_embeddings"]:
            continue  # gemma3_text builds lm_head and drops it in sanitize when tied
        if "norm" in name:
            out[name] = np.round(rng.uniform(-0.5, 0.5, p.shape) * 256).astype(np.float32) / 256
        else:
            out[name] = rng.normal(0.0, 0.5, p.shape).astype(np.float32)
    return out


def hf_tokenizer() -> Tokenizer:
    vocab = {t: i for i, t in enumerate(byte_level_vocab())}
    tok = Tokenizer(models.BPE(vocab, MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok


def save_mlx_folder(folder: Path, config: dict, weights: dict[str, np.ndarray]) -> Path:
    """The reference model: what mlx-lm would load had there never been a GGUF."""
    folder.mkdir(parents=True)
    mx.save_safetensors(
        str(folder / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()}
    )
    (folder / "config.json").write_text(json.dumps(config))
    hf_tokenizer().save(str(folder / "tokenizer.json"))
    tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "bos_token": "<|im_start|>", "chat_template": CHAT_TEMPLATE}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return folder


def llama_cpp_permute(w: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.permute, verbatim in behaviour."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def llama3_rope_factors(config: dict) -> np.ndarray:
    """convert_hf_to_gguf.LlamaModel.generate_extra_tensors: Llama 3's `rope_freqs` tensor."""
    rs, dim = config["rope_scaling"], config["head_dim"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    old_ctx = rs["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def random_kquant(rows: int, cols: int, qtype: Q, seed: int = 0) -> np.ndarray:
    """Random but valid K-quant blocks (gguf-py cannot quantize to K types): random payload
    bytes, with the fp16 super-block scales set to sane values instead of random NaNs."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = rng.uniform(1e-3, 1e-2, (rows, cols // block, 1)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:  # d, dmin, 12 scale bytes, 128 nibble bytes
        raw[..., 0:2], raw[..., 2:4] = d, d
    elif qtype == Q.Q6_K:  # 128 ql, 64 qh, 16 int8 scales, then d
        raw[..., 208:210] = d
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, -1)


def write_gguf(
    path: Path,
    config: dict,
    weights: dict[str, np.ndarray],
    qtypes: dict[str, Q] | None = None,
    raw: dict[str, tuple[np.ndarray, Q]] | None = None,
    arch: str | None = None,
) -> Path:
    """A GGUF as llama.cpp writes it. `qtypes`: quantize these tensors with gguf-py; `raw`:
    store these pre-made blocks as-is (their float twin in `weights` must be their dequant)."""
    qtypes, raw = qtypes or {}, raw or {}
    arch = arch or GGUF_ARCH[config["model_type"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    for method, key in HPARAMS.items():  # the keys TextModel.set_gguf_parameters writes
        getattr(w, method)(config[key])
    if arch == "llama":
        w.add_vocab_size(config["vocab_size"])
        w.add_rope_dimension_count(config["head_dim"])
    if arch == "gemma3":
        w.add_sliding_window(config["sliding_window"])
    tokens = byte_level_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    names = gguf.get_tensor_name_map(arch_id, config["num_hidden_layers"])
    for hf_name, value in weights.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        if hf_name in raw:
            data, qtype = raw[hf_name]
            w.add_tensor(name, data, raw_dtype=qtype)
            continue
        data = value
        if arch == "llama" and ".attn_q." in name:
            data = llama_cpp_permute(data, config["num_attention_heads"])
        elif arch == "llama" and ".attn_k." in name:
            data = llama_cpp_permute(
                data, config["num_attention_heads"], config["num_key_value_heads"]
            )
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # Gemma3Model.modify_tensors: norm_shift
        qtype = qtypes.get(hf_name, Q.F32)
        if qtype == Q.F32:
            w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    if arch == "llama" and config.get("rope_scaling", {}).get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
