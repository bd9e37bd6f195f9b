"""`/v1/models`: the served model, a model loaded on request beside it, and the mlx-lm models
of the local Hugging Face cache (mlx_lm.server's rule: config, weight index, tokenizer config);
`/health`; a model that cannot load is a 404."""

from pathlib import Path

import httpx
import huggingface_hub.constants as hf_constants
import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MLX_LM_FILES = ("config.json", "model.safetensors.index.json", "tokenizer_config.json")


def _fake_repo(root: Path, repo: str, files: tuple[str, ...]) -> None:
    base = root / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    (base / "blobs").mkdir()
    for i, name in enumerate(files):  # snapshots hold links into blobs, as the hub writes them
        blob = base / "blobs" / f"{i:040x}"
        blob.write_text("{}")
        (snap / name).symlink_to(blob)


def test_models_lists_served_loaded_and_cached(
    make_server, tiny_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qwen3_server = make_server(allow_model_paths=True)  # the request below names a path
    _fake_repo(tmp_path, "acme/chat-model", MLX_LM_FILES)
    _fake_repo(tmp_path, "acme/not-mlx", ("config.json",))
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path))
    other = str(tiny_model("llama"))
    body = {"model": other, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    r = httpx.post(qwen3_server.v1 + "/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == other
    listing = httpx.get(qwen3_server.v1 + "/models").json()
    ids = [m["id"] for m in listing["data"]]
    assert listing["object"] == "list"
    assert ids[0] == str(qwen3_server.state.config.model)  # the served model first
    assert other in ids and "acme/chat-model" in ids and "acme/not-mlx" not in ids
    one = httpx.get(qwen3_server.v1 + "/models/acme/chat-model")
    assert one.status_code == 200 and one.json()["id"] == "acme/chat-model"
    assert httpx.get(qwen3_server.v1 + "/models/acme/absent").status_code == 404


def test_unloadable_model_is_404_and_health_stays_ok(make_server) -> None:
    qwen3_server = make_server(allow_model_paths=True)
    body = {"model": "/no/such/dir", "messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(qwen3_server.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 404
    assert "/no/such/dir" in r.json()["error"]["message"]
    assert httpx.get(qwen3_server.url + "/health").json()["status"] == "ok"
