"""Adapter folders as mlx-lm loads them: a PEFT LoRA / DoRA adapter (`adapter_model.safetensors`
and PEFT's `adapter_config.json`) is converted once into mlx-lm's format, cached under
$MLXD_HOME/adapters by a hash of its files; an mlx-lm adapter is checked and used as it is.

The conversion is exact: PEFT's lora_A (r, in) and lora_B (out, r) become mlx-lm's lora_a (in, r)
and lora_b (r, out), transposed with the same values and dtype; scale = lora_alpha / r (or / √r
with `use_rslora`); DoRA's magnitude is mlx-lm's `m` (both divide by the row norms of
W + scale·BA). Anything the format cannot say the same way is refused with the file it is in.
"""

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import mlx.core as mx

from ..config import mlxd_home
from .errors import ModelLoadError

CONVERTER_VERSION = 1  # bump when the output changes, so stale cached folders are redone
MARKER = "mlxd_peft.json"  # written last: its presence (and content) means "complete"
CONFIG = "adapter_config.json"  # the config's name in both formats
PEFT_WEIGHTS, MLX_WEIGHTS = "adapter_model.safetensors", "adapters.safetensors"
PREFIX = "base_model.model."
# PEFT's tensor suffixes and the mlx-lm leaf each becomes (a 2-D one transposed).
LEAVES = {".lora_A.weight": "lora_a", ".lora_B.weight": "lora_b", ".lora_magnitude_vector": "m"}
LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
FINE_TUNE_TYPES = ("lora", "dora", "full")


def mlx_adapter(adapter_path: str, model_folder: Path | None = None) -> str:
    """The mlx-lm adapter folder to load for `adapter_path`: a PEFT folder's cached conversion
    (`model_folder`'s config gives the layer count when the adapter skips the first blocks),
    else `adapter_path` itself once its config and weights have been checked."""
    folder = Path(adapter_path)
    if not folder.is_dir():
        raise ModelLoadError(f"{adapter_path[:200]}: not an adapter folder")
    if (folder / MLX_WEIGHTS).is_file() or not (folder / PEFT_WEIGHTS).is_file():
        if (folder / "adapter_model.bin").is_file() and not (folder / MLX_WEIGHTS).is_file():
            raise ModelLoadError(
                f"{folder / 'adapter_model.bin'}: pickled PEFT adapters are not loaded; "
                "save it as safetensors (PEFT's default)"
            )
        check_mlx_adapter(folder)
        return adapter_path
    return str(convert_peft(folder, model_folder))


def check_mlx_adapter(folder: Path) -> None:
    """What mlx-lm's load_adapters reads, checked first so a fault names its file in one line."""
    config = _read_config(folder / CONFIG)
    kind = config.get("fine_tune_type", "lora")
    if kind not in FINE_TUNE_TYPES:
        _bad(folder / CONFIG, f"fine_tune_type {kind!r} is not one of {', '.join(FINE_TUNE_TYPES)}")
    lora = config.get("lora_parameters")
    if kind != "full":  # a full fine-tune's weights replace whole blocks: no layers to make
        if not isinstance(config.get("num_layers"), int) or isinstance(config["num_layers"], bool):
            _bad(folder / CONFIG, "num_layers must be an integer")
        if not isinstance(lora, dict):
            _bad(folder / CONFIG, "lora_parameters must be an object")
        for key in ("rank", "scale", "dropout"):
            if not isinstance(lora.get(key), (int, float)) or isinstance(lora[key], bool):
                hint = " (mlx-lm's config takes scale, not alpha)" if key == "scale" else ""
                _bad(folder / CONFIG, f"lora_parameters.{key} must be a number{hint}")
    _read_weights(folder / MLX_WEIGHTS, load=False)


