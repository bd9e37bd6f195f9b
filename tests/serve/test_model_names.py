"""A request names a model the server serves, not a path: without --allow-model-paths every
other name gets one answer that says nothing of the file system, no second copy of the served
model is loaded, and an adapter path is refused; a repo in the local Hugging Face cache loads
by its id. With the flag, paths load as mlx_lm.server loads them."""

import shutil
from pathlib import Path

import httpx
import pytest

M = [{"role": "user", "content": "hi"}]


def chat(url: str, **fields) -> httpx.Response:
    body = {"messages": M, "max_tokens": 2, **fields}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def test_paths_and_unknown_names_get_the_same_answer(qwen3_server, qwen3_model_dir) -> None:
    names = [
        "/etc/passwd",  # a file
        "/etc/nonexistent",  # nothing
        "/etc",  # a folder
        "~root",
        "../../etc/passwd",
        str(qwen3_model_dir) + "/",  # the served model's folder, spelt another way
        "nobody/nothing",  # a repo id not in the cache
    ]
    messages = set()
    for name in names:
        r = chat(qwen3_server.url, model=name)
        assert r.status_code == 404, (name, r.text)
        err = r.json()["error"]
        assert err["param"] == "model" and err["code"] == "model_not_found"
        messages.add(err["message"].replace(repr(name), "NAME"))
    assert messages == {"model NAME is not served here; GET /v1/models lists the models it serves"}
    assert len(qwen3_server.state.provider.loaded()) == 1  # nothing was loaded beside it


def test_an_adapter_path_is_refused_without_revealing_the_model_folder(
    qwen3_server, qwen3_model_dir
) -> None:
    r = chat(qwen3_server.url, adapters="/etc")
    assert r.status_code == 404, r.text
    message = r.json()["error"]["message"]
    assert message == "adapter '/etc' is not served here"
    assert str(qwen3_model_dir) not in r.text


def test_anthropic_ids_fall_back_without_a_path_being_read(qwen3_server) -> None:
    body = {"model": "/etc/passwd", "max_tokens": 2, "messages": M}
    r = httpx.post(qwen3_server.url + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert len(qwen3_server.state.provider.loaded()) == 1


def _cache_repo(cache: Path, repo: str, model_dir: Path) -> None:
    """A Hugging Face hub cache entry for `repo` holding `model_dir`'s files."""
    root = cache / ("models--" + repo.replace("/", "--"))
    commit = "0" * 40
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    shutil.copytree(model_dir, root / "snapshots" / commit)


def test_a_repo_in_the_local_cache_loads_by_its_id(
    make_server, qwen3_model_dir, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache_repo(tmp_path / "hub", "tiny/qwen3", qwen3_model_dir)
    server = make_server()
    r = chat(server.url, model="tiny/qwen3")
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny/qwen3"
    assert [s.name for s in server.state.provider.loaded()][1:] == ["tiny/qwen3"]


def test_with_allow_model_paths_a_path_loads(make_server, qwen3_model_dir) -> None:
    server = make_server(allow_model_paths=True)
    r = chat(server.url, model=str(qwen3_model_dir) + "/")
    assert r.status_code == 200, r.text
    assert len(server.state.provider.loaded()) == 2


@pytest.mark.parametrize("name", ["a" * 2000, "x\u0000y"], ids=["too-long", "nul"])
def test_names_no_model_could_have_are_400(qwen3_server, name) -> None:
    r = chat(qwen3_server.url, model=name)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model", r.text
