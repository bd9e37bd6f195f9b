"""How a model folder says its token states pool into one embedding: sentence-transformers'
`modules.json` names a Pooling module whose `config.json` picks cls, mean or last-token pooling.
A folder without one (a causal LM) pools by the mean, as OpenAI-compatible servers do."""

import json
from pathlib import Path
from typing import Literal

Pooling = Literal["mean", "cls", "last"]

POOLING_MODULE = "sentence_transformers.models.Pooling"
# sentence-transformers' config keys; where several are set it concatenates their outputs,
# which no OpenAI client expects: the first set here wins
_MODES: tuple[tuple[str, Pooling], ...] = (
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_mean_tokens", "mean"),
)


def pooling_of(folder: str | Path | None) -> Pooling:
    """The pooling `folder`'s sentence-transformers config names; "mean" when it names none or
    one mlxd does not run (max, weighted mean: their outputs would not be that model's)."""
    if folder is None:
        return "mean"
    root = Path(folder)
    try:
        modules = json.loads((root / "modules.json").read_text())
    except (OSError, ValueError):
        return "mean"
    if not isinstance(modules, list):
        return "mean"
    for module in modules:
        if isinstance(module, dict) and module.get("type") == POOLING_MODULE:
            return _mode(root / str(module.get("path", "")) / "config.json")
    return "mean"


def _mode(config_file: Path) -> Pooling:
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return "mean"
    if not isinstance(config, dict):
        return "mean"
    for key, mode in _MODES:
        if config.get(key) is True:
            return mode
    return "mean"
