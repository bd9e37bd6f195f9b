"""Connection-level limits uvicorn lacks: a deadline for a request's head and a cap on open
connections, mixed into uvicorn's h11 or httptools protocol (`--http`).

uvicorn times out only an idle keep-alive connection: one that opens and sends half a request
head (or drips a byte a second) keeps its file descriptor forever, and 2,100 of them ran the
process out of descriptors (/health failed too). Its `limit_concurrency` does not help: it
counts connections only once a whole head has arrived, then answers 503 to every request,
/health included, while half-open connections fill the count.

Here a connection must send its request head within `header_timeout` seconds of opening (or
of the first byte of its next request): else it is answered 408 and closed. Past
`max_connections`, the connection that has waited longest for a request head (half-open or
idle keep-alive) is closed to make room; only when every connection is busy with a request is
the new one answered 503 at once. So stalled connections never starve /health."""

import asyncio
import json
import logging
import time
from typing import Any

log = logging.getLogger("mlxd.serve")

FD_HEADROOM = 128  # descriptors kept for model files, the SSD tier, sockets to clients' DNS...


def fd_limit() -> int | None:
    """The process's soft limit on open files, raised to its hard limit first where allowed
    (macOS starts processes at 256); None where it cannot be read."""
    try:
        import resource
    except ImportError:  # no rlimits on this platform
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # macOS refuses more than OPEN_MAX (10240) even when the hard limit says unlimited.
    want = 10240 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return None if soft == resource.RLIM_INFINITY else soft


def connection_cap(requested: int, fds: int | None) -> int:
    """`--max-connections` within the descriptors left after headroom (a quarter of the
    limit, at least FD_HEADROOM), so accepting never fails for want of a descriptor."""
    if fds is None:
        return requested
    return min(requested, max(8, fds - max(FD_HEADROOM, fds // 4)))


def _raw_response(status: str, message: str, kind: str, extra: str = "") -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind}}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


TIMED_OUT = _raw_response(
    "408 Request Timeout", "the request head did not arrive in time", "invalid_request_error"
)


class Limits:
    """One server's settings, shared by its connections."""

    def __init__(self, header_timeout: float, max_connections: int) -> None:
        self.header_timeout, self.max_connections = header_timeout, max_connections
        self.refused = 0  # connections answered 503 (tests, logs)
        self.evicted = 0  # waiting connections closed to make room
        self.timed_out = 0  # heads that did not arrive in time
        self._warned_at = -1e9
        self.full = _raw_response(
            "503 Service Unavailable",
            f"too many open connections (--max-connections {max_connections})",
            "server_error",
            "retry-after: 1\r\n",
        )

    def admit(self, conn: "Guarded") -> bool:
        """Room for `conn`: free, or made by closing the longest-waiting connection."""
        connections = conn.connections
        if len(connections) <= self.max_connections:
            return True  # the per-connection fast path (closing ones still count: rare)
        live = [c for c in connections if c is not conn and not c.transport.is_closing()]
        if len(live) < self.max_connections:
            return True
        waiting = [c for c in live if getattr(c, "idle_since", None) is not None]
        if waiting:
            self.evicted += 1
            min(waiting, key=lambda c: c.idle_since).transport.close()
            return True
        self.refused += 1
        if time.monotonic() - self._warned_at > 60:  # an attack would flood the log
            self._warned_at = time.monotonic()
            log.warning("refusing connections: %d are open and busy", len(live))
        conn.transport.write(self.full)
        conn.transport.close()
        return False


class Guarded:
    """Mixed in before uvicorn's H11Protocol or HttpToolsProtocol (both keep `self.cycle`,
    None or its request's, and call `on_response_complete` when a response ends)."""

    limits: Limits
    cycle: Any
    connections: set[Any]
    transport: asyncio.Transport
    idle_since: float | None = None  # waiting for a request head since (None: busy)
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self.idle_since = time.monotonic()
        if self.limits.admit(self):
            self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            if self._deadline is None:  # the first bytes of a next request: its clock starts
                self._arm()
        else:
            self.idle_since = None  # a whole head came: the request is the app's (or body's)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._disarm()  # idle: uvicorn's keep-alive timer runs now; or a pipelined request's
        idle = self.cycle is None or self.cycle.response_complete
        self.idle_since = time.monotonic() if idle else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self.limits.header_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        self.limits.timed_out += 1
        log.debug("closed a connection whose request head did not arrive in time")
        self.transport.write(TIMED_OUT)
        self.transport.close()


def guarded_protocol(http: str, limits: Limits) -> type:
    """uvicorn's protocol class for `--http` (h11, httptools or auto) with `limits`."""
    if http == "h11":
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    elif http == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol as base
    return type(f"Guarded{base.__name__}", (Guarded, base), {"limits": limits})
