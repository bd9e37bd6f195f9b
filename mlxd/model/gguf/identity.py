"""A GGUF file's identity (its SHA-256 and architecture) without re-reading it each run: a
record keyed by what stat says (path, size, mtime_ns, inode, device). The hash stays the
identity; stat only decides whether the last hash still holds, as make and ccache trust it."""

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ...config import mlxd_home

CHUNK = 1 << 20
RECORDS = "gguf-sources"  # under MLXD_HOME: one small JSON file per GGUF path
FORMAT = 1


@dataclass(frozen=True)
class Source:
    sha256: str
    architecture: str  # general.architecture, so a hit needs no header parse either


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    with (
        open(path, "rb") as f,
        tqdm(
            total=size, unit="B", unit_scale=True, desc=f"hashing {path.name}", file=sys.stderr
        ) as bar,
    ):
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def stat_key(path: Path) -> dict:
    """What must not change for the last hash to hold; a rewrite moves mtime_ns or the inode."""
    st = os.stat(path)
    return {
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "device": st.st_dev,
    }


def _record_path(path: Path) -> Path:
    name = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return mlxd_home() / RECORDS / f"{name}.json"


def known_source(path: Path) -> Source | None:
    """The recorded identity of `path` when its stat key still matches, else None."""
    try:
        record = json.loads(_record_path(path).read_text())
        if record.get("format") == FORMAT and record.get("stat") == stat_key(path):
            return Source(str(record["sha256"]), str(record["architecture"]))
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # missing, unreadable or from another version: hash again
    return None


def remember_source(path: Path, before: dict, source: Source) -> None:
    """Record `source` for `path`, unless the file changed while it was hashed (`before` is
    its stat key from before). Written atomically; a failure only costs a re-hash."""
    if stat_key(path) != before:
        return
    target = _record_path(path)
    record = {"format": FORMAT, "stat": before, "sha256": source.sha256}
    record["architecture"] = source.architecture
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, target)
    except OSError:
        return
    _prune(target.parent)


def _prune(folder: Path) -> None:
    """Drop the records of files that are gone (temp files, deleted models): this runs only
    after a hash, itself a full read, so a folder of small records costs nothing in comparison."""
    for record in folder.glob("*.json"):
        try:
            if not Path(json.loads(record.read_text())["stat"]["path"]).exists():
                record.unlink()
        except (OSError, ValueError, KeyError, TypeError):
            record.unlink(missing_ok=True)  # unreadable: worthless, rewritten on next use
