"""Layer 0: the prefix store, beside the KV layer: prompt caches kept by token prefix in a
byte-capped RAM tier and an SSD tier that survives restarts."""

from .store import Hit, PrefixStore

__all__ = ["Hit", "PrefixStore"]
