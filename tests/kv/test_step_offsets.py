"""One RoPE offset add per batched step (mlxd/kv/step_offsets.py): after a step, the layers
that advanced take the first one's offset, the same graph node, so the next step launches one
add where mlx-lm's caches launch one per layer. The bits are the parity suite's: every engine
batch steps through it (tests/parity/test_batch_parity.py: llama, gemma3's sliding and global
layers, lfm2's conv and attention layers, qwen3_moe)."""

import mlx.core as mx
from fixtures.folded_models import PROMPTS, qwen2_model
from mlx_lm.models.cache import BatchKVCache, BatchRotatingKVCache

from bench.probes.probe_ops import primitives
from mlxd.kv import step_offsets
from mlxd.model import folded_attention as fa


def _offset_adds(model, steps: int, share: bool) -> int:
    """The adds behind the caches' offsets after `steps` evaluated decode steps: the last
    step's, left lazy until the next step's RoPE reads them."""
    caches = [BatchKVCache([0, 4, 9]) for _ in model.layers]
    tokens = mx.array([[0] * p + PROMPTS[2][: 11 - p] for p in (0, 4, 9)])
    for _ in range(steps + 1):
        before = step_offsets.offsets(caches)
        logits = model(tokens, cache=caches)[:, -1, :]
        if share:
            assert step_offsets.share(caches, before) == len(caches) - 1
        tokens = mx.argmax(logits, axis=-1, keepdims=True)
        mx.eval(tokens)
    return primitives(*[c.offset for c in caches])["Add"]


def test_a_step_leaves_one_offset_add_not_one_per_layer() -> None:
    model = qwen2_model()
    assert len(model.layers) == 2
    assert _offset_adds(model, 3, share=False) == 2  # mlx-lm's caches: one add per layer
    assert _offset_adds(model, 3, share=True) == 1
    assert _offset_adds(fa.folded(model), 3, share=True) == 1


def test_an_engine_batch_leaves_one_offset_add(tiny_model, monkeypatch) -> None:
    from mlx_lm import load

    from mlxd.config import EngineConfig
    from mlxd.engine.engine import Engine
    from mlxd.engine.request import GenerationRequest

    model = load(str(tiny_model("qwen3")))[0]
    seen: list[tuple[int, int]] = []  # (layers that took the first's offset, adds left)
    real = step_offsets.share

    def spy(caches, before):
        n = real(caches, before)
        lazy = [c.offset for c in caches if isinstance(c.offset, mx.array)]
        seen.append((n, primitives(*lazy)["Add"]))
        return n

    monkeypatch.setattr(step_offsets, "share", spy)  # the batch step calls it by the module
    engine = Engine(model, config=EngineConfig(8, 8, 2048))
    try:
        reqs = [GenerationRequest(prompt=mx.array(p), max_tokens=4) for p in PROMPTS]
        for handle in engine.submit_many(reqs):
            assert len([e for e in handle if e.token is not None]) == 4
    finally:
        engine.close()
    assert seen and set(seen) == {(len(model.layers) - 1, 1)}


def test_a_layers_offset_is_its_own_object() -> None:
    """An in-place op on one layer's offset (mlx-lm's caches use +=, -=) leaves the others."""
    caches = [BatchKVCache([0, 1]) for _ in range(3)]
    before = step_offsets.offsets(caches)
    for c in caches:
        c.offset = c.offset + 1
    assert step_offsets.share(caches, before) == 2
    assert caches[1].offset is not caches[0].offset
    caches[1].offset -= 5
    assert caches[0].offset.tolist() == caches[2].offset.tolist() == [1, 0]
    assert caches[1].offset.tolist() == [-4, -5]
    caches[0].offset += 2  # the first layer's own array, the one the others copied
    assert caches[2].offset.tolist() == [1, 0] and caches[0].offset.tolist() == [3, 2]


def test_layers_that_did_not_advance_and_other_kinds_keep_their_own() -> None:
    still, moved, rotating = (
        BatchKVCache([0, 0]),
        BatchKVCache([1, 1]),
        BatchRotatingKVCache(8, [0, 0]),
    )
    first = BatchKVCache([0, 0])
    caches = [first, still, moved, rotating]
    before = step_offsets.offsets(caches)
    first.offset, moved.offset = first.offset + 1, moved.offset + 1
    rotating_was = rotating.offset
    assert step_offsets.share(caches, before) == 1
    assert still.offset is before[1] and still.offset.tolist() == [0, 0]  # not updated: its own
    assert moved.offset is not first.offset and moved.offset.tolist() == [1, 1]
    assert rotating.offset is rotating_was
