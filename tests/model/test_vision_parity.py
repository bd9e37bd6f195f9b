"""Vision-language models on mlxd's serial row give mlx-vlm's own tokens and logprobs.

Each tiny VLM (tests/fixtures/tiny_vlm.py) is loaded by `mlxd.load` and, separately, by
mlx-vlm's loader; the same templated prompt and images go to mlx-vlm's stream_generate (the
oracle) and to `mlxd.stream_generate(..., image=...)`, and every token id and logprob vector
must be equal (mx.array_equal)."""

import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from fixtures.tiny_vlm import tiny_vlm_dir
from mlx_vlm import stream_generate as vlm_stream_generate
from mlx_vlm.prompt_utils import apply_chat_template
from mlx_vlm.utils import load as vlm_load
from PIL import Image

import mlxd
from mlxd.model.vision.media import MediaImage

ARCHS = ("qwen2_5_vl", "qwen3_vl", "gemma3")
MAX_TOKENS = 10
SEEDED = {"temperature": 0.8, "seed": 3}


def _images() -> list[np.ndarray]:
    """Two random RGB pictures of different sizes (Qwen-VL gives them different grids)."""
    rng = np.random.default_rng(7)
    return [
        rng.integers(0, 256, (56, 84, 3), dtype=np.uint8),
        rng.integers(0, 256, (70, 56, 3), dtype=np.uint8),
    ]


@pytest.fixture(scope="module", params=ARCHS)
def vlm(request: pytest.FixtureRequest, qwen3_tokenizer_dir: Path) -> dict[str, Any]:
    folder = tiny_vlm_dir(request.param, qwen3_tokenizer_dir)
    model, processor = mlxd.load(str(folder))
    oracle, oracle_processor = vlm_load(str(folder))
    return {"folder": folder, "model": model, "processor": processor,
            "oracle": oracle, "oracle_processor": oracle_processor}  # fmt: skip


def _oracle(vlm: dict[str, Any], text: str, images: list[np.ndarray], **kw: Any) -> list[Any]:
    """mlx-vlm's (token, logprobs) pairs: its stream yields each token, then a final result that
    repeats the last one (or carries the stop token, which it did not yield)."""
    pil = [Image.fromarray(a) for a in images] or None
    out = list(vlm_stream_generate(vlm["oracle"], vlm["oracle_processor"], text, image=pil,
                                   max_tokens=MAX_TOKENS, **kw))  # fmt: skip
    pairs = [(r.token, r.logprobs) for r in out[:-1]]
    if out[-1].finish_reason == "stop":
        pairs.append((out[-1].token, out[-1].logprobs))
    return pairs


def _mlxd(vlm: dict[str, Any], text: str, images: list[Any], **kw: Any) -> list[Any]:
    out = mlxd.stream_generate(vlm["model"], vlm["processor"], text, image=images,
                               max_tokens=MAX_TOKENS, **kw)  # fmt: skip
    return [(r.token, r.logprobs) for r in out]


def _assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(want) >= 2
    assert [t for t, _ in got] == [t for t, _ in want]
    for i, ((_, a), (_, b)) in enumerate(zip(got, want, strict=True)):
        assert a.shape == b.shape and mx.array_equal(a, b), f"logprobs differ at token {i}"


@pytest.mark.parametrize("n_images", [0, 1, 2])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
def test_tokens_and_logprobs_equal_mlx_vlm(vlm: dict[str, Any], n_images: int,
                                           sampling: str) -> None:  # fmt: skip
    images = _images()[:n_images]
    kw = SEEDED if sampling == "seeded" else {}
    text = apply_chat_template(vlm["oracle_processor"], vlm["oracle"].config, "Describe.",
                               num_images=n_images)  # fmt: skip
    want = _oracle(vlm, text, images, **kw)
    got = _mlxd(vlm, text, images, **kw)
    _assert_same(got, want)


def test_media_images_and_the_images_matter(vlm: dict[str, Any]) -> None:
    """MediaImage parts give the arrays' bits; another picture gives other logprobs (the
    image reaches the model)."""
    a, b = _images()
    text = apply_chat_template(vlm["oracle_processor"], vlm["oracle"].config, "Describe.",
                               num_images=1)  # fmt: skip
    media = [MediaImage.from_pixels(a, "messages[0].content[0]")]
    got = _mlxd(vlm, text, media)
    _assert_same(got, _oracle(vlm, text, [a]))
    other = _mlxd(vlm, text, [b[:56, :56]])
    assert not mx.array_equal(got[0][1], other[0][1])


def test_generate_returns_text(vlm: dict[str, Any]) -> None:
    text = apply_chat_template(vlm["oracle_processor"], vlm["oracle"].config, "Hi", num_images=1)
    out = mlxd.generate(vlm["model"], vlm["processor"], text, image=[_images()[0]], max_tokens=4)
    tokens = [t for t, _ in _oracle(vlm, text, [_images()[0]])][:4]
    assert out == vlm["processor"].tokenizer.decode(tokens)


def test_broken_config_is_one_line_load_error(vlm: dict[str, Any], tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    shutil.copytree(vlm["folder"], folder)
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"]["hidden_size"] = 48  # weights are 32 wide
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(mlxd.ModelLoadError) as err:
        mlxd.load(str(folder))
    message = str(err.value)
    assert "\n" not in message and str(folder / "config.json") in message
