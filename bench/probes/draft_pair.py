"""A larger target for a real draft: the draft model's folder with `--extra` more layers, each a
copy of one of its own layers whose writes to the residual stream (o_proj, down_proj) are
scaled by `--scale`. The target shares the draft's tokenizer and its first layers, so the
draft's greedy tokens match the target's often but not always (smaller scale: more often), and
each extra layer costs what a real one does. `--dtype bfloat16` dequantizes both first (the
draft then goes to `--draft-out`), as a GPU serves them.

    python -m bench.probes.draft_pair --src SMOLLM2_FOLDER --out TARGET --extra 90 --scale 0.1
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx

WRITES = ("self_attn.o_proj.", "mlp.down_proj.")


def dequantized(config: dict, weights: dict, dtype: mx.Dtype) -> dict:
    """Every quantized triple as a plain `dtype` weight (the config's per-module bits)."""
    q = config.pop("quantization")
    config.pop("quantization_config", None)
    out = {}
    for key, value in weights.items():
        if key.endswith((".scales", ".biases")):
            continue
        module = key.rsplit(".", 1)[0]
        if key.endswith(".weight") and value.dtype == mx.uint32:
            own = q.get(module, q)
            value = mx.dequantize(value, weights[module + ".scales"], weights[module + ".biases"],
                                  group_size=own["group_size"], bits=own["bits"])  # fmt: skip
        out[key] = value.astype(dtype)
    config["torch_dtype"] = str(dtype).split(".")[-1]
    return out


def _write(out: Path, src: Path, config: dict, weights: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            shutil.copyfile(f, out / f.name)


def build(
    src: Path, out: Path, extra: int, scale: float, dtype: str | None, draft_out: Path | None
) -> None:
    config = json.loads((src / "config.json").read_text())
    layers = config["num_hidden_layers"]
    weights = mx.load(str(src / "model.safetensors"))
    if dtype is not None:
        weights = dequantized(config, weights, getattr(mx, dtype))
        if draft_out is not None:
            _write(draft_out, src, dict(config), dict(weights))
    for j in range(extra):
        prefix = f"model.layers.{j % layers}."
        for key, value in list(weights.items()):
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            scaled = rest.startswith(WRITES) and rest.endswith(("weight", "scales", "biases"))
            if scaled and value.dtype == mx.uint32:
                scaled = False  # packed quantized ints: their scales and biases carry the scale
            new = value * scale if scaled else value
            weights[f"model.layers.{layers + j}.{rest}"] = new.astype(value.dtype)
    config["num_hidden_layers"] = layers + extra
    _write(out, src, config, weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--extra", type=int, default=90)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--dtype", default=None, help="e.g. bfloat16: dequantize both")
    ap.add_argument("--draft-out", type=Path, default=None, help="the dequantized draft")
    args = ap.parse_args()
    build(args.src, args.out, args.extra, args.scale, args.dtype, args.draft_out)


if __name__ == "__main__":
    main()
