"""One model-name rule for every API: the names an agent tool sends (gpt-4o, gpt-5-codex,
claude-*) mean the served model unless --strict-model-names; --served-model-name gives the
model its names (the first is the listed id); GET /v1/models/{id} answers for every name a
request may use, and every entry carries its context length (`max_model_len`)."""

import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

M = [{"role": "user", "content": "hi"}]
AGENT_NAMES = ["gpt-4o", "gpt-5-codex", "claude-sonnet-4-5"]


def _calls(url: str, model: str) -> dict[str, httpx.Response]:
    """One request per API naming `model`."""
    bodies = {
        "/v1/chat/completions": {"messages": M, "max_tokens": 2},
        "/v1/completions": {"prompt": "hi", "max_tokens": 2},
        "/v1/responses": {"input": "hi", "max_output_tokens": 2},
        "/v1/messages": {"messages": M, "max_tokens": 2},
    }
    return {
        path: httpx.post(url + path, json={"model": model, **body}, timeout=60)
        for path, body in bodies.items()
    }


def _context(model_dir: Path) -> int:
    return json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]


@pytest.mark.parametrize("name", AGENT_NAMES)
def test_agent_tool_names_mean_the_served_model_on_every_api(qwen3_server, name) -> None:
    for path, r in _calls(qwen3_server.url, name).items():
        assert r.status_code == 200, (path, r.text)
        assert r.json()["model"] == name, path  # echoed as sent, as mlx_lm.server does
    assert len(qwen3_server.state.provider.loaded()) == 1  # nothing was loaded for them


def test_the_sdks_with_their_own_model_names(qwen3_server) -> None:
    oa = openai.OpenAI(base_url=qwen3_server.v1, api_key="unused")
    chat = oa.chat.completions.create(model="gpt-4o", messages=M, max_tokens=3)
    assert chat.choices[0].finish_reason == "length"
    out = oa.responses.create(model="gpt-5-codex", input="hi", max_output_tokens=3)
    assert out.status == "incomplete" and out.model == "gpt-5-codex"
    assert oa.models.retrieve("gpt-4o").id == "gpt-4o"


def test_strict_model_names_refuses_them_everywhere(make_server) -> None:
    server = make_server(strict_model_names=True)
    for path, r in _calls(server.url, "gpt-4o").items():
        assert r.status_code == 404, (path, r.text)
    assert httpx.get(server.v1 + "/models/gpt-4o").status_code == 404
    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=M)
    for path, r in _calls(server.url, "default_model").items():  # its own names still serve
        assert r.status_code == 200, (path, r.text)


def test_served_model_names_are_listed_first_and_all_accepted(make_server, qwen3_model_dir) -> None:
    server = make_server(served_model_name=["qwen-tiny", "coder"], strict_model_names=True)
    oa = openai.OpenAI(base_url=server.v1, api_key="unused")
    listed = oa.models.list().data
    assert listed[0].id == "qwen-tiny"
    assert [m.id for m in listed].count("coder") == 0  # one entry per model
    for name in ("qwen-tiny", "coder", str(qwen3_model_dir), "default_model"):
        for path, r in _calls(server.url, name).items():
            assert r.status_code == 200, (name, path, r.text)
    r = oa.models.retrieve("coder")
    assert r.id == "coder" and r.model_extra["root"] == "qwen-tiny"
    assert _calls(server.url, "other")["/v1/chat/completions"].status_code == 404


def test_models_answer_for_default_model_with_the_context_length(
    qwen3_server, qwen3_model_dir
) -> None:
    ctx = _context(qwen3_model_dir)
    listing = httpx.get(qwen3_server.v1 + "/models").json()["data"]
    assert listing[0]["max_model_len"] == ctx
    for name in ("default_model", listing[0]["id"]):
        r = httpx.get(qwen3_server.v1 + "/models/" + name)
        assert r.status_code == 200, (name, r.text)
        assert r.json()["id"] == name and r.json()["max_model_len"] == ctx


def test_cached_repos_carry_their_context_length(
    make_server, qwen3_model_dir, tmp_path, monkeypatch
) -> None:
    from huggingface_hub import constants
    from test_model_names import _cache_repo

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _cache_repo(tmp_path / "hub", "tiny/qwen3", qwen3_model_dir)
    snapshot = next((tmp_path / "hub" / "models--tiny--qwen3" / "snapshots").iterdir())
    (snapshot / "model.safetensors.index.json").write_text("{}")  # mlx_lm.server's listing rule
    server = make_server()
    one = httpx.get(server.v1 + "/models/tiny/qwen3")
    assert one.status_code == 200, one.text
    assert one.json()["max_model_len"] == _context(qwen3_model_dir)


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../x", "nobody/nothing", "~root", "x" * 129, "a b", ".hidden"]
)
def test_names_that_are_no_label_stay_404_and_unlisted(qwen3_server, name) -> None:
    assert _calls(qwen3_server.url, name)["/v1/completions"].status_code == 404
    assert httpx.get(qwen3_server.v1 + "/models/" + name.lstrip("/")).status_code == 404
