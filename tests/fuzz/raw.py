"""Malformed HTTP on a raw socket: bad JSON, wrong content types, declared lengths that lie,
broken chunking, unknown methods, garbage paths and headers, requests sent a byte at a time or
left half sent, and streams the client cuts. Each case has one expectation: an answer under
500 in time (`answer`, `slow`), or none needed (`half`, `cut`: the client leaves)."""

import asyncio
import json
from dataclasses import dataclass

POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/messages",
         "/v1/messages/count_tokens", "/v1/responses")  # fmt: skip
VALID = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
STREAM = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 48,
                     "stream": True}).encode()  # fmt: skip
BAD_JSON = (
    b"", b"{", b'{"messages": [', b'{"a": 1} trailing', b"\xff\xfe\x00", b"\xef\xbb\xbf{}",
    b"[" * 100_000, b'{"a":' * 20_000, b"null", b"[]", b'"x"', b"1e999999", b'"\\ud800"',
    b'{"messages": "\x00"}', b'{"max_tokens": NaN, "messages": []}', b'{"a": 1, "a": [}',
    b'{"prompt": "hi", "max_tokens": 99999999999999999999999}', b'{"\\u0000": 1}',
)  # fmt: skip


@dataclass(frozen=True)
class RawCase:
    name: str
    data: bytes
    mode: str = "answer"  # answer | slow | half | cut


def http(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    """A request as bytes; `headers` replace the defaults (a value of "" drops one)."""
    fields = {"Host": "127.0.0.1", "Connection": "close", "Content-Type": "application/json",
              "Content-Length": str(len(body))}  # fmt: skip
    fields.update({k.replace("_", "-"): v for k, v in headers.items()})
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in fields.items() if v]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def cases() -> list[RawCase]:
    out = [RawCase(f"bad-json {p} {b[:12]!r}", http("POST", p, b)) for p in POSTS for b in BAD_JSON]
    for kind in (
        "text/plain",
        "multipart/form-data; boundary=x",
        "application/x-www-form-urlencoded",
        "",
        "application/json; charset=utf-16",
        "*/*; q=\x7f",
    ):
        out.append(
            RawCase(f"content-type {kind!r}", http("POST", POSTS[0], VALID, Content_Type=kind))
        )
    utf16 = VALID.decode().encode("utf-16")
    out.append(RawCase("utf-16 body", http("POST", POSTS[0], utf16)))
    for declared in ("1000000000000", "99999999999999999999999999", "-1", "abc", "1e3"):
        out.append(
            RawCase(f"length {declared}", http("POST", POSTS[0], b"{}", Content_Length=declared))
        )
    out += [
        RawCase("two lengths",
                http("POST", POSTS[1], b"{}", Content_Length="2\r\nContent-Length: 3")),
        RawCase("chunked bad size", http("POST", POSTS[0], b"zz\r\n{}\r\n0\r\n\r\n",
                                         Content_Length="", Transfer_Encoding="chunked")),
        RawCase("chunked huge size", http("POST", POSTS[0], b"ffffffffffffffff\r\n{}\r\n",
                                          Content_Length="", Transfer_Encoding="chunked"), "half"),
        RawCase("length and chunked", http("POST", POSTS[0], b"2\r\n{}\r\n0\r\n\r\n",
                                           Transfer_Encoding="chunked")),
        RawCase("huge header", http("GET", "/v1/models", X_Big="a" * 200_000)),
        RawCase("header name garbage", http("GET", "/health", **{"Bad\x01Name": "x"})),
        RawCase("path %ff", http("GET", "/v1/models/%ff%fe%00")),
        RawCase("path long", http("GET", "/v1/models/" + "a" * 20_000)),
        RawCase("path dots", http("GET", "/v1/../../etc/passwd")),
        RawCase("no version", b"GET /health\r\n\r\n"),
        RawCase("http/0.9 garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
        RawCase("slow body", http("POST", POSTS[0], VALID), "slow"),
        RawCase("half body", http("POST", POSTS[0], VALID, Content_Length="5000"), "half"),
        RawCase("half headers", http("POST", POSTS[0], VALID)[:30], "half"),
        RawCase("stream cut", http("POST", POSTS[0], STREAM), "cut"),
    ]  # fmt: skip
    for method in ("PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "FOO", "TRACE"):
        out.append(RawCase(f"method {method}", http(method, POSTS[0], b"")))
    return out


async def send(host: str, port: int, case: RawCase, deadline_s: float) -> tuple[str, int | None]:
    """(outcome, status): outcome is answered, closed (no status line), left (the client
    left, as the case wants) or timeout (no answer by the deadline)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if case.mode == "slow":
            for i in range(0, len(case.data), 16):
                writer.write(case.data[i : i + 16])
                await writer.drain()
                await asyncio.sleep(0.01)
        else:
            writer.write(case.data)
            await writer.drain()
        if case.mode == "half":
            return "left", None
        try:
            head = await asyncio.wait_for(reader.readline(), deadline_s)
            if case.mode == "cut":
                await asyncio.wait_for(reader.read(64), deadline_s)  # a frame in, then hang up
                return "left", _status(head)
            await asyncio.wait_for(reader.read(), deadline_s)  # Connection: close ends it
        except TimeoutError:
            return "timeout", None
        except ConnectionError:
            head = b""
        status = _status(head)
        return ("answered" if status is not None else "closed"), status
    finally:
        writer.close()


def _status(line: bytes) -> int | None:
    parts = line.split()
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None
