"""One RoPE offset add per batched decode step (mlxd/model/step_offsets.py): the folded
modes' later layers take the step's first layer's advanced offset, the same graph node, so a
step launches one add where mlx-lm's caches launch one per layer. The bits are covered by
test_folded_attention.py's shadow-model and engine tests, which run through it."""

import mlx.core as mx
from fixtures.folded_models import PROMPTS, qwen2_model
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from mlxd.bench.probe_ops import primitives
from mlxd.model import folded_attention as fa
from mlxd.model.step_offsets import StepOffsets


def _offset_adds(model, steps: int) -> int:
    """The adds behind the caches' offsets after `steps` evaluated decode steps: the last
    step's, left lazy until the next step's RoPE reads them."""
    caches = [BatchKVCache([0, 4, 9]) for _ in model.layers]
    tokens = mx.array([[0] * p + PROMPTS[2][: 11 - p] for p in (0, 4, 9)])
    for _ in range(steps + 1):
        logits = model(tokens, cache=caches)[:, -1, :]
        tokens = mx.argmax(logits, axis=-1, keepdims=True)
        mx.eval(tokens)
    return primitives(*[c.offset for c in caches])["Add"]


def test_a_folded_step_advances_the_offset_once_not_once_per_layer() -> None:
    model = qwen2_model()
    assert len(model.layers) == 2
    assert _offset_adds(model, 3) == 2  # mlx-lm's caches: one add per layer
    shadow = fa.folded(model)
    assert _offset_adds(shadow, 3) == 1
    assert shadow.model.layers[0].self_attn.offsets.shared == 3  # layer 1 of each decode step


def test_a_layers_offset_is_its_own_object() -> None:
    """An in-place op on one layer's offset (mlx-lm's caches use +=, -=) leaves the others."""
    s = StepOffsets()
    mask = mx.ones((2, 1, 1, 5), mx.bool_)
    caches = [BatchKVCache([0, 1]) for _ in range(3)]
    for i, c in enumerate(caches):
        c.offset = c.offset + 1
        s.advanced(i, mask, c)
    assert caches[1].offset is not caches[0].offset
    caches[1].offset -= 5
    assert caches[0].offset.tolist() == caches[2].offset.tolist() == [1, 0]
    assert caches[1].offset.tolist() == [-4, -5]


def test_a_new_step_starts_at_its_first_layer_even_with_the_same_mask() -> None:
    s = StepOffsets()
    mask = mx.ones((2, 1, 1, 5), mx.bool_)  # a caller could hand two steps the same mask
    caches = [BatchKVCache([0, 1]) for _ in range(2)]
    for _ in range(3):
        for i, c in enumerate(caches):
            c.offset = c.offset + 1
            s.advanced(i, mask, c)
    assert [c.offset.tolist() for c in caches] == [[3, 2], [3, 2]]
    assert s.shared == 3


def test_other_masks_and_caches_keep_their_own_offsets() -> None:
    s = StepOffsets()
    full, window = mx.ones((2, 1, 1, 5), mx.bool_), mx.ones((2, 1, 1, 4), mx.bool_)
    a, b = BatchKVCache([0, 0]), BatchKVCache([1, 1])
    a.offset, b.offset = a.offset + 1, b.offset + 7
    s.advanced(0, full, a)
    s.advanced(1, window, b)  # another attention kind: not the step's first layer's offset
    assert b.offset.tolist() == [6, 6]
    rotating = BatchRotatingKVCache(8, [0, 0])
    before = rotating.offset
    s.advanced(2, window, rotating)  # not a BatchKVCache: untouched
    assert rotating.offset is before and s.shared == 0
