"""Mixed per-layer KV quantization in mlx-optiq's kv_config format (`optiq serve --kv-config`).

The file is a JSON list of `{"layer_idx": i, "bits": b, "group_size": g}` (group_size defaults
to 64), where `layer_idx` indexes the model's prompt-cache list. Layers the config does not
name stay unquantized. The conversion is optiq's `install_mixed_kv` hook, which replaces
mlx-lm's `maybe_quantize_kv_cache` and so runs at the same points (after every model call of
generate_step): a named layer converts once its own offset reaches `quantized_kv_start`, into
a `QuantizedKVCache` of its own bits and group size, one layer at a time (evaluated before the
next, so a transient holds one layer twice, not the whole cache). Layers without keys and
values (recurrent state, cache lists) keep their format, as in optiq. Sliding-window layers
convert into a quantized ring as optiq converts them when `windows` is set (the server and
CLI set it; the Python API raises mlx-lm's NYI without it). One deliberate difference, a
refusal rather than other bits: optiq's loader silently accepts configs that `parse` and
`kv.schemes.unsupported` reject (unknown keys, duplicate or out-of-range layers, layers
without keys and values, bits or group sizes MLX cannot quantize).
"""

import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache, make_prompt_cache

from .rotating_quantized import RotatingQuantizedKVCache, to_quantized_rotating

BITS = (2, 3, 4, 5, 6, 8)  # mx.quantize's affine bit widths that mlx-lm's quantized SDPA reads
GROUP_SIZES = (32, 64, 128)  # mx.quantize's affine group sizes
DEFAULT_GROUP_SIZE = 64  # optiq's default when an entry has no group_size
_KEYS = {"layer_idx", "bits", "group_size"}


@dataclass(frozen=True)
class LayerKV:
    """One named layer: its prompt-cache index, bits and quantization group size."""

    layer: int
    bits: int
    group_size: int = DEFAULT_GROUP_SIZE


@dataclass(frozen=True)
class MixedKV:
    """A validated kv_config: hashable, equal configs compare equal (rows may share a batch)."""

    layers: tuple[LayerKV, ...]  # sorted by layer, one entry per layer
    _by_layer: dict[int, LayerKV] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_layer", {e.layer: e for e in self.layers})

    @property
    def key(self) -> str:
        """A stable string naming the scheme (batch grouping, prefix-store namespaces)."""
        return "mixed:" + ",".join(f"{e.layer}={e.bits}/{e.group_size}" for e in self.layers)

    def get(self, layer: int) -> LayerKV | None:
        return self._by_layer.get(layer)

    def to_json(self) -> list[dict[str, int]]:
        """optiq's file format, back."""
        return [{"layer_idx": e.layer, "bits": e.bits, "group_size": e.group_size} for e in self]

    def __iter__(self) -> Iterator[LayerKV]:
        return iter(self.layers)

    def __len__(self) -> int:
        return len(self.layers)

    def summary(self) -> str:
        """One line for logs, e.g. `2 layers: 1@4-bit, 1@8-bit (avg 6.00 bits)` (optiq's)."""
        counts: dict[int, int] = {}
        for e in self.layers:
            counts[e.bits] = counts.get(e.bits, 0) + 1
        parts = ", ".join(f"{n}@{b}-bit" for b, n in sorted(counts.items()))
        avg = sum(e.bits for e in self.layers) / len(self.layers)
        return f"{len(self.layers)} layers: {parts} (avg {avg:.2f} bits)"


def _int(entry: dict[str, Any], key: str, where: str) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: '{key}' must be an integer, got {value!r}")
    return value


def parse(raw: Any, where: str = "kv_config") -> MixedKV:
    """Validate optiq's list-of-entries form (what `json.load` gives) into a MixedKV."""
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a JSON list, got {type(raw).__name__}")
    if not raw:
        raise ValueError(f"{where} names no layers")
    layers: dict[int, LayerKV] = {}
    for n, entry in enumerate(raw):
        at = f"{where} entry {n}"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be an object, got {type(entry).__name__}")
        if missing := sorted({"layer_idx", "bits"} - entry.keys()):
            raise ValueError(f"{at} is missing {', '.join(repr(k) for k in missing)}")
        if unknown := sorted(entry.keys() - _KEYS):
            raise ValueError(f"{at} has unknown keys {unknown} (expected {sorted(_KEYS)})")
        layer, bits = _int(entry, "layer_idx", at), _int(entry, "bits", at)
        group = _int(entry, "group_size", at) if "group_size" in entry else DEFAULT_GROUP_SIZE
        if layer < 0:
            raise ValueError(f"{at}: layer_idx {layer} is negative")
        if bits not in BITS:
            raise ValueError(f"{at}: bits {bits} is not one of {list(BITS)}")
        if group not in GROUP_SIZES:
            raise ValueError(f"{at}: group_size {group} is not one of {list(GROUP_SIZES)}")
        if layer in layers:
            raise ValueError(f"{at}: layer {layer} is named twice")
        layers[layer] = LayerKV(layer, bits, group)
    return MixedKV(tuple(layers[i] for i in sorted(layers)))


