"""A model's fingerprint: what the prefix store keys its disk entries by, so a KV cache is only
ever restored into the weights that computed it.

Hashing every byte of a large model at each start would take seconds per gigabyte, so each
weight file contributes its name, its size, its head and tail and evenly spaced samples; two
fine-tunes of one base differ in nearly every sampled block. Small files are hashed whole.
"""

import hashlib
import os
from pathlib import Path

SAMPLE = 1 << 16  # bytes per sample
SAMPLES = 64
WHOLE = 8 << 20  # files up to this size are hashed entirely
CONFIGS = ("config.json", "adapter_config.json")  # the tokenizer does not change a token's KV


def _file(h: "hashlib._Hash", path: Path) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        if size <= WHOLE:
            h.update(f.read())
            return
        step = (size - SAMPLE) // (SAMPLES - 1)
        for i in range(SAMPLES):
            f.seek(i * step)
            h.update(f.read(SAMPLE))


def fingerprint(folder: str | os.PathLike | None, adapter: str | os.PathLike | None = None) -> str:
    """Hex digest over the model folder's config and weights (and the adapter's, if any)."""
    h = hashlib.sha256(b"mlxd-model-v1\0")
    for root in (folder, adapter):
        if root is None:
            h.update(b"\0none\0")
            continue
        root = Path(root)
        if root.is_file():  # a single-file model (GGUF)
            _file(h, root)
            continue
        names = sorted(p for p in root.iterdir() if p.suffix == ".safetensors" or p.name in CONFIGS)
        for path in names:
            if path.is_file():
                _file(h, path)
    return h.hexdigest()[:32]
