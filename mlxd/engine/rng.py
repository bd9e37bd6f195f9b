"""Per-row PRNG keys on the engine thread. MLX keeps one key per thread; a row carries the
caller's key so `mx.random.seed(s)` before a call gives mlx-lm's samples, whatever thread runs."""

import mlx.core as mx


def current_key() -> tuple[int, int]:
    """This thread's key as two ints (evaluates the pending key splits, a tiny graph)."""
    hi, lo = mx.random.state[0].tolist()
    return int(hi), int(lo)


def repair_key() -> None:
    """A step that failed inside a compiled sampler can leave the thread's key unevaluable;
    give the thread a readable key again (the next seeded row sets its own anyway)."""
    try:
        current_key()
    except RuntimeError:
        mx.random.seed(0)


def set_key(key: tuple[int, int]) -> None:
    """Make this thread's key exactly `key` (mx.random.key(s) is [s >> 32, s & 0xffffffff])."""
    mx.random.seed((key[0] << 32) | key[1])


class KeyOwner:
    """Tracks which row's key the engine thread holds, swapping only when another row needs it."""

    def __init__(self) -> None:
        self.owner: object | None = None
        self.keys: dict[int, tuple[int, int]] = {}
        self.installed: tuple[int, int] | None = None  # the key `enter` gave the owner

    def enter(self, row: object, initial: tuple[int, int] | None) -> None:
        if initial is None or self.owner is row:
            return
        if self.owner is not None:
            self.keys[id(self.owner)] = current_key()
        key = self.keys.pop(id(row), initial)
        set_key(key)
        self.owner, self.installed = row, key

    def take_over(self, row: object, drawn: mx.array | None) -> None:
        """This thread takes `row` from a driver's thread (driver.py): the row's key becomes
        the one its last draw left (`drawn`, already scheduled), or, if it has not drawn since
        `enter`, the key `enter` gave it; `enter` installs it here."""
        if self.owner is not row:
            return  # the row has no key of its own
        if drawn is None:
            assert self.installed is not None  # set with the owner
            self.keys[id(row)] = self.installed
        else:
            hi, lo = drawn.tolist()
            self.keys[id(row)] = (int(hi), int(lo))
        self.owner = None

    def adopt(self, row: object, key: tuple[int, int]) -> None:
        """A row arriving with a key of its own (from the batch) starts from that key."""
        self.keys[id(row)] = key

    def leave(self, row: object) -> tuple[int, int] | None:
        """The row ended: its final key, if it had one."""
        if self.owner is row:
            self.owner = None
            return current_key()
        return self.keys.pop(id(row), None)


# MLX's key split (`mx.random.split(key)`, Threefry-2x32) on the host, in Python ints.
#
# A batched step draws one key per sampled row from a chain of splits; as MLX ops that is a few
# tiny kernels a row, computed here instead (tests/engine/test_threefry.py checks it against MLX).
# The layout is MLX's RandomBits for a (2, 2) uint32 output from one key.

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
