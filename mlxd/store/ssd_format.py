"""The SSD tier's file format: one prompt cache per file, content-addressed and checksummed.

Layout: MAGIC (8 bytes) | header length (u64 LE) | header (JSON) | payload | digest (32 bytes).
The header records the format version, namespace, token ids, kind, and every layer's mlx-lm
class, its `state` tree with arrays replaced by indexes into the tensor table (dtype, shape), and
its buffer's capacity; the payload is those tensors' raw C-order bytes back to back. A KV layer's
tensors hold only its used positions (ssd_used.py), so a file grows with its prompt, not with
the buffer. The digest covers header + payload, so any flipped byte is caught: blake2b-256 over
the header and the blake2b digests of the payload's pieces (each tensor cut into PIECE-byte
pieces), which are hashed on several threads (hashlib lets go of the GIL), so verifying a
gigabyte is not a second of one core. The key recomputed from the header must equal the file
name, so a renamed or swapped-in file is caught.
"""

import hashlib
import importlib
import json
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import _BaseCache

from .ssd_used import regrow, shrink

FORMAT_VERSION = 3  # bump when the on-disk format changes; part of every key
MAGIC = b"MLXDKV\x00\x00"
PREFIX = len(MAGIC) + 8
DIGEST = 32
MAX_HEADER = 256 << 20  # a header larger than this is corrupt (1M tokens take ~8 MB)
# Layers are rebuilt only from cache classes of these packages (a file never names arbitrary code).
CLASS_MODULES = ("mlx_lm.models.", "mlxd.")

# dtype name -> (MLX dtype, numpy dtype holding the same bytes). bfloat16 has no numpy dtype: its
# bytes travel as uint16 and are reinterpreted with `view` when rebuilt.
DTYPES: dict[str, tuple[mx.Dtype, np.dtype]] = {
    name: (getattr(mx, name), np.dtype("uint16" if name == "bfloat16" else name.rstrip("_")))
    for name in (
        "bool_", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
        "float16", "bfloat16", "float32", "float64", "complex64",
    )
}  # fmt: skip
_NAMES = {mx_dtype: name for name, (mx_dtype, _) in DTYPES.items()}


PIECE = 16 << 20  # bytes per separately hashed piece of the payload
_POOL = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="mlxd-hash")


def _pieces(buffers: list[memoryview]) -> list[memoryview]:
    return [b[i : i + PIECE] for b in buffers for i in range(0, max(len(b), 1), PIECE)]


def digest(header: bytes, buffers: list[memoryview]) -> bytes:
    """The file's digest over the header and the tensors' bytes (flat byte views)."""

    def one(piece: memoryview) -> bytes:
        return hashlib.blake2b(piece, digest_size=DIGEST).digest()

    h = hashlib.blake2b(header, digest_size=DIGEST)
    for d in _POOL.map(one, _pieces(buffers)):
        h.update(d)
    return h.digest()


class FormatError(ValueError):
    """The file is not a valid entry (or not the entry that was asked for)."""


def content_key(namespace: str, tokens: Any) -> str:
    """sha256 over (FORMAT_VERSION, namespace, token ids); length-prefixed, so unambiguous."""
    ns = namespace.encode()
    h = hashlib.sha256(b"mlxd-prefix\x00" + struct.pack("<IQ", FORMAT_VERSION, len(ns)) + ns)
    h.update(np.asarray(tokens, dtype="<i8").tobytes())
    return h.hexdigest()


@dataclass
class Prepared:
    """An entry ready for the writer: everything it needs, no MLX calls left to make."""

    key: str
    namespace: str
    tokens: tuple[int, ...]
    kind: str
    trimmable: bool
    layers: list[dict[str, Any]]  # {"module", "class", "state": encoded tree, "capacity"}
    tensors: list[tuple[str, list[int]]]  # (dtype name, shape), in payload order
    views: list[memoryview]  # the tensors' bytes (possibly strided), kept alive until written
    payload_nbytes: int


