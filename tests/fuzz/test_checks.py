"""The hostile checks' verdicts on streams: an error frame is a failure, except a rate-limit
refusal (a 429 whose status line had gone out as 200), in each API's stream shape."""

import json

from tests.fuzz.checks import problem, stream_refused

SSE = "text/event-stream"


def openai(error_type: str) -> str:
    err = {"error": {"message": "m", "type": error_type, "param": None, "code": None}}
    return f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"


def anthropic(error_type: str) -> str:
    body = {"type": "error", "error": {"type": error_type, "message": "m"}}
    return f"event: error\ndata: {json.dumps(body)}\n\n"


def responses(code: str) -> str:
    body = {"type": "response.failed", "response": {"error": {"code": code, "message": "m"}}}
    return f"event: response.failed\ndata: {json.dumps(body)}\n\n"


def test_a_rate_limit_frame_is_a_refusal_in_every_api() -> None:
    for text in (openai("rate_limit_error"), anthropic("rate_limit_error"),
                 responses("rate_limit_error")):  # fmt: skip
        assert stream_refused(text)
        assert problem("/v1/x", 200, SSE, text) is None


def test_any_other_error_frame_is_a_failure() -> None:
    for text in (openai("server_error"), anthropic("api_error"), responses("server_error")):
        assert not stream_refused(text)
        assert "error frame" in problem("/v1/x", 200, SSE, text)


def test_a_stream_that_stops_short_is_a_failure() -> None:
    assert problem("/v1/x", 200, SSE, 'data: {"choices": []}\n\n') == "the stream did not finish"
    assert problem("/v1/x", 200, SSE, 'data: {"choices": []}\n\ndata: [DONE]\n\n') is None


def test_a_frame_with_a_line_separator_in_its_text_is_one_frame() -> None:
    """JSON keeps U+2028 raw (ensure_ascii=False): it does not end the SSE line."""
    frame = 'data: {"choices": [{"delta": {"content": "a\u2028b"}}]}\n\ndata: [DONE]\n\n'
    assert "\u2028" in frame
    assert problem("/v1/x", 200, SSE, frame) is None and not stream_refused(frame)
    assert "not JSON" in problem("/v1/x", 200, SSE, 'data: {"a": \n\ndata: [DONE]\n\n')
