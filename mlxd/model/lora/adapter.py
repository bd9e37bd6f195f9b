"""One mlx-lm adapter folder read from disk: its config, read as mlx-lm's `load_adapters` and
`linear_to_lora_layers` read it, and its tensors grouped by the module they adapt."""

import json
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
LEAVES = ("lora_a", "lora_b", "m")  # the only adapter leaves mlx-lm's load_adapters accepts


class AdapterError(ValueError):
    """An adapter that cannot be read, or cannot be served over this model."""


@dataclass(frozen=True)
class AdapterConfig:
    """The keys mlx-lm's loader uses; the rest of the training args are ignored, as there."""

    fine_tune_type: str  # "lora" | "dora"
    num_layers: int
    rank: int
    scale: float
    dropout: float
    keys: tuple[str, ...] | None  # block-relative module names; None: every linear of a block

    @property
    def dora(self) -> bool:
        return self.fine_tune_type == "dora"


@dataclass
class Adapter:
    """A named adapter: its config and, per adapted module path, its leaves (lora_a, lora_b, m)."""

    name: str
    path: Path
    config: AdapterConfig
    modules: dict[str, dict[str, mx.array]] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """The bytes of the adapter's own tensors."""
        return sum(a.nbytes for leaves in self.modules.values() for a in leaves.values())


def read_config(path: Path) -> AdapterConfig:
    """adapter_config.json with mlx-lm's defaults and its refusals (no `scale`, full fine-tunes)."""
    file = path / CONFIG_FILE
    if not file.is_file():
        raise AdapterError(f"{path} has no {CONFIG_FILE}: not an mlx-lm adapter folder")
    raw = json.loads(file.read_text())
    kind = raw.get("fine_tune_type", "lora")
    if kind not in ("lora", "dora"):
        raise AdapterError(f"{path}: fine_tune_type {kind!r} is not an adapter (lora or dora)")
    params = raw.get("lora_parameters")
    if not isinstance(params, dict):
        raise AdapterError(f"{path}: {CONFIG_FILE} has no lora_parameters")
    if "scale" not in params:
        hint = " (found 'alpha': mlx-lm's LoRA config uses 'scale')" if "alpha" in params else ""
        raise AdapterError(f"{path}: lora_parameters is missing required key 'scale'{hint}")
    # mlx-lm indexes these without defaults: a folder it cannot load is refused here too.
    missing = [k for k in ("rank", "dropout") if k not in params]
    missing += ["num_layers"] if "num_layers" not in raw else []
    if missing:
        raise AdapterError(f"{path}: {CONFIG_FILE} is missing {', '.join(missing)}")
    keys = params.get("keys")
    return AdapterConfig(
        fine_tune_type=kind,
        num_layers=int(raw["num_layers"]),
        rank=int(params["rank"]),
        scale=float(params["scale"]),
        dropout=float(params["dropout"]),
        keys=None if keys is None else tuple(keys),
    )


def read_adapter(name: str, path: str | Path) -> Adapter:
    """The config and tensors of the adapter folder `path`, tensors grouped by module path."""
    path = Path(path)
    if not path.exists():
        raise AdapterError(f"the adapter path does not exist: {path}")
    config = read_config(path)
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise AdapterError(f"{path} has no {WEIGHTS_FILE}")
    adapter = Adapter(name, path, config)
    for key, value in mx.load(str(weights_file)).items():
        module, _, leaf = key.rpartition(".")
        if leaf not in LEAVES or (leaf == "m" and not config.dora):
            raise AdapterError(f"{path}: {key} is not an adapter parameter")
        adapter.modules.setdefault(module, {})[leaf] = value
    return adapter
