"""A vision-language model served: an image through each API (OpenAI `image_url`, Anthropic
`image`, Responses `input_image`) gives the tokens and logprobs mlx-vlm's own generate gives for
the same templated prompt and pixels; text-only requests run on it too; a bad image is a 400."""

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from mlx_vlm import stream_generate as vlm_stream_generate
from mlx_vlm.utils import load as vlm_load
from PIL import Image
from serve.conftest import LiveServer, start_server

TOKENS = 6
ASK = "What is in the picture?"


def png(seed: int, shape: tuple[int, int]) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*shape, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "gemma3"])
def vlm(request, qwen3_tokenizer_dir: Path, tmp_path_factory) -> Iterator[dict[str, Any]]:
    folder = tiny_vlm_dir(request.param, qwen3_tokenizer_dir)
    live = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("data")))
    model, processor = vlm_load(str(folder))
    yield {"live": live, "model": model, "processor": processor}
    live.stop()


def oracle(vlm: dict[str, Any], images: list[bytes]) -> tuple[list[int], list[float]]:
    """mlx-vlm's greedy tokens for the chat the server templates (its processor's template)."""
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": ASK}]
    tok = vlm["processor"].tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    out = list(vlm_stream_generate(vlm["model"], vlm["processor"], text, image=pil or None,
                                   max_tokens=TOKENS, temperature=0.0))  # fmt: skip
    steps = out[:-1] if out[-1].finish_reason != "stop" else out
    return [r.token for r in steps], [r.logprobs[r.token].item() for r in steps]


def openai_chat(live: LiveServer, images: list[bytes], text: bool = False) -> Any:
    parts = [{"type": "image_url", "image_url": {"url": data_url(b)}} for b in images]
    body = {"messages": [{"role": "user", "content": [*parts, {"type": "text", "text": ASK}]}],
            "max_tokens": TOKENS, "temperature": 0.0, "logprobs": True}  # fmt: skip
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if text:
        return choice["message"]["content"]
    return [c["id"] for c in choice["logprobs"]["content"]], [
        c["logprob"] for c in choice["logprobs"]["content"]
    ]


@pytest.mark.parametrize("n", [0, 1, 2])
def test_openai_image_parts_give_mlx_vlms_tokens(vlm, n: int) -> None:
    images = [png(1, (56, 84)), png(2, (70, 56))][:n]
    assert openai_chat(vlm["live"], images) == oracle(vlm, images)


def test_anthropic_and_responses_images_give_the_same_tokens(vlm) -> None:
    image = png(3, (56, 56))
    want = openai_chat(vlm["live"], [image], text=True)
    b64 = base64.b64encode(image).decode()
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}
    body = {"model": "m", "max_tokens": TOKENS, "temperature": 0.0,
            "messages": [{"role": "user",
                          "content": [block, {"type": "text", "text": ASK}]}]}  # fmt: skip
    r = httpx.post(vlm["live"].v1 + "/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == want.strip()  # its text blocks are trimmed
    item = {"role": "user", "content": [{"type": "input_image", "image_url": data_url(image)},
                                        {"type": "input_text", "text": ASK}]}  # fmt: skip
    body = {"input": [item], "max_output_tokens": TOKENS, "temperature": 0.0}
    r = httpx.post(vlm["live"].v1 + "/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["output"][-1]["content"][0]["text"] == want.strip()


def test_a_bad_image_is_a_400_naming_the_part_and_the_server_serves_on(vlm) -> None:
    bad = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 64}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": ASK}, bad]}]}
    r = httpx.post(vlm["live"].v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and "messages[0].content[1]" in r.text, r.text
    assert len(openai_chat(vlm["live"], [png(4, (56, 56))])[0]) == TOKENS


def test_image_and_text_rows_at_once_each_answer_as_alone(vlm) -> None:
    """Text rows batch (mrope's per-row positions on Qwen-VL); a row with images runs beside
    them; every answer is the one it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    live, image = vlm["live"], png(5, (56, 70))

    def text_row(i: int) -> list[int]:
        body = {"messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": TOKENS,
                "temperature": 0.0, "logprobs": True}  # fmt: skip
        r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        return [c["id"] for c in r.json()["choices"][0]["logprobs"]["content"]]

    jobs = [lambda: openai_chat(live, [image])[0], *(lambda i=i: text_row(i) for i in range(3))]
    alone = [job() for job in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        together = list(pool.map(lambda job: job(), jobs))
    assert together == alone
