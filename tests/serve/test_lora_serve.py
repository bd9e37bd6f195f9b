"""Many LoRA adapters over one served model, vLLM's way: --lora-modules, `model: NAME` on every
API, /v1/models with `parent`, /v1/load_lora_adapter and /v1/unload_lora_adapter, --max-loras
eviction. The reference for an adapter's answer is a server started with `--adapter-path`
(mlx-lm's bits for it, parity-tested elsewhere): token ids and logprobs must be equal.

Adapters: two tiny random LoRA folders made with mlx-lm's tuner (fixtures/adapters.py)."""

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest
from fixtures.adapters import tiny_adapter_dir
from serve.conftest import LiveServer, start_server

from mlxd.config import ConfigError
from mlxd.engine import GenerationRequest
from mlxd.model import ModelLoadError

MESSAGES = [{"role": "user", "content": "Say something about adapters."}]
TOKENS = 8


@pytest.fixture(scope="module")
def adapters(qwen3_model_dir: Path) -> dict[str, str]:
    a = tiny_adapter_dir(qwen3_model_dir, "lora", seed=1)
    b = tiny_adapter_dir(qwen3_model_dir, "lora", seed=2)
    return {"a": str(a), "b": str(b)}


@pytest.fixture(scope="module")
def multi(qwen3_model_dir, adapters, tmp_path_factory) -> Iterator[LiveServer]:
    """`a` as NAME=PATH, `b` in vLLM's JSON form."""
    b = json.dumps({"name": "b", "path": adapters["b"], "base_model_name": "x"})
    live = start_server(model=str(qwen3_model_dir), lora_modules=[f"a={adapters['a']}", b],
                        allow_model_paths=True,
                        data_dir=str(tmp_path_factory.mktemp("data")))  # fmt: skip
    yield live
    live.stop()


@pytest.fixture(scope="module")
def with_a(qwen3_model_dir, adapters, tmp_path_factory) -> Iterator[LiveServer]:
    """The reference: mlx-lm's --adapter-path a."""
    live = start_server(model=str(qwen3_model_dir), adapter_path=adapters["a"],
                        data_dir=str(tmp_path_factory.mktemp("data")))  # fmt: skip
    yield live
    live.stop()