def _encode(node: Any, arrays: list[mx.array]) -> Any:
    if isinstance(node, mx.array):
        arrays.append(node)
        return {"a": len(arrays) - 1}
    if isinstance(node, tuple | list):
        return {"t" if isinstance(node, tuple) else "l": [_encode(x, arrays) for x in node]}
    if isinstance(node, dict):
        return {"d": {str(k): _encode(v, arrays) for k, v in node.items()}}
    if node is None or isinstance(node, bool | int | float | str):
        return node
    raise TypeError(f"cache state holds a {type(node).__name__}, which cannot be stored")


def _decode(node: Any, arrays: list[mx.array]) -> Any:
    if not isinstance(node, dict):
        return node
    ((tag, value),) = node.items()
    if tag == "a":
        return arrays[value]
    if tag in ("t", "l"):
        items = [_decode(x, arrays) for x in value]
        return tuple(items) if tag == "t" else items
    if tag == "d":
        return {k: _decode(v, arrays) for k, v in value.items()}
    raise FormatError(f"unknown state tag {tag!r}")


def prepare(namespace: str, tokens: Any, cache: list[Any], kind: str) -> Prepared:
    """Runs on the engine thread, so the writer thread runs no MLX op at all (mx.save_safetensors
    would build and eval `contiguous` graphs there); it reads raw bytes via the buffer protocol.
    Each array is pinned by a buffer-sharing alias (stop_gradient, no copy): a later in-place
    update of the cache then copies instead of donating and overwriting the bytes being written
    (tests/store/test_ssd_writer.py fails without the pin)."""
    arrays: list[mx.array] = []
    layers = []
    for c in cache:
        used, capacity = shrink(c)  # views of the used positions: the pins below copy nothing
        state = _encode(used.state, arrays)
        layers.append({"module": type(c).__module__, "class": type(c).__name__,
                       "state": state, "capacity": capacity})  # fmt: skip
    pins = [mx.stop_gradient(a) for a in arrays]
    mx.eval(pins)  # new no-copy nodes: evaluated here, on the thread that owns MLX work
    views = [memoryview(p) for p in pins]  # each view keeps its pin (and the buffer) alive
    toks = tuple(int(t) for t in tokens)
    return Prepared(
        key=content_key(namespace, toks),
        namespace=namespace,
        tokens=toks,
        kind=kind,
        trimmable=all(c.is_trimmable() for c in cache),
        layers=layers,
        tensors=[(_NAMES[p.dtype], list(p.shape)) for p in pins],
        views=views,
        payload_nbytes=sum(v.nbytes for v in views),
    )


def header_bytes(p: Prepared) -> bytes:
    header = {
        "format": FORMAT_VERSION,
        "namespace": p.namespace,
        "tokens": list(p.tokens),
        "kind": p.kind,
        "trimmable": p.trimmable,
        "layers": p.layers,
        "tensors": p.tensors,
        "payload_nbytes": p.payload_nbytes,
    }
    return json.dumps(header, separators=(",", ":")).encode()


def file_size(header_len: int, payload_nbytes: int) -> int:
    return PREFIX + header_len + payload_nbytes + DIGEST


def write(f: IO[bytes], header: bytes, views: list[memoryview]) -> None:
    """Stream the entry into `f` (no MLX calls: raw bytes through the buffer protocol)."""
    flat = [(v if v.c_contiguous else memoryview(v.tobytes())).cast("B") for v in views]
    f.write(MAGIC + struct.pack("<Q", len(header)) + header)
    for chunk in flat:
        f.write(chunk)
    f.write(digest(header, flat))


