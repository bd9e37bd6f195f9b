"""Jobs and files that outlive the server: one SQLite file for the rows (jobs, uploaded
files) and one JSONL file of events per job, under `<data dir>/jobs`."""

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = (
    "queued",
    "running",
    "succeeded",
    "failed",
    "cancelled",
)
DONE = (SUCCEEDED, FAILED, CANCELLED)
TEXT = ("id", "type", "model", "status", "priority", "stage", "output_model")  # the rest is JSON


@dataclass
class Job:
    id: str
    type: str  # "fine_tune" or "quantize"
    model: str  # the base model's id, as the request named it
    request: dict  # the request as accepted (the OpenAI view shows its fields)
    spec: dict  # the driver's spec (mlxd/jobs)
    priority: str = "background"
    status: str = QUEUED
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    progress: float = 0.0
    stage: str = ""
    eta_s: float | None = None
    result: dict | None = None
    error: dict | None = None  # {"code", "message", "param"}
    output_model: str | None = None  # what `model` names to use the result
    trained_tokens: int | None = None
    lease_bytes: int = 0


@dataclass
class File:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    path: str


class JobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(root / "jobs.sqlite", check_same_thread=False)
        cols = ", ".join(
            f"{f.name} TEXT" if f.name != "id" else "id TEXT PRIMARY KEY" for f in fields(Job)
        )
        self._db.execute(f"CREATE TABLE IF NOT EXISTS jobs ({cols})")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT, purpose TEXT,"
            " bytes INTEGER, created_at INTEGER, path TEXT)"
        )
        self._db.commit()

    def folder(self, job_id: str) -> Path:
        return self.root / job_id

    # jobs
    def save(self, job: Job) -> None:
        row = {k: v if k in TEXT else json.dumps(v) for k, v in asdict(job).items()}
        marks = ", ".join("?" * len(row))
        with self._lock:
            self._db.execute(
                f"INSERT OR REPLACE INTO jobs ({', '.join(row)}) VALUES ({marks})",
                list(row.values()),
            )
            self._db.commit()

    def jobs(self) -> list[Job]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM jobs ORDER BY created_at")
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        return [_job(dict(zip(names, r, strict=True))) for r in rows]

    def delete(self, job_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            self._db.commit()

    # events
    def append_event(self, job_id: str, event: dict) -> None:
        folder = self.folder(job_id)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "events.jsonl", "a") as f:
            f.write(json.dumps(event, default=str) + "\n")

    def events(self, job_id: str) -> list[dict]:
        path = self.folder(job_id) / "events.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut short by a crash mid-write
        return out

    # files
    def add_file(self, f: File) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)", tuple(asdict(f).values())
            )
            self._db.commit()

    def files(self) -> list[File]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM files ORDER BY created_at").fetchall()
        return [File(*r) for r in rows]

    def delete_file(self, file_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _job(row: dict[str, Any]) -> Job:
    return Job(**{f.name: _value(f.name, row.get(f.name)) for f in fields(Job)})


def _value(name: str, raw: Any) -> Any:
    return raw if name in TEXT or raw is None else json.loads(raw)
