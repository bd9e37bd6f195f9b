"""`--log-format json`: every line `mlxd serve` logs (its own, uvicorn's, the request lines) is
one JSON object; uvicorn's access line is off unless `--access-log`."""

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from mlxd.serve.log_format import JsonFormatter


def test_json_formatter_fields_and_traceback() -> None:
    record = logging.LogRecord("mlxd.requests", logging.INFO, __file__, 1, "GET / %d", (200,), None)
    record.fields = {"request_id": "req_1", "status": 200, "message": "not a base key"}
    out = json.loads(JsonFormatter().format(record))
    assert out["message"] == "GET / 200" and out["level"] == "INFO"
    assert out["logger"] == "mlxd.requests" and out["time"].endswith("+00:00")
    assert out["request_id"] == "req_1" and out["status"] == 200
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", (), sys.exc_info())
    line = JsonFormatter().format(failed)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exception"]


def _serve(model: Path, data: Path, *flags: str) -> tuple[list[str], list[httpx.Response]]:
    """Run `mlxd serve` with `flags`, send a good and a bad request, stop it: its stderr lines."""
    from serve.conftest import free_port, wait_healthy

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "mlxd", "serve", "--model", str(model), "--port", str(port),
           "--data-dir", str(data), *flags]  # fmt: skip
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert wait_healthy(url, proc), "the server did not start"
        good = {"model": "default_model", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3}  # fmt: skip
        answers = [httpx.post(url + "/v1/chat/completions", json=good, timeout=60)]
        answers.append(httpx.post(url + "/v1/chat/completions", content=b"{", timeout=60))
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    return [line for line in err.splitlines() if line.strip()], answers


def test_serve_logs_json_lines(qwen3_model_dir: Path, tmp_path: Path) -> None:
    lines, (ok, bad) = _serve(qwen3_model_dir, tmp_path, "--log-format", "json")
    assert ok.status_code == 200 and bad.status_code == 400
    records = [json.loads(line) for line in lines]  # every line: one JSON object
    loggers = {r["logger"] for r in records}
    assert {"mlxd.serve", "mlxd.requests", "uvicorn.error"} <= loggers
    assert "uvicorn.access" not in loggers
    served = {r["request_id"]: r for r in records if r["logger"] == "mlxd.requests"}
    done = served[ok.headers["x-request-id"]]
    assert done["status"] == 200 and done["api"] == "chat"
    assert done["completion_tokens"] == ok.json()["usage"]["completion_tokens"] == 3
    assert done["finish"] == "length" and done["message"].startswith("POST /v1/chat/completions")
    refused = served[bad.headers["x-request-id"]]
    assert refused["status"] == 400 and refused["error"] == bad.json()["error"]["message"]


def test_access_log_flag_brings_uvicorns_line_back(qwen3_model_dir: Path, tmp_path: Path) -> None:
    lines, _ = _serve(qwen3_model_dir, tmp_path, "--access-log")
    access = [line for line in lines if '"POST /v1/chat/completions HTTP/1.1" 200' in line]
    assert len(access) == 1
    assert any(" - INFO - POST /v1/chat/completions 200 request_id=" in line for line in lines)
