"""Rows with images decode in the running batch: each prefills alone (its embeddings), then joins
the text rows' batched step, where Qwen-VL's calls get every row's own mrope delta. Every row
answers as it does alone: token ids on both models, and on Qwen-VL the logprobs bit for bit
(Gemma 3's sliding-window layers, 16 tokens here, make rows of other lengths batch with other
float sums, as its text rows already do: same tokens, logprobs a few 1e-5 apart)."""

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from serve.conftest import LiveServer, start_server
from serve.test_vision_serve import data_url, png

from mlxd.engine.batch import BatchedRows

TOKENS = 24  # long enough for a row that arrives later to find the first still decoding


@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3"])
def live(request, qwen3_tokenizer_dir: Path, tmp_path_factory) -> Iterator[tuple[str, LiveServer]]:
    folder = tiny_vlm_dir(request.param, qwen3_tokenizer_dir)
    server = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("data")))
    yield request.param, server
    server.stop()


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Each insert into a batch: (rows with images among the joiners, rows in the batch after)."""
    seen: list[tuple[int, int]] = []
    insert = BatchedRows.insert

    def spying(self, rows, *args, **kwargs):
        insert(self, rows, *args, **kwargs)
        seen.append((sum(r.req.input_embeddings is not None for r in rows), len(self)))

    monkeypatch.setattr(BatchedRows, "insert", spying)
    return seen


def body(image: bytes | None, text: str, stream: bool = False) -> dict[str, Any]:
    content: Any = text
    if image is not None:
        content = [{"type": "image_url", "image_url": {"url": data_url(image)}},
                   {"type": "text", "text": text}]  # fmt: skip
    return {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS,
            "temperature": 0.0, "logprobs": True, "stream": stream}  # fmt: skip


Answer = tuple[list[int], list[float]]


def chat(server: LiveServer, payload: dict[str, Any]) -> Answer:
    r = httpx.post(server.v1 + "/chat/completions", json=payload, timeout=120)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content]


def streamed(server: LiveServer, payload: dict[str, Any], first: threading.Event) -> Answer:
    """A streamed chat's answer; `first` is set once its first token arrived."""
    ids, logprobs = [], []
    with httpx.stream("POST", server.v1 + "/chat/completions", json=payload, timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in (json.loads(line[6:])["choices"][0].get("logprobs") or {}).get("content", []):
                ids.append(c["id"])
                logprobs.append(c["logprob"])
                first.set()
    first.set()
    return ids, logprobs


def same(arch: str, got: list[Answer], want: list[Answer]) -> None:
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    if arch == "qwen2_5_vl":  # bit for bit (see the module doc for Gemma 3)
        assert [lp for _, lp in got] == [lp for _, lp in want]


def paths(server: LiveServer) -> dict[str, int]:
    return dict(server.state.provider.default.engine.stats()["paths"])


ROWS: list[tuple[bytes | None, str]] = [
    (png(11, (56, 84)), "What is in the picture?"),
    (None, "Count to three."),
    (png(12, (70, 56)), "Describe it."),
    (None, "Hello there, how are you today?"),
]


def test_two_image_rows_and_two_text_rows_at_once_each_answer_as_alone(live, joins) -> None:
    arch, server = live
    alone = [chat(server, body(image, text)) for image, text in ROWS]
    joins.clear()
    before = paths(server)
    with ThreadPoolExecutor(len(ROWS)) as pool:
        together = list(pool.map(lambda row: chat(server, body(*row)), ROWS))
    same(arch, together, alone)
    after = paths(server)
    assert after.get("serial->batched", 0) > before.get("serial->batched", 0)
    # both image rows decoded in a batch beside other rows
    assert sum(n for n, _ in joins) == 2 and any(n and size > 1 for n, size in joins), joins


@pytest.mark.parametrize("live", ["qwen2_5_vl"], indirect=True)  # Gemma 3 keeps no row state
def test_control_image_rows_batched_with_a_delta_of_0_answer_otherwise(
    live, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: Qwen-VL's batched calls given every row a delta of 0 (as for text rows
    only) move the image rows' positions, and their answers change."""
    _, server = live
    import mlx.core as mx

    import mlxd.model.vision.model as vision

    alone = [chat(server, body(image, text)) for image, text in ROWS]
    monkeypatch.setattr(vision, "_deltas", lambda _states, rows: mx.zeros((rows, 1), mx.int32))
    with ThreadPoolExecutor(len(ROWS)) as pool:
        together = list(pool.map(lambda row: chat(server, body(*row)), ROWS))
    moved = [a[0] != b[0] for a, b in zip(alone, together, strict=True)]
    assert moved[0] and moved[2], moved  # the image rows
    assert not moved[1] and not moved[3], moved  # the text rows: 0 is theirs


@pytest.mark.parametrize("order", ["image first", "text first"])
def test_an_image_row_and_a_text_row_arriving_one_after_the_other(live, joins, order) -> None:
    """The second row arrives while the first decodes: a text row no longer waits for an image
    row (it joins its batch), and an image row prefills beside a running text row."""
    arch, server = live
    rows = [ROWS[0], ROWS[1]] if order == "image first" else [ROWS[1], ROWS[0]]
    alone = [chat(server, body(image, text)) for image, text in rows]
    joins.clear()
    first = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        leading = pool.submit(streamed, server, body(*rows[0], stream=True), first)
        assert first.wait(60)
        second = chat(server, body(*rows[1]))
        together = [leading.result(), second]
    same(arch, together, alone)
    assert any(n and size > 1 for n, size in joins), joins  # the image row batched with the other


def test_a_text_cache_without_saved_state_goes_on_at_its_offset(qwen3_tokenizer_dir) -> None:
    """Caches that hold tokens but no saved mrope state (the prefix store's, a batch's
    extracted row) continue a Qwen-VL text row at their offset: a text prefix's delta is 0."""
    import mlx.core as mx

    import mlxd

    model, processor = mlxd.load(str(tiny_vlm_dir("qwen2_5_vl", qwen3_tokenizer_dir)))
    prompt = mx.array(processor.tokenizer.encode("Name three colours, please."))

    def tokens(forget: bool) -> list[int]:
        cache = model.make_cache()
        logits = model(prompt[None], cache=cache)
        if forget:
            del cache[0].mlxd_row_state  # as the store hands a cache back
        out = [int(mx.argmax(logits[0, -1]).item())]
        for _ in range(8):
            out.append(int(mx.argmax(model(mx.array([[out[-1]]]), cache=cache)[0, -1]).item()))
        return out

    assert tokens(forget=True) == tokens(forget=False)


def test_a_text_row_from_a_prefix_a_batch_stored_answers_as_the_first_time(live) -> None:
    """A row whose cache comes from the prefix store as a batch left it (no mrope state saved
    with it) goes on at its cache's offset: a text prefix's delta is 0."""
    arch, server = live
    payload, other = body(None, "Name three colours, please."), body(None, "Say hi.")
    first = chat(server, payload)
    with ThreadPoolExecutor(2) as pool:  # batched: the store keeps its cache from the batch
        together = list(pool.map(lambda p: chat(server, p), [payload, other, payload]))
    same(arch, together[::2], [first, first])
    r = httpx.post(server.v1 + "/chat/completions", json=payload, timeout=120)
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # a store hit
    same(arch, [chat(server, payload)], [first])
