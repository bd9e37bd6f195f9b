"""The job queue: one job runs at a time, in its own process (runner.py), once the model pool
grants its memory lease; its events update the job's row and land in its log; a job that
succeeds is put to work at once (publish.py). At start-up a job the last server left running
is failed with `server_restarted` (a fine-tuning job can resume from its last checkpoint)."""

import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ...config import child_environment
from ..errors import APIError
from ..process.incarnation import PACKAGE_ROOT
from .journal import Journal
from .publish import Publisher
from .runner import JobProcess
from .store import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, Job, JobStore

log = logging.getLogger("mlxd.serve")
STOP_GRACE_S = 60.0  # a cancel waits this long for the step to end, then kills
RESTARTED = {
    "code": "server_restarted",
    "message": "the server stopped while the job ran; resume it from its last checkpoint",
}
RETRY_S = 5  # an exclusive job's 503: jobs run for minutes, clients retry in seconds


class JobManager:
    def __init__(self, root: Path, pool: Any, publisher: Publisher) -> None:
        self.store = JobStore(root)
        self.pool, self.publisher = pool, publisher
        self._lock = threading.RLock()
        self._jobs: dict[str, Job] = {j.id: j for j in self.store.jobs()}
        self.journal = Journal(self.store)
        self._running: dict[str, JobProcess] = {}
        self._cancelling: set[str] = set()
        self._wake = threading.Event()
        self._closed = False
        for job in self._jobs.values():
            if job.status == RUNNING:  # its process ended with the last server
                self.journal.finish(job, FAILED, error=dict(RESTARTED))
            elif job.status == SUCCEEDED:
                self.publisher.publish(job, at_start=True)
        self._thread: threading.Thread | None = None  # started with the first queued job
        if any(j.status == QUEUED for j in self._jobs.values()):
            self._kick()

    def _kick(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._schedule, name="mlxd-jobs", daemon=True)
            self._thread.start()
        self._wake.set()

    # queries
    def get(self, job_id: str) -> Job:
        with self._lock:
            if (job := self._jobs.get(job_id)) is None:
                raise APIError(
                    404, f"job {job_id!r} not found", param="job_id", code="job_not_found"
                )
            return job

    def jobs(self, kind: str | None = None) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if kind is None or j.type == kind]

    def events(self, job_id: str) -> list[dict]:
        self.get(job_id)
        with self._lock:
            return list(self.journal.events(job_id))

    def exclusive(self) -> Job | None:
        """The exclusive job running now, if any: new inference waits for it (503)."""
        with self._lock:
            return next(
                (
                    j
                    for j in self._jobs.values()
                    if j.status == RUNNING and j.priority == "exclusive"
                ),
                None,
            )

    # changes
    def create(
        self, kind: str, model: str, request: dict, spec: dict, priority: str, lease: int
    ) -> Job:
        prefix = "ftjob" if kind == "fine_tune" else "qjob"
        job = Job(
            f"{prefix}-{uuid.uuid4().hex[:24]}",
            kind,
            model,
            request,
            spec,
            priority,
            lease_bytes=lease,
        )
        with self._lock:
            self._jobs[job.id] = job
            self.store.save(job)
            self.journal.event(job, "message", f"Created {kind.replace('_', '-')} job {job.id}")
        self._kick()
        return job

    def cancel(self, job_id: str, force: bool = False) -> Job:
        """Queued: cancelled now. Running: asked to stop at its next step (its work so far kept
        as a checkpoint), killed after STOP_GRACE_S, or at once with `force`."""
        with self._lock:
            job = self.get(job_id)
            if job.status == QUEUED:
                self.journal.finish(job, CANCELLED)
            elif job.status == RUNNING:
                self._cancelling.add(job.id)
                proc = self._running.get(job.id)
                if proc is not None:
                    self.journal.event(
                        job, "message", "Cancel requested" + (" (killed)" if force else "")
                    )
                    threading.Thread(
                        target=self._stop_then_kill, args=(proc, force), daemon=True
                    ).start()
            return job

    def stop(self, job_id: str) -> Job:
        """A running job ends at its next step and succeeds with what it has done."""
        with self._lock:
            job = self.get(job_id)
            if job.status != RUNNING or job.type != "fine_tune":
                raise APIError(
                    400, f"job {job_id} is {job.status}: only a running fine-tuning job stops early"
                )
            self.journal.event(job, "message", "Stop requested: the job ends at its next step")
            self._running[job.id].stop()
            return job

    def resume(self, job_id: str) -> Job:
        """A failed or cancelled fine-tuning job runs again from its last checkpoint."""
        with self._lock:
            job = self.get(job_id)
            if job.type != "fine_tune" or job.status not in (FAILED, CANCELLED):
                raise APIError(
                    400,
                    f"job {job_id} is {job.status}: only a failed or cancelled fine-tuning job "
                    "resumes",
                )
            ckpt = self.publisher.last_checkpoint(job, self.events(job_id))
            if ckpt is not None:
                job.spec = {**job.spec, "resume_adapter_file": ckpt["path"]}
                if job.spec.get("iters"):
                    job.spec["iters"] = max(int(job.spec["iters"]) - int(ckpt["step"]), 1)
            job.status, job.error, job.finished_at, job.progress = QUEUED, None, None, 0.0
            self.store.save(job)
            self.journal.event(
                job, "message", f"Resumed from step {ckpt['step']}" if ckpt else "Restarted"
            )
        self._kick()
        return job

    def _stop_then_kill(self, proc: JobProcess, force: bool) -> None:
        if not force:
            proc.stop()
            try:
                proc.proc.wait(timeout=STOP_GRACE_S)
                return
            except Exception:  # noqa: BLE001 - still running: kill it
                pass
        proc.kill()

    # the queue
    def _schedule(self) -> None:
        while not self._closed:
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            with self._lock:
                if self._closed or self._running:
                    continue
                job = next((j for j in self._jobs.values() if j.status == QUEUED), None)
                if job is None:
                    continue
            granted = self.pool.lease(job.id, job.lease_bytes)
            if granted is None:  # not now: models are running rows; try again soon
                continue
            if isinstance(granted, APIError):
                with self._lock:
                    self.journal.finish(
                        job,
                        FAILED,
                        error={"code": "insufficient_memory", "message": granted.message},
                    )
                continue
            with self._lock:
                if job.status == QUEUED and not self._closed:
                    self._start(job, granted)
                else:
                    self.pool.release(job.id)

    def _start(self, job: Job, limit: int) -> None:
        out = self.store.folder(job.id) / "out"
        out.mkdir(parents=True, exist_ok=True)
        job.status, job.started_at = RUNNING, time.time()
        self.store.save(job)
        self.journal.event(job, "message", "Job started")
        spec = {"type": job.type, "spec": job.spec, "out": str(out), "memory_limit": limit or None,
                "nice": 10 if job.priority == "background" else 0}  # fmt: skip
        self._running[job.id] = JobProcess(
            spec,
            self.store.folder(job.id) / "job.log",
            on_event=lambda e, j=job: self._on_event(j, e),
            on_exit=lambda code, j=job: self._on_exit(j, code),
            env=child_environment(PACKAGE_ROOT),
        )

    def _on_event(self, job: Job, event: dict) -> None:
        with self._lock:
            self.journal.apply(job, event)

    def _on_exit(self, job: Job, code: int) -> None:
        with self._lock:
            self._running.pop(job.id, None)
            self.pool.release(job.id)
            cancelled = job.id in self._cancelling
            self._cancelling.discard(job.id)
            if cancelled:
                self.journal.keep_final(job)  # a fine-tuning job stopped at a step: kept
                self.journal.finish(job, CANCELLED)
            elif self._closed:
                self.journal.finish(job, FAILED, error=dict(RESTARTED))
            elif job.result is not None and code == 0:
                try:
                    job.output_model = self.publisher.publish(job)
                    self.journal.finish(job, SUCCEEDED)
                except Exception as e:  # noqa: BLE001 - the work is done but cannot be served
                    log.exception("job %s: publishing its result", job.id)
                    self.journal.finish(
                        job, FAILED, error={"code": "publish_failed", "message": str(e)}
                    )
            else:
                error = job.error or {
                    "code": "process_died",
                    "message": f"the job process exited with {code}",
                }
                self.journal.finish(job, FAILED, error=error)
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            running = list(self._running.values())
        self._wake.set()
        for proc in running:
            proc.close()  # their on_exit fails them: the server is going
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.store.close()
