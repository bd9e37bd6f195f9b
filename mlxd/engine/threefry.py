"""MLX's key split (`mx.random.split(key)`, Threefry-2x32) on the host, in Python ints.

A batched step draws one key per sampled row from a chain of splits; as MLX ops that is a few
tiny kernels a row, computed here instead (tests/engine/test_threefry.py checks it against
MLX). The layout is MLX's RandomBits for a (2, 2) uint32 output from one key.
"""

M32 = 0xFFFFFFFF
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))

Key = tuple[int, int]


def _hash(key: Key, c0: int, c1: int) -> Key:
    ks = (key[0], key[1], key[0] ^ key[1] ^ 0x1BD11BDA)
    x0, x1 = (c0 + ks[0]) & M32, (c1 + ks[1]) & M32
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = (x0 + x1) & M32
            x1 = ((x1 << r) | (x1 >> (32 - r))) & M32
            x1 ^= x0
        x0 = (x0 + ks[(i + 1) % 3]) & M32
        x1 = (x1 + ks[(i + 2) % 3] + i + 1) & M32
    return x0, x1


def split(key: Key) -> tuple[Key, Key]:
    """(first, second) of `mx.random.split(key)`: MLX's KeySequence keeps the first and
    draws with the second."""
    a, b = _hash(key, 0, 2), _hash(key, 1, 3)
    return (a[0], b[0]), (a[1], b[1])
