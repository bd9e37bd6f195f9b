"""SSD tier on disk: restart, corruption -> quarantine, atomic publish, the byte cap (LRU)."""

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from store.helpers import (
    BIG,
    arrays_cache,
    assert_same_cache,
    disk_bytes,
    files,
    kv_cache,
    quarantined,
    write,
)

from mlxd.store import ssd_format
from mlxd.store.ssd import FORMAT_VERSION, SSDEntry, SSDTier
from mlxd.store.ssd_format import content_key


def test_restart_finds_and_restores_the_entry(tmp_path: Path) -> None:
    cache = kv_cache(1)
    tier = SSDTier(tmp_path, BIG)
    entry = write(tier, "ns", [1, 2, 3, 4], cache, kind="system")
    tier.close()
    assert files(tier) == [tmp_path / f"v{FORMAT_VERSION}" / entry.key]

    again = SSDTier(tmp_path, BIG)
    try:
        assert again.match("ns", [1, 2, 3, 4, 5]) == (entry, 4)
        restored = again.restore(entry)
        assert restored is not None
        assert_same_cache(cache, restored)
        assert (again.stats()["entries"], again.stats()["bytes"]) == (1, entry.nbytes)
    finally:
        again.close()


# Each damage function breaks the file of `a` (b is a second, healthy entry of the same tier)
# and returns the entry that is then asked for.
def _flip_payload(tier: SSDTier, a: SSDEntry, b: SSDEntry) -> SSDEntry:
    path = tier.dir / a.key
    data = bytearray(path.read_bytes())
    data[-ssd_format.DIGEST - 5] ^= 0x01
    path.write_bytes(bytes(data))
    return a


