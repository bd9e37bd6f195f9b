"""Images through a live server on the tiny text model: each API's image part is a 400 naming
the part ("does not take images"); 50 hostile image requests leave it serving; with the served
and on a tiny vision model (Qwen2.5-VL's template) the parts reach the built prompt as decoded
images, in order."""

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from PIL import Image
from serve.conftest import LiveServer, start_server

from mlxd.serve import anthropic_convert, openai_api, responses_api


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def pixels_of(raw: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


def url(raw: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(raw).decode()


def chat(*images: bytes) -> dict[str, Any]:
    parts: list[dict] = [{"type": "text", "text": "look"}]
    parts += [{"type": "image_url", "image_url": {"url": url(r)}} for r in images]
    return {"messages": [{"role": "user", "content": parts}], "max_tokens": 2}


def anthropic(*images: bytes) -> dict[str, Any]:
    blocks: list[dict] = [{"type": "text", "text": "look"}]
    data = (base64.b64encode(r).decode() for r in images)
    blocks += [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": d}}
        for d in data
    ]
    return {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": blocks}]}


def responses(*images: bytes) -> dict[str, Any]:
    parts: list[dict] = [{"type": "input_text", "text": "look"}]
    parts += [{"type": "input_image", "image_url": url(r)} for r in images]
    return {"input": [{"role": "user", "content": parts}], "max_output_tokens": 2}


APIS = [
    ("/v1/chat/completions", chat, "messages[0].content[1]"),
    ("/v1/messages", anthropic, "messages.0.content.1"),  # Anthropic's errors' style
    ("/v1/responses", responses, "input[0].content[1]"),
]


def message(r: httpx.Response) -> str:
    return r.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body", "where"), APIS)
def test_a_text_model_refuses_images(qwen3_server, path: str, body: Any, where: str) -> None:
    r = httpx.post(qwen3_server.url + path, json=body(png(0)), timeout=60)
    assert r.status_code == 400, r.text
    assert message(r).startswith(where) and "does not take images" in message(r), r.text


HOSTILE = [
    "data:image/png;base64,!!!!",
    "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 64).decode(),
    "data:image/tiff;base64,AAAA",
    "http://127.0.0.1:1/a.png",
    "file:///etc/passwd",
    "data:image/png;base64," + base64.b64encode(png(1)[:50]).decode(),
]


def test_hostile_images_leave_it_serving(qwen3_server, monkeypatch) -> None:
    monkeypatch.setattr(qwen3_server.state.provider.default.facts, "takes_images", True)
    with httpx.Client(base_url=qwen3_server.url, timeout=60) as client:
        for i in range(50):
            bad = HOSTILE[i % len(HOSTILE)]
            body = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": bad}}]}], "max_tokens": 2}  # fmt: skip
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and message(r).startswith("messages[0].content[0]"), r.text
        r = client.post("/v1/chat/completions", json={**chat(), "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert client.get("/health").json()["status"] == "ok"


@pytest.fixture(scope="module")
def vlm_server(qwen3_tokenizer_dir: Path, tmp_path_factory) -> Iterator[LiveServer]:
    folder = tiny_vlm_dir("qwen2_5_vl", qwen3_tokenizer_dir)
    live = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("data")))
    yield live
    live.stop()


@pytest.fixture
def built(monkeypatch) -> Iterator[list[Any]]:
    """Every prompt the three APIs build, recorded."""
    prompts: list[Any] = []
    for module in (openai_api, responses_api, anthropic_convert):
        real = module.chat_prompt

        def spy(*args: Any, real: Any = real, **kwargs: Any) -> Any:
            prompts.append(real(*args, **kwargs))
            return prompts[-1]

        monkeypatch.setattr(module, "chat_prompt", spy)
    yield prompts


@pytest.mark.parametrize(("path", "body", "where"), APIS)
def test_images_reach_the_prompt_in_order(
    vlm_server, built: list[Any], path: str, body: Any, where: str
) -> None:
    a, b = png(2), png(3)
    r = httpx.post(vlm_server.url + path, json=body(a, b, a), timeout=60)
    assert r.status_code == 200, r.text
    (prompt,) = built
    images = prompt.images
    assert len(images) == 3
    for image, raw in zip(images, (a, b, a), strict=True):
        assert np.array_equal(image.pixels, pixels_of(raw))
    assert images[0].digest == images[2].digest != images[1].digest
    assert images[0].where.startswith(where)
    tok = vlm_server.state.provider.default.tokenizer
    pad, text = tok.convert_tokens_to_ids("<|image_pad|>"), tok.encode("look")
    assert prompt.tokens.count(pad) == 3  # one placeholder per image, after the text
    first = prompt.tokens.index(pad)
    assert prompt.tokens[first - 1 - len(text) : first - 1] == text
