"""Stored responses (`store: true` on /v1/responses), so `previous_response_id` continues a
conversation, across restarts too.

SQLite (`<data_dir>/responses.sqlite3`, WAL): each response's full input items (its history
included, so a chain of `previous_response_id`s needs one read) and the response object. The
store is bounded: at most `max_stored` rows, none older than `max_age_s`, the oldest deleted
first. As each row holds its whole history, deleting an old response never breaks a newer one
that continues it; a `previous_response_id` naming a deleted one is unknown (a 404). One
connection behind a lock; the async methods run it off the event loop.
"""

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import private_dir
from .streaming import offload

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    input TEXT NOT NULL,
    response TEXT NOT NULL
)
"""
_AGE_INDEX = "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at)"
# Every row but the newest `max_stored` (rowid breaks ties of equal times: later is newer).
_OVER_COUNT = """
DELETE FROM responses WHERE rowid IN (
    SELECT rowid FROM responses ORDER BY created_at DESC, rowid DESC LIMIT -1 OFFSET ?
)
"""


class ResponseStore:
    def __init__(
        self,
        path: Path,
        max_stored: int = 0,
        max_age_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`max_stored` rows at most and none older than `max_age_s` seconds (0: no bound)."""
        private_dir(path.parent)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))  # SQLite gives its WAL these
        path.chmod(0o600)
        self.path, self.max_stored, self.max_age_s = path, max_stored, max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        # Autocommit: every write is its own transaction, durable before the call returns.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            self._db.execute(_SCHEMA)
            self._db.execute(_AGE_INDEX)
            self._evict()  # the bounds may have shrunk since the last run

    def _expired(self, created_at: float) -> bool:
        return self.max_age_s > 0 and created_at < self._clock() - self.max_age_s

    def _evict(self) -> None:
        """Delete rows past the bounds (under the lock)."""
        if self.max_age_s > 0:
            cutoff = self._clock() - self.max_age_s
            self._db.execute("DELETE FROM responses WHERE created_at < ?", (cutoff,))
        if self.max_stored > 0:
            self._db.execute(_OVER_COUNT, (self.max_stored,))

    def put(self, response_id: str, items: list[dict[str, Any]], response: dict) -> None:
        row = (response_id, self._clock(), json.dumps(items), json.dumps(response))
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", row)
            self._evict()

    def get(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """(input items, response object), or None when unknown or past the age bound."""
        with self._lock:
            row = self._db.execute(
                "SELECT input, response, created_at FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
        if row is None or self._expired(row[2]):  # no write since it aged out
            return None
        return json.loads(row[0]), json.loads(row[1])

    def delete(self, response_id: str) -> bool:
        with self._lock:
            self._evict()  # one past a bound is unknown here too, as in `get`
            cur = self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cur.rowcount > 0

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    async def save(self, response_id: str, items: list[dict[str, Any]], response: dict) -> None:
        await offload(lambda: self.put(response_id, items, response))

    async def load(self, response_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        return await offload(lambda: self.get(response_id))

    async def remove(self, response_id: str) -> bool:
        return await offload(lambda: self.delete(response_id))
