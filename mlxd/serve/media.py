"""Images at the door: a data URL, raw base64, an http(s) URL (only with --allow-fetch) or a
file URL (only under --allowed-media-dir) decoded once into a `MediaImage`, within the server's
limits. Every failure is a 400 that names the part and says why; nothing here raises anything
else, so a hostile image costs one request, never the server."""

import base64
import io
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from ..model.vision.media import MediaImage
from .errors import APIError, bad_request

# Pillow formats -> the media types that name them
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
MEDIA_TYPES = frozenset(FORMATS.values()) | {"image/jpg"}  # image/jpg: a common misspelling
FETCH_TIMEOUT = 10.0  # seconds for a whole fetch (--allow-fetch)


@dataclass(frozen=True)
class MediaPolicy:
    """The server's image limits (ServeConfig's flags); the defaults are the flags'."""

    max_bytes: int = 20 << 20
    max_pixels: int = 7680 * 4320
    max_images: int = 16
    allow_fetch: bool = False
    media_dir: str | None = None

    @classmethod
    def of(cls, config: Any) -> "MediaPolicy":
        return cls(
            config.max_image_bytes,
            config.max_image_pixels,
            config.max_images_per_request,
            config.allow_fetch,
            config.allowed_media_dir,
        )


DEFAULT_POLICY = MediaPolicy()


class PendingImage:
    """An image part whose shape, source and limits were checked when the request was read;
    its bytes are read and decoded on first use (`get`), once, off the event loop where the
    prompt is built, and never for a model that takes no images."""

    def __init__(self, where: str, param: str, policy: MediaPolicy, read: Any) -> None:
        self.where, self.param, self.policy, self._read = where, param, policy, read
        self._media: MediaImage | None = None
        self._lock = threading.Lock()

    def get(self) -> MediaImage:
        with self._lock:
            if self._media is None:
                raw = self._read(self)
                if len(raw) > self.policy.max_bytes:
                    raise self.fail(too_large(len(raw), self.policy.max_bytes))
                pixels = decode_pixels(raw, self.policy.max_pixels, self.fail)
                self._media = MediaImage.from_pixels(pixels, self.where)
            return self._media

    def fail(self, why: str) -> APIError:
        return bad_request(f"{self.where}: {why}", self.param)


def too_large(size: int, limit: int) -> str:
    return f"the image is {size} bytes; the limit is {limit} (--max-image-bytes)"