def parse_header(prefix: bytes, header: bytes, size: int) -> dict[str, Any]:
    """Check the header's shape and that the file is exactly as long as it says."""
    if len(prefix) != PREFIX or prefix[: len(MAGIC)] != MAGIC:
        raise FormatError("bad magic")
    try:
        h = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"header is not JSON: {e}") from None
    if not isinstance(h, dict) or h.get("format") != FORMAT_VERSION:
        raise FormatError(f"format {h.get('format') if isinstance(h, dict) else h!r}")
    toks, ns, nbytes = h.get("tokens"), h.get("namespace"), h.get("payload_nbytes")
    if not (isinstance(ns, str) and isinstance(toks, list) and isinstance(nbytes, int)):
        raise FormatError("header lacks namespace / tokens / payload_nbytes")
    if not all(isinstance(t, int) for t in toks) or not isinstance(h.get("trimmable"), bool):
        raise FormatError("header has bad tokens / trimmable")
    if size != file_size(len(header), nbytes):
        raise FormatError(f"size {size} != {file_size(len(header), nbytes)} (truncated?)")
    return h


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of the file at `path` and the file's size (no payload read, no checksum)."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        prefix = f.read(PREFIX)
        n = struct.unpack("<Q", prefix[len(MAGIC) :])[0] if len(prefix) == PREFIX else -1
        if not 0 <= n <= min(MAX_HEADER, size):
            raise FormatError(f"header length {n}")
        return parse_header(prefix, f.read(n), size), size


def read(data: Any, key: str, namespace: str) -> tuple[dict[str, Any], list[Any]]:
    """Verify a whole file's bytes (bytes, or a memoryview of a mapped file) against the entry
    asked for; rebuild its cache layers."""
    data = memoryview(data).cast("B")
    n = struct.unpack("<Q", data[len(MAGIC) : PREFIX])[0] if len(data) >= PREFIX else -1
    if not 0 <= n <= min(MAX_HEADER, len(data)):
        raise FormatError(f"header length {n}")
    header = bytes(data[PREFIX : PREFIX + n])
    h = parse_header(bytes(data[:PREFIX]), header, len(data))
    if h["namespace"] != namespace:
        raise FormatError(f"namespace {h['namespace']!r}, asked for {namespace!r}")
    if content_key(h["namespace"], h["tokens"]) != key:
        raise FormatError("the header's namespace/tokens do not hash to the file's key")
    payload = data[PREFIX + n : len(data) - DIGEST]
    if digest(header, _split(h, payload)) != bytes(data[len(data) - DIGEST :]):
        raise FormatError("checksum mismatch")
    try:
        return h, _rebuild(h, payload)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, ImportError) as e:
        raise FormatError(f"cannot rebuild the layers: {e!r}") from e


def _split(h: dict[str, Any], payload: memoryview) -> list[memoryview]:
    """The payload cut at the tensors' boundaries (as written), from the header's table."""
    out, at = [], 0
    for name, shape in h.get("tensors") or []:
        if name not in DTYPES or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise FormatError(f"tensor {name!r} {shape!r}")
        n = int(np.prod(shape, dtype=np.int64)) * DTYPES[name][1].itemsize
        out.append(payload[at : at + n])
        at += n
    if at != len(payload):
        raise FormatError(f"tensors take {at} bytes, payload has {len(payload)}")
    return out


def _rebuild(h: dict[str, Any], payload: memoryview) -> list[Any]:
    arrays, offset = [], 0
    for name, shape in h["tensors"]:
        mx_dtype, np_dtype = DTYPES[name]
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise FormatError(f"tensor shape {shape!r}")
        count = int(np.prod(shape, dtype=np.int64))
        host = np.frombuffer(payload, np_dtype, count, offset).reshape(shape)
        offset += host.nbytes
        a = mx.array(host)  # copies the bytes into MLX memory
        arrays.append(a.view(mx_dtype) if a.dtype != mx_dtype else a)
    if offset != len(payload):
        raise FormatError(f"tensors take {offset} bytes, payload has {len(payload)}")
    layers = []
    for layer in h["layers"]:
        module = layer["module"]
        if not module.startswith(CLASS_MODULES):
            raise FormatError(f"cache class from module {module!r}")
        cls = getattr(importlib.import_module(module), layer["class"])
        if not (isinstance(cls, type) and issubclass(cls, _BaseCache)):
            raise FormatError(f"{module}.{layer['class']} is not an mlx-lm cache class")
        restored = cls.from_state(_decode(layer["state"], arrays))
        layers.append(regrow(restored, layer.get("capacity")))
    mx.eval([c.state for c in layers])
    return layers
