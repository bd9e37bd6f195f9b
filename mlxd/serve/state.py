"""What the app's handlers share: options, the models, metrics, the response store."""

import platform
import time
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm import __version__ as mlx_lm_version

from .provider import ModelProvider


def system_fingerprint() -> str:
    """mlx_lm.server's fingerprint: versions, platform and the device architecture."""
    try:
        arch = mx.device_info().get("architecture", "")
    except Exception:  # noqa: BLE001 - some backends have no device info
        arch = ""
    return f"{mlx_lm_version}-{mx.__version__}-{platform.platform()}-{arch}"


@dataclass
class ServerState:
    args: Any
    provider: ModelProvider
    metrics: Any = None  # metrics.Metrics
    store: Any = None  # responses_store.ResponseStore
    template_args: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    fingerprint: str = field(default_factory=system_fingerprint)
