"""Anthropic image blocks and Responses input_image parts as the chat template's content lists:
placeholders in order beside the text, one request's count limit, images in user turns only."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

from mlxd.serve.anthropic_convert import convert_request
from mlxd.serve.errors import APIError
from mlxd.serve.media import MediaPolicy
from mlxd.serve.media_parts import ImagePart, images_of
from mlxd.serve.responses_convert import input_items, to_messages


def picture(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (9, 7, 3), dtype=np.uint8)


def b64(pixels: np.ndarray) -> str:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def block(pixels: np.ndarray) -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": b64(pixels)}
    return {"type": "image", "source": source}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def same(got: tuple, expected: list[np.ndarray]) -> bool:
    return len(got) == len(expected) and all(
        np.array_equal(g.pixels, e) for g, e in zip(got, expected, strict=True)
    )


def test_anthropic_blocks_in_order_around_tool_results() -> None:
    a, b = picture(0), picture(1)
    result = {"type": "tool_result", "tool_use_id": "t", "content": "r"}
    call = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    body = {
        "system": "s",
        "messages": [
            {"role": "user", "content": [text("one"), block(a)]},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [block(b), result, text("two"), block(a)]},
        ],
    }
    msgs = convert_request(body, {}).messages
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "tool", "user"]
    assert msgs[1]["content"] == [text("one"), {"type": "image"}]
    assert msgs[3]["content"] == [{"type": "image"}] and msgs[5]["content"][0] == text("two")
    assert same(images_of(msgs), [a, b, a])
    assert images_of(msgs)[1].where == "messages.2.content.0.source"
    plain = convert_request({"messages": [{"role": "user", "content": [text("a"), text("b")]}]}, {})
    assert plain.messages == [{"role": "user", "content": "a\nb"}]  # text only: as before


FILE = {"type": "image", "source": {"type": "file", "file_id": "f"}}
HTTP = {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}


@pytest.mark.parametrize(
    ("content", "role", "words"),
    [
        ([block(picture(2))] * 3, "user", "messages.0.content.2.source: a request may carry"),
        ([FILE], "user", "'base64' or 'url'"),
        ([HTTP], "user", "messages.0.content.0.source.url: fetching image URLs is off"),
        ([block(picture(2))], "assistant", "user messages only"),
    ],
)
def test_anthropic_refusals(content: list, role: str, words: str) -> None:
    body = {"messages": [{"role": role, "content": content}]}
    with pytest.raises(APIError) as e:
        convert_request(body, {}, MediaPolicy(max_images=2))
    assert e.value.status == 400 and words in e.value.message, e.value.message


def test_responses_input_image() -> None:
    a, b = picture(3), picture(4)
    url = "data:image/png;base64,"
    items = input_items([
        {"role": "user", "content": [{"type": "input_text", "text": "q"},
                                     {"type": "input_image", "image_url": url + b64(a)}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "input_image", "image_url": url + b64(b)}]},
    ])  # fmt: skip
    msgs = to_messages(items, "sys")
    assert msgs[1]["content"][0] == {"type": "text", "text": "q"}
    assert isinstance(msgs[1]["content"][1], ImagePart) and msgs[2]["content"] == "ok"
    assert same(images_of(msgs), [a, b])
    assert images_of(msgs)[0].where == "input[0].content[1].image_url"
    with pytest.raises(APIError, match=r"input\[1\].content\[1\].image_url: a request may carry"):
        to_messages(items[:1] + items[:1], None, MediaPolicy(max_images=1))
    as_system = [{"role": "system", "content": [{"type": "input_image", "image_url": url}]}]
    with pytest.raises(APIError, match="only text parts"):
        to_messages(input_items(as_system), None)
