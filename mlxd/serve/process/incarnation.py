"""One engine process and its two sockets: started with its settings on stdin, watched by a
receiver thread that hands each message to its owner and reports the process's exit."""

import logging
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from ...config import child_environment
from . import wire

log = logging.getLogger("mlxd.serve")
PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder that holds mlxd/
POLL_MS = 100  # how soon an exit is noticed while no message comes
# A PUSH socket's send waits while no process is connected (not yet, or no more): bounded.
SEND_TIMEOUT_MS = 2000


class Gone(ConnectionError):
    """The message could not be sent: the engine process is not connected."""


def exit_reason(code: int) -> str:
    """`code` as Popen gives it (negative: the signal that ended it)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class Incarnation:
    """`on_items(self, items)` runs on the receiver thread for each message; `on_exit(self,
    code)` once, after the last message, when the process has ended."""

    def __init__(
        self,
        ctx: zmq.Context,
        init: dict[str, Any],
        on_items: Callable[["Incarnation", list[Any]], None],
        on_exit: Callable[["Incarnation", int], None],
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="mlxd-engine-")  # private (0700): the sockets' home
        self._lock = threading.Lock()  # the PUSH socket is not thread-safe
        self.to_child = ctx.socket(zmq.PUSH)
        self.to_child.setsockopt(zmq.LINGER, 0)
        self.to_child.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        self.from_child = ctx.socket(zmq.PULL)
        self.from_child.setsockopt(zmq.LINGER, 0)
        addr_in, addr_out = f"ipc://{self.dir}/in", f"ipc://{self.dir}/out"
        self.to_child.bind(addr_in)
        self.from_child.bind(addr_out)
        self.on_items, self.on_exit = on_items, on_exit
        # A session of its own: the terminal's Ctrl-C reaches the server, which closes it.
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mlxd.serve.process.child"],
            stdin=subprocess.PIPE,
            env=child_environment(PACKAGE_ROOT),
            start_new_session=True,
        )
        blob = pickle.dumps({**init, "to_child": addr_in, "to_parent": addr_out})
        assert self.proc.stdin is not None
        self.proc.stdin.write(struct.pack("<Q", len(blob)) + blob)
        self.proc.stdin.flush()  # kept open: its end tells the process the server is gone
        self.closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True, name="mlxd-engine-rx")
        self._thread.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, msg: Any) -> None:
        """Raises Gone when the process is not there to take it."""
        data = wire.encode(msg)
        with self._lock:
            if self.closed:
                raise Gone("the engine process has ended")
            try:
                self.to_child.send(data)
            except zmq.Again:
                raise Gone("the engine process is not taking messages") from None

    def _receive(self) -> None:
        sock = self.from_child
        while True:
            if sock.poll(POLL_MS):
                self._deliver(sock.recv())
                continue
            code = self.proc.poll()
            if code is not None:
                while sock.poll(0):  # what it sent before it ended
                    self._deliver(sock.recv())
                break
        self._close_sockets()
        self.on_exit(self, code)

    def _deliver(self, data: bytes) -> None:
        try:
            self.on_items(self, wire.to_parent(data))
        except Exception:  # a bad message must not stop the watch over the process
            log.exception("engine process message not handled")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def wait(self, timeout: float) -> bool:
        """True once the process has ended and the receiver has reported it."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _close_sockets(self) -> None:
        with self._lock:
            self.closed = True
            self.to_child.close()
        self.from_child.close()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
