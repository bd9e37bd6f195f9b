"""The response store: SQLite rows that survive a reopen (unit) and a server restart (live)."""

import json
import sqlite3
from pathlib import Path

import httpx
import openai
import pytest

from mlxd.serve.responses_api import ResponseStore


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
