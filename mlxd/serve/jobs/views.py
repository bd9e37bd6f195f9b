"""Jobs as the APIs show them: OpenAI's `fine_tuning.job`, its events and checkpoints, and
mlxd's one envelope for every kind (`/v1/jobs`)."""

from typing import Any

from .store import Job

OPENAI_EVENT_TYPES = ("message", "metrics")


def _int(t: float | None) -> int | None:
    return int(t) if t is not None else None


def fine_tuning_job(job: Job, files: dict[str, str]) -> dict[str, Any]:
    """`files`: uploaded file paths -> ids (the spec keeps the paths)."""
    req, spec = job.request, job.spec
    hp = {k: spec.get(k, "auto") for k in ("batch_size", "learning_rate_multiplier", "n_epochs")}
    eta = job.started_at + job.eta_s if job.eta_s is not None and job.status == "running" else None
    return {
        "id": job.id, "object": "fine_tuning.job", "created_at": int(job.created_at),
        "error": {**job.error, "param": None} if job.error else None,
        "fine_tuned_model": job.output_model, "finished_at": _int(job.finished_at),
        "hyperparameters": hp, "model": job.model, "organization_id": "mlxd",
        "result_files": [], "seed": spec.get("seed", 0), "status": job.status,
        "trained_tokens": job.trained_tokens,
        "training_file": files.get(spec.get("train_file", "")),
        "validation_file": files.get(spec.get("valid_file", "")), "integrations": None,
        "estimated_finish": _int(eta), "metadata": req.get("metadata"),
        "method": {"type": "supervised", "supervised": {"hyperparameters": hp}},
        "user_provided_suffix": req.get("suffix"),
    }  # fmt: skip


def openai_event(event: dict) -> dict[str, Any]:
    kind = event.get("type") if event.get("type") in OPENAI_EVENT_TYPES else "message"
    return {"object": "fine_tuning.job.event", "id": event["id"], "created_at": event["created_at"],
            "level": event.get("level", "info"), "message": event.get("message", ""),
            "data": event.get("data"), "type": kind}  # fmt: skip


def checkpoints(job: Job, events: list[dict]) -> list[dict[str, Any]]:
    """Newest first, as OpenAI lists them."""
    out = []
    for e in events:
        if e.get("type") != "checkpoint":
            continue
        step = int(e["data"]["step"])
        model = f"{job.output_model or job.id}:ckpt-step-{step}"
        out.append({"object": "fine_tuning.job.checkpoint", "id": f"ftckpt-{job.id[6:]}-{step}",
                    "created_at": e["created_at"], "fine_tuned_model_checkpoint": model,
                    "fine_tuning_job_id": job.id, "step_number": step,
                    "metrics": e["data"].get("metrics") or {"step": step}})  # fmt: skip
    return out[::-1]


def job_object(job: Job) -> dict[str, Any]:
    """mlxd's envelope: every kind, its progress (0-1), stage and ETA in seconds."""
    return {
        "id": job.id, "object": "job", "type": job.type, "status": job.status,
        "model": job.model, "priority": job.priority, "progress": round(job.progress, 4),
        "stage": job.stage or None, "eta_s": job.eta_s, "created_at": int(job.created_at),
        "started_at": _int(job.started_at), "finished_at": _int(job.finished_at),
        "output_model": job.output_model, "result": job.result, "error": job.error,
        "trained_tokens": job.trained_tokens, "lease_bytes": job.lease_bytes,
    }  # fmt: skip


def page(items: list[dict], after: str | None, limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: the items after the one whose id is `after`, at most `limit`."""
    if after is not None:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    return {"object": "list", "data": items[:limit], "has_more": len(items) > limit}
