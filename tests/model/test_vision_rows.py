"""Two rows on one Qwen-VL model keep their own mrope state: the language model's
`_rope_deltas` lives on each row's cache between calls (mlxd/model/vision/model.py), so rows
that take turns decode as each would alone."""

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from fixtures.tiny_vlm import tiny_vlm_dir
from mlx_vlm.prompt_utils import apply_chat_template

import mlxd
from mlxd.model.vision.prompt import vision_prompt

STEPS = 6


class Row:
    """A greedy row driven by hand: the prompt in one call, then one token a call."""

    def __init__(self, model: Any, processor: Any, n_images: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        images = [rng.integers(0, 256, (56, 84, 3), dtype=np.uint8) for _ in range(n_images)]
        text = apply_chat_template(processor, model.config, "Describe.", num_images=n_images)
        self.model, self.vp = model, vision_prompt(processor, text, images)
        model.embed(self.vp)
        self.cache, self.tokens = model.make_cache(), []

    def prefill(self) -> None:
        vp = self.vp
        logits = self.model(
            vp.input_ids[None], cache=self.cache, input_embeddings=vp.embeddings[None],
            **vp.model_kwargs,
        )  # fmt: skip
        self.tokens.append(int(mx.argmax(logits[0, -1]).item()))

    def step(self) -> None:
        logits = self.model(mx.array([[self.tokens[-1]]]), cache=self.cache)
        self.tokens.append(int(mx.argmax(logits[0, -1]).item()))


def test_interleaved_rows_decode_as_alone(qwen3_tokenizer_dir: Path) -> None:
    model, processor = mlxd.load(str(tiny_vlm_dir("qwen2_5_vl", qwen3_tokenizer_dir)))
    alone = Row(model, processor, 1, seed=1)
    alone.prefill()
    for _ in range(STEPS):
        alone.step()
    a, b = Row(model, processor, 1, seed=1), Row(model, processor, 0, seed=2)
    a.prefill()
    b.prefill()  # sets the language model's rope deltas for a text-only prompt
    for _ in range(STEPS):
        a.step()
        b.step()
    assert a.tokens == alone.tokens
    # The control: the image row's deltas differ from the text row's, so a shared state would
    # have moved its positions.
    assert not mx.array_equal(a.cache[0].mlxd_row_state["_rope_deltas"],
                              b.cache[0].mlxd_row_state["_rope_deltas"])  # fmt: skip
