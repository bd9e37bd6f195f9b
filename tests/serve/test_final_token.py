"""The finishing token's frame leaves before the engine stores the row's cache: the text of the
last token (with the detokenizer's final flush) rides on the token event, not the DoneEvent."""

import json
import threading

import httpx
import mlx.core as mx

from mlxd.engine.output import RowOutput
from mlxd.engine.request import GenerationRequest


def test_the_last_frame_is_sent_before_the_cache_is_stored(make_server) -> None:
    live = make_server()
    engine = live.state.provider.default.engine
    storing, release, stored = threading.Event(), threading.Event(), threading.Event()
    keep = engine.rows.keep

    def slow_keep(row, done) -> None:  # the store's work, held until the client has the frame
        storing.set()
        release.wait(timeout=10)
        keep(row, done)
        stored.set()

    engine.rows.keep = slow_keep
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    finish_seen_before_stored = None
    with httpx.stream("POST", live.v1 + "/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:])["choices"]
            if choices and choices[0].get("finish_reason") is not None:
                # the frame may beat the engine to the store; it must never wait on it
                finish_seen_before_stored = not stored.is_set()
                release.set()
    assert finish_seen_before_stored is True
    assert storing.wait(timeout=10) and stored.wait(timeout=10)  # and the store did run, held


class _Detok:
    """A detokenizer that holds the last token's text back until finalize (as BPE ones do)."""

    def __init__(self) -> None:
        self.text, self.held, self.out = "", "", ""

    def add_token(self, token: int) -> None:
        self.out, self.held = self.held, f"<{token}>"

    def finalize(self) -> None:
        self.out, self.held = self.out + self.held, ""

    @property
    def last_segment(self) -> str:
        seg, self.out = self.out, ""
        return seg


class _Tok:
    def __init__(self) -> None:
        self.detokenizer = _Detok()


def test_the_finishing_event_carries_the_final_flush_and_done_carries_none() -> None:
    out = RowOutput(GenerationRequest(prompt=mx.array([1]), max_tokens=2), _Tok(), 0.0)
    first, reason = out.token(5, mx.zeros(4))
    assert (first.text, reason) == ("", None)  # held back by the detokenizer
    last, reason = out.token(6, mx.zeros(4))
    assert (last.text, reason, last.finish) == ("<5><6>", "length", "length")
    assert out.done("length").text == ""  # flushed once, on the token
