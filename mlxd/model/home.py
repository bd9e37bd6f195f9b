"""Where mlxd keeps what it makes: converted models, the default model, later the SSD tier."""

import os
from pathlib import Path


def mlxd_home() -> Path:
    """`MLXD_HOME`, else `~/.cache/mlxd` (created on first use)."""
    root = os.environ.get("MLXD_HOME")
    path = Path(root).expanduser() if root else Path.home() / ".cache" / "mlxd"
    path.mkdir(parents=True, exist_ok=True)
    return path
