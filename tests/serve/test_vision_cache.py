"""The prefix store on a vision model: a prompt with images is keyed by the digests of its decoded
pixels at their place, so a next turn that re-sends the same picture hits the cache past it
(and past the first answer), another picture never hits past its first patch token, the disk
tier keeps such keys, and a hit answers with the bits a server with no store gives (token ids
and logprobs equal). Gemma 3's sliding-window layers hold another buffer layout after a hit
than after one prefill (as in mlx-lm), so its servers run --prefix-deterministic: prefill
chunks and hits on a grid of GRID tokens, the same in both."""

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from mlx_vlm.utils import prepare_inputs, should_add_special_tokens
from PIL import Image
from serve.conftest import LiveServer, start_server
from serve.test_vision_serve import data_url, png

from mlxd.engine.prefix import clear_of_media
from mlxd.serve.vision_rows import media_id, media_key

TOKENS = 6
GRID = 16  # Gemma 3's --prefill-step-size under --prefix-deterministic
ASK = "What is in the picture?"


def image_part(data: bytes) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "gemma3"])
def servers(request, qwen3_tokenizer_dir: Path, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """A server with the prefix store (RAM and disk) and one without any, on one tiny VLM."""
    folder = tiny_vlm_dir(request.param, qwen3_tokenizer_dir)
    grid = GRID if request.param == "gemma3" else 0
    flags = {"prefix_deterministic": True, "prefill_step_size": grid} if grid else {}
    store = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("d")), **flags)
    bare = start_server(model=str(folder), data_dir=str(tmp_path_factory.mktemp("d")),
                        prompt_cache_size=0, **flags)  # fmt: skip
    yield {"store": store, "bare": bare, "grid": grid}
    store.stop()
    bare.stop()


def chat(live: LiveServer, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"messages": messages, "max_tokens": TOKENS, "temperature": 0.0, "logprobs": True}
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def answer(resp: dict[str, Any]) -> tuple[list[int], list[float]]:
    content = resp["choices"][0]["logprobs"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content]


def cached(resp: dict[str, Any]) -> int:
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def expanded(live: LiveServer, messages: list[dict[str, Any]], images: list[bytes]) -> Any:
    """(the prompt's length, its image patch tokens' positions) as mlx-vlm's processor makes it
    of these messages (its chat template and prepare_inputs, as its generate calls them). The
    usage's prompt_tokens counts each image's placeholder once, not its patches."""
    served = live.state.provider.default
    model, processor = served.model, served.model.processor
    parts = [
        {"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else
         [{"type": "image"} if p["type"] == "image_url" else p for p in m["content"]]}
        for m in messages
    ]  # fmt: skip
    text = processor.tokenizer.apply_chat_template(parts, tokenize=False,
                                                   add_generation_prompt=True)  # fmt: skip
    config = model.config
    token = getattr(config, "image_token_id", None) or config.image_token_index
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    kind = config.model_type
    special = should_add_special_tokens(kind, processor)
    inputs = prepare_inputs(processor, images=pil, prompts=text, image_token_index=token,
                            add_special_tokens=special)  # fmt: skip
    ids = inputs["input_ids"][0].tolist()
    return len(ids), [i for i, t in enumerate(ids) if t == token]


def on_grid(n: int, grid: int) -> int:
    return n // grid * grid if grid else n


def conversation(image: bytes, reply: str | None = None) -> list[dict[str, Any]]:
    first = {"role": "user", "content": [image_part(image), {"type": "text", "text": ASK}]}
    if reply is None:
        return [first]
    return [first, {"role": "assistant", "content": reply},
            {"role": "user", "content": "And what colour is it?"}]  # fmt: skip


