"""Malformed HTTP (raw.py) against a live server: every case that waits for an answer gets one
under 500 in time, the ones that hang up or stall harm nothing, and a normal request is
served afterwards."""

import asyncio
from urllib.parse import urlsplit

from .raw import RawCase, cases, send
from .test_hostile import serves

DEADLINE_S = 30.0


async def _all(host: str, port: int, todo: list[RawCase]) -> list[tuple[RawCase, str, int | None]]:
    results = await asyncio.gather(*(send(host, port, c, DEADLINE_S) for c in todo))
    return [(c, *r) for c, r in zip(todo, results, strict=True)]


def test_malformed_http(fuzz_server) -> None:
    url = urlsplit(fuzz_server.url)
    results = asyncio.run(_all(url.hostname, url.port, cases()))
    bad = [f"{c.name}: {outcome} {status}" for c, outcome, status in results
           if outcome == "timeout" or (status or 0) >= 500]  # fmt: skip
    assert not bad, bad
    answered = [s for c, o, s in results if o == "answered"]
    assert len(answered) >= len(results) // 2, results  # most are answered, not cut off
    assert 413 in answered and 405 in answered and 400 in answered
    assert serves(fuzz_server.url), "the server stopped serving after the malformed requests"
