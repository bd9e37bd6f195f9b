"""Image requests that arrive together run the vision tower in one call (serve/vision_batch.py):
fewer tower calls than requests, every request's embeddings bit for bit those it gets alone,
and its answer the one it gets alone (token ids on both models, logprobs on Qwen-VL: see
test_vision_batch.py for Gemma 3's batched decode). --vision-batch-pixels bounds a call; a
request whose image or tower fails is that request's error only."""

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import numpy as np
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from mlx_vlm.prompt_utils import apply_chat_template
from serve.conftest import LiveServer, start_server
from serve.test_vision_serve import data_url, png

import mlxd
from mlxd.config import VISION_BATCH_PIXELS
from mlxd.model.vision.model import VisionModel
from mlxd.model.vision.prompt import vision_prompt

TOKENS = 8
IMAGES = [png(21, (56, 84)), png(22, (70, 56)), png(23, (112, 112)), png(24, (56, 56))]
BAD = "data:image/png;base64," + "A" * 64  # not a PNG: a 400 at the door


@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3"])
def live(request, qwen3_tokenizer_dir: Path, tmp_path_factory) -> Iterator[tuple[str, LiveServer]]:
    folder = tiny_vlm_dir(request.param, qwen3_tokenizer_dir)
    server = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("data")))
    yield request.param, server
    server.stop()


def body(image: bytes | str, text: str = "What is in the picture?") -> dict[str, Any]:
    url = image if isinstance(image, str) else data_url(image)
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": text}]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS,
            "temperature": 0.0, "logprobs": True}  # fmt: skip


def chat(server: LiveServer, payload: dict[str, Any]) -> Any:
    """(token ids, logprobs), or the status code of a refused request."""
    r = httpx.post(server.v1 + "/chat/completions", json=payload, timeout=120)
    if r.status_code != 200:
        return r.status_code
    content = r.json()["choices"][0]["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content]


def same(arch: str, got: Any, want: Any) -> None:
    assert [g[0] for g in got] == [w[0] for w in want]
    if arch == "qwen2_5_vl":
        assert [g[1] for g in got] == [w[1] for w in want]


@pytest.fixture
def held(live, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Spies on the served model: each request's embeddings (by its first image's digest), and
    a first tower call that waits until `held["others"]` requests queue behind it (so requests
    sent at once meet in the batcher however their threads are scheduled)."""
    _, server = live
    spy: dict[str, Any] = {"others": 0, "hold": False, "started": threading.Event(),
                           "embeddings": {}, "fail": None}  # fmt: skip
    embed, features = VisionModel.embed, VisionModel.image_features

    def spying_embed(self, prompt, features=None):
        out = embed(self, prompt, features)
        mx.eval(out)
        spy["embeddings"][prompt.digests[0]] = out
        return out

    def holding_features(self, prompts):
        if spy["hold"]:  # the first call after `hold` is set waits for the others
            spy["hold"] = False
            spy["started"].set()
            deadline = time.time() + 30
            while self.vision_batcher.waiting < spy["others"] and time.time() < deadline:
                time.sleep(0.01)
        if spy["fail"] is not None and any(spy["fail"] in p.digests for p in prompts):
            raise RuntimeError("the tower failed on this image")
        return features(self, prompts)

    monkeypatch.setattr(VisionModel, "embed", spying_embed)
    monkeypatch.setattr(VisionModel, "image_features", holding_features)
    spy["batcher"] = lambda: server.state.provider.default.model.vision_batcher
    return spy


def alone_then_together(server: LiveServer, spy: dict[str, Any], payloads: list) -> tuple:
    """Each request alone, then all at once: (answers alone, answers together, embeddings
    alone, embeddings together, images per tower call together)."""
    alone = [chat(server, p) for p in payloads]
    first = dict(spy["embeddings"])
    spy["embeddings"].clear()
    batcher = spy["batcher"]()
    batcher.calls.clear()
    spy["others"], spy["hold"] = sum(a != 400 for a in alone) - 1, True
    with ThreadPoolExecutor(len(payloads)) as pool:
        together = list(pool.map(lambda p: chat(server, p), payloads))
    return alone, together, first, dict(spy["embeddings"]), list(batcher.calls)


def exact(a: dict[str, mx.array], b: dict[str, mx.array]) -> None:
    assert sorted(a) == sorted(b) and len(a) > 0
    assert all(mx.array_equal(a[k], b[k]).item() for k in a)


def test_four_image_requests_at_once_share_tower_calls_and_answer_as_alone(live, held) -> None:
    arch, server = live
    alone, together, e_alone, e_together, calls = alone_then_together(
        server, held, [body(im) for im in IMAGES]
    )
    assert len(calls) < 4 and sum(calls) == 4, calls  # e.g. [1, 3]: the first, then the rest
    exact(e_alone, e_together)
    same(arch, together, alone)


def test_a_tiny_budget_runs_one_image_per_call(live, held, monkeypatch) -> None:
    arch, server = live
    chat(server, body(IMAGES[0]))  # the batcher exists from the first image request
    batcher = held["batcher"]()
    assert batcher.budget == VISION_BATCH_PIXELS  # the engine's default --vision-batch-pixels
    monkeypatch.setattr(batcher, "budget", 1)
    alone, together, e_alone, e_together, calls = alone_then_together(
        server, held, [body(im) for im in IMAGES]
    )
    assert calls == [1, 1, 1, 1]
    exact(e_alone, e_together)
    same(arch, together, alone)


def test_a_bad_image_fails_only_its_own_request(live, held) -> None:
    arch, server = live
    payloads = [body(IMAGES[0]), body(BAD), body(IMAGES[1]), body(IMAGES[2])]
    alone, together, *_ = alone_then_together(server, held, payloads)
    assert alone[1] == 400 and together[1] == 400
    same(arch, together[::2] + together[3:], alone[::2] + alone[3:])


def test_a_tower_failing_on_one_request_fails_only_that_request(live, held) -> None:
    """A call held while the four requests queue; the next, over all four, fails; each of them
    runs alone, and only the failing one's request is an error."""
    arch, server = live
    good = [chat(server, body(im)) for im in IMAGES]
    digest = next(iter(held["embeddings"]))  # IMAGES[0]'s, the first request's
    batcher = held["batcher"]()
    batcher.calls.clear()
    held["fail"], held["others"], held["hold"] = digest, 4, True
    with ThreadPoolExecutor(5) as pool:
        plug = pool.submit(chat, server, body(png(25, (56, 56))))
        assert held["started"].wait(30)
        together = list(pool.map(lambda im: chat(server, body(im)), IMAGES))
    assert isinstance(plug.result(), tuple)  # the server's error for a failure inside it
    assert isinstance(together[0], int) and together[0] >= 500, together[0]
    assert batcher.calls == [1, 1, 1, 1]  # the plug, then the three that succeed alone
    same(arch, together[1:], good[1:])


def test_the_flag_sets_the_engines_budget() -> None:
    from mlxd.cli.serve import parse_config
    from mlxd.config import ConfigError

    config = parse_config(["--vision-batch-pixels", "1"]).resolved()
    assert config.engine.vision_batch_pixels == 1
    with pytest.raises((ConfigError, SystemExit)):
        parse_config(["--vision-batch-pixels", "0"])


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "gemma3"])
def test_features_batched_are_bit_for_bit_those_alone(arch, qwen3_tokenizer_dir) -> None:
    """The tower over four prompts' images (one or two each, of four sizes) in one call, each
    prompt's features and merged embeddings against the tower over its images alone."""
    model, processor = mlxd.load(str(tiny_vlm_dir(arch, qwen3_tokenizer_dir)))

    def prompts() -> list:
        rng, out = np.random.default_rng(5), []
        for i, shape in enumerate([(56, 84), (70, 56), (112, 112), (56, 56)]):
            images = [rng.integers(0, 256, (*shape, 3), dtype=np.uint8) for _ in range(1 + i % 2)]
            text = apply_chat_template(processor, model.config, "Describe.", num_images=len(images))
            out.append(vision_prompt(processor, text, images))
        return out

    alone, batched = prompts(), prompts()
    assert all(model.tower_key(p) == model.tower_key(batched[0]) for p in batched)
    one_call = model.image_features(batched)
    for a, b, f in zip(alone, batched, one_call, strict=True):
        assert mx.array_equal(model.image_features([a])[0], f).item()
        assert mx.array_equal(model.embed(a), model.embed(b, features=f)).item()
        arrays = {k: v for k, v in a.model_kwargs.items() if isinstance(v, mx.array)}
        assert all(mx.array_equal(v, b.model_kwargs[k]).item() for k, v in arrays.items())


