"""What a job has done, as it reports it: its row (status, progress, ETA, result, error) and
its numbered event log. The caller holds the manager's lock."""

import time
from pathlib import Path
from typing import Any

from .store import CANCELLED, FAILED, SUCCEEDED, Job, JobStore

SAVE_EVERY_S = 1.0  # progress lands in SQLite at most this often; the row in memory is live


class Journal:
    def __init__(self, store: JobStore) -> None:
        self.store = store
        self._events: dict[str, list[dict]] = {}
        self._saved: dict[str, float] = {}

    def events(self, job_id: str) -> list[dict]:
        if job_id not in self._events:
            self._events[job_id] = self.store.events(job_id)
        return self._events[job_id]

    def event(
        self, job: Job, kind: str, message: str, level: str = "info", data: Any = None
    ) -> None:
        events = self.events(job.id)
        seq = len(events) + 1
        event = {"id": f"{job.id}-event-{seq}", "seq": seq, "created_at": int(time.time()),
                 "level": level, "type": kind, "message": message, "data": data}  # fmt: skip
        events.append(event)
        self.store.append_event(job.id, event)

    def apply(self, job: Job, event: dict) -> None:
        """One event of the job's process onto its row and log."""
        kind = event.get("type")
        if kind == "progress":
            self._progress(job, event)
        elif kind == "result":
            job.result = event["result"]
        elif kind == "error":
            job.error = {"code": event.get("code"), "message": event.get("message")}
            self.event(job, "message", event.get("message", ""), level="error")
        elif kind == "checkpoint":
            data = {k: event.get(k) for k in ("step", "path", "metrics")}
            self.event(
                job,
                kind,
                event.get("message") or f"Checkpoint at step {event.get('step')}",
                data=data,
            )
        else:
            data = event.get("data") or {}
            if kind == "metrics" and data.get("trained_tokens"):
                job.trained_tokens = int(data["trained_tokens"])
            self.event(
                job,
                kind or "message",
                event.get("message", ""),
                event.get("level", "info"),
                data or None,
            )

    def _progress(self, job: Job, event: dict) -> None:
        """The driver's ETA, else one from the pace so far."""
        job.progress, job.stage = event["progress"], event.get("stage") or job.stage
        job.eta_s = event.get("eta_s")
        if job.eta_s is None and job.started_at and 0 < job.progress < 1:
            spent = time.time() - job.started_at
            job.eta_s = round(spent * (1 - job.progress) / job.progress, 1)
        if time.monotonic() - self._saved.get(job.id, 0.0) >= SAVE_EVERY_S:
            self._saved[job.id] = time.monotonic()
            self.store.save(job)

    def keep_final(self, job: Job) -> None:
        """The adapter a cancelled job saved at its last step, listed with its checkpoints."""
        if job.type != "fine_tune" or job.result is None:
            return
        path = Path(job.result["adapter_path"]) / "adapters.safetensors"
        if path.exists():
            step = int(job.result.get("steps", 0))
            data = {"step": step, "path": str(path), "metrics": {"step": step}}
            self.event(job, "checkpoint", f"Checkpoint at step {step} (cancelled)", data=data)

    def finish(self, job: Job, status: str, error: dict | None = None) -> None:
        job.status, job.finished_at = status, time.time()
        job.error = error if status == FAILED else None
        job.eta_s = None
        if status == SUCCEEDED:
            job.progress = 1.0
        self.store.save(job)
        text = {SUCCEEDED: "The job has successfully completed", CANCELLED: "The job was cancelled",
                FAILED: f"The job failed: {(error or {}).get('message', '')}"}[status]  # fmt: skip
        self.event(job, "message", text, level="error" if status == FAILED else "info")
