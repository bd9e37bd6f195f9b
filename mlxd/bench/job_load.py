"""The background job of `mlxd bench serve --during-job`: a LoRA fine-tuning job on the served
model itself, over mlxd's own HTTP APIs (Files, `/v1/jobs`), long enough to outlast a round;
started before a round's agents, its state read before and after, cancelled with force after."""

import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from .fleet import words

# Long enough to outlast any round; the job is cancelled after it. Every step reports its
# metrics (steps_per_report 1), which is how the bench counts the steps a round overlapped.
HYPERPARAMETERS: dict[str, Any] = {
    "iters": 1_000_000, "batch_size": 4, "max_seq_length": 512, "learning_rate": 1e-5,
    "save_every": 1_000_000, "steps_per_report": 1,
}  # fmt: skip
EXAMPLES = 64
WARM_STEPS = 2
DONE = ("succeeded", "failed", "cancelled")


def training_jsonl(seed: str, examples: int = EXAMPLES) -> bytes:
    """Seeded chat examples of random words (the model learns nothing useful: only its load)."""
    rng = random.Random(seed)
    lines = []
    for i in range(examples):
        user = f"Question {i}: {' '.join(words(rng, 24))}?"
        answer = " ".join(words(rng, 96))
        msgs = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        lines.append(json.dumps({"messages": msgs}))
    return "\n".join(lines).encode()


@dataclass(frozen=True)
class JobState:
    """The job as the bench saw it at one moment: status, stage and its last trained step."""

    t: float  # time.perf_counter() of the read
    status: str
    stage: str | None
    step: int  # the last step a metrics event reported (0 before the first)

    def view(self) -> dict[str, Any]:
        return {"status": self.status, "stage": self.stage, "step": self.step}


class TrainingJob:
    """One fine-tuning job on `url`'s default model; `hp` overrides HYPERPARAMETERS."""

    def __init__(self, url: str, file_id: str, hp: dict[str, Any] | None = None) -> None:
        self.client = httpx.Client(base_url=url, timeout=60)
        self.file_id, self.hp = file_id, HYPERPARAMETERS | (hp or {})
        self.id: str | None = None
        self.step, self._seq = 0, 0

    @staticmethod
    def upload(url: str, seed: str) -> str:
        """The training file, uploaded once per run (every round's job reuses it)."""
        files = {"file": ("during-job.jsonl", training_jsonl(seed), "application/jsonl")}
        r = httpx.post(url + "/v1/files", files=files, data={"purpose": "fine-tune"}, timeout=60)
        if r.status_code != 200:
            raise RuntimeError(f"upload of the training file: HTTP {r.status_code}: {r.text}")
        return r.json()["id"]

    def start(self, timeout_s: float) -> JobState:
        """Create the job and wait until it has trained WARM_STEPS (the model loaded, the
        first step's compile behind it): a round's agents start against a job training."""
        method = {"type": "supervised", "supervised": {"hyperparameters": self.hp}}
        body = {"type": "fine_tune", "model": "default_model", "training_file": self.file_id,
                "priority": "background", "method": method}  # fmt: skip
        r = self.client.post("/v1/jobs", json=body)
        if r.status_code != 200:
            raise RuntimeError(f"creating the fine-tuning job: HTTP {r.status_code}: {r.text}")
        self.id = r.json()["id"]
        deadline = time.perf_counter() + timeout_s
        while (state := self.read()).step < WARM_STEPS:
            if state.status in DONE:
                raise RuntimeError(f"job {self.id} ended before training: {self._job()}")
            if time.perf_counter() > deadline:
                raise RuntimeError(f"job {self.id} not training after {timeout_s} s: {state}")
            time.sleep(0.1)
        return state

    def _job(self) -> dict[str, Any]:
        return self.client.get(f"/v1/jobs/{self.id}").json()

    def read(self) -> JobState:
        """The job's status now, and its last step from the events logged since the last read."""
        job = self._job()
        t = time.perf_counter()
        while True:
            q = {"after": self._seq, "limit": 1000}
            page = self.client.get(f"/v1/jobs/{self.id}/events", params=q).json()
            for e in page["data"]:
                self._seq = e["seq"]
                if e["type"] == "metrics" and "train_loss" in (e.get("data") or {}):
                    self.step = max(self.step, int(e["data"]["step"]))
            if not page["has_more"]:
                break
        return JobState(t, job["status"], job.get("stage"), self.step)

    def cancel(self, timeout_s: float = 120.0) -> str:
        """Cancel with force (the process killed at once) and wait for the job to be done, so
        that the next round runs without it; its final status."""
        self.client.post(f"/v1/jobs/{self.id}/cancel", params={"force": "true"})
        deadline = time.perf_counter() + timeout_s
        while (status := self._job()["status"]) not in DONE:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"job {self.id} still {status} {timeout_s} s after its cancel")
            time.sleep(0.1)
        self.client.close()
        return status


def overlap(before: JobState, after: JobState) -> dict[str, Any]:
    """What the job did across one round: valid only if it was running (training) at both ends
    and trained at least one step in between; its steps/s over the round's span."""
    steps = after.step - before.step
    span = after.t - before.t
    valid = before.status == after.status == "running" and steps > 0
    return {"before": before.view(), "after": after.view(), "steps": steps, "span_s": span,
            "steps_per_s": steps / span if span > 0 else None, "valid": valid}  # fmt: skip