def _truncate(tier: SSDTier, a: SSDEntry, b: SSDEntry) -> SSDEntry:
    with open(tier.dir / a.key, "r+b") as f:
        f.truncate(a.nbytes // 2)
    return a


def _swap(tier: SSDTier, a: SSDEntry, b: SSDEntry) -> SSDEntry:
    os.replace(tier.dir / a.key, tier.dir / b.key)  # b's name now holds a's bytes
    return b


def _other_namespace(tier: SSDTier, a: SSDEntry, b: SSDEntry) -> SSDEntry:
    """a's file (namespace X) put where namespace Y's entry for the same tokens would be."""
    key = content_key("Y", a.tokens)
    (tier.dir / key).write_bytes((tier.dir / a.key).read_bytes())
    (tier.dir / a.key).unlink()
    return SSDEntry(key, "Y", a.tokens, a.kind, a.nbytes, a.trimmable)


def _garbage_header(tier: SSDTier, a: SSDEntry, b: SSDEntry) -> SSDEntry:
    path = tier.dir / a.key
    data = bytearray(path.read_bytes())
    data[ssd_format.PREFIX : ssd_format.PREFIX + 40] = os.urandom(20).hex().encode()
    path.write_bytes(bytes(data))
    return a


DAMAGE: dict[str, Callable[[SSDTier, SSDEntry, SSDEntry], SSDEntry]] = {
    "flip-payload": _flip_payload,
    "truncate": _truncate,
    "swap": _swap,
    "other-namespace": _other_namespace,
    "garbage-header": _garbage_header,
}


def _two_entries(root: Path) -> tuple[SSDTier, SSDEntry, SSDEntry]:
    tier = SSDTier(root, BIG)
    a = write(tier, "X", [5, 6, 7, 8], kv_cache(1))
    b = write(tier, "X", [9, 10, 11], kv_cache(2))
    return tier, a, b


def _not_served(tier: SSDTier, asked: SSDEntry) -> None:
    hit = tier.match(asked.namespace, asked.tokens)
    if hit is not None and hit[0].key == asked.key:
        assert tier.restore(hit[0]) is None  # listed (payload damage) but never served
    assert asked.key not in tier.index
    assert tier.restore(asked) is None


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_file_is_quarantined_and_never_served(tmp_path: Path, damage: str) -> None:
    tier, a, b = _two_entries(tmp_path)
    asked = DAMAGE[damage](tier, a, b)
    assert tier.restore(asked) is None
    assert asked.key not in tier.index
    assert tier.match(asked.namespace, asked.tokens) is None
    assert [p.name.split(".")[0] for p in quarantined(tier)] == [asked.key]
    assert tier.stats()["quarantined"] == 1 and tier.stats()["restored"] == 0
    tier.close()

    again = SSDTier(tmp_path, BIG)
    try:
        _not_served(again, asked)
        assert len(quarantined(again)) == 1
    finally:
        again.close()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damage_found_after_a_restart(tmp_path: Path, damage: str) -> None:
    """Damage done while nothing runs: the scan (header) or the restore (payload) catches it."""
    tier, a, b = _two_entries(tmp_path)
    tier.close()
    asked = DAMAGE[damage](tier, a, b)
    again = SSDTier(tmp_path, BIG)
    try:
        _not_served(again, asked)
        assert [p.name.split(".")[0] for p in quarantined(again)] == [asked.key]
        assert again.stats()["quarantined"] == 1
        if damage != "swap":  # the healthy entry is still served
            assert again.restore(b) is not None
    finally:
        again.close()


def test_leftover_temp_file_is_removed_and_never_listed(tmp_path: Path) -> None:
    tier = SSDTier(tmp_path, BIG)
    entry = write(tier, "ns", [1, 2, 3], kv_cache(1))
    tier.close()
    partial = (tier.dir / entry.key).read_bytes()[:100]
    temp = tier.dir / f"{content_key('ns', [1, 2, 3, 4])}.0badc0de.tmp"
    temp.write_bytes(partial)  # what a crash mid-write leaves

    again = SSDTier(tmp_path, BIG)
    try:
        assert not temp.exists()
        assert files(again) == [again.dir / entry.key]
        assert again.match("ns", [1, 2, 3, 4]) == (entry, 3)
        assert again.stats()["quarantined"] == 0
    finally:
        again.close()


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(f, header, views) -> None:
        f.write(header[:10])
        raise OSError("disk full")

    monkeypatch.setattr(ssd_format, "write", broken)
    tier = SSDTier(tmp_path, BIG)
    try:
        assert tier.submit("ns", [1, 2], kv_cache(1))
        assert tier.flush(10)
        assert files(tier) == [] and tier.match("ns", [1, 2]) is None
        assert tier.stats()["errors"] == 1 and tier.stats()["written"] == 0
    finally:
        tier.close()


def test_byte_cap_evicts_least_recently_used(tmp_path: Path) -> None:
    size = _entry_size(tmp_path / "probe")
    tier = SSDTier(tmp_path / "t", max_bytes=3 * size + size // 2)
    try:
        entries = [write(tier, "ns", [i, i + 1], kv_cache(i)) for i in range(3)]
        assert tier.restore(entries[0]) is not None  # 0 is now the most recently used
        survivors = [(0, 2, 3), (0, 3, 4), (3, 4, 5)]  # 1, then 2, then 0 leave
        for i, kept in zip(range(3, 6), survivors, strict=True):
            entries.append(write(tier, "ns", [i, i + 1], kv_cache(i)))
            assert disk_bytes(tier) <= tier.max_bytes
            assert {p.name for p in files(tier)} == {entries[j].key for j in kept}
            assert {e.key for e in tier.index.entries()} == {entries[j].key for j in kept}
        assert tier.stats()["evicted"] == 3 and tier.stats()["bytes"] == disk_bytes(tier)
        assert (tier.stats()["entries"], tier.stats()["dropped"]) == (3, 0)
        assert not tier.submit("ns", [99], kv_cache(99, length=1024))  # larger than the cap
        assert tier.flush(10)
        assert tier.stats()["dropped"] == 1 and tier.match("ns", [99]) is None
    finally:
        tier.close()


def test_eviction_order_follows_restores(tmp_path: Path) -> None:
    size = _entry_size(tmp_path / "probe")
    tier = SSDTier(tmp_path / "t", max_bytes=2 * size + size // 2)
    a = write(tier, "ns", [1], kv_cache(1))
    b = write(tier, "ns", [2], kv_cache(2))
    assert tier.restore(a) is not None
    c = write(tier, "ns", [3], kv_cache(3))  # evicts b, not a
    assert {e.key for e in tier.index.entries()} == {a.key, c.key}
    assert not (tier.dir / b.key).exists()
    assert tier.restore(a) is not None  # a is newer than c now, also across a restart
    tier.close()
    smaller = SSDTier(tmp_path / "t", max_bytes=size + size // 2)
    try:
        assert [e.key for e in smaller.index.entries()] == [a.key]
        assert smaller.stats()["evicted"] == 1 and disk_bytes(smaller) <= smaller.max_bytes
    finally:
        smaller.close()


def test_entries_of_other_classes_count_their_own_size(tmp_path: Path) -> None:
    tier = SSDTier(tmp_path, BIG)
    try:
        e = write(tier, "ns", [1, 2], arrays_cache(1))
        assert e.nbytes == disk_bytes(tier) and not e.trimmable
    finally:
        tier.close()


def _entry_size(root: Path) -> int:
    tier = SSDTier(root, BIG)
    try:
        return write(tier, "ns", [0, 1], kv_cache(0)).nbytes
    finally:
        tier.close()
