"""The SSD tier of the prefix store: prompt caches as content-addressed files that survive
restarts, written in the background, capped in bytes (LRU), verified before they are served.

Files live in root/v{FORMAT_VERSION}/<key>; root/quarantine/ receives any file that fails a
check. Entries an older format wrote (root/v1/, root/v2/, ...) are misses: they are deleted at
start, so they do not sit outside the byte cap. Writes are atomic (temp file, fsync, rename,
fsync of the directory), so a crash leaves at most a temp file, which the next start deletes.
The format is in ssd_format.py.
"""

import logging
import mmap
import os
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import private_dir
from . import ssd_format as fmt
from .ssd_format import FORMAT_VERSION, FormatError, Prepared
from .ssd_index import Index, SSDEntry
from .ssd_writer import Writer

__all__ = ["FORMAT_VERSION", "SSDEntry", "SSDTier"]

log = logging.getLogger("mlxd.store")
_KEY_LEN = 64
_TMP = ".tmp"


def _sync(fd: int) -> None:
    """fsync; on macOS F_FULLFSYNC, since plain fsync there does not flush the drive's cache."""
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_FULLFSYNC)  # type: ignore[attr-defined]
    except (ImportError, AttributeError, OSError):
        os.fsync(fd)


class SSDTier:
    def __init__(self, root: Path, max_bytes: int, queue_depth: int = 4) -> None:
        self.root, self.max_bytes = Path(root), max_bytes
        self.dir = self.root / f"v{FORMAT_VERSION}"
        self.quarantine_dir = self.root / "quarantine"
        for folder in (self.dir, self.quarantine_dir):  # entries hold prompts' token ids:
            private_dir(folder)  # the user's alone
        self._lock = threading.Lock()  # counters and the pending set
        self._pending: set[str] = set()
        self._counts = dict.fromkeys(
            ("written", "dropped", "quarantined", "restored", "evicted", "skipped", "errors"), 0
        )
        self.index = Index()
        self._drop_old_formats()
        self._scan()
        self.evict_to(max_bytes)  # the cap may have shrunk since the last run
        self._writer = Writer(self._write_entry, queue_depth)

    # ---- engine-thread API -------------------------------------------------------------

    def submit(
        self, namespace: str, tokens: Sequence[int], cache: list[Any], kind: str = "assistant"
    ) -> bool:
        """Queue `cache` (evaluated arrays) for writing; never waits. False when dropped."""
        if len(tokens) == 0:
            return self._drop()
        key = fmt.content_key(namespace, tokens)
        with self._lock:
            if key in self._pending or key in self.index:
                self._counts["skipped"] += 1
                return True
        if self._writer.full():
            return self._drop()
        item = fmt.prepare(namespace, tokens, cache, kind)
        if item.payload_nbytes > self.max_bytes:  # the header only adds to it
            return self._drop()
        with self._lock:
            self._pending.add(key)
        if not self._writer.offer(item):
            with self._lock:
                self._pending.discard(key)
            return self._drop()
        return True

    def match(self, namespace: str, tokens: Sequence[int]) -> tuple[SSDEntry, int] | None:
        """The entry of `namespace` serving the longest prefix of `tokens` (index only)."""
        return self.index.match(namespace, np.asarray(tokens, dtype=np.int64))

    def restore(self, entry: SSDEntry) -> list[Any] | None:
        """The entry's cache layers, verified; None (and the file quarantined) when bad."""
        path = self.dir / entry.key
        try:  # mapped, not read: the only copy is into MLX memory
            with open(path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:  # evicted meanwhile (or removed by hand): a miss, not corrupt
            self.index.remove(entry.key)
            return None
        except (OSError, ValueError) as e:  # an empty file cannot be mapped
            self._quarantine(path, str(e))
            self.index.remove(entry.key)
            return None
        try:
            header, cache = fmt.read(data, entry.key, entry.namespace)
            if tuple(header["tokens"]) != entry.tokens:
                raise FormatError("tokens differ from the index entry")
        except FormatError as e:
            self._quarantine(path, str(e))
            self.index.remove(entry.key)
            return None
        now = time.time_ns()
        if self.index.touch(entry.key, now):
            try:
                os.utime(path, ns=(now, now))  # the LRU order survives a restart
            except OSError:
                pass
        self._count("restored")
        return cache

    def flush(self, timeout: float | None = None) -> bool:
        return self._writer.flush(timeout)

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            out = dict(self._counts)
        out.update(entries=len(self.index), bytes=self.index.nbytes, pending=len(self._pending))
        return out

    def evict_to(self, max_bytes: int) -> None:
        """Delete least recently used entries until the files take at most `max_bytes`."""
        for entry in self.index.lru_victims(max(0, max_bytes)):
            try:
                (self.dir / entry.key).unlink()
            except FileNotFoundError:
                pass
            self._count("evicted")

    # ---- writer thread -----------------------------------------------------------------

    def _write_entry(self, item: Prepared) -> None:
        try:
            self._publish(item)
        finally:
            with self._lock:
                self._pending.discard(item.key)

    def _publish(self, item: Prepared) -> None:
        header = fmt.header_bytes(item)
        size = fmt.file_size(len(header), item.payload_nbytes)
        if size > self.max_bytes:
            self._count("dropped")
            return
        self.evict_to(self.max_bytes - size)  # room first: the cap holds at every moment
        final = self.dir / item.key
        tmp = self.dir / f"{item.key}.{uuid.uuid4().hex[:8]}{_TMP}"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                fmt.write(f, header, item.views)
                f.flush()
                _sync(f.fileno())
            os.replace(tmp, final)
            self._sync_dir()
            now = time.time_ns()
            os.utime(final, ns=(now, now))
        except OSError as e:
            log.warning("SSD tier: writing %s failed: %s", item.key, e)
            tmp.unlink(missing_ok=True)
            self._count("errors")
            return
        entry = SSDEntry(item.key, item.namespace, item.tokens, item.kind, size, item.trimmable)
        self.index.add(entry, now)
        self._count("written")
        self.evict_to(self.max_bytes)

    # ---- start-up scan and helpers -----------------------------------------------------

    def _scan(self) -> None:
        """Index what a previous run left: delete temp files, quarantine unreadable headers."""
        for path in sorted(self.dir.iterdir()):
            name = path.name
            if name.endswith(_TMP):
                path.unlink(missing_ok=True)
                continue
            if len(name) != _KEY_LEN or not path.is_file():
                continue  # not ours: leave it alone
            try:
                h, size = fmt.read_header(path)
                if fmt.content_key(h["namespace"], h["tokens"]) != name:
                    raise FormatError("the header's namespace/tokens do not hash to the name")
                mtime = path.stat().st_mtime_ns
            except (OSError, FormatError) as e:
                self._quarantine(path, str(e))
                continue
            toks = tuple(h["tokens"])
            kind = str(h.get("kind", "assistant"))
            self.index.add(SSDEntry(name, h["namespace"], toks, kind, size, h["trimmable"]), mtime)

    def _drop_old_formats(self) -> None:
        """Delete the entries (and temp files) of older formats; anything else stays."""
        for folder in self.root.glob("v*"):
            version = folder.name[1:]
            if not (version.isdigit() and int(version) < FORMAT_VERSION and folder.is_dir()):
                continue
            gone = 0
            try:
                for path in folder.iterdir():
                    if path.is_file() and (len(path.name) == _KEY_LEN or path.name.endswith(_TMP)):
                        path.unlink(missing_ok=True)
                        gone += 1
                folder.rmdir()
            except OSError as e:  # not empty (files that are not ours) or not ours to change
                log.info("SSD tier: %s left in place: %s", folder, e)
            log.info("SSD tier: deleted %d entries of format %s in %s", gone, version, folder)

    def _quarantine(self, path: Path, why: str) -> None:
        log.warning("SSD tier: quarantined %s: %s", path.name, why)
        self._count("quarantined")
        try:
            shutil.move(path, self.quarantine_dir / f"{path.name}.{time.time_ns()}")
        except FileNotFoundError:
            pass

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def _drop(self) -> bool:
        self._count("dropped")
        return False
