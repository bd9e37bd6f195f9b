"""A succeeded job's result, put to work: a fine-tuned adapter becomes a model name every API
takes (served over its base through the per-request adapters, lora.py); a quantized model joins
the pool under its own name and is listed by `mlxd models`."""

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from ...config import mlxd_home
from ..pool_specs import ModelSpec
from .store import Job

log = logging.getLogger("mlxd.serve")


def quantized_home() -> Path:
    """Where quantized models live (`mlxd quantize`'s default, and `mlxd models` lists them)."""
    return mlxd_home() / "models"


def fine_tuned_name(base: str, suffix: str | None, job_id: str) -> str:
    """OpenAI's `ft:<base>:<org>:<suffix>:<id>` without the organisation."""
    return f"ft:{base}:{suffix or ''}:{job_id.removeprefix('ftjob-')}"


def quantized_name(base: str, spec: dict) -> str:
    """`<base's last path part>-<4bit | mxfp4 | mixed_3_6 | 4.5bpw>`, or the request's `name`."""
    if spec.get("name"):
        return spec["name"]
    if spec.get("target_bpw"):
        label = f"{spec['target_bpw']:g}bpw"
    elif spec.get("recipe"):
        label = spec["recipe"]
    elif spec.get("mode", "affine") != "affine":
        label = spec["mode"]
    else:
        label = f"{spec.get('bits', 4)}bit"
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{base.rstrip('/').split('/')[-1]}-{label}")


class Publisher:
    def __init__(self, provider: Any) -> None:
        self.provider = provider

    def publish(self, job: Job, at_start: bool = False) -> str | None:
        """The result's model name, served from now on (at start-up: a failure only logged)."""
        try:
            return self._fine_tuned(job) if job.type == "fine_tune" else self._quantized(job)
        except Exception as e:
            if not at_start:
                raise
            log.warning("job %s: its result is no longer served: %s", job.id, e)
            return None

    def _fine_tuned(self, job: Job) -> str:
        name = job.output_model or fine_tuned_name(job.model, job.request.get("suffix"), job.id)
        path = str(job.result["adapter_path"])
        loras = self.provider.loras
        loras.start_paths.add(path)  # a reload after eviction needs no --allow-model-paths
        if name not in dict(loras.entries()):
            loras.load(name, path)
        return name

    def _quantized(self, job: Job) -> str:
        made = Path(job.result["model_path"])
        name = job.output_model or quantized_name(job.model, job.spec)
        if job.output_model is None:  # first publish: the folder moves where models are kept
            home = quantized_home()
            home.mkdir(parents=True, exist_ok=True)
            while (home / name).exists() or self.provider.pool.find(name) is not None:
                name = f"{name}-{job.id[-6:]}"
            shutil.move(made, home / name)
            job.result = {**job.result, "model_path": str(home / name)}
        if self.provider.pool.find(name) is None:
            self.provider.pool.add(ModelSpec(name, job.result["model_path"]))
        return name

    def last_checkpoint(self, job: Job, events: list[dict]) -> dict | None:
        """The newest checkpoint the job's events name whose file is still there."""
        for event in reversed(events):
            data = event.get("data") or {}
            if event.get("type") == "checkpoint" and Path(data.get("path", "")).exists():
                return data
        return None