def test_a_second_turn_with_the_same_image_hits_past_it_with_a_miss_bits(servers) -> None:
    store, bare, image = servers["store"], servers["bare"], png(11, (56, 84))
    turn1 = chat(store, conversation(image))
    assert cached(turn1) == 0
    assert answer(turn1) == answer(chat(bare, conversation(image)))
    reply = turn1["choices"][0]["message"]["content"]
    messages = conversation(image, reply)
    turn2 = chat(store, messages)
    n1, _ = expanded(store, conversation(image), [image])
    n2, where = expanded(store, messages, [image])
    # At least the first turn's prompt but its last token: the snapshot every row leaves there
    # (the first answer's cache serves more where the model's layers can be trimmed back); on
    # a grid, the grid point at or before it.
    assert cached(turn2) >= on_grid(n1 - 1, servers["grid"])
    assert where[-1] < on_grid(n1 - 1, servers["grid"])  # so past the image's last patch
    assert cached(turn2) < n2
    assert answer(turn2) == answer(chat(bare, messages))
    again = chat(store, messages)  # the same prompt: all of it but its last token is stored
    assert cached(again) == on_grid(n2 - 1, servers["grid"])
    assert answer(again) == answer(turn2)


def test_another_image_at_the_same_place_hits_no_further_than_its_first_patch(servers) -> None:
    store, bare = servers["store"], servers["bare"]
    seen, other = png(21, (56, 56)), png(22, (56, 56))  # one size: the same patch tokens
    chat(store, conversation(seen))
    assert cached(chat(store, conversation(seen))) > 0  # the same image would hit
    resp = chat(store, conversation(other))
    assert cached(resp) <= expanded(store, conversation(other), [other])[1][0]
    assert answer(resp) == answer(chat(bare, conversation(other)))


def test_negative_ids_key_the_disk_tier(tmp_path: Path) -> None:
    """Entries keyed with image ids (negative) are written, matched and restored by a new tier."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    from mlxd.store.ssd import SSDTier

    key = [5, 6, media_id("ab" * 32, 0), media_id("ab" * 32, 1), 8, 4]
    layer = KVCache()
    layer.update_and_fetch(mx.ones((1, 2, len(key), 4)), mx.zeros((1, 2, len(key), 4)))
    tier = SSDTier(tmp_path, 1 << 30)
    assert tier.submit("ns", key, [layer], "assistant")
    tier.close()
    again = SSDTier(tmp_path, 1 << 30)
    other = [*key[:2], media_id("cd" * 32, 0), *key[3:]]
    hit = again.match("ns", [*key, 9])
    assert hit is not None and hit[1] == len(key)
    miss = again.match("ns", other)
    assert miss is None or miss[1] <= 2
    restored = again.restore(hit[0])
    assert restored is not None and mx.array_equal(restored[0].keys[..., : len(key), :],
                                                   layer.keys[..., : len(key), :])  # fmt: skip
    again.close()


def test_media_key_names_each_run_by_its_digest() -> None:
    a, b = "ab" * 32, "cd" * 32
    tokens = [1, 7, 7, 2, 7, 3]
    key = media_key(tokens, 7, (a, b))
    assert key == [1, media_id(a, 0), media_id(a, 1), 2, media_id(b, 0), 3]
    assert all(k < 0 for k in key[1:3]) and media_id(a, 0) != media_id(b, 0)
    assert media_id(a, 8) == media_id(a, 0) and media_id(a, 1) != media_id(a, 0) or a[:8] == a[8:16]
    assert media_key(tokens, 7, (a,)) is None  # two runs, one image: no key (no store)
    assert media_key(tokens, None, (a, b)) is None
    assert min(media_id("f" * 64, j) for j in range(8)) >= -(2**31)  # int32, as the store keeps


def test_cuts_move_out_of_an_image() -> None:
    key = np.array([5, 6, -9, -9, -9, 8, 4], dtype=np.int32)
    assert [clear_of_media(key, c) for c in range(7)] == [0, 1, 2, 2, 2, 5, 6]
    assert clear_of_media(key, 4, grid=2) == 2 and clear_of_media(key, 4, grid=4) == 0
    assert clear_of_media(key, 6, grid=5) == 5
    assert clear_of_media(None, 5, grid=4) == 4