def test_threads_meet_in_one_call(qwen3_tokenizer_dir) -> None:
    """Without any hold: prompts submitted while a tower call runs go in the next one."""
    from mlxd.serve.vision_batch import VisionBatcher

    model, processor = mlxd.load(str(tiny_vlm_dir("gemma3", qwen3_tokenizer_dir)))
    batcher, gate = VisionBatcher(model, VISION_BATCH_PIXELS), threading.Event()
    features = model.image_features
    model.image_features = lambda ps: (gate.wait(30), features(ps))[1]

    def one(seed: int) -> None:
        image = np.random.default_rng(seed).integers(0, 256, (56, 56, 3), dtype=np.uint8)
        text = apply_chat_template(processor, model.config, "Describe.", num_images=1)
        prompt = vision_prompt(processor, text, [image])
        batcher.embed(prompt)
        mx.eval(prompt.embeddings)

    threads = [threading.Thread(target=one, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while batcher.waiting < 3 and time.time() < deadline:
        time.sleep(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert len(batcher.calls) <= 2 and sum(batcher.calls) == 4, batcher.calls


def test_qwen3_vl_runs_its_tower_per_request_and_answers_as_alone(
    qwen3_tokenizer_dir, tmp_path_factory
) -> None:
    """Qwen3-VL is not batched: mlx-vlm's merge of cached features drops its deepstack
    features, so each request runs its own tower inside get_input_embeddings (one call each)."""
    folder = tiny_vlm_dir("qwen3_vl", qwen3_tokenizer_dir)
    server = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("data")))
    try:
        alone = [chat(server, body(im)) for im in IMAGES]
        batcher = server.state.provider.default.model.vision_batcher
        batcher.calls.clear()
        with ThreadPoolExecutor(len(IMAGES)) as pool:
            together = list(pool.map(lambda im: chat(server, body(im)), IMAGES))
        assert batcher.calls == [1, 1, 1, 1]
        assert [t[0] for t in together] == [a[0] for a in alone]
    finally:
        server.stop()
