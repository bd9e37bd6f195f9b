"""How `mlxd serve` writes its log: `--log-format text` (one readable line a record) or `json`
(one JSON object a line, for log collectors). Every logger goes through the root handler set
here, uvicorn's included (main.py gives uvicorn no handlers of its own), so one format holds
for every line the server logs."""

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s - %(levelname)s - %(message)s"
BASE_KEYS = ("time", "level", "logger", "message")  # a record's fields never replace these


class JsonFormatter(logging.Formatter):
    """A record as one JSON object: time (UTC, ISO 8601), level, logger, message, the record's
    `fields` (a request line's request_id, tokens, timings...) and a traceback when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update((k, v) for k, v in fields.items() if k not in BASE_KEYS)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure(level: str, log_format: str) -> None:
    """The root logger's level and one stderr handler in `log_format`, unless the embedding
    program configured logging already (basicConfig's rule). Python's warnings go through it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
    logging.captureWarnings(True)
