"""When a wave's rows start decoding, hold their shared prefix once (`--batched-attention
folded+shared`, kv/shared_prefix.py).

A wave that joins an empty batch shares the longest prefix all its rows' tokens have (rounded
down to a multiple of ALIGN, at least MIN_TOKENS); a wave that joins a sharing batch shares that
batch's prefix copy when every row starts with its tokens. Otherwise the wave stays plain, and
joining a sharing batch turns the batch back to the plain layout (`extend`).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..kv.batch_roll import RollingBatchKVCache
from ..kv.shared_prefix import SharedPrefixBatchKVCache, common_prefix

MIN_TOKENS = 512  # a shorter prefix saves less than the split costs
ALIGN = 64  # whole tiles of keys for the prefix's matmul (an odd count leaves the tensor cores)


@dataclass
class SharedPrefixes:
    running: Callable[[], list[Any]]  # the decoding batch's cache layers ([] when empty)
    min_tokens: int = MIN_TOKENS
    shared_waves: int = 0  # waves split off against a prefix (tests, the trace)

    def share(self, caches: list[Any], tokens: list[list[int]]) -> list[Any]:
        """The wave's cache layers, with the prefix held once where it can be."""
        if len(tokens) == 0 or not all(type(c) is RollingBatchKVCache for c in caches):
            return caches  # quantized, rotating or another kind: as they are
        if caches[0].offset.tolist() != [len(t) for t in tokens]:
            return caches  # the tokens do not describe the cache (not a history-fed insert)
        running = self.running()
        if running:
            like = running[0]
            if not isinstance(like, SharedPrefixBatchKVCache) or like.prefix_keys is None:
                return caches
            prefix = like.prefix_tokens
            if common_prefix([list(prefix), *tokens]) < len(prefix):
                return caches
            shared = [
                SharedPrefixBatchKVCache.split_off(c, prefix, r)
                for c, r in zip(caches, running, strict=True)
            ]
        else:
            n = common_prefix(tokens) // ALIGN * ALIGN if len(tokens) > 1 else 0
            if n < self.min_tokens:
                return caches
            prefix = tuple(tokens[0][:n])
            shared = [SharedPrefixBatchKVCache.split_off(c, prefix) for c in caches]
        self.shared_waves += 1
        return shared
