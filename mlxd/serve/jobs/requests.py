"""A job request, checked at the door: the base model (a served one), the files it names,
the driver's spec (validated by the driver's own `from_dict`, so a bad knob is a 400 before
anything queues) and the memory lease the job asks of the pool."""

import json
import re
from pathlib import Path
from typing import Any

from ...model.resolve import resolve_model
from ..errors import APIError, bad_request

PRIORITIES = ("background", "exclusive")
SUFFIX = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
SERVER_KEYS = {"model", "train_file", "valid_file", "resume_adapter_file", "seed"}


def base_folder(state: Any, model: Any) -> Path:
    """Fine-tuning and quantizing start from a served model: its folder on this machine."""
    provider = state.provider
    if not isinstance(model, str) or not model:
        raise bad_request("model must be the name of a served model", "model")
    entry = provider._default if provider.serves(model) else provider.pool.find(model)
    if entry is None:
        raise APIError(404, f"model {model!r} is not served here; GET /v1/models lists the "
                       "models it serves", param="model", code="model_not_found")  # fmt: skip
    return Path(entry.spec.path).expanduser() if entry.spec.path else resolve_model(None)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


def priority_of(body: dict) -> str:
    priority = body.get("priority", "background")
    if priority not in PRIORITIES:
        raise bad_request(f"priority must be one of {', '.join(PRIORITIES)}", "priority")
    return priority


def _file_path(state: Any, body: dict, key: str, required: bool) -> str | None:
    file_id = body.get(key)
    if file_id is None and not required:
        return None
    for f in state.jobs.store.files():
        if f.id == file_id:
            if f.purpose != "fine-tune":
                raise bad_request(f"{key} {file_id} was uploaded with purpose {f.purpose!r}", key)
            return f.path
    raise bad_request(f"invalid {key}: {file_id!r} is not an uploaded file", key)


def _hyperparameters(body: dict) -> dict:
    """`method.supervised.hyperparameters`, else the deprecated top-level `hyperparameters`."""
    method = body.get("method")
    if method is not None:
        if not isinstance(method, dict) or method.get("type", "supervised") != "supervised":
            raise bad_request(
                "method.type must be supervised (LoRA / DoRA on mlx-lm's trainer)", "method"
            )
        hp = (method.get("supervised") or {}).get("hyperparameters") or {}
    else:
        hp = body.get("hyperparameters") or {}
    if not isinstance(hp, dict):
        raise bad_request("hyperparameters must be an object", "hyperparameters")
    if reserved := sorted(set(hp) & SERVER_KEYS):  # paths on the server's disk: its own to set
        raise bad_request(
            f"hyperparameters: {reserved[0]} is not a hyperparameter", "hyperparameters"
        )
    return hp


def fine_tune(state: Any, body: dict) -> tuple[str, dict, dict, str, int]:
    """(model, request, spec, priority, lease) of a `POST /v1/fine_tuning/jobs` body."""
    from ...jobs.finetune_spec import FineTuneSpec

    known = {"model", "training_file", "validation_file", "hyperparameters", "method", "seed",
             "suffix", "metadata", "integrations", "priority", "type"}  # fmt: skip
    if unknown := sorted(set(body) - known):
        raise bad_request(f"unknown field {unknown[0]!r}", unknown[0])
    if body.get("integrations"):
        raise bad_request("integrations (wandb) are not supported", "integrations")
    suffix = body.get("suffix")
    if suffix is not None and not (isinstance(suffix, str) and SUFFIX.match(suffix)):
        raise bad_request("suffix is 1-64 letters, digits, '.', '_' or '-'", "suffix")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_request("seed must be an integer", "seed")
    folder = base_folder(state, body.get("model"))
    if not state.provider.serves(body["model"]):  # adapters are served over that one engine
        default = state.provider.names[0]
        raise bad_request(f"fine-tuning runs on the default served model ({default}): its "
                          "adapters are served by name over its engine", "model")  # fmt: skip
    spec = {"model": str(folder), **_hyperparameters(body),
            "train_file": _file_path(state, body, "training_file", True),
            "valid_file": _file_path(state, body, "validation_file", False)}  # fmt: skip
    if seed is not None:
        spec["seed"] = seed
    spec = {k: v for k, v in spec.items() if v is not None}
    try:
        FineTuneSpec.from_dict(spec)
    except ValueError as e:
        raise bad_request(f"hyperparameters: {e}", "hyperparameters") from e
    return body["model"], body, spec, priority_of(body), fine_tune_lease(folder, spec)


def fine_tune_lease(folder: Path, spec: dict) -> int:
    """Weights, a quarter more for the LoRA state and MLX's buffers, and the activations of
    one batch (batch x length x hidden x layers, a few values of 4 bytes each)."""
    config = json.loads((folder / "config.json").read_text())
    hidden = int(config.get("hidden_size", 4096))
    layers = int(config.get("num_hidden_layers", 32))
    batch = spec.get("batch_size") if isinstance(spec.get("batch_size"), int) else 4
    length = int(spec.get("max_seq_length", 2048))
    activations = batch * length * hidden * layers * 4 * (2 if spec.get("grad_checkpoint") else 16)
    weights = folder_bytes(folder)
    return weights + weights // 4 + activations


def quantize(state: Any, body: dict) -> tuple[str, dict, dict, str, int]:
    """(model, request, spec, priority, lease) of a `POST /v1/jobs` quantize body: every field
    but `type`, `model` and `priority` goes to the quantizer's spec."""
    from ...jobs.quantize_spec import QuantizeSpec

    folder = base_folder(state, body.get("model"))
    spec = {
        k: v for k, v in body.items() if k not in ("type", "model", "priority", "calibration_file")
    }
    spec["model"] = str(folder)
    if (cal := body.get("calibration_file")) is not None:
        spec["calibration"] = _calibration_path(state, cal)
    try:
        QuantizeSpec.from_dict(spec)
    except ValueError as e:
        raise bad_request(str(e)) from e
    weights = folder_bytes(folder)  # the source, and the measured model beside it
    return body["model"], body, spec, priority_of(body), 2 * weights


def _calibration_path(state: Any, file_id: Any) -> str:
    for f in state.jobs.store.files():
        if f.id == file_id:
            return f.path
    raise bad_request(f"calibration_file {file_id!r} is not an uploaded file", "calibration_file")
