"""`--isolation process`: the engine in a child process answers exactly as the engine in the
server's process. Two servers on one tiny model, the same requests to both: token ids,
logprobs, text, usage, embeddings and error bodies must be equal (greedy and seeded, n > 1,
a grammar, stop words, streaming, a LoRA adapter); a client that leaves frees its row there."""

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.adapters import tiny_adapter_dir
from serve.conftest import LiveServer, start_server

from mlxd.serve.process import RemoteEngine

MESSAGES = [{"role": "user", "content": "Tell me about isolation."}]


@pytest.fixture(scope="module")
def adapter(qwen3_model_dir: Path) -> str:
    return str(tiny_adapter_dir(qwen3_model_dir, "lora", seed=3))


def _server(model: Path, adapter: str, data: Path, isolation: str) -> LiveServer:
    return start_server(model=str(model), lora_modules=[f"a={adapter}"], data_dir=str(data),
                        isolation=isolation)  # fmt: skip


@pytest.fixture(scope="module")
def pair(qwen3_model_dir, adapter, tmp_path_factory) -> Iterator[tuple[LiveServer, LiveServer]]:
    here = _server(qwen3_model_dir, adapter, tmp_path_factory.mktemp("here"), "off")
    child = _server(qwen3_model_dir, adapter, tmp_path_factory.mktemp("child"), "process")
    yield here, child
    here.stop()
    child.stop()


def test_the_process_server_runs_its_engine_in_a_child(pair) -> None:
    here, child = pair
    engine = child.state.provider.default.engine
    assert isinstance(engine, RemoteEngine) and engine.proc.pid != 0
    assert child.state.provider.default.model is None  # the weights live in the child only
    assert not isinstance(here.state.provider.default.engine, RemoteEngine)


def _answer(r: httpx.Response) -> Any:
    body = r.json()
    for key in ("id", "created", "system_fingerprint"):
        body.pop(key, None)
    return r.status_code, body


def _both(pair, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    here, child = pair
    a = _answer(httpx.post(here.v1 + path, json=body, timeout=60))
    b = _answer(httpx.post(child.v1 + path, json=body, timeout=60))
    return a, b


BODIES = {
    "greedy": {"max_tokens": 12, "logprobs": True, "top_logprobs": 3, "temperature": 0.0},
    "seeded": {"max_tokens": 12, "logprobs": True, "temperature": 0.9, "seed": 11},
    "n2": {"max_tokens": 8, "logprobs": True, "temperature": 0.8, "seed": 5, "n": 2},
    "grammar": {"max_tokens": 16, "temperature": 0.0, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}},
    "penalties": {"max_tokens": 12, "temperature": 0.0, "repetition_penalty": 1.3,
                  "logit_bias": {"100": 5.0}},
    "adapter": {"model": "a", "max_tokens": 10, "logprobs": True, "temperature": 0.0},
    "bad_bias": {"max_tokens": 4, "logit_bias": {"99999999": 1.0}},
}  # fmt: skip


@pytest.mark.parametrize("case", list(BODIES))
def test_chat_answers_are_equal(pair, case: str) -> None:
    a, b = _both(pair, "/chat/completions", {"messages": MESSAGES, **BODIES[case]})
    assert a == b
    assert a[0] == (400 if case == "bad_bias" else 200), a


def test_a_stop_word_and_token_prompts_are_equal(pair) -> None:
    a, b = _both(pair, "/completions", {"prompt": [5, 6, 7], "max_tokens": 6})
    assert a == b
    first = a[1]["choices"][0]["text"]
    body = {"prompt": [5, 6, 7], "max_tokens": 12, "stop": [first[2:5] or "x"], "logprobs": 2}
    a, b = _both(pair, "/completions", body)
    assert a == b and a[0] == 200
    a, b = _both(pair, "/completions", {"prompt": [5, 10**9], "max_tokens": 2})
    assert a == b and a[0] == 400


def _stream(live: LiveServer, body: dict[str, Any]) -> list[Any]:
    frames = []
    with httpx.stream("POST", live.v1 + "/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                frame = json.loads(line[6:])
                for key in ("id", "created", "system_fingerprint"):
                    frame.pop(key, None)
                frames.append(frame)
    return frames


def test_streams_are_equal(pair) -> None:
    here, child = pair
    body = {"messages": MESSAGES, "max_tokens": 10, "stream": True, "logprobs": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}  # fmt: skip
    frames = _stream(here, body)
    assert len(frames) > 3
    assert _stream(child, body) == frames


def test_embeddings_are_equal(pair) -> None:
    a, b = _both(pair, "/embeddings", {"input": ["one text", "another, longer text"]})
    assert a == b and a[0] == 200


def test_a_client_that_leaves_frees_its_row_in_the_child(pair) -> None:
    _, child = pair
    engine = child.state.provider.default.engine
    body = {"messages": MESSAGES, "max_tokens": 2000, "stream": True, "temperature": 0.0,
            "ignore_eos": True}  # fmt: skip
    with httpx.stream("POST", child.v1 + "/chat/completions", json=body, timeout=60) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 3:
                break
        assert engine.stats()["active"] == 1
    deadline = time.time() + 20
    while engine.stats()["active"] and time.time() < deadline:
        time.sleep(0.05)
    assert engine.stats()["active"] == 0
    assert not engine.rows  # the server's side forgot it too


def test_health_and_metrics_read_the_child(pair) -> None:
    _, child = pair
    assert httpx.get(child.url + "/health").json()["status"] == "ok"
    text = httpx.get(child.url + "/metrics").text
    assert 'mlxd_lora_adapters_loaded{model="' in text
    assert "mlxd_prefix_store_lookups" in text


def test_two_models_serve_at_once_each_in_its_own_process(tiny_model, tmp_path: Path) -> None:
    """A pool of two: each model's engine is a process of its own, both answer as the model's
    in-process server does, and unloading one ends its process and leaves the other."""
    dirs = {"qwen": tiny_model("qwen3"), "llama": tiny_model("llama")}
    entries = [{"name": k, "path": str(v)} for k, v in dirs.items()]
    (tmp_path / "models.json").write_text(json.dumps(entries))
    live = start_server(model=None, models_file=str(tmp_path / "models.json"),
                        data_dir=str(tmp_path / "data"), isolation="process")  # fmt: skip
    body = {"messages": MESSAGES, "max_tokens": 6, "logprobs": True, "temperature": 0.0}
    try:
        answers = {k: _answer(httpx.post(live.v1 + "/chat/completions", timeout=60,
                                         json={**body, "model": k})) for k in dirs}  # fmt: skip
        engines = {s.name: s.engine for s in live.state.provider.loaded()}
        assert set(engines) == set(dirs)
        pids = {k: e.proc.pid for k, e in engines.items()}
        assert len(set(pids.values())) == 2
        r = httpx.post(live.v1 + "/models/unload", json={"model": "llama"}, timeout=60)
        assert r.status_code == 200, r.text
        assert engines["llama"].proc.proc.poll() is not None  # its process has ended
        assert engines["qwen"].proc.proc.poll() is None
    finally:
        live.stop()
    for key, folder in dirs.items():  # the references: each model's in-process server
        ref = start_server(model=str(folder), data_dir=str(tmp_path / f"ref-{key}"))
        try:
            want = _answer(httpx.post(ref.v1 + "/chat/completions", timeout=60,
                                      json={**body, "model": str(folder)}))  # fmt: skip
        finally:
            ref.stop()
        got = answers[key]
        assert got[0] == want[0] == 200
        assert got[1]["choices"] == want[1]["choices"] and got[1]["usage"] == want[1]["usage"]