class MediaReader:
    """One request's image parts, checked in order and counted against the request's limit.
    `param` is the top-level field errors name (OpenAI's `param`)."""

    def __init__(self, policy: MediaPolicy, param: str = "messages") -> None:
        self.policy, self.param, self.count = policy, param, 0

    def fail(self, where: str, why: str) -> APIError:
        return bad_request(f"{where}: {why}", self.param)

    def _pending(self, where: str, read: Any) -> PendingImage:
        self.count += 1
        if self.count > self.policy.max_images:
            limit = self.policy.max_images
            raise self.fail(
                where, f"a request may carry at most {limit} images (--max-images-per-request)"
            )
        return PendingImage(where, self.param, self.policy, read)

    def url(self, url: Any, where: str) -> PendingImage:
        """A data URL, an http(s) URL or a file URL."""
        if not isinstance(url, str) or not url:
            raise self.fail(where, "an image URL must be a non-empty string")
        scheme = url.split(":", 1)[0].lower() if ":" in url else ""
        if scheme == "data":
            return self.data_url(url, where)
        if scheme in ("http", "https"):
            if not self.policy.allow_fetch:
                why = "fetching image URLs is off; send a data URL or start the server with"
                raise self.fail(where, why + " --allow-fetch")
            return self._pending(where, lambda p: fetch(url, p))
        if scheme == "file":
            path = self._file(url, where)
            return self._pending(where, lambda p: read_file(path, p))
        raise self.fail(where, "an image URL must be a data URL (data:image/png;base64,...)")

    def data_url(self, url: str, where: str) -> PendingImage:
        head, comma, data = url[5:].partition(",")
        if not comma or not head.lower().endswith(";base64"):
            raise self.fail(where, "a data URL must be data:<media type>;base64,<data>")
        return self.base64(head[: -len(";base64")], data, where)

    def base64(self, media_type: Any, data: Any, where: str) -> PendingImage:
        """Anthropic's `{type: base64, media_type, data}`, and a data URL's parts."""
        if not isinstance(media_type, str) or media_type.lower() not in MEDIA_TYPES:
            kinds = ", ".join(sorted(FORMATS.values()))
            raise self.fail(where, f"media type {media_type!r} is not one of {kinds}")
        if not isinstance(data, str) or not data:
            raise self.fail(where, "the image data must be a non-empty base64 string")
        if (size := len(data) // 4 * 3) > self.policy.max_bytes + 2:  # before decoding it
            raise self.fail(where, too_large(size, self.policy.max_bytes))
        if len(data) % 4 or not _BASE64.fullmatch(data):
            raise self.fail(where, "the image data is not valid base64")
        return self._pending(where, lambda p: base64.b64decode(data))

    def _file(self, url: str, where: str) -> str:
        """The real path of a file URL under --allowed-media-dir."""
        root = self.policy.media_dir
        if root is None:
            raise self.fail(where, "file URLs are off; start the server with --allowed-media-dir")
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost"):
            raise self.fail(where, "a file URL must name a local file")
        real, base = os.path.realpath(unquote(parsed.path)), os.path.realpath(root)
        if os.path.commonpath([real, base]) != base:  # symlinks resolved first: none lead out
            raise self.fail(where, "the file is outside --allowed-media-dir")
        if not os.path.isfile(real):
            raise self.fail(where, "no such file under --allowed-media-dir")
        return real


_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")


def fetch(url: str, pending: PendingImage) -> bytes:
    """An http(s) image within the byte limit and FETCH_TIMEOUT; no redirects (one could lead
    where the client could not point the server itself)."""
    import httpx

    limit, chunks, size = pending.policy.max_bytes, [], 0
    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT, follow_redirects=False) as r:
            if r.status_code != 200:
                raise pending.fail(f"fetching the image answered HTTP {r.status_code}")
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > limit:
                    raise pending.fail(too_large(size, limit))
                chunks.append(chunk)
    except httpx.HTTPError as e:
        raise pending.fail(f"fetching the image failed ({type(e).__name__})") from None
    return b"".join(chunks)


def read_file(path: str, pending: PendingImage) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(pending.policy.max_bytes + 1)  # one byte over: refused as too large
    except OSError as e:
        raise pending.fail(f"the file cannot be read ({type(e).__name__})") from None


def decode_pixels(raw: bytes, max_pixels: int, fail: Any) -> np.ndarray:
    """H x W x 3 uint8 RGB of a PNG, JPEG, WebP or GIF (its first frame); the pixel count is
    read from the header and checked before anything is decoded. `fail(why)` makes the error."""
    from PIL import Image

    # Pillow's own bomb guard (twice this raises inside open) set to the server's limit; one
    # server has one limit, so the global holds the same value on every call
    Image.MAX_IMAGE_PIXELS = max_pixels
    # past the limit Pillow warns, then the check below refuses: the warning says nothing more
    warnings.filterwarnings("ignore", category=Image.DecompressionBombWarning)
    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in FORMATS:
                raise fail(f"image format {im.format} is not PNG, JPEG, WebP or GIF")
            width, height = im.size
            if width * height > max_pixels:
                raise fail(
                    f"the image is {width}x{height}, more than {max_pixels} pixels "
                    "(--max-image-pixels)"
                )
            im.seek(0)  # an animation's first frame
            pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except APIError:
        raise
    except Image.DecompressionBombError:
        raise fail(f"the image has more than {max_pixels} pixels (--max-image-pixels)") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many kinds on hostile bytes
        raise fail(f"the image cannot be decoded ({type(e).__name__})") from None
    if pixels.ndim != 3 or pixels.shape[2] != 3 or 0 in pixels.shape:
        raise fail("the image decodes to no RGB pixels")
    return pixels
