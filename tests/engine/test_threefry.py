"""The host-side key split equals MLX's `mx.random.split` (and so its key sequence)."""

import random

import mlx.core as mx

from mlxd.engine.rng import current_key, set_key, split


def test_split_equals_mlx_on_random_keys() -> None:
    rng = random.Random(0)
    keys = [(0, 0), (0xFFFFFFFF, 0xFFFFFFFF), (0, 42)]
    keys += [(rng.getrandbits(32), rng.getrandbits(32)) for _ in range(200)]
    for key in keys:
        first, second = mx.random.split(mx.array(list(key), dtype=mx.uint32)).tolist()
        assert split(key) == (tuple(first), tuple(second))


def test_a_chain_of_splits_follows_mlxs_key_sequence() -> None:
    set_key((3, 9))
    drawn = [mx.random.uniform(shape=(1,)) for _ in range(5)]  # each draw splits the key
    state, mine = (3, 9), []
    for _ in range(5):
        state, k = split(state)
        mine.append(mx.random.uniform(shape=(1,), key=mx.array(list(k), dtype=mx.uint32)))
    assert current_key() == state
    assert all(mx.array_equal(a, b).item() for a, b in zip(drawn, mine, strict=True))
