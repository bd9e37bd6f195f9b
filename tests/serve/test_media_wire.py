"""Images at the door (serve/media.py): real PNG / JPEG / WebP / GIF made with Pillow decode to
their pixels; truncated files, bomb headers, wrong media types, bad base64, too many or too
large images, refused URLs and file URLs outside --allowed-media-dir are each a 400 naming the
part."""

import base64
import http.server
import io
import struct
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mlxd.serve.errors import APIError
from mlxd.serve.media import MediaPolicy, MediaReader

WHERE = "messages[1].content[2].image_url"


def picture(seed: int, size: tuple[int, int] = (24, 16)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)


def encode(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def data_url(raw: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(raw).decode()}"


def read(url: str, policy: MediaPolicy | None = None) -> np.ndarray:
    return MediaReader(policy or MediaPolicy()).url(url, WHERE).get().pixels


def refused(url: str, policy: MediaPolicy | None = None) -> str:
    with pytest.raises(APIError) as e:
        read(url, policy)
    assert e.value.status == 400 and e.value.param == "messages"
    assert e.value.message.startswith(WHERE + ": "), e.value.message
    return e.value.message


def test_png_decodes_to_its_pixels_and_digest() -> None:
    a, b = picture(0), picture(1)
    got = MediaReader(MediaPolicy()).url(data_url(encode(a)), WHERE).get()
    assert got.pixels.dtype == np.uint8 and np.array_equal(got.pixels, a)
    assert got.where == WHERE
    again = MediaReader(MediaPolicy()).url(data_url(encode(a)), "x").get()
    assert again.digest == got.digest and len(got.digest) == 64
    other = MediaReader(MediaPolicy()).url(data_url(encode(b)), "y").get()
    assert other.digest != got.digest
    transposed = MediaReader(MediaPolicy()).url(data_url(encode(a.reshape(24, 16, 3))), "z")
    assert transposed.get().digest != got.digest  # same bytes, another shape


def test_jpeg_webp_gif() -> None:
    a = picture(2)
    jpeg = read(data_url(encode(a, "JPEG"), "image/jpeg"))
    assert jpeg.shape == a.shape and np.abs(jpeg.astype(int) - a).mean() < 80  # lossy
    webp = read(data_url(encode(a, "WEBP"), "image/webp"))
    assert webp.shape == a.shape
    frames = [Image.new("RGB", (8, 6), c) for c in ((255, 0, 0), (0, 0, 255))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    gif = read(data_url(out.getvalue(), "image/gif"))
    assert gif.shape == (6, 8, 3) and tuple(gif[0, 0]) == (255, 0, 0)  # the first frame


def bomb_png(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` (its pixel data is a few bytes)."""
    raw = encode(picture(3, (4, 4)))
    ihdr = raw[16:29]
    new = struct.pack(">II", width, height) + ihdr[8:]
    crc = struct.pack(">I", zlib.crc32(b"IHDR" + new) & 0xFFFFFFFF)
    return raw[:16] + new + crc + raw[33:]


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (data_url(encode(picture(4))[:60]), "cannot be decoded"),  # truncated
        (data_url(bomb_png(100_000, 100_000)), "pixels"),
        (data_url(bomb_png(7681, 4320)), "7681x4320, more than 33177600 pixels"),
        (data_url(encode(picture(5)), "image/tiff"), "media type 'image/tiff'"),
        (data_url(encode(picture(5)), "text/plain"), "media type"),
        ("data:image/png;base64,!!!!", "not valid base64"),
        ("data:image/png;base64,iVBORw0", "not valid base64"),
        ("data:image/png,plain", "data:<media type>;base64"),
        (data_url(b"not an image at all"), "cannot be decoded"),
        (data_url(encode(picture(6), "BMP")), "format BMP"),
        ("ftp://example.com/a.png", "must be a data URL"),
        ("", "non-empty string"),
        (
            "http://127.0.0.1:1/a.png",
            "fetching image URLs is off; send a data URL or start the server with --allow-fetch",
        ),  # noqa: E501
        ("https://example.com/a.png", "--allow-fetch"),
        ("file:///etc/passwd", "file URLs are off"),
    ],
)
def test_bad_images_are_400s_naming_the_part(url: str, words: str) -> None:
    assert words in refused(url)


def test_limits_bytes_and_count() -> None:
    raw = encode(picture(7))
    assert "--max-image-bytes" in refused(data_url(raw), MediaPolicy(max_bytes=len(raw) // 2))
    read(data_url(raw), MediaPolicy(max_bytes=len(raw)))  # exactly the limit is fine
    reader = MediaReader(MediaPolicy(max_images=2))
    for i in range(2):
        reader.url(data_url(raw), f"p{i}")
    with pytest.raises(APIError, match="p2: a request may carry at most 2 images"):
        reader.url(data_url(raw), "p2")
    assert "more than 100 pixels" in refused(data_url(raw), MediaPolicy(max_pixels=100))


def test_anthropic_base64_source() -> None:
    a = picture(8)
    raw = base64.b64encode(encode(a)).decode()
    got = MediaReader(MediaPolicy()).base64("image/png", raw, "messages.0.content.1.source")
    assert np.array_equal(got.get().pixels, a)
    with pytest.raises(APIError, match="media type"):
        MediaReader(MediaPolicy()).base64(None, raw, "s")


def test_file_urls_only_under_the_media_dir(tmp_path: Path) -> None:
    root, outside = tmp_path / "media", tmp_path / "secret"
    root.mkdir()
    outside.mkdir()
    a = picture(9)
    (root / "a.png").write_bytes(encode(a))
    (outside / "b.png").write_bytes(encode(a))
    (root / "link.png").symlink_to(outside / "b.png")
    (root / "dirlink").symlink_to(outside)
    policy = MediaPolicy(media_dir=str(root))
    assert np.array_equal(read(f"file://{root}/a.png", policy), a)
    assert "outside --allowed-media-dir" in refused(f"file://{outside}/b.png", policy)
    assert "outside --allowed-media-dir" in refused(f"file://{root}/../secret/b.png", policy)
    assert "outside --allowed-media-dir" in refused(f"file://{root}/link.png", policy)
    assert "outside --allowed-media-dir" in refused(f"file://{root}/dirlink/b.png", policy)
    assert "no such file" in refused(f"file://{root}/none.png", policy)
    assert "local file" in refused(f"file://host{root}/a.png", policy)
    assert "file URLs are off" in refused(f"file://{root}/a.png")


@pytest.fixture
def image_site() -> Iterator[str]:
    """A loopback HTTP server: /a.png an image, /moved a redirect to a file URL."""
    body = encode(picture(10))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/a.png":
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(302)
                self.send_header("location", "file:///etc/passwd")
                self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_when_allowed(image_site: str) -> None:
    on = MediaPolicy(allow_fetch=True)
    assert np.array_equal(read(image_site + "/a.png", on), picture(10))
    assert "HTTP 302" in refused(image_site + "/moved", on)  # redirects are not followed
    small = MediaPolicy(max_bytes=99, allow_fetch=True)
    assert "--max-image-bytes" in refused(image_site + "/a.png", small)


def test_openai_part_spellings() -> None:
    """mlx_lm.server's `_image_url` spellings: `image_url` or `image`, a string or `{url}`."""
    from mlxd.serve.media_parts import ImagePart, images_of
    from mlxd.serve.prompt import normalize_messages

    a, b = picture(11), picture(12)
    parts = [
        {"type": "text", "text": "x"},
        {"type": "image_url", "image_url": {"url": data_url(encode(a)), "detail": "high"}},
        {"type": "input_image", "image_url": data_url(encode(b))},
        {"type": "image", "image": data_url(encode(a))},
        {"type": "image", "image": {"url": data_url(encode(b))}},
    ]
    (m,) = normalize_messages([{"role": "user", "content": parts}])
    assert m["content"][0] == {"type": "text", "text": "x"}
    assert all(isinstance(p, ImagePart) and p == {"type": "image"} for p in m["content"][1:])
    got = [i.pixels for i in images_of([m])]
    assert all(np.array_equal(g, e) for g, e in zip(got, [a, b, a, b], strict=True))
    bad = {"type": "image_url", "image_url": {"url": data_url(encode(a)), "detail": 3}}
    with pytest.raises(APIError, match=r"messages\[0\].content\[0\].image_url.detail"):
        normalize_messages([{"role": "user", "content": [bad]}])
    with pytest.raises(APIError, match="user messages only"):
        normalize_messages([{"role": "system", "content": parts[1:2]}])
    (text,) = normalize_messages([{"role": "user", "content": [parts[0], parts[0]]}])
    assert text["content"] == "xx"  # text only: joined, as before
