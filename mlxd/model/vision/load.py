"""Load a vision-language model folder through mlx-vlm (the optional `mlxd[vision]` extra)."""

import json
from pathlib import Path
from typing import Any

from ..errors import ModelLoadError
from .model import VisionModel


def _config(folder: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def is_vision_folder(folder: Path) -> bool:
    """config.json names a model with a vision tower that mlx-vlm has a class for."""
    config = _config(folder)
    if config is None or not isinstance(config.get("vision_config"), dict):
        return False
    try:
        from mlx_vlm.utils import get_model_and_args
    except ImportError:  # the `vision` extra is not installed: not a model mlxd can load
        return False
    try:
        get_model_and_args(config=dict(config))
    except (ValueError, ImportError, KeyError, TypeError):
        return False
    return True


def load_vision(folder: Path) -> tuple[VisionModel, Any]:
    """(the model, mlx-vlm's processor); a folder mlx-vlm cannot load is a one-line
    ModelLoadError naming config.json or the failing file."""
    from mlx_vlm.utils import load

    folder = Path(folder)
    try:
        vlm, processor = load(str(folder))
    except Exception as e:  # mlx-vlm raises many kinds (config fields, shapes, files)
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        raise ModelLoadError(f"{folder / 'config.json'}: {type(e).__name__}: {text[:300]}") from e
    # What vision_prompt passes to prepare_inputs, as mlx-vlm's generate reads it off the model.
    processor.mlxd_model_type = getattr(vlm.config, "model_type", "")
    processor.mlxd_image_token_index = getattr(vlm.config, "image_token_index", None)
    return VisionModel(vlm), processor
