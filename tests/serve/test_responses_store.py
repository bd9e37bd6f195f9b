"""The response store: SQLite rows that survive a reopen (unit) and a server restart (live), kept
within a count and an age bound, the oldest deleted first."""

import json
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest

from mlxd.serve.responses_store import ResponseStore


def test_store_roundtrip_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "responses.sqlite3"
    store = ResponseStore(path)
    items = [{"role": "user", "content": "héllo"}]
    store.put("resp_1", items, {"id": "resp_1", "output": []})
    store.put("resp_2", [], {"id": "resp_2", "output": []})
    assert store.get("resp_1") == (items, {"id": "resp_1", "output": []})
    assert store.delete("resp_2") and not store.delete("resp_2")
    assert store.get("resp_2") is None and store.get("nope") is None
    again = ResponseStore(path)  # a second process would open it the same way
    assert again.get("resp_1") == (items, {"id": "resp_1", "output": []})
    store.close()
    again.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_responses_survive_a_restart(make_server) -> None:
    first = make_server()
    c1 = openai.OpenAI(base_url=first.v1, api_key="x", max_retries=0)
    r = c1.responses.create(model="default_model", input="remember me", max_output_tokens=3)
    dropped = c1.responses.create(model="default_model", input="bye", max_output_tokens=1)
    c1.responses.delete(dropped.id)
    first.stop()
    second = make_server()  # same data_dir (tmp_path/"data")
    assert second.state.store is not None
    db = Path(second.state.config.data_dir) / "responses.sqlite3"
    assert db.exists()
    c2 = openai.OpenAI(base_url=second.v1, api_key="x", max_retries=0)
    got = c2.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    with pytest.raises(openai.NotFoundError):
        c2.responses.retrieve(dropped.id)
    chained = c2.responses.create(
        model="default_model", input="again", previous_response_id=r.id, max_output_tokens=1
    )
    assert chained.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens
    assert json.loads(httpx.get(f"{second.v1}/responses/{chained.id}").text)["id"] == chained.id


def test_the_database_is_the_users_alone(tmp_path: Path) -> None:
    """Stored responses hold whole conversations: the folder 0700, the database and its WAL
    0600, whatever the umask."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        store = ResponseStore(tmp_path / "data" / "responses.sqlite3")
        store.put("resp_1", [{"role": "user", "content": "secret"}], {"id": "resp_1"})
    finally:
        os.umask(old)
    folder = tmp_path / "data"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert any(p.name.endswith("-wal") for p in files)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files), files
    store.close()


def _put(store: ResponseStore, *ids: str) -> None:
    for i in ids:
        store.put(i, [{"role": "user", "content": i}], {"id": i, "output": []})


def _kept(store: ResponseStore, *ids: str) -> list[str]:
    return [i for i in ids if store.get(i) is not None]


def test_past_max_stored_the_oldest_go_first(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_stored=3)
    try:
        _put(store, "r1", "r2", "r3", "r4", "r5")
        assert _kept(store, "r1", "r2", "r3", "r4", "r5") == ["r3", "r4", "r5"]
        assert len(store) == 3
        _put(store, "r3")  # stored again: the newest now
        _put(store, "r6")
        assert _kept(store, "r3", "r4", "r5", "r6") == ["r3", "r5", "r6"]
    finally:
        store.close()


def test_a_smaller_bound_at_reopen_evicts_at_once(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = ResponseStore(path)  # no bound
    _put(store, "r1", "r2", "r3", "r4")
    store.close()
    again = ResponseStore(path, max_stored=2)
    try:
        assert len(again) == 2 and _kept(again, "r1", "r2", "r3", "r4") == ["r3", "r4"]
    finally:
        again.close()


def test_responses_past_max_age_are_unknown_then_deleted(tmp_path: Path) -> None:
    now = [1000.0]
    store = ResponseStore(tmp_path / "r.sqlite3", max_age_s=100, clock=lambda: now[0])
    try:
        _put(store, "old")
        now[0] += 60
        _put(store, "young")
        now[0] += 50  # old is 110 s old, young 50 s
        assert _kept(store, "old", "young") == ["young"] and len(store) == 2
        assert not store.delete("old")  # unknown to DELETE too
        _put(store, "new")
        assert len(store) == 2 and _kept(store, "young", "new") == ["young", "new"]
    finally:
        store.close()


def test_an_evicted_previous_response_is_a_404_and_later_turns_go_on(make_server) -> None:
    """Each stored response holds its whole history: evicting the first turn of a chain leaves
    the later turns whole, and only naming the evicted one is an error (OpenAI's 404 shape)."""
    server = make_server(responses_max_stored=2)
    assert server.state.store.max_age_s == 30 * 24 * 3600  # the default: 30 days
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)

    def turn(text: str, previous: str | None = None):
        return client.responses.create(
            model="default_model", input=text, previous_response_id=previous, max_output_tokens=2
        )

    r1 = turn("the first turn of a long chain")
    r2 = turn("second", r1.id)
    r3 = turn("third", r2.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r1.id)
    assert client.responses.retrieve(r2.id).id == r2.id
    r = httpx.post(
        f"{server.v1}/responses",
        json={"model": "default_model", "input": "again", "previous_response_id": r1.id},
    )
    assert r.status_code == 404
    error = r.json()["error"]
    assert error["param"] == "previous_response_id" and r1.id in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    r4 = turn("fourth", r3.id)  # r1's turn is in r3's stored history, though r1 is gone
    assert r4.usage.input_tokens > r3.usage.input_tokens + r3.usage.output_tokens
    assert r3.usage.input_tokens > r2.usage.input_tokens + r2.usage.output_tokens


def test_the_bounds_are_serve_flags() -> None:
    from mlxd.cli.serve import parse_config
    from mlxd.config import ConfigError

    config = parse_config(["--responses-max-stored", "5", "--responses-max-age", "0.5"])
    assert (config.responses_max_stored, config.responses_max_age) == (5, 0.5)
    default = parse_config([])
    assert (default.responses_max_stored, default.responses_max_age) == (10_000, 30.0)
    for bad in (["--responses-max-stored", "-1"], ["--responses-max-age", "nan"]):
        with pytest.raises(ConfigError):
            parse_config(bad)
