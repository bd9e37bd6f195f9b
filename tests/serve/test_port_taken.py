"""`mlxd serve` on a port another server holds: one line naming the port and the flag to change,
exit status 1, at once (before the model loads)."""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from mlxd.serve.port import port_problem


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port a live server holds: bound and listening on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_serve_on_a_taken_port_fails_at_once(held_port: int, tmp_path) -> None:
    # A model that does not exist: had the model load come first, its error would show instead.
    cmd = [sys.executable, "-m", "mlxd", "serve", "--port", str(held_port),
           "--model", str(tmp_path / "no-such-model")]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("mlxd serve: error: port ")
    assert str(held_port) in lines[0] and "--port" in lines[0] and "in use" in lines[0]
    assert "no-such-model" not in proc.stderr and "Errno" not in proc.stderr
    assert elapsed < 60  # the CLI's imports, nothing more


def test_port_problem(held_port: int) -> None:
    assert "in use" in (port_problem("127.0.0.1", held_port) or "")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert port_problem("127.0.0.1", free) is None
    assert port_problem("localhost", free) is None
    assert "--host" in (port_problem("203.0.113.7", free) or "")  # not this machine's address
    assert "--host" in (port_problem("no-such-host.invalid", free) or "")
