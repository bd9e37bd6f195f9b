"""Stored responses in SQLite (`<data_dir>/responses.sqlite3`, WAL): each response's full input
items (its history included, so a chain of `previous_response_id`s needs one read) and the
response object. One connection behind a lock; the async methods run it off the event loop."""

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from .offload import offload

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    input TEXT NOT NULL,
    response TEXT NOT NULL
)
"""


class ResponseStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        # Autocommit: every write is its own transaction, durable before the call returns.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute(_SCHEMA)

    def put(self, response_id: str, items: list[dict[str, Any]], response: dict) -> None:
        row = (response_id, time.time(), json.dumps(items), json.dumps(response))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", row)

    def get(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """(input items, response object), or None when unknown."""
        with self._lock:
            row = self._db.execute(
                "SELECT input, response FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        return None if row is None else (json.loads(row[0]), json.loads(row[1]))

    def delete(self, response_id: str) -> bool:
        with self._lock:
            cur = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cur.rowcount > 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def save(self, response_id: str, items: list[dict[str, Any]], response: dict) -> None:
        await offload(lambda: self.put(response_id, items, response))

    async def load(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        return await offload(lambda: self.get(response_id))

    async def remove(self, response_id: str) -> bool:
        return await offload(lambda: self.delete(response_id))
