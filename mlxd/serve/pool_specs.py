"""The models a pool starts with: --model (repeated), --models (names or `auto`) and
--models-file's entries, each a ModelSpec; and a models-file entry's request defaults."""

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ServeConfig
from ..model import ModelLoadError

# What a models-file entry's `defaults` may set: a request's own value wins.
DEFAULT_KEYS = frozenset({
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "repetition_penalty",
    "repetition_context_size", "presence_penalty", "frequency_penalty", "seed", "stop",
})  # fmt: skip


@dataclass
class ModelSpec:
    """One configured model: `name` is its id, `path` what --model takes (None: the embedded
    default), `aliases` other names a request may give."""

    name: str
    path: str | None
    aliases: tuple[str, ...] = ()
    pinned: bool = False
    ttl: float | None = None
    defaults: dict[str, Any] = field(default_factory=dict)
    requested: bool = False  # joined by a request's name (--allow-model-paths, the HF cache)


def _spec(item: Any, where: str) -> ModelSpec:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise ModelLoadError(f"{where}: each entry is an object with a non-empty `name`")
    name, path = item["name"], item.get("path", item["name"])
    aliases, ttl, defaults = item.get("aliases", []), item.get("ttl"), item.get("defaults", {})
    if not isinstance(path, str) or not path:
        raise ModelLoadError(f"{where}: {name}: `path` is a non-empty string")
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ModelLoadError(f"{where}: {name}: `aliases` is a list of names")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
        raise ModelLoadError(f"{where}: {name}: `ttl` is a positive number of seconds")
    if not isinstance(item.get("pinned", False), bool):
        raise ModelLoadError(f"{where}: {name}: `pinned` is true or false")
    if not isinstance(defaults, dict) or (bad := set(defaults) - DEFAULT_KEYS):
        got = f", not {sorted(bad)}" if isinstance(defaults, dict) else ""
        raise ModelLoadError(f"{where}: {name}: `defaults` takes {sorted(DEFAULT_KEYS)}{got}")
    extra = set(item) - {"name", "path", "aliases", "pinned", "ttl", "defaults"}
    if extra:
        raise ModelLoadError(f"{where}: {name}: unknown keys {sorted(extra)}")
    return ModelSpec(name, path, tuple(aliases), item.get("pinned", False), ttl, dict(defaults))


@functools.cache
def read_models_file(path: str) -> tuple[ModelSpec, ...]:
    """--models-file: a JSON list of {"name", "path", "aliases", "pinned", "ttl", "defaults"}."""
    where = f"--models-file {path}"
    try:
        items = json.loads(Path(path).expanduser().read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{where}: {e}") from None
    if not isinstance(items, list):
        raise ModelLoadError(f"{where}: a JSON list of models")
    return tuple(_spec(item, where) for item in items)


def specs_from(config: ServeConfig, scan: Callable[[], list[str]] | None = None) -> list[ModelSpec]:
    """The configured models, the default first: --model (each one, repeated), --models
    (names, or `auto`: what `scan` finds), then --models-file's. The default is pinned unless
    its models-file entry says otherwise."""
    specs = [ModelSpec(config.model or "", config.model, pinned=True)]
    for ref in config.models:
        if ref == "auto":
            specs += [ModelSpec(name, name) for name in (scan() if scan is not None else [])]
        else:
            specs.append(ModelSpec(ref, ref))
    from_file = list(read_models_file(config.models_file)) if config.models_file else []
    if config.model is None and from_file:
        specs[0] = from_file.pop(0)  # the file's first is the default
    elif from_file and from_file[0].path == config.model:
        specs[0] = from_file.pop(0)
    specs += from_file
    seen: set[str] = set()
    out = []
    for spec in specs:
        names = {spec.name, *spec.aliases}
        if names & seen:
            if spec.name in seen and not spec.aliases:
                continue  # the same --model twice
            raise ModelLoadError(f"model name {sorted(names & seen)[0]!r} is given twice")
        seen |= names
        out.append(spec)
    return out


def model_defaults(config: ServeConfig, name: Any) -> dict[str, Any]:
    """A models-file entry's `defaults` for the model a request names (by name or alias)."""
    path = getattr(config, "models_file", None)
    if not path or not isinstance(name, str):
        return {}
    for spec in read_models_file(path):
        if name == spec.name or name in spec.aliases:
            return spec.defaults
    return {}


def disk_bytes(folder: Path | None) -> int | None:
    """The weight files' bytes: what a model will hold before it is loaded."""
    if folder is None or not folder.is_dir():
        return None
    files = [*folder.glob("*.safetensors"), *folder.glob("*.npz")]
    return sum(f.stat().st_size for f in files) or None
