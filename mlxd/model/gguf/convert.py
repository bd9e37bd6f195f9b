"""Orchestration: identity (stat record, else hash) → cached folder or convert into a temp
folder → atomic rename."""

import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx

from ...config import mlxd_home
from ..errors import ModelLoadError
from . import identity
from .arch import ARCHS, Arch, get_arch
from .reader import read_gguf
from .weights import write_model

CONVERTER_VERSION = 1  # bump when the output changes, so stale cached folders are redone
MARKER = "mlxd_gguf.json"  # written last: its presence (and content) means "complete"
DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
STALE_SECONDS = 24 * 3600  # a temp folder this old belongs to no running conversion


def default_dtype(arch: Arch) -> str:
    # MLX's quantized matmul on CPU is ~8x slower with half-precision scales.
    if mx.default_device().type == mx.DeviceType.cpu:
        return "float32"
    return arch.gpu_dtype


def _marker(digest: str, dtype: str, arch_name: str, source: Path) -> dict:
    return {
        "converter_version": CONVERTER_VERSION,
        "source_sha256": digest,
        "dtype": dtype,
        "architecture": arch_name,
        "source": str(source),
    }


def is_complete(folder: Path, digest: str, dtype: str) -> bool:
    """A finished conversion of this exact file, dtype and converter version."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(marker, dict)
        and marker.get("converter_version") == CONVERTER_VERSION
        and marker.get("source_sha256") == digest
        and marker.get("dtype") == dtype
        and (folder / "config.json").exists()
    )


def _check_replaceable(out: Path) -> None:
    """Only ever replace our own output, never a folder someone pointed us at by mistake."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise ModelLoadError(f"{out}: exists and is not an mlxd conversion; not replacing it")


def _publish(tmp: Path, out: Path, digest: str, dtype: str, force: bool) -> None:
    """Move the finished temp folder into place with renames: `out` is never half-written."""
    if not force and is_complete(out, digest, dtype):
        shutil.rmtree(tmp)  # a concurrent conversion finished first: keep (and share) theirs
        return
    old = None
    if out.exists():
        _check_replaceable(out)
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sweep_stale(out: Path) -> None:
    """Remove temp folders left by conversions that were killed outright (SIGKILL, power)."""
    cutoff = time.time() - STALE_SECONDS
    for leftover in out.parent.glob(f".{glob.escape(out.name)}.*"):
        if leftover.is_dir() and leftover.stat().st_mtime < cutoff:
            shutil.rmtree(leftover, ignore_errors=True)


def convert_gguf(
    path: Path, out: Path | None = None, dtype: str | None = None, force: bool = False
) -> Path:
    """Convert a GGUF file once into an MLX model folder that `mlx_lm.utils.load` loads."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"{path}: GGUF file not found")
    gf = None
    source = None if force else identity.known_source(path)  # --force trusts no record
    if source is None or source.architecture not in ARCHS:
        gf = read_gguf(path)  # header first: a bad file fails before we hash gigabytes
        before = identity.stat_key(path)
        source = identity.Source(identity.sha256_file(path), get_arch(path, gf.metadata)[0])
        identity.remember_source(path, before, source)
    digest, arch_name, arch = source.sha256, source.architecture, ARCHS[source.architecture]
    dtype = dtype or default_dtype(arch)
    if dtype not in DTYPES:
        raise ModelLoadError(
            f"{path}: unsupported dtype {dtype!r} (choose from {', '.join(DTYPES)})"
        )
    if out is None:
        out = mlxd_home() / "models" / f"{path.stem}-{digest[:16]}-{dtype}"
    out = Path(out).expanduser()
    if not force and is_complete(out, digest, dtype):
        return out
    _check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(out)
    if gf is None:
        gf = read_gguf(path)
    print(f"[mlxd] converting {path.name} → {out} ({dtype}, once)", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        write_model(gf, arch_name, arch, DTYPES[dtype], tmp)
        marker = _marker(digest, dtype, arch_name, path)
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _publish(tmp, out, digest, dtype, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