def convert_peft(folder: Path, model_folder: Path | None = None) -> Path:
    """Convert the PEFT adapter in `folder` once; returns the cached mlx-lm adapter folder."""
    config_file, weights_file = folder / CONFIG, folder / PEFT_WEIGHTS
    config = _read_config(config_file)
    h = hashlib.sha256(f"mlxd-peft-v{CONVERTER_VERSION}\0".encode())
    for path in (config_file, weights_file):
        with path.open("rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    layers = _layer_count(model_folder)
    h.update(f"\0{layers}".encode())  # the count enters num_layers when blocks are skipped
    digest = h.hexdigest()
    out = mlxd_home() / "adapters" / f"{_safe(folder.name)}-{digest[:16]}"
    if _is_complete(out, digest):
        return out
    scale, use_dora = _peft_settings(config, config_file)
    weights, keys, num_layers, rank = _peft_weights(weights_file, use_dora, layers)
    if rank != config["r"]:
        _bad(weights_file, f"LoRA rank {rank}, but {CONFIG} says r = {config['r']}")
    mlx_config = {
        "fine_tune_type": "dora" if use_dora else "lora",
        "num_layers": num_layers,
        "lora_parameters": {"rank": rank, "scale": scale, "dropout": 0.0, "keys": keys},
        "peft_source": str(folder),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        mx.save_safetensors(str(tmp / MLX_WEIGHTS), weights, metadata={"format": "mlx"})
        (tmp / CONFIG).write_text(json.dumps(mlx_config, indent=2) + "\n")
        marker = {"converter_version": CONVERTER_VERSION, "sha256": digest, "source": str(folder)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _publish(tmp, out, digest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _bad(path: Path, why: str) -> None:
    raise ModelLoadError(f"{path}: {why}")


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: unreadable ({e})") from e
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from e
    if not isinstance(config, dict):
        _bad(path, "not a JSON object")
    return config


def _read_weights(path: Path, load: bool = True) -> dict[str, mx.array]:
    """The tensors of a safetensors file (`load` off: only the header is read)."""
    if not path.is_file():
        _bad(path, "not found")
    try:
        weights = mx.load(str(path))
        if load:
            mx.eval(weights)
    except (RuntimeError, ValueError, OSError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelLoadError(f"{path}: not a readable safetensors file ({first})") from e
    return weights


def _number(config: dict[str, Any], key: str, path: Path) -> float:
    value = config.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        _bad(path, f"{key} must be a positive number")
    return value


def _peft_settings(config: dict[str, Any], path: Path) -> tuple[float, bool]:
    """(scale, use_dora) of a PEFT LoRA config; what mlx-lm's layers cannot compute is refused."""
    if config.get("peft_type", "LORA") != "LORA":
        _bad(path, f"peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    rank, alpha = _number(config, "r", path), _number(config, "lora_alpha", path)
    if not isinstance(rank, int):
        _bad(path, "r must be an integer")
    refused = {
        "rank_pattern": "per-module ranks",
        "alpha_pattern": "per-module alphas",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D) weights",
        "layer_replication": "layer replication",
        "lora_bias": "a bias on lora_B",
        "modules_to_save": "fully trained modules (modules_to_save)",
        "target_parameters": "LoRA on parameters (target_parameters)",
    }
    for key, what in refused.items():
        if config.get(key):
            _bad(path, f"{what} cannot be loaded as an mlx-lm adapter")
    if config.get("bias", "none") != "none":
        _bad(path, f"bias {config['bias']!r} cannot be loaded as an mlx-lm adapter (only 'none')")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return float(scale), bool(config.get("use_dora"))


def _peft_weights(
    path: Path, use_dora: bool, layers: int | None
) -> tuple[dict[str, mx.array], list[str], int, int]:
    """(mlx-lm tensors, lora keys, num_layers, rank) from a PEFT adapter_model.safetensors."""
    out: dict[str, mx.array] = {}
    keys: set[str] = set()
    first, last, ranks = None, -1, set()
    for name, w in _read_weights(path).items():
        suffix, leaf = next(((k, v) for k, v in LEAVES.items() if name.endswith(k)), ("", ""))
        if not name.startswith(PREFIX) or not leaf or (leaf == "m") != (w.ndim == 1):
            _bad(path, f"unexpected tensor {name[:200]} {tuple(w.shape)} for a LoRA adapter")
        if leaf == "m" and not use_dora:
            _bad(path, f"{name[:200]}: a DoRA magnitude, but the config's use_dora is off")
        module = name[len(PREFIX) : -len(suffix)]
        if leaf != "m":
            ranks.add(w.shape[0] if leaf == "lora_a" else w.shape[1])
            w = mx.contiguous(w.T)
        out[f"{module}.{leaf}"] = w
        if (m := LAYER.search(module)) is None:
            keys.add(module)  # a top-level module (lm_head): mlx-lm matches its full name
            continue
        index = int(m.group(1))
        first, last = index if first is None else min(first, index), max(last, index)
        keys.add(module[m.end() :])
    if not out:
        _bad(path, "holds no LoRA tensors")
    if len(ranks) != 1:
        _bad(path, f"LoRA ranks differ between modules ({sorted(ranks)})")
    modules = {n.rsplit(".", 1)[0] for n in out}
    for module in sorted(modules):
        need = ("lora_a", "lora_b", "m") if use_dora else ("lora_a", "lora_b")
        missing = [leaf for leaf in need if f"{module}.{leaf}" not in out]
        if missing:
            _bad(path, f"{module[:200]} has no {' / '.join(missing)} tensor")
    # mlx-lm converts the last num_layers blocks (-1: all); a block the adapter leaves out
    # gets LoRA layers with a zero lora_b, which add exactly nothing.
    total = layers if layers is not None else last + 1
    num_layers = -1 if first in (None, 0) else total - first
    return out, sorted(keys), num_layers, ranks.pop()


def _layer_count(model_folder: Path | None) -> int | None:
    """num_hidden_layers of the model's config.json (or its text_config), if it says."""
    try:
        config = json.loads((Path(model_folder) / "config.json").read_text())
    except (TypeError, OSError, ValueError):
        return None
    for c in (config, config.get("text_config") or {}):
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if isinstance(c.get(key), int):
                return c[key]
    return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64] or "adapter"


def _is_complete(out: Path, digest: str) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("converter_version") == CONVERTER_VERSION
        and marker.get("sha256") == digest
        and (out / MLX_WEIGHTS).is_file()
    )


def _publish(tmp: Path, out: Path, digest: str) -> None:
    """Rename the finished folder into place; a concurrent conversion that won keeps its own."""
    if _is_complete(out, digest):
        shutil.rmtree(tmp)
        return
    old = None
    if out.exists():  # a damaged or stale conversion of ours (the name holds the digest)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
