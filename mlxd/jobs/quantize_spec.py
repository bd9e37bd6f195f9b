"""What a quantization job asks for: `QuantizeSpec`, validated from a request's dict before the
job is queued (a bad field is a ValueError naming it, so the server answers 400)."""

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
# mlx-lm's (group_size, bits) per mode (utils.quantize_model's defaults); the fp modes allow
# no others.
MODE_DEFAULTS = {"affine": (64, 4), "mxfp4": (32, 4), "nvfp4": (16, 4), "mxfp8": (32, 8)}
RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
DTYPES = ("float16", "bfloat16", "float32")
AFFINE_GROUP_SIZES = (32, 64, 128)
AFFINE_BITS = range(2, 9)


@dataclass(frozen=True)
class QuantizeSpec:
    model: str  # a local model folder (mlx-lm layout)
    mode: str = "affine"
    bits: int = 4
    group_size: int = 64
    recipe: str | None = None  # one of mlx-lm's mixed recipes (affine only)
    target_bpw: float | None = None  # measured-sensitivity mixed bits (affine only)
    candidate_bits: tuple[int, ...] = (4, 8)  # the widths target_bpw chooses among, ascending
    calibration: str | None = None  # a local text file; None: the package's embedded text
    calibration_tokens: int = 256
    dtype: str | None = None  # None: the model config's torch_dtype, as mlx-lm's convert does
    name: str | None = None  # the output model's name (the CLI's default folder name)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "QuantizeSpec":
        return _parse(d)


def _int(d: dict[str, Any], key: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key}: an integer is required, got {v!r}")
    return v


def _choice(d: dict[str, Any], key: str, allowed: tuple[str, ...]) -> str | None:
    v = d.get(key)
    if v is not None and v not in allowed:
        raise ValueError(f"{key}: one of {', '.join(allowed)} is required, got {v!r}")
    return v


def _model(d: dict[str, Any]) -> str:
    model = d.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model: a local model folder is required")
    if not (Path(model).expanduser() / "config.json").is_file():
        raise ValueError(f"model: {model} is not a local model folder (no config.json)")
    return str(Path(model).expanduser())


def _candidates(d: dict[str, Any]) -> tuple[int, ...]:
    given = d.get("candidate_bits")
    if given is not None and ("low_bits" in d or "high_bits" in d):
        raise ValueError("candidate_bits: give either candidate_bits or low_bits/high_bits")
    if given is None:
        low, high = _int(d, "low_bits"), _int(d, "high_bits")
        given = [4 if low is None else low, 8 if high is None else high]
    if not isinstance(given, list | tuple) or len(given) < 2:
        raise ValueError("candidate_bits: a list of at least two bit widths is required")
    for b in given:
        if isinstance(b, bool) or not isinstance(b, int) or b not in AFFINE_BITS:
            raise ValueError(f"candidate_bits: widths are integers 2..8, got {b!r}")
    widths = tuple(sorted(set(given)))
    if len(widths) < 2:
        raise ValueError("candidate_bits: at least two different widths are required")
    return widths


def _target(d: dict[str, Any], mode: str, recipe: str | None) -> float | None:
    v = d.get("target_bpw")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 1.0 < float(v) <= 32.0:
        raise ValueError(f"target_bpw: a number of bits per weight is required, got {v!r}")
    if recipe is not None:
        raise ValueError("target_bpw: give either target_bpw or recipe, not both")
    if mode != "affine":
        raise ValueError("target_bpw: mixed bits need mode affine")
    return float(v)


def _parse(d: dict[str, Any]) -> QuantizeSpec:
    if not isinstance(d, dict):
        raise ValueError("spec: an object is required")
    known = {f.name for f in fields(QuantizeSpec)} | {"low_bits", "high_bits"}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown field")
    model = _model(d)
    mode = _choice(d, "mode", MODES) or "affine"
    default_group, default_bits = MODE_DEFAULTS[mode]
    bits, group_size = _int(d, "bits"), _int(d, "group_size")
    if mode == "affine":
        if bits is not None and bits not in AFFINE_BITS:
            raise ValueError(f"bits: 2..8 for affine, got {bits}")
        if group_size is not None and group_size not in AFFINE_GROUP_SIZES:
            raise ValueError(f"group_size: one of 32, 64, 128, got {group_size}")
    else:
        if bits is not None and bits != default_bits:
            raise ValueError(f"bits: {mode} is {default_bits}-bit, got {bits}")
        if group_size is not None and group_size != default_group:
            raise ValueError(f"group_size: {mode} groups {default_group} weights, got {group_size}")
    recipe = _choice(d, "recipe", RECIPES)
    if recipe is not None and mode != "affine":
        raise ValueError("recipe: mixed recipes need mode affine")
    target = _target(d, mode, recipe)
    has_candidates = any(k in d for k in ("candidate_bits", "low_bits", "high_bits"))
    if has_candidates and target is None:
        raise ValueError("candidate_bits: only used with target_bpw")
    calibration = d.get("calibration")
    if calibration is not None:
        if not isinstance(calibration, str) or not Path(calibration).expanduser().is_file():
            raise ValueError(f"calibration: a local text file is required, got {calibration!r}")
        if target is None:
            raise ValueError("calibration: only used with target_bpw")
        calibration = str(Path(calibration).expanduser())
    n_tokens = _int(d, "calibration_tokens")
    if n_tokens is not None and not 8 <= n_tokens <= 8192:
        raise ValueError(f"calibration_tokens: 8..8192, got {n_tokens}")
    name = d.get("name")
    if name is not None and (
        not isinstance(name, str) or not name or "/" in name or name.startswith(".")
    ):
        raise ValueError(f"name: a folder name is required, got {name!r}")
    return QuantizeSpec(
        model=model,
        mode=mode,
        bits=default_bits if bits is None else bits,
        group_size=default_group if group_size is None else group_size,
        recipe=recipe,
        target_bpw=target,
        candidate_bits=_candidates(d) if target is not None else (4, 8),
        calibration=calibration,
        calibration_tokens=256 if n_tokens is None else n_tokens,
        dtype=_choice(d, "dtype", DTYPES),
        name=name,
    )