def chat(live: LiveServer, model: str, **extra: Any) -> tuple[list[int], list[float], str]:
    body = {"model": model, "messages": MESSAGES, "max_tokens": TOKENS, "logprobs": True,
            "temperature": 0.0, **extra}  # fmt: skip
    r = httpx.post(live.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == model
    content = out["choices"][0]["logprobs"]["content"]
    text = out["choices"][0]["message"]["content"]
    return [c["id"] for c in content], [c["logprob"] for c in content], text


def test_models_lists_each_adapter_with_its_parent(multi, adapters) -> None:
    data = httpx.get(multi.v1 + "/models", timeout=30).json()["data"]
    by_id = {m["id"]: m for m in data}
    base = multi.state.provider.default.name
    assert base in by_id and "parent" not in by_id[base]
    for name in ("a", "b"):
        assert by_id[name]["parent"] == base and by_id[name]["root"] == adapters[name]
    assert httpx.get(multi.v1 + "/models/a", timeout=30).json()["parent"] == base


def test_model_name_runs_the_adapter_as_adapter_path_does(multi, with_a) -> None:
    a = chat(multi, "a")
    assert a == chat(with_a, "default_model") and len(a[0]) == TOKENS
    base, b = chat(multi, "default_model"), chat(multi, "b")
    assert base[0] != a[0] and b[0] != a[0] and b[0] != base[0]


def test_rows_with_a_b_and_base_together_answer_as_alone(multi) -> None:
    models = ["a", "b", "default_model", "a", "b", "default_model"]
    alone = [chat(multi, m) for m in models[:3]]
    with ThreadPoolExecutor(len(models)) as pool:
        together = list(pool.map(lambda m: chat(multi, m), models))
    assert together == alone + alone


def _messages(live: LiveServer, model: str) -> str:
    body = {"model": model, "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0.0}
    r = httpx.post(live.v1 + "/messages", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return r.json()["content"][0]["text"]


def _responses(live: LiveServer, model: str) -> str:
    body = {"model": model, "input": MESSAGES[0]["content"], "max_output_tokens": TOKENS,
            "temperature": 0.0, "store": False}  # fmt: skip
    r = httpx.post(live.v1 + "/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return r.json()["output"][-1]["content"][0]["text"]


@pytest.mark.parametrize("endpoint", [_messages, _responses])
def test_anthropic_and_responses_route_the_name_too(multi, with_a, endpoint) -> None:
    a = endpoint(multi, "a")
    assert a == endpoint(with_a, "claude-x" if endpoint is _messages else "default_model")
    assert a != endpoint(multi, "b")


def test_a_bad_adapter_file_is_a_400_and_the_server_serves_on(multi, tmp_path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("{not json")
    (bad / "adapters.safetensors").write_bytes(b"junk")
    r = httpx.post(multi.v1 + "/load_lora_adapter", timeout=60,
                   json={"lora_name": "bad", "lora_path": str(bad)})  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "lora_path" and "adapter_config.json" in err["message"]
    assert "\n" not in err["message"]
    assert "bad" not in {m["id"] for m in httpx.get(multi.v1 + "/models").json()["data"]}
    assert len(chat(multi, "a")[0]) == TOKENS


def _post(live: LiveServer, path: str, body: Any) -> httpx.Response:
    return httpx.post(live.v1 + path, json=body, timeout=60)


def _hold(live: LiveServer, adapter: str) -> Any:
    """A row using `adapter` that runs until cancelled (its budget: the context)."""
    engine = live.state.provider.default.engine
    req = GenerationRequest(prompt=mx.array([5, 17, 301, 42]), max_tokens=30000, adapter=adapter)
    handle = engine.submit(req)
    next(iter(handle))  # admitted and decoding
    return handle


def test_load_and_unload_endpoints(make_server, adapters) -> None:
    live = make_server(lora_modules=[f"a={adapters['a']}", f"b={adapters['b']}"])
    reference = chat(live, "a")
    ok = _post(live, "/unload_lora_adapter", {"lora_name": "a"})
    assert (ok.status_code, ok.text) == (200, "Success: LoRA adapter 'a' removed successfully.")
    assert "a" not in live.state.provider.default.engine.adapter_names()
    r = _post(live, "/unload_lora_adapter", {"lora_name": "a"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_name", r.text
    # a --lora-modules path loads again without --allow-model-paths, under any name
    ok = _post(live, "/load_lora_adapter", {"lora_name": "again", "lora_path": adapters["a"]})
    assert (ok.status_code, ok.text) == (200, "Success: LoRA adapter 'again' added successfully.")
    assert chat(live, "again") == reference
    for body, param in (({"lora_path": adapters["a"]}, "lora_name"),
                        ({"lora_name": "c"}, "lora_path"),
                        ({"lora_name": 3, "lora_path": adapters["a"]}, "lora_name"),
                        ({"lora_name": "b", "lora_path": adapters["b"]}, "lora_name"),
                        ({"lora_name": "default_model", "lora_path": adapters["b"]}, "lora_name"),
                        ):  # fmt: skip
        r = _post(live, "/load_lora_adapter", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    r = _post(live, "/load_lora_adapter", {"lora_name": "c", "lora_path": "/tmp"})
    assert r.status_code == 403 and "--allow-model-paths" in r.text, r.text
    held = _hold(live, "b")  # in use: not unloaded
    try:
        r = _post(live, "/unload_lora_adapter", {"lora_name": "b"})
        assert r.status_code == 409 and r.headers["retry-after"], r.text
    finally:
        held.cancel()
        held.wait()
    assert _post(live, "/unload_lora_adapter", {"lora_name": "b"}).status_code == 200


def test_max_loras_evicts_the_least_recently_used_idle_adapter(make_server, adapters) -> None:
    live = make_server(lora_modules=[f"a={adapters['a']}", f"b={adapters['b']}"], max_loras=2,
                       allow_model_paths=True)  # fmt: skip
    engine = live.state.provider.default.engine
    reference = chat(live, "a")  # a: used last
    assert (
        _post(
            live, "/load_lora_adapter", {"lora_name": "c", "lora_path": adapters["b"]}
        ).status_code
        == 200
    )
    assert sorted(engine.adapter_names()) == ["a", "c"]  # b evicted, still listed and served
    assert "b" in {m["id"] for m in httpx.get(live.v1 + "/models").json()["data"]}
    b = chat(live, "b")  # loads b again, evicting a (c was loaded after a was used)
    assert sorted(engine.adapter_names()) == ["b", "c"] and b != reference
    assert chat(live, "a") == reference  # a back, c evicted
    held = [_hold(live, "a"), _hold(live, "b")]
    try:  # both resident adapters in use: nothing to evict
        r = _post(live, "/load_lora_adapter", {"lora_name": "d", "lora_path": adapters["a"]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        r = httpx.post(live.v1 + "/chat/completions", timeout=60,
                       json={"model": "c", "messages": MESSAGES, "max_tokens": 2})  # fmt: skip
        assert r.status_code == 503, r.text
    finally:
        for h in held:
            h.cancel()
            h.wait()
    assert sorted(engine.adapter_names()) == ["a", "b"]


def test_memory_budget_counts_the_adapters(make_server, adapters, multi) -> None:
    served = multi.state.provider.default
    one = served.engine.adapter_bytes("a")
    budget = (256 << 20) + served.weight_bytes + one + 4096  # a fits, and 4 KB of KV
    live = make_server(lora_modules=[f"a={adapters['a']}"], memory_budget=str(budget),
                       allow_model_paths=True)  # fmt: skip
    assert live.state.provider.default.engine.kv_budget == 4096
    r = _post(live, "/load_lora_adapter", {"lora_name": "b", "lora_path": adapters["b"]})
    assert r.status_code == 400 and "--memory-budget" in r.json()["error"]["message"], r.text
    assert live.state.provider.default.engine.adapter_names() == ["a"]


def test_a_bad_lora_module_stops_start_up_naming_it(qwen3_model_dir, adapters, tmp_path) -> None:
    with pytest.raises(ModelLoadError, match=r"^--lora-modules x=/nowhere: .*not an adapter"):
        start_server(model=str(qwen3_model_dir), lora_modules=["x=/nowhere"],
                     data_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ModelLoadError, match="do not run over --adapter-path"):
        start_server(model=str(qwen3_model_dir), lora_modules=[f"b={adapters['b']}"],
                     adapter_path=adapters["a"], data_dir=str(tmp_path))  # fmt: skip
    with pytest.raises(ConfigError, match="--max-loras is 1"):
        start_server(lora_modules=["x=/a", "y=/b"], max_loras=1)
    with pytest.raises(ConfigError, match="not NAME=PATH"):
        start_server(lora_modules=["x"])


def test_metrics_count_resident_adapters(multi) -> None:
    text = httpx.get(multi.url + "/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("mlxd_lora_adapters_loaded{"))
    assert line.endswith(" 2.0"), line


def test_embeddings_refuse_an_adapter_name(multi) -> None:
    """An embedding forward would be the base model's: a 400 rather than an unmarked answer."""
    r = httpx.post(multi.url + "/v1/embeddings", json={"model": "a", "input": "hi"}, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "model"


def test_n_choices_each_run_the_adapter(multi) -> None:
    body = {"model": "a", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0.0, "n": 2}
    r = httpx.post(multi.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    texts = [c["message"]["content"] for c in r.json()["choices"]]
    assert texts == [chat(multi, "a")[2]] * 2
