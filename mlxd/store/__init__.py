"""Layer 0: the prefix store (RAM tier and SSD tier), beside the KV layer. Lands with its issue."""
