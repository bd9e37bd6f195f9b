"""`mlxd bench serve --make-adapters K`: K random LoRA adapters for the benchmarked model, in
mlx-lm's format, so that a device run needs no adapter files. The model's blocks go through
mlx-lm's own `linear_to_lora_layers` (as `mlx_lm.lora` converts them), then every `lora_a` and
`lora_b` gets seeded random values (a fresh `lora_b` is zero: it would change nothing)."""

import json
import math
import re
from pathlib import Path

RANK, SCALE = 8, 20.0  # mlx_lm.lora's defaults
NUM_LAYERS = 16  # mlx_lm.lora's default: the last 16 blocks
B_STD = 0.02  # lora_b's std: replies move off the base model's, and stay text
BLOCK = re.compile(r"(?:^|\.)layers\.\d+\.(.+)\.lora_[ab]$")


def lora_keys(names: list[str]) -> list[str]:
    """The converted linears' paths inside a block ("self_attn.q_proj", ...), from the
    trainable parameters' names: mlx-lm's `lora_parameters.keys`."""
    return sorted({m.group(1) for n in names if (m := BLOCK.search(n))})


def make_adapters(
    model_dir: Path, k: int, dest: Path, num_layers: int = NUM_LAYERS, seed: int = 0
) -> list[str]:
    """Write K adapter folders `dest/adapter{j}` for the model in `model_dir`; their paths."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten
    from mlx_lm.tuner.utils import linear_to_lora_layers
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir, lazy=True)
    model.freeze()
    lora = {"rank": RANK, "dropout": 0.0, "scale": SCALE}
    linear_to_lora_layers(model, num_layers, lora)
    params = sorted(tree_flatten(model.trainable_parameters()))
    config = {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": lora | {"keys": lora_keys([n for n, _ in params])},
    }
    paths = []
    for j in range(k):
        rng = np.random.default_rng([seed, j])
        weights = {}
        for name, p in params:
            # lora_a as mlx-lm initialises it (uniform, 1/sqrt(in)); lora_b small and non-zero.
            if name.endswith(".lora_a"):
                bound = 1 / math.sqrt(p.shape[0])
                value = rng.uniform(-bound, bound, p.shape)
            else:
                value = rng.standard_normal(p.shape) * B_STD
            weights[name] = mx.array(value.astype(np.float32)).astype(p.dtype)
        folder = dest / f"adapter{j}"
        folder.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
        (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
        paths.append(str(folder.resolve()))
    return paths
