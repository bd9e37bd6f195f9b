"""`mlxd quantize`: quantize a local MLX model folder in this process (the same driver the
server's quantization jobs run), with a progress bar on stderr."""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")


def add_parser(subs: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subs.add_parser(
        "quantize",
        help="quantize a local MLX model folder",
        description="Quantize a local MLX model folder with mlx-lm's quantization (the same "
        "tensors as mlx_lm.convert with the same settings), or with per-layer widths chosen "
        "from measured sensitivity for --target-bpw. Without --out the result goes under "
        "MLXD_HOME/models. Prints the output folder.",
    )
    p.add_argument("model", type=Path, help="the model folder (config.json, safetensors)")
    p.add_argument("--out", type=Path, default=None, help="output folder (must not exist)")
    p.add_argument("--mode", choices=MODES, default=None, help="default: affine")
    p.add_argument("--bits", type=int, default=None, help="affine: 2..8 (default 4)")
    p.add_argument("--group-size", type=int, default=None, help="affine: 32, 64 or 128 (64)")
    p.add_argument("--recipe", choices=RECIPES, default=None, help="mlx-lm's mixed recipes")
    p.add_argument(
        "--target-bpw",
        type=float,
        default=None,
        help="bits per weight to reach with per-layer widths chosen by measured sensitivity",
    )
    p.add_argument("--low-bits", type=int, default=None, help="--target-bpw: lowest width (4)")
    p.add_argument("--high-bits", type=int, default=None, help="--target-bpw: highest width (8)")
    p.add_argument(
        "--calibration",
        default=None,
        help="--target-bpw: a local text file (default: a short text in the package)",
    )
    p.add_argument(
        "--calibration-tokens", type=int, default=None, help="--target-bpw: tokens used (256)"
    )
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default=None)
    p.add_argument("--name", default=None, help="the output folder's name under MLXD_HOME")


def _spec_dict(args: argparse.Namespace) -> dict[str, Any]:
    given = {
        "model": str(args.model),
        "mode": args.mode,
        "bits": args.bits,
        "group_size": args.group_size,
        "recipe": args.recipe,
        "target_bpw": args.target_bpw,
        "low_bits": args.low_bits,
        "high_bits": args.high_bits,
        "calibration": args.calibration,
        "calibration_tokens": args.calibration_tokens,
        "dtype": args.dtype,
        "name": args.name,
    }
    return {k: v for k, v in given.items() if v is not None}


def _default_out(spec: Any) -> Path:
    from ..config import mlxd_home

    if spec.name:
        return mlxd_home() / "models" / spec.name
    if spec.target_bpw is not None:
        label = f"{spec.target_bpw:g}bpw"
    elif spec.recipe is not None:
        label = spec.recipe
    else:
        label = spec.mode if spec.mode != "affine" else f"{spec.bits}bit"
    return mlxd_home() / "models" / f"{Path(spec.model).name}-{label}"


def run(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    from ..jobs.quantize import MODEL, run_quantize
    from ..jobs.quantize_spec import QuantizeSpec
    from ..jobs.report import JobError, Reporter

    try:
        spec = QuantizeSpec.from_dict(_spec_dict(args))
    except ValueError as e:
        print(f"mlxd quantize: error: {e}", file=sys.stderr)
        sys.exit(2)
    out = (args.out or _default_out(spec)).expanduser()
    if out.exists():
        # As mlx-lm's convert: never write into (or over) an existing folder.
        print(f"mlxd quantize: error: {out} exists already", file=sys.stderr)
        sys.exit(1)
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=1000, file=sys.stderr, unit="‰", bar_format="{desc} {percentage:3.0f}%|{bar}|")

    def emit(event: dict) -> None:
        if event["type"] == "progress":
            bar.set_description(event["stage"] or bar.desc, refresh=False)
            bar.update(int(event["progress"] * 1000) - bar.n)
        elif event["type"] == "message":
            bar.write(event["message"], file=sys.stderr)

    # The job's folder sits next to the output so the final rename stays on one filesystem.
    job = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        run_quantize(spec, job, Reporter(emit))
        bar.close()
        (job / MODEL).rename(out)
        if (job / "sensitivity.json").is_file():
            (job / "sensitivity.json").rename(out / "sensitivity.json")
    except JobError as e:
        bar.close()
        print(f"mlxd quantize: error: {e.message}", file=sys.stderr)
        sys.exit(1)
    finally:
        shutil.rmtree(job, ignore_errors=True)
    print(out)
