"""Write a random-weight model folder in a real architecture's shape, with a real tokenizer, for
the HTTP benchmarks (`mlxd bench serve --model OUT`): the servers load it like any MLX model.

    python -m bench.probes.random_model OUT --shape qwen3-0.6b --tokenizer TOKENIZER_DIR
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxd.bench.models import SHAPES, build_random

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write(out: Path, shape: str, tokenizer: Path, dtype: str = "bfloat16", seed: int = 0) -> int:
    """The folder's weights (the bench's random model, same seed and gain), config and
    tokenizer files; returns the bytes of weights written."""
    model = build_random(shape, dtype, seed).model
    weights = dict(tree_flatten(model.parameters()))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = dict(SHAPES[shape], torch_dtype=dtype, hidden_act="silu", attention_bias=False)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in _TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, out / name)
    return sum(v.nbytes for v in weights.values())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--tokenizer", type=Path, required=True, help="a folder with tokenizer.json")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n = write(args.out, args.shape, args.tokenizer, args.dtype, args.seed)
    print(f"{args.out}: {args.shape}, {n / 1e9:.2f} GB of {args.dtype} weights")


if __name__ == "__main__":
    main()
