"""One job's process: started with the job on its stdin, its events read line by line on a
thread, a cooperative stop sent as a line, a hard cancel as a kill of its process group. The
server's exit closes the pipe, and the job process ends with it (child.py)."""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("mlxd.serve")


class JobProcess:
    """`on_event(event)` for each event line; `on_exit(returncode)` once, after the last one."""

    def __init__(
        self,
        job: dict,
        log_path: Path,
        on_event: Callable[[dict], None],
        on_exit: Callable[[int], None],
        env: dict[str, str] | None = None,
    ) -> None:
        self._log = open(log_path, "ab")  # noqa: SIM115 - the process writes it while it runs
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlxd.jobs.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,  # Ctrl-C on the server reaches the server only
            env=env,
        )
        assert self.proc.stdin is not None
        self._stdin = self.proc.stdin
        self._write(json.dumps(job))
        self._on_event, self._on_exit = on_event, on_exit
        self._reader = threading.Thread(target=self._read, name="mlxd-job-events", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the process is gone already
            self._stdin.write((line + "\n").encode())
            self._stdin.flush()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 - a bad event must not stop the reading
                log.exception("job event %r", event)
        code = self.proc.wait()
        self._log.close()
        self._on_exit(code)

    def stop(self) -> None:
        """Ask the job to end at its next step, keeping what it has done."""
        self._write("stop")

    def kill(self, grace_s: float = 5.0) -> None:
        """SIGTERM to its process group, then SIGKILL after `grace_s`."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def close(self) -> None:
        """The server is going: EOF on stdin ends the job (child.py), then make sure."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill(grace_s=1)
        self._reader.join(timeout=5)  # its on_exit has run