def load(source: "str | os.PathLike[str] | list[Any] | MixedKV") -> MixedKV:
    """A MixedKV from a kv_config.json path, its parsed list, or a MixedKV (returned as is)."""
    if isinstance(source, MixedKV):
        return source
    if isinstance(source, list):
        return parse(source)
    try:
        with open(source) as f:
            raw = json.load(f)
    except OSError as e:
        raise ValueError(f"kv_config {source}: cannot read it ({e.strerror or e})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"kv_config {source}: not JSON ({e})") from e
    return parse(raw, where=f"kv_config {source}")


def from_flags(path: str | None, kv_bits: int | None) -> MixedKV | None:
    """The CLI's `--kv-config PATH`, exclusive with `--kv-bits` (optiq lets one override the
    other; here asking for both is an error, since only one scheme can hold a layer)."""
    if path is None:
        return None
    if kv_bits is not None:
        raise ValueError("--kv-config and --kv-bits are mutually exclusive: pick one KV scheme")
    return load(path)


def _probe(model: Any, max_kv_size: int | None = None) -> list[Any]:
    """A fresh prompt cache after one token, so each layer's key/value shapes are known."""
    cache = make_prompt_cache(model, max_kv_size=max_kv_size)
    model(mx.array([[0]]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def check(model: Any, cfg: MixedKV, max_kv_size: int | None = None) -> None:
    """Raise ValueError when `cfg` does not fit this model at all: a layer index past the
    model's cache layers, or a group size that does not divide the layer's head dimension."""
    cache = _probe(model, max_kv_size)
    for e in cfg:
        if e.layer >= len(cache):
            raise ValueError(
                f"kv_config layer {e.layer} is out of range: the model has {len(cache)} "
                f"cache layers (0..{len(cache) - 1})"
            )
        c = cache[e.layer]
        keys = getattr(c, "keys", None)
        if keys is None or not hasattr(c, "to_quantized"):
            continue  # recurrent state or a cache list: kept as is, as optiq does
        for name, a in (("keys", keys), ("values", c.values)):
            if a.shape[-1] % e.group_size:
                raise ValueError(
                    f"kv_config layer {e.layer}: group_size {e.group_size} does not divide its "
                    f"{name} head dimension {a.shape[-1]}"
                )


def convert(
    cache: list[Any], cfg: MixedKV, quantized_kv_start: int = 0, windows: bool = False
) -> None:
    """Quantize the named layers of one row's (unpadded) cache list in place, optiq's rule:
    a layer converts when it has keys and values and its offset reached the start.
    `windows`: a named rotating layer becomes RotatingQuantizedKVCache, as optiq converts it
    (without it: mlx-lm's "Quantization NYI")."""
    for idx, c in enumerate(cache):
        e = cfg.get(idx)
        if e is None or not hasattr(c, "to_quantized"):
            continue  # unnamed layers stay unquantized; recurrent layers keep their format
        if c.offset < quantized_kv_start or isinstance(c, QuantizedKVCache):
            continue
        if getattr(c, "keys", None) is None:
            continue  # nothing written yet (optiq skips, where mlx-lm would convert it empty)
        if isinstance(c, RotatingKVCache):
            if not windows:
                raise NotImplementedError(
                    f"RotatingKVCache Quantization NYI (kv_config layer {idx})"
                )
            if not isinstance(c, RotatingQuantizedKVCache):
                cache[idx] = to_quantized_rotating(c, group_size=e.group_size, bits=e.bits)
                mx.eval(cache[idx].keys, cache[idx].values)
                mx.clear_cache()
            continue
        q = QuantizedKVCache(group_size=e.group_size, bits=e.bits)
        q.offset = c.offset
        # The whole buffer, spare capacity included, as mlx-lm's KVCache.to_quantized.
        q.keys = mx.quantize(c.keys, group_size=e.group_size, bits=e.bits)
        q.values = mx.quantize(c.values, group_size=e.group_size, bits=e.bits)
        mx.eval(q.keys, q.values)  # one layer at a time: free its unquantized copy first
        c.keys = c.values = None
        cache[idx] = q
        mx.clear_cache()


def quantizer(cfg: "MixedKV | Any", quantized_kv_start: int) -> Callable[[list[Any]], None]:
    """`fn(prompt_cache)` to call where mlx-lm calls maybe_quantize_kv_cache (after each
    prefill chunk and each step): optiq's patched hook with its start bound."""
    mixed = load(cfg)

    def quantize(prompt_cache: list[Any]) -> None:
        convert(prompt_cache, mixed, quantized_kv_start)

    return quantize


def layer_token_bytes(model: Any) -> tuple[list[int], int]:
    """Unquantized bytes one token adds to each growing (full-attention) layer, 0 for the
    others (sliding windows are bounded, recurrent state is fixed), and the element size."""
    per_layer, itemsize = [], 2
    for c in _probe(model):
        growing = hasattr(c, "to_quantized") and not isinstance(c, RotatingKVCache)
        if growing and getattr(c, "keys", None) is not None:
            per_layer.append(sum(a.nbytes // a.shape[-2] for a in (c.keys, c.values)))
            itemsize = c.keys.itemsize
        else:
            per_layer.append(0)
    return per_layer, itemsize


def token_bytes(cfg: MixedKV | None, per_layer: Sequence[int], itemsize: int = 2) -> float:
    """Bytes per token of context over the growing layers under `cfg`: a named layer packs
    `bits` per element plus a scale and a bias per group (model dtype); the rest stay as is.
    KVCost.token_bytes's formula, layer by layer."""
    total = 0.0
    for idx, b in enumerate(per_layer):
        e = cfg.get(idx) if cfg is not None else None
        total += b if e is None else b * (e.bits / 8 + 2 * itemsize / e.group_size) / itemsize
    return total
