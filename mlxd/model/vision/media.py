"""One decoded image of a request: its RGB pixels, decoded once at the door, and a content hash
of those pixels that names it to the prefix store and the tests (the encoded bytes do not: the
same picture sent as PNG and as WebP is one image)."""

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MediaImage:
    pixels: np.ndarray  # H x W x 3 uint8 RGB
    digest: str  # sha256 hex over the shape and the pixel bytes
    where: str  # the part's path for errors, e.g. "messages[1].content[2]"

    @classmethod
    def from_pixels(cls, pixels: np.ndarray, where: str) -> "MediaImage":
        """The image of `pixels` (H x W x 3 uint8), its digest computed here so no caller
        hashes differently."""
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
            got = f"{pixels.dtype} {pixels.shape}"
            raise ValueError(f"{where}: pixels must be H x W x 3 uint8, got {got}")
        pixels = np.ascontiguousarray(pixels)
        pixels.setflags(write=False)
        return cls(pixels=pixels, digest=pixel_digest(pixels), where=where)


def pixel_digest(pixels: np.ndarray) -> str:
    """sha256 hex of the shape then the C-order pixel bytes: equal pictures, equal digests."""
    h = hashlib.sha256(repr(tuple(pixels.shape)).encode())
    h.update(np.ascontiguousarray(pixels).tobytes())
    return h.hexdigest()
