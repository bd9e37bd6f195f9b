"""`FineTuneSpec`: what a fine-tuning job trains, validated before the job is queued.

OpenAI's hyperparameters (`n_epochs`, `batch_size`, `learning_rate_multiplier`, each "auto" or a
value) sit beside mlxd's own knobs, which mirror `mlx_lm.lora`'s flags. A bad value or an unknown
key is a ValueError whose one-line message starts with the field's name.
"""

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

BASE_LEARNING_RATE = 1e-5  # mlx-lm's default; OpenAI's multiplier scales it
# OpenAI's published "auto" epochs heuristic: 3 epochs, raised so tiny files see >= 100 examples
# in all, lowered so huge ones see <= 25,000, within 1..25 epochs.
TARGET_EPOCHS, MIN_EPOCHS, MAX_EPOCHS = 3, 1, 25
MIN_TARGET_EXAMPLES, MAX_TARGET_EXAMPLES = 100, 25_000
AUTO_MAX_BATCH = 4
FINE_TUNE_TYPES = ("lora", "dora")


@dataclass(frozen=True)
class FineTuneSpec:
    model: str  # a local mlx-lm model folder
    train_file: str  # JSONL: chat ({"messages"}), {"prompt","completion"} or {"text"}
    valid_file: str | None = None  # None: no validation
    fine_tune_type: str = "lora"
    n_epochs: int | str = "auto"
    batch_size: int | str = "auto"
    learning_rate_multiplier: float | str = "auto"
    iters: int | None = None  # overrides n_epochs
    learning_rate: float | None = None  # absolute; overrides learning_rate_multiplier
    rank: int = 8
    scale: float = 20.0
    dropout: float = 0.0
    num_layers: int = 16  # the last N blocks get adapters; -1 = all
    max_seq_length: int = 2048
    mask_prompt: bool = True  # train on the completion / last assistant turn only
    seed: int = 0
    steps_per_report: int = 1
    steps_per_eval: int = 50
    val_batches: int = 25  # -1 = the whole validation file
    save_every: int = 100
    grad_checkpoint: bool = False
    resume_adapter_file: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FineTuneSpec":
        if not isinstance(d, dict):
            raise ValueError("fine-tuning spec must be an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown field")
        for name in ("model", "train_file"):
            if d.get(name) is None:
                raise ValueError(f"{name}: required")
        kw: dict[str, Any] = {}
        for name, value in d.items():
            kw[name] = _CHECKS[name](name, value)
        return cls(**kw)

    def resolved_epochs(self, n_examples: int) -> int:
        if self.n_epochs != "auto":
            return int(self.n_epochs)
        n = max(n_examples, 1)
        if n * TARGET_EPOCHS < MIN_TARGET_EXAMPLES:
            return min(MAX_EPOCHS, -(-MIN_TARGET_EXAMPLES // n))
        if n * TARGET_EPOCHS > MAX_TARGET_EXAMPLES:
            return max(MIN_EPOCHS, MAX_TARGET_EXAMPLES // n)
        return TARGET_EPOCHS

    def resolved_batch_size(self, n_examples: int) -> int:
        if self.batch_size != "auto":
            return int(self.batch_size)
        return max(1, min(AUTO_MAX_BATCH, n_examples))

    def resolved_learning_rate(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        mult = 1.0 if self.learning_rate_multiplier == "auto" else self.learning_rate_multiplier
        return BASE_LEARNING_RATE * float(mult)

    def resolved_iters(self, n_examples: int) -> int:
        """Steps to train: `iters`, else epochs x full batches per epoch (mlx-lm's batcher
        drops a last partial batch)."""
        if self.iters is not None:
            return self.iters
        per_epoch = max(1, n_examples // self.resolved_batch_size(n_examples))
        return self.resolved_epochs(n_examples) * per_epoch


def _int(name: str, v: Any, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{name}: must be an integer, got {v!r}")
    if v < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {v}")
    return v


def _float(name: str, v: Any, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name}: must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise ValueError(f"{name}: must be > 0, got {v}")
    return float(v)


def _auto(check: Any) -> Any:
    return lambda name, v: v if v == "auto" else check(name, v)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"{name}: must be true or false, got {v!r}")
    return v


def _path(kind: str, optional: bool) -> Any:
    def check(name: str, v: Any) -> str | None:
        if v is None and optional:
            return None
        if not isinstance(v, (str, Path)) or not str(v):
            raise ValueError(f"{name}: must be a path, got {v!r}")
        p = Path(v)
        ok = (p / "config.json").is_file() if kind == "model" else p.is_file()
        if not ok:
            what = "a model folder (with config.json)" if kind == "model" else "a file"
            raise ValueError(f"{name}: not {what}: {str(v)[:200]}")
        return str(v)

    return check


def _choice(name: str, v: Any) -> str:
    if v not in FINE_TUNE_TYPES:
        raise ValueError(f"{name}: must be one of {', '.join(FINE_TUNE_TYPES)}, got {v!r}")
    return v


def _num_layers(name: str, v: Any) -> int:
    if v == -1:
        return -1
    return _int(name, v)


def _dropout(name: str, v: Any) -> float:
    v = _float(name, v, positive=False)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name}: must be in [0, 1), got {v}")
    return v


_CHECKS: dict[str, Any] = {
    "model": _path("model", optional=False),
    "train_file": _path("file", optional=False),
    "valid_file": _path("file", optional=True),
    "resume_adapter_file": _path("file", optional=True),
    "fine_tune_type": _choice,
    "n_epochs": _auto(_int),
    "batch_size": _auto(_int),
    "learning_rate_multiplier": _auto(_float),
    "iters": lambda n, v: None if v is None else _int(n, v),
    "learning_rate": lambda n, v: None if v is None else _float(n, v),
    "rank": _int,
    "scale": _float,
    "dropout": _dropout,
    "num_layers": _num_layers,
    "max_seq_length": lambda n, v: _int(n, v, lo=2),
    "mask_prompt": _bool,
    "seed": lambda n, v: _int(n, v, lo=0),
    "steps_per_report": _int,
    "steps_per_eval": _int,
    "val_batches": lambda n, v: -1 if v == -1 else _int(n, v),
    "save_every": _int,
    "grad_checkpoint": _bool,
}
