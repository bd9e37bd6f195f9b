"""`mlxd convert`: turn a GGUF file into a cached MLX model folder explicitly."""

import argparse
from pathlib import Path


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "convert",
        help="convert a GGUF file into an MLX model folder",
        description="Convert a GGUF file (llama, qwen2, qwen3, gemma3) into an MLX model folder. "
        "Without --out the folder is cached under MLXD_HOME (default ~/.cache/mlxd), keyed by "
        "the file's hash, and later loads of the same GGUF reuse it.",
    )
    p.add_argument("gguf", type=Path, help="the .gguf file")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the cache)")
    p.add_argument(
        "--dtype",
        choices=["float32", "float16", "bfloat16"],
        default=None,
        help="dtype of unquantized tensors and quantization scales "
        "(default: float32 on CPU, float16 / bfloat16 on GPU)",
    )
    p.add_argument("--force", action="store_true", help="convert again even if cached")


def run(args: argparse.Namespace) -> None:
    from ..model.errors import ModelLoadError
    from ..model.gguf import convert_gguf

    if not args.gguf.is_file():
        raise ModelLoadError(f"{args.gguf}: no such file")
    folder = convert_gguf(args.gguf, out=args.out, dtype=args.dtype, force=args.force)
    print(folder)
