"""Write the converted folder: weights (sharded safetensors), config.json, tokenizer files."""

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from tqdm import tqdm

from ..errors import ModelLoadError
from .arch import Arch, build_config, llama3_rope_scaling, map_tensor
from .reader import GGUFFile, TensorInfo
from .tensors import GROUP_SIZE, convert_tensor, is_supported
from .tokenizer import build_tokenizer, eos_token_ids, tokenizer_config

SHARD_BYTES = 5 << 30  # mlx-lm's own shard size


def _plan(gf: GGUFFile, arch_name: str, arch: Arch, cfg: dict) -> list[tuple]:
    """Check every tensor before converting any, so a bad file fails fast and names the tensor."""
    plan = []
    for name, info in gf.tensors.items():
        if not is_supported(info.ggml_type):
            raise ModelLoadError(
                f"{gf.path}: tensor {name!r} has unsupported quant type {info.type_name}"
            )
        try:
            mapped = map_tensor(name, arch, cfg)
        except KeyError:
            raise ModelLoadError(
                f"{gf.path}: unexpected tensor {name!r} for architecture {arch_name!r}"
            ) from None
        if mapped is not None:
            plan.append((info, *mapped))
    return plan


def _rope_freqs(gf: GGUFFile, info: TensorInfo, cfg: dict) -> None:
    """Llama 3.x stores its rope scaling as a tensor; mlx-lm wants the parameters back."""
    freqs = dequantize(np.asarray(gf.raw(info)), Q(info.ggml_type)).reshape(-1)
    scaling = llama3_rope_scaling(
        freqs, cfg["head_dim"], cfg.get("rope_theta", 10000.0), cfg["max_position_embeddings"]
    )
    if scaling is None:
        raise ModelLoadError(f"{gf.path}: rope_freqs tensor does not match Llama 3 rope scaling")
    cfg["rope_scaling"] = scaling


def _quantization(bits: dict[str, int]) -> dict[str, Any]:
    """mlx-lm's config entry: the commonest width as default, the rest per module."""
    default = Counter(bits.values()).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default}
    for module, b in sorted(bits.items()):
        if b != default:
            quant[module] = {"group_size": GROUP_SIZE, "bits": b}
    return quant


class _ShardWriter:
    """Save weights in ~5 GB shards as they come, so memory stays at one shard; names are fixed
    up at the end (model.safetensors when there is only one)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.files, self.current, self.size = folder, [], {}, 0
        self.weight_map: dict[str, int] = {}

    def add(self, arrays: dict[str, mx.array]) -> None:
        nbytes = sum(a.nbytes for a in arrays.values())
        if self.current and self.size + nbytes > SHARD_BYTES:
            self._flush()
        self.current.update(arrays)
        self.size += nbytes

    def _flush(self) -> None:
        path = self.folder / f"shard-{len(self.files)}.tmp.safetensors"
        mx.save_safetensors(str(path), self.current, {"format": "mlx"})
        self.weight_map.update(dict.fromkeys(self.current, len(self.files)))
        self.files.append(path)
        self.current, self.size = {}, 0

    def close(self) -> None:
        self._flush()
        n = len(self.files)
        names = (
            ["model.safetensors"]
            if n == 1
            else [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        )
        for path, name in zip(self.files, names, strict=True):
            path.rename(self.folder / name)
        if n > 1:
            weight_map = {k: names[i] for k, i in sorted(self.weight_map.items())}
            index = {"metadata": {}, "weight_map": weight_map}
            _write_json(self.folder / "model.safetensors.index.json", index)


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_model(gf: GGUFFile, arch_name: str, arch: Arch, dtype: mx.Dtype, folder: Path) -> None:
    md = gf.metadata
    embed = gf.tensors.get("token_embd.weight")
    if embed is None:
        raise ModelLoadError(f"{gf.path}: GGUF has no token_embd.weight tensor")
    try:
        cfg = build_config(arch_name, arch, md, vocab_size=embed.shape[0])
    except KeyError as e:
        raise ModelLoadError(f"{gf.path}: GGUF metadata lacks {e.args[0]}") from None
    cfg["tie_word_embeddings"] = "output.weight" not in gf.tensors
    if arch.model_type == "llama":
        cfg["attention_bias"] = "blk.0.attn_q.bias" in gf.tensors
        cfg["mlp_bias"] = "blk.0.ffn_up.bias" in gf.tensors
    if arch_name in ("llama", "mistral") and "rope_freqs.weight" in gf.tensors:
        _rope_freqs(gf, gf.tensors["rope_freqs.weight"], cfg)
    plan = _plan(gf, arch_name, arch, cfg)
    tokenizer = build_tokenizer(gf.path, arch_name, md)  # before the slow part: fail early

    shards, bits = _ShardWriter(folder), {}
    for info, name, transform in tqdm(plan, desc="converting", unit="tensor", file=sys.stderr):
        try:
            arrays, nbits = convert_tensor(gf, info, dtype, transform)
        except ValueError as e:  # shapes that contradict the metadata (e.g. head counts)
            raise ModelLoadError(f"{gf.path}: cannot convert tensor {info.name!r} ({e})") from e
        module = name.rsplit(".", 1)[0]
        if nbits:  # a packed triple: module.weight / .scales / .biases
            bits[module] = nbits
            shards.add({f"{module}.{k}": v for k, v in arrays.items()})
        else:  # plain tensor: keep its own name (it may be a .bias)
            shards.add({name: arrays["weight"]})
    shards.close()

    if bits:
        cfg["quantization"] = cfg["quantization_config"] = _quantization(bits)
    eos = eos_token_ids(md)
    specials = {"eos_token_id": eos[0] if len(eos) == 1 else eos} if eos else {}
    for key in ("bos_token_id", "padding_token_id"):
        if isinstance(md.get(f"tokenizer.ggml.{key}"), int):
            specials[key.replace("padding", "pad")] = md[f"tokenizer.ggml.{key}"]
    cfg.update(specials)
    cfg["torch_dtype"] = str(dtype).removeprefix("mlx.core.")
    _write_json(folder / "config.json", dict(sorted(cfg.items())))
    _write_json(folder / "generation_config.json", specials)
    tokenizer.save(str(folder / "tokenizer.json"))
    tok_cfg = tokenizer_config(md, cfg["max_position_embeddings"])
    _write_json(folder / "tokenizer_config.json", tok_cfg)
