"""`mlxd bench serve --adapters`: agents spread over LoRA adapters. Agent i uses adapter
i % K: mlxd serves them all with `--lora-modules lora0=PATH0 ...` and agent i's requests name
`lora{i % K}`; mlx_lm.server gets the path in its own `adapters` field (it reloads the model at
each switch). Side "mlxd-base" runs the same agents on the served model, no adapter."""

import argparse
from pathlib import Path
from typing import Any

BASE_SIDE = "mlxd-base"
MLXD_MAX_LORAS = 8  # mlxd's --max-loras default: more adapters than that would evict


def parse_adapters(text: str) -> list[str]:
    """`PATH[,PATH...]` (argparse type of --adapters): mlx-lm or PEFT adapter folders."""
    paths = [p.strip() for p in text.split(",") if p.strip()]
    if not paths:
        raise argparse.ArgumentTypeError("--adapters: no path given")
    for p in paths:
        if not (Path(p).expanduser() / "adapter_config.json").exists():
            raise argparse.ArgumentTypeError(f"--adapters: no adapter_config.json in {p}")
    return [str(Path(p).expanduser().resolve()) for p in paths]


def adapters(args: Any) -> list[str]:
    return list(getattr(args, "adapters", None) or [])


def adapter_name(i: int) -> str:
    return f"lora{i}"


def _mlxd(side: str) -> bool:  # variants.kind's test, here so that variants may import this file
    return side == "mlxd" or side.startswith("mlxd-")


def lora_flags(args: Any, side: str) -> list[str]:
    """mlxd's flags serving every adapter (none for the base side or mlx_lm.server); they come
    before --mlxd-args, so that a user's --max-loras wins."""
    paths = adapters(args)
    if not paths or not _mlxd(side) or side == BASE_SIDE:
        return []
    flags = ["--lora-modules", *(f"{adapter_name(i)}={p}" for i, p in enumerate(paths))]
    return flags + (["--max-loras", str(len(paths))] if len(paths) > MLXD_MAX_LORAS else [])


def agent_fields(args: Any, side: str, model: Path, agents: int) -> list[dict[str, Any]]:
    """Each agent's extra request fields on this side: its adapter's name (mlxd), or the model
    and its adapter's path (mlx_lm.server, whose "default_model" would override `adapters`
    with its --adapter-path); nothing without --adapters or on the base side."""
    paths = adapters(args)
    if not paths or side == BASE_SIDE:
        return [{} for _ in range(agents)]
    if _mlxd(side):
        return [{"model": adapter_name(i % len(paths))} for i in range(agents)]
    return [{"model": str(model), "adapters": paths[i % len(paths)]} for i in range(agents)]


def adapters_line(paths: list[str] | None) -> list[str]:
    """The table's line naming each adapter and who uses it ([] without --adapters)."""
    if not paths:
        return []
    named = ", ".join(f"{adapter_name(i)}={p}" for i, p in enumerate(paths))
    return [
        f"adapters: {named}; agent i uses lora{{i % {len(paths)}}} (mlx-lm: its `adapters` "
        f"path, reloading the model at each switch); {BASE_SIDE}: the same agents, no adapter"
    ]
